#include "checkpoint/io.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "io/get_all.h"

namespace wharf::checkpoint {
namespace {

// Bytes of the caller's memory as a Cord, without a copy (the caller keeps the memory alive
// and unchanged until WriteFiles returns, which outlives every writer).
absl::Cord External(absl::Span<const char> bytes) {
  return absl::MakeCordFromExternal(absl::string_view(bytes.data(), bytes.size()), [] {});
}

absl::StatusOr<ObjectMeta> WriteOne(ObjectStore& store, const FileToWrite& file,
                                    uint64_t slice_bytes, const std::atomic<bool>& failed) {
  auto writer = store.NewWriter(file.key, file.put);
  if (!writer.ok()) return writer.status();
  uint64_t size = 0;
  for (absl::Span<const char> region : file.regions) {
    for (uint64_t off = 0; off < region.size(); off += slice_bytes) {
      if (failed.load(std::memory_order_relaxed)) {
        (*writer)->Abort();
        return absl::CancelledError(absl::StrCat("write ", store.Uri(file.key),
                                                 ": cancelled (another file of the save failed)"));
      }
      const uint64_t n = std::min<uint64_t>(slice_bytes, region.size() - off);
      if (absl::Status s = (*writer)->Write(External(region.subspan(off, n))); !s.ok()) {
        (*writer)->Abort();
        return s;
      }
      size += n;
    }
  }
  auto meta = (*writer)->Close();
  if (!meta.ok()) return meta.status();
  if (meta->size != size) {
    return absl::DataLossError(absl::StrCat("write ", store.Uri(file.key), ": the store reports ",
                                            meta->size, " bytes, ", size, " were written"));
  }
  return meta;
}

}  // namespace

absl::StatusOr<std::vector<WrittenFile>> WriteFiles(ObjectStore& store,
                                                    std::vector<FileToWrite> files,
                                                    const WriteFilesOptions& options) {
  std::vector<WrittenFile> out(files.size());
  if (files.empty()) return out;
  const uint64_t slice = std::max<uint64_t>(options.slice_bytes, uint64_t{1} << 20);
  int workers = options.max_files_in_flight > 0 ? options.max_files_in_flight : 8;
  workers = std::min<int>(workers, static_cast<int>(files.size()));

  // ObjectWriter::Write blocks (back-pressure), so each file in flight needs a thread; a
  // few threads of this call's own (not the runtime's blocking pool, whose threads the
  // local store's writers may themselves wait for).
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  absl::Status first_error;
  std::vector<bool> done(files.size(), false);
  auto work = [&] {
    while (true) {
      const size_t i = next.fetch_add(1);
      if (i >= files.size()) return;
      if (failed.load()) continue;  // leave the rest unstarted
      absl::StatusOr<ObjectMeta> meta = WriteOne(store, files[i], slice, failed);
      absl::MutexLock lock(&mu);
      if (meta.ok()) {
        out[i] = WrittenFile{files[i].key, meta->size, meta->etag};
        done[i] = true;
        continue;
      }
      failed = true;
      // The first real failure wins over the cancellations it caused.
      if (first_error.ok() ||
          (absl::IsCancelled(first_error) && !absl::IsCancelled(meta.status()))) {
        first_error = meta.status();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < workers; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();

  if (failed.load()) {
    // Nothing of a failed call stays: the files that completed are removed.
    std::vector<std::string> written;
    for (size_t i = 0; i < files.size(); ++i) {
      if (done[i]) written.push_back(files[i].key);
    }
    if (!written.empty()) (void)store.DeleteMany(std::move(written));
    return first_error;
  }
  return out;
}

namespace {

// One GET: either straight into one destination (`direct`), or a coalesced run of ranges
// whose bytes a sink scatters.
struct Request {
  std::string key;
  std::string etag;
  uint64_t offset = 0;
  uint64_t length = 0;
  char* direct = nullptr;
  std::vector<const RangeToRead*> ranges;  // coalesced: sorted by offset
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

  // The sinks live here until every GET has ended (GetAll waits for them).
  std::vector<std::unique_ptr<ScatterSink>> sinks;
  std::vector<GetRequest> gets;
  gets.reserve(requests.size());
  for (const Request& q : requests) {
    GetRequest get;
    get.key = q.key;
    get.range = ByteRange::Of(q.offset, q.length);
    get.if_match = q.etag;
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
  const GetAllResult got = GetAll(store, std::move(gets), get_options);
  if (!got.error.ok()) return got.error;
  stats.bytes_fetched = got.bytes;
  return stats;
}

}  // namespace wharf::checkpoint
