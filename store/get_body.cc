#include "store/get_body.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace wharf {

absl::string_view RangeCut::Take(absl::string_view chunk) {
  if (!active) return chunk;
  const uint64_t at = seen;
  seen += chunk.size();
  const uint64_t stop = want > std::numeric_limits<uint64_t>::max() - skip
                            ? std::numeric_limits<uint64_t>::max()
                            : skip + want;
  const uint64_t lo = std::max(at, skip);
  const uint64_t hi = std::min<uint64_t>(at + chunk.size(), stop);
  return lo < hi ? chunk.substr(lo - at, hi - lo) : absl::string_view();
}

absl::Status DeliverGetBytes(const GetRequest& request, uint64_t filled, absl::string_view bytes,
                             absl::string_view uri) {
  if (request.sink != nullptr) return request.sink->Append(bytes);
  if (filled > request.buffer.size() || bytes.size() > request.buffer.size() - filled) {
    return absl::OutOfRangeError(absl::StrCat("get ", uri, ": the response body of at least ",
                                              filled + bytes.size(), " bytes does not fit the ",
                                              request.buffer.size(), "-byte buffer"));
  }
  std::memcpy(request.buffer.data() + filled, bytes.data(), bytes.size());
  return absl::OkStatus();
}

}  // namespace wharf
