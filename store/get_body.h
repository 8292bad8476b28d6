// Where the body of one GET goes, for the stores that receive it in chunks (s3://, gs://):
// the bytes a server sent for a range it ignored are cut to the range, and the rest lands in
// the request's sink or buffer.
#ifndef WHARF_STORE_GET_BODY_H_
#define WHARF_STORE_GET_BODY_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
  // One past the range's last byte; nullopt for a range to the end of an object of unknown
  // size.
  std::optional<uint64_t> end() const;
};

// The cut for a 200 (the whole object, `size` bytes when the response said) that answered a
// ranged GET: of `range`, or on a resumed attempt (`delivered` > 0) of the rest of the
// extent [begin, end) the first response fixed. Inactive when the whole object is what was
// wanted. OutOfRange for a range past the end (as a 416), DataLoss when the object is now
// shorter than what was already delivered, Unimplemented for a suffix range of an object of
// unknown size; errors start "get <uri>: ".
absl::StatusOr<RangeCut> CutFromWholeObject(const ByteRange& range, std::optional<uint64_t> size,
                                            uint64_t begin, uint64_t delivered,
                                            std::optional<uint64_t> end, absl::string_view uri);

// Appends `bytes` to the request's sink, or copies them into its buffer at `filled` (bytes
// already there); OutOfRange naming `uri` when the buffer cannot take them.
absl::Status DeliverGetBytes(const GetRequest& request, uint64_t filled, absl::string_view bytes,
                             absl::string_view uri);

// A suffix range ("the last N bytes") of an empty object is empty, as the local store and
// `tail -c` have it; HTTP servers refuse it with 416 (RFC 9110: unsatisfiable). Called with
// that refusal (`refused`, OutOfRange) of `request`: a HEAD of the key decides. An empty object
// (of the version asked for, when the request pins one) answers 0 bytes; anything else passes
// `refused` on unchanged.
void SuffixOfEmptyObject(ObjectStore& store, const GetRequest& request, absl::Status refused,
                         Callback<GetResult> done);

}  // namespace wharf

#endif  // WHARF_STORE_GET_BODY_H_
