// Multipart ETags: telling whether a file holds the same bytes as an object uploaded in parts.
//
// An S3 object uploaded in N parts has the ETag hex(MD5(MD5(part 1) || ... || MD5(part N)))-N,
// not the MD5 of its content, so a copy that compares ETags (wharf cp -r, tier export) took
// every such object for changed and moved it again on each run. The ETag says how many parts
// there were, not how big they were; the tools that upload in parts each have their own part
// size (8 MiB for the AWS CLI, boto3 and wharf; 5, 15, 16, 50 or 64 MiB elsewhere; wharf's
// doubles every 1,000 parts). MultipartEtagMatches tries each plan that cuts the object into
// exactly N parts in one pass over the local bytes, which costs a read and an MD5 of the file
// per plausible plan (almost always one or two): cheaper than moving the object again.
//
// Thread-safety: the functions are thread-safe; the store must be (every ObjectStore is).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "store/object_store.h"

namespace wharf {

// The part count of a multipart ETag ("<32 hex>-N", N in 1..10,000, quotes allowed), or 0
// for any other ETag (an MD5, a GCS generation, empty).
uint32_t MultipartEtagParts(absl::string_view etag);

// The multipart ETags ("<32 hex>-N", lowercase) the `size` bytes of `key` in `store` (a local
// file, typically) would have if uploaded in `parts` parts under each plausible part plan: a
// uniform part size among those tools use (5, 8, 15, 16, 32, 50, 64, 100, 128, 256, 512 MiB,
// 1 GiB), `base` (the part size of this process's writer), the size split evenly into N
// parts (exactly, or rounded up to a MiB), and each of those doubled every 1,000 parts
// (wharf's writer); only the plans that give exactly `parts` parts, each once. One pass over
// the bytes. Empty when no plan fits or the object's size is no longer `size`; a read that
// fails is the status.
absl::StatusOr<std::vector<std::string>> MultipartEtags(ObjectStore& store, const std::string& key,
                                                        uint64_t size, uint32_t parts,
                                                        uint64_t base);

// Whether those bytes have the multipart ETag `etag` (false for an ETag that is not one).
absl::StatusOr<bool> MultipartEtagMatches(ObjectStore& store, const std::string& key, uint64_t size,
                                          absl::string_view etag, uint64_t base);

}  // namespace wharf
