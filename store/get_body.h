// Where the body of one GET goes, for the stores that receive it in chunks (s3://, gs://):
// the bytes a server sent for a range it ignored are cut to the range, and the rest lands in
// the request's sink or buffer.
#ifndef WHARF_STORE_GET_BODY_H_
#define WHARF_STORE_GET_BODY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "store/object_store.h"

namespace wharf {

// HTTP lets a server answer a ranged GET with 200 and the whole object (some S3-compatible
// servers and proxies do; the GCS emulator does for suffix ranges): only [skip, skip + want)
// of that body is the range. One per attempt.
struct RangeCut {
  bool active = false;
  uint64_t skip = 0;
  uint64_t want = 0;  // may be UINT64_MAX: to the end
  uint64_t seen = 0;  // body bytes passed to Take so far

  // The part of `chunk` (the next body bytes) inside the range; empty when none is.
  absl::string_view Take(absl::string_view chunk);
};

// Appends `bytes` to the request's sink, or copies them into its buffer at `filled` (bytes
// already there); OutOfRange naming `uri` when the buffer cannot take them.
absl::Status DeliverGetBytes(const GetRequest& request, uint64_t filled, absl::string_view bytes,
                             absl::string_view uri);

}  // namespace wharf

#endif  // WHARF_STORE_GET_BODY_H_
