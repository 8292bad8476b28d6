// gs://: Google Cloud Storage. Today in XML mode: GCS's XML API is S3-compatible, so a gs://
// store is an S3Store (store/s3/) pointed at GCS, signing with SigV4 and HMAC keys, with its
// own capabilities. The JSON API (OAuth bearer tokens, compose, generations) is the next
// step; its mode will be chosen by the spec's `api` option (docs/design/gcs.md).
//
// Configuration, as before store specs:
//   endpoint: the spec's `endpoint`, else WHARF_GS_ENDPOINT, else https://storage.googleapis.com
//   HMAC key: WHARF_GS_ACCESS_KEY_ID and WHARF_GS_SECRET_ACCESS_KEY (never in the spec)
//   anonymous: the spec's `anonymous`, else WHARF_NO_SIGN_REQUEST; then no key is needed
//   region "auto", path-style addressing (the spec may say addressing_style=virtual).
// Options taken: endpoint, anonymous, addressing_style, api ("xml"; "json" is Unimplemented).
// `region` and `profile` (AWS notions) are refused with InvalidArgument.
//
// Thread-safety: the functions are thread-safe; the stores are (see S3Store).
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "store/object_store.h"
#include "store/spec.h"

namespace wharf::gcs {

// What a gs:// store does in XML mode: multipart uploads (GCS XML supports S3's multipart
// protocol), pages of up to 1,000 keys, upload options as headers; no compose yet (XML
// compose is not S3's request shape: it comes with the JSON API).
const Capabilities& XmlCapabilities();

// The gs:// store of a spec (the scheme registry's factory).
absl::StatusOr<std::shared_ptr<ObjectStore>> OpenGcsSpec(const StoreSpec& spec);

// The buckets the HMAC key's project can see: `wharf ls gs://`.
absl::StatusOr<std::vector<BucketInfo>> ListGcsBuckets(const StoreSpec& spec);

}  // namespace wharf::gcs
