#include "io/read_ranges.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "io/get_all.h"

namespace wharf {
namespace {

// One GET: either straight into one destination (`direct`), or a coalesced run of ranges
// whose bytes a sink scatters.
struct Request {
  std::string key;
  std::string etag;
  uint64_t offset = 0;
  uint64_t length = 0;
  char* direct = nullptr;
  // The ranges this GET delivers (all of a coalesced run, sorted by offset; for a direct
  // GET, the one range it is a part of).
  std::vector<const RangeToRead*> ranges;
};

// Receives a coalesced GET's bytes in order and copies each piece into every range it
// overlaps (ranges may overlap: two destinations of the same stored bytes).
class ScatterSink : public ReadSink {
 public:
  explicit ScatterSink(const Request& request) : request_(request), at_(request.offset) {}

  absl::Status Append(absl::string_view chunk) override {
    const uint64_t begin = at_, end = at_ + chunk.size();
    const auto& ranges = request_.ranges;
    // Ranges before first_ ended before this chunk; later ones that did are skipped below.
    while (first_ < ranges.size() && ranges[first_]->offset + ranges[first_]->length <= begin) {
      ++first_;
    }
    for (size_t i = first_; i < ranges.size() && ranges[i]->offset < end; ++i) {
      const RangeToRead& r = *ranges[i];
      const uint64_t lo = std::max(begin, r.offset);
      const uint64_t hi = std::min(end, r.offset + r.length);
      if (lo >= hi) continue;
      std::memcpy(r.dst + (lo - r.offset), chunk.data() + (lo - begin), hi - lo);
    }
    at_ = end;
    return absl::OkStatus();
  }

 private:
  const Request& request_;
  uint64_t at_;
  size_t first_ = 0;
};

std::vector<Request> PlanRequests(const std::vector<RangeToRead>& ranges, uint64_t gap,
                                  uint64_t max_request) {
  std::vector<const RangeToRead*> sorted;
  sorted.reserve(ranges.size());
  for (const RangeToRead& r : ranges) {
    if (r.length > 0) sorted.push_back(&r);
  }
  std::sort(sorted.begin(), sorted.end(), [](const RangeToRead* a, const RangeToRead* b) {
    return a->key != b->key ? a->key < b->key : a->offset < b->offset;
  });
  std::vector<Request> out;
  auto flush = [&](std::vector<const RangeToRead*>& run, uint64_t run_end) {
    if (run.empty()) return;
    const RangeToRead& head = *run.front();
    if (run.size() == 1) {
      // One range: split into parallel GETs straight into its destination.
      for (uint64_t off = 0; off < head.length; off += max_request) {
        Request q;
        q.key = head.key;
        q.etag = head.etag;
        q.offset = head.offset + off;
        q.length = std::min(max_request, head.length - off);
        q.direct = head.dst + off;
        q.ranges = run;
        out.push_back(std::move(q));
      }
    } else {
      Request q;
      q.key = head.key;
      q.etag = head.etag;
      q.offset = head.offset;
      q.length = run_end - head.offset;
      q.ranges = run;
      out.push_back(std::move(q));
    }
    run.clear();
  };
  std::vector<const RangeToRead*> run;
  uint64_t run_end = 0;
  for (const RangeToRead* r : sorted) {
    const uint64_t end = r->offset + r->length;
    if (!run.empty() && r->key == run.front()->key && r->etag == run.front()->etag &&
        r->offset <= run_end + gap && std::max(run_end, end) - run.front()->offset <= max_request) {
      run.push_back(r);
      run_end = std::max(run_end, end);
      continue;
    }
    flush(run, run_end);
    run.push_back(r);
    run_end = end;
  }
  flush(run, run_end);
  return out;
}

}  // namespace

absl::StatusOr<ReadRangesStats> ReadRanges(ObjectStore& store, std::vector<RangeToRead> ranges,
                                           const ReadRangesOptions& options) {
  std::shared_ptr<Runtime> runtime = options.runtime ? options.runtime : Runtime::Default();
  uint64_t max_request = options.max_request_bytes;
  if (max_request == 0) max_request = runtime->link(store.Uri("")).PartSize();
  max_request = std::max<uint64_t>(max_request, uint64_t{64} << 10);
  int max_in_flight = options.max_in_flight;
  if (max_in_flight <= 0) max_in_flight = runtime->inflight() > 0 ? runtime->inflight() : 64;

  ReadRangesStats stats;
  stats.ranges = ranges.size();
  for (const RangeToRead& r : ranges) {
    if (r.length > 0 && r.dst == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("read ", store.Uri(r.key), ": no destination for ", r.length, " bytes"));
    }
    stats.bytes += r.length;
  }
  const std::vector<Request> requests = PlanRequests(ranges, options.coalesce_gap, max_request);
  stats.requests = requests.size();

  // Each range is done when every GET carrying a piece of it has ended well.
  std::unique_ptr<std::atomic<int>[]> remaining(new std::atomic<int>[ranges.size()]);
  for (size_t i = 0; i < ranges.size(); ++i) remaining[i].store(0, std::memory_order_relaxed);
  for (const Request& q : requests) {
    for (const RangeToRead* r : q.ranges) remaining[r - ranges.data()].fetch_add(1);
  }
  if (options.on_range_done) {
    for (size_t i = 0; i < ranges.size(); ++i) {
      if (remaining[i].load(std::memory_order_relaxed) == 0) options.on_range_done(i);
    }
  }

  // The sinks live here until every GET has ended (GetAll waits for them).
  std::vector<std::unique_ptr<ScatterSink>> sinks;
  std::vector<GetRequest> gets;
  gets.reserve(requests.size());
  for (const Request& q : requests) {
    GetRequest get;
    get.key = q.key;
    get.range = ByteRange::Of(q.offset, q.length);
    get.if_match = q.etag;
    get.cancel = options.cancel;
    if (q.direct != nullptr) {
      get.buffer = absl::MakeSpan(q.direct, q.length);
    } else {
      sinks.push_back(std::make_unique<ScatterSink>(q));
      get.sink = sinks.back().get();
    }
    gets.push_back(std::move(get));
  }
  GetAllOptions get_options;
  get_options.max_in_flight = max_in_flight;
  if (options.on_range_done) {
    // GetAll returns only after every completion has run, so `remaining` and `requests`
    // outlive these calls.
    get_options.on_done = [&](size_t i, const absl::StatusOr<GetResult>& result) {
      if (!result.ok()) return;
      for (const RangeToRead* r : requests[i].ranges) {
        const size_t index = r - ranges.data();
        if (remaining[index].fetch_sub(1, std::memory_order_acq_rel) == 1) {
          options.on_range_done(index);
        }
      }
    };
  }
  const GetAllResult got = GetAll(store, std::move(gets), get_options);
  if (!got.error.ok()) return got.error;
  if (IsCancelled(options.cancel)) {
    return absl::CancelledError(absl::StrCat("read ", store.Uri(""), ": cancelled"));
  }
  stats.bytes_fetched = got.bytes;
  return stats;
}

}  // namespace wharf
