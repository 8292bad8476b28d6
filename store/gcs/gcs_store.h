// gs://: Google Cloud Storage, over one of its two APIs (docs/design/gcs.md).
//
// JSON API (the default; GcsJsonStore, store/gcs/gcs_json_store.h): OAuth2 bearer tokens from
// application-default credentials (store/gcs/gcs_credentials.h), or none for the emulator
// (STORAGE_EMULATOR_HOST) and anonymous access. Endpoint: the spec's `endpoint`, else
// STORAGE_EMULATOR_HOST, else WHARF_GS_ENDPOINT, else https://storage.googleapis.com.
//
// XML API (S3-compatible; an S3Store from store/s3/ with GCS's settings): SigV4 with an HMAC
// key from WHARF_GS_ACCESS_KEY_ID / WHARF_GS_SECRET_ACCESS_KEY, region "auto", path-style
// addressing (the spec may say addressing_style=virtual). Endpoint: the spec's `endpoint`,
// else WHARF_GS_ENDPOINT, else https://storage.googleapis.com.
//
// Which API: the spec's `api` option ("json" or "xml"), else WHARF_GS_API, else XML when an
// HMAC key is set, else JSON. Options taken: endpoint, anonymous (else WHARF_NO_SIGN_REQUEST),
// api, and addressing_style in XML mode; `region` and `profile` (AWS notions) are refused with
// InvalidArgument.
//
// Thread-safety: the functions are thread-safe; the stores are.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "store/object_store.h"
#include "store/spec.h"

namespace wharf::gcs {

// What a gs:// store does in XML mode: multipart uploads (GCS XML supports S3's multipart
// protocol), pages of up to 1,000 keys, upload options as headers; no compose (XML compose is
// not S3's request shape; the JSON API has it).
const Capabilities& XmlCapabilities();

// The gs:// store of a spec (the scheme registry's factory).
absl::StatusOr<std::shared_ptr<ObjectStore>> OpenGcsSpec(const StoreSpec& spec);

// The buckets of the project (JSON: GOOGLE_CLOUD_PROJECT or the service-account key's; XML:
// the HMAC key's): `wharf ls gs://`.
absl::StatusOr<std::vector<BucketInfo>> ListGcsBuckets(const StoreSpec& spec);

}  // namespace wharf::gcs
