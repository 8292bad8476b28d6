#include "store/get_body.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace wharf {

constexpr uint64_t kUnbounded = std::numeric_limits<uint64_t>::max();

absl::string_view RangeCut::Take(absl::string_view chunk) {
  if (!active) return chunk;
  const uint64_t at = seen;
  seen += chunk.size();
  const uint64_t stop = want > kUnbounded - skip ? kUnbounded : skip + want;
  const uint64_t lo = std::max(at, skip);
  const uint64_t hi = std::min<uint64_t>(at + chunk.size(), stop);
  return lo < hi ? chunk.substr(lo - at, hi - lo) : absl::string_view();
}

std::optional<uint64_t> RangeCut::end() const {
  if (want == kUnbounded) return std::nullopt;
  return skip + want;
}

namespace {

absl::StatusOr<RangeCut> Cut(const ByteRange& range, std::optional<uint64_t> size, uint64_t begin,
                             uint64_t delivered, std::optional<uint64_t> end) {
  uint64_t from = 0, to = kUnbounded;
  if (delivered > 0) {  // a resumed attempt: the rest of the extent
    from = begin + delivered;
    if (end) to = *end;
  } else if (size) {
    auto span = range.Resolve(*size);
    if (!span.ok()) return span.status();
    std::tie(from, to) = *span;
  } else if (!range.suffix) {
    from = range.offset;
    if (range.length) to = from + *range.length;
  } else {
    return absl::UnimplementedError(
        "the server ignored the Range header and sent no Content-Length: the last bytes of "
        "the object cannot be found");
  }
  if (size) {
    if (from > *size) {
      return absl::DataLossError(absl::StrCat("the object is now ", *size,
                                              " bytes, shorter than the ", from, " already read"));
    }
    to = std::min(to, *size);
    if (from == 0 && to == *size) return RangeCut{};  // the whole object was wanted
  }
  return RangeCut{.active = true, .skip = from, .want = to == kUnbounded ? kUnbounded : to - from};
}

}  // namespace

absl::StatusOr<RangeCut> CutFromWholeObject(const ByteRange& range, std::optional<uint64_t> size,
                                            uint64_t begin, uint64_t delivered,
                                            std::optional<uint64_t> end, absl::string_view uri) {
  absl::StatusOr<RangeCut> cut = Cut(range, size, begin, delivered, end);
  if (!cut.ok()) return Annotate(cut.status(), absl::StrCat("get ", uri));
  return cut;
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

void SuffixOfEmptyObject(ObjectStore& store, const GetRequest& request, absl::Status refused,
                         Callback<GetResult> done) {
  if (!request.range.suffix || !absl::IsOutOfRange(refused)) {
    return std::move(done)(std::move(refused));
  }
  store.HeadAsync(request.key, [if_match = request.if_match, if_none_match = request.if_none_match,
                                refused = std::move(refused),
                                done = std::move(done)](absl::StatusOr<ObjectMeta> head) mutable {
    if (!head.ok() || head->size != 0 || (!if_match.empty() && head->etag != if_match)) {
      return std::move(done)(std::move(refused));
    }
    GetResult result;
    result.not_modified = !if_none_match.empty() && head->etag == if_none_match;
    result.meta = *std::move(head);
    std::move(done)(std::move(result));
  });
}

}  // namespace wharf
