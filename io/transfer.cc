#include "io/transfer.h"

#include <errno.h>
#include <fnmatch.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "io/fetch_scheduler.h"
#include "io/multipart_etag.h"
#include "io/parallel_list.h"
#include "io/prefix_fetch.h"
#include "store/keys.h"

namespace wharf {

int TransferShardOf(absl::string_view relative_key, int count) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : relative_key) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<int>(h % static_cast<uint64_t>(count));
}

bool PassesFilters(const std::vector<TransferFilter>& filters, absl::string_view relative_key) {
  bool included = true;
  const std::string key(relative_key);
  for (const TransferFilter& f : filters) {
    // No FNM_PATHNAME: '*' crosses '/', as in `aws s3 --exclude`.
    if (fnmatch(f.pattern.c_str(), key.c_str(), 0) == 0) included = f.include;
  }
  return included;
}

namespace {

// Parts of one object requested at once, and submitted ahead of the one consumed.
constexpr int kPartsInFlight = 8;
constexpr int kPartsAhead = 2 * kPartsInFlight;
// Threads pumping big objects' part streams at once (between two stores).
constexpr int kStreamWorkers = 4;
constexpr uint64_t kDefaultPartSize = uint64_t{8} << 20;
// Objects between two returns of freed heap pages to the kernel (see ReturnFreedMemory).
constexpr uint64_t kTrimEvery = 4096;

// Gives the heap's free pages back to the kernel. The engine's live heap is flat in the
// number of objects, but glibc keeps an arena per thread and returns freed memory only
// from the top of each: small allocations made on one thread (listing, fetch, puts) and
// freed on another (the transport's) leave free pages scattered in every arena, and the
// process's RSS would creep up with the count although nothing is held (measured against
// RGW with 32 requests in flight: 7.7 MB more peak RSS uploading 20,000 small files than
// 2,000, 4.0 MB with these trims; the live heap differed by 0.3 MB). malloc_trim releases
// those pages (MADV_DONTNEED) in every arena; every few thousand objects it costs nothing
// measurable.
void ReturnFreedMemory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

// What the destination holds below its prefix, 48 bytes per object: the relative key's
// hash -> size, ETag hash, modification time, content MD5 hash, multipart part count, and
// whether the source listed it (sync --delete removes the others). A 64-bit hash collision could
// only make an object look present when size, ETag (or time) also agree.
struct DstEntry {
  uint64_t size = 0;
  uint64_t etag_hash = 0;
  int64_t mtime_s = 0;
  uint64_t md5_hash = 0;  // of ContentMd5() when the store knows it (GCS md5Hash), else 0
  uint32_t parts = 0;     // of a multipart ETag (MultipartEtagParts), else 0
  bool seen = false;
};
using DstIndex = absl::flat_hash_map<uint64_t, DstEntry>;
// The size of an entry deleted during the transfer (no source object has it).
constexpr uint64_t kGone = ~uint64_t{0};

uint64_t HashKey(absl::string_view s) {
  return std::hash<std::string_view>()(std::string_view(s.data(), s.size()));
}

int64_t Seconds(absl::Time t) { return t == absl::InfinitePast() ? 0 : absl::ToUnixSeconds(t); }
// A source's time in whole seconds, rounded up: a file written at 10:11:28.17 is newer than
// an object stamped 10:11:28 (S3 keeps whole seconds), so a same-size edit made in the second
// of the upload is copied again, as aws s3 sync does, rather than taken for current.
int64_t SourceSeconds(absl::Time t) {
  return t == absl::InfinitePast()
             ? 0
             : absl::ToInt64Seconds(absl::Ceil(t - absl::UnixEpoch(), absl::Seconds(1)));
}

bool IsLocal(const ObjectStore& store) { return absl::StartsWith(store.Uri(""), "file://"); }

// Failures and counts, updated from many threads. Flat in the number of objects: counters
// and the first failure; each failure goes to the observer as it happens.
class Outcome {
 public:
  explicit Outcome(TransferObserver* observer) : observer_(observer) {}
  void Fail(const absl::Status& status) {
    if (observer_) observer_->OnError(status);
    absl::MutexLock lock(&mu_);
    if (failed_++ == 0) first_error_ = status;
  }
  void Done(uint64_t bytes, const std::string& src, const std::string& dst) {
    objects_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
    if (observer_) observer_->OnObjectDone(src, dst);
  }
  // Done() for an object whose source and destination metadata are known.
  void Stored(const ObjectMeta& src, const std::string& src_uri, const ObjectMeta& dst,
              const std::string& dst_uri) {
    Done(src.size, src_uri, dst_uri);
    if (observer_) observer_->OnObjectAt(src, dst, /*copied=*/true);
  }
  void Bytes(uint64_t n) {
    if (observer_) observer_->OnBytes(n);
  }
  uint64_t failed() const {
    absl::MutexLock lock(&mu_);
    return failed_;
  }
  absl::Status first_error() const {
    absl::MutexLock lock(&mu_);
    return first_error_;
  }
  uint64_t objects() const { return objects_.load(); }
  uint64_t bytes() const { return bytes_.load(); }

 private:
  TransferObserver* const observer_;
  std::atomic<uint64_t> objects_{0};
  std::atomic<uint64_t> bytes_{0};
  mutable absl::Mutex mu_;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

// A fixed set of threads for work that blocks (server-side copies, part streams). Run()
// blocks while 2 x threads tasks are queued or running, which keeps the listing that feeds
// it only a little ahead of the work.
class Workers {
 public:
  explicit Workers(int threads) : limit_(2 * threads), pool_(threads) {}
  ~Workers() { Wait(); }
  void Run(absl::AnyInvocable<void() &&> fn) {
    {
      absl::MutexLock lock(&mu_);
      auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ < limit_; };
      AwaitInterruptibly(mu_, absl::Condition(&room));
      ++pending_;
    }
    pool_.Schedule([this, fn = std::move(fn)]() mutable {
      std::move(fn)();
      absl::MutexLock lock(&mu_);
      --pending_;
    });
  }
  void Wait() {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
    AwaitInterruptibly(mu_, absl::Condition(&idle));
  }

 private:
  const int limit_;
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  ThreadPool pool_;  // last: joined before the members its tasks use go away
};

// Puts fetched objects into the destination asynchronously. The fetched blocks stay charged
// to the budget until their put completes, so bytes are bounded by the budget; the count of
// puts in flight is bounded here, so memory stays flat however small the objects are.
class PutQueue {
 public:
  PutQueue(ObjectStore& dst, int max_pending, Outcome& outcome)
      : dst_(dst), max_pending_(max_pending), outcome_(outcome) {}
  ~PutQueue() { Wait(); }

  // A put whose bytes were damaged on the way (IsSourceMismatch) is not a failure yet: it is
  // kept for the engine to fetch again (TakeDamaged) once the queue is idle.
  struct Damaged {
    ObjectMeta src;
    std::string dst_key;
    absl::Status status;
  };
  std::vector<Damaged> TakeDamaged() {
    absl::MutexLock lock(&mu_);
    return std::exchange(damaged_, {});
  }

  void Put(std::string dst_key, FetchBuffer data, PutOptions options, ObjectMeta src,
           std::string src_uri) {
    {
      absl::MutexLock lock(&mu_);
      auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ < max_pending_; };
      AwaitInterruptibly(mu_, absl::Condition(&room));
      ++pending_;
    }
    const uint64_t size = data.size();
    // Zero-copy: the Cord keeps the fetched block (and its budget charge) until written.
    absl::Cord cord = absl::MakeCordFromExternal(data.view(), [data] {});
    std::string dst_uri = dst_.Uri(dst_key);
    std::string key = dst_key;
    dst_.PutAsync(std::move(dst_key), std::move(cord), options,
                  [this, size, src = std::move(src), src_uri = std::move(src_uri),
                   dst_uri = std::move(dst_uri),
                   key = std::move(key)](absl::StatusOr<ObjectMeta> meta) mutable {
                    const bool damaged = !meta.ok() && IsSourceMismatch(meta.status());
                    if (meta.ok()) {
                      outcome_.Bytes(size);
                      outcome_.Stored(src, src_uri, *meta, dst_uri);
                    } else if (!damaged) {
                      outcome_.Fail(meta.status());
                    }
                    absl::MutexLock lock(&mu_);
                    if (damaged)
                      damaged_.push_back({std::move(src), std::move(key), meta.status()});
                    --pending_;
                  });
  }

  void Wait() {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
    AwaitInterruptibly(mu_, absl::Condition(&idle));
  }

 private:
  ObjectStore& dst_;
  const int max_pending_;
  Outcome& outcome_;
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Damaged> damaged_ ABSL_GUARDED_BY(mu_);
};

// ---- One part plan, part sources and sinks, one pump ----
//
// Every object that is not moved whole (big objects between stores, a single-object copy,
// standard input and output) moves as a stream of ordered parts: a PartSource yields the
// parts in order, a PartSink consumes them, and Pump() joins the two. Parts are cut in one
// place, PartSizeAt(): so an object read from a store, from standard input or written to
// S3 is cut the same way, and each part is one multipart part of the destination.

// The size of part `n` (0-based): `base`, doubled every 1,000 parts, at most 5 GiB. S3's
// writer uses the same rule for its multipart parts, so with the same base (8 MiB by
// default on both sides) each part it receives is uploaded as it arrives, never held back
// to be joined with the next one, and 10,000 parts still cover 8 TiB.
uint64_t PartSizeAt(uint64_t base, uint64_t n) {
  const uint64_t doublings = std::min<uint64_t>(10, n / 1000);
  return std::min(base << doublings, uint64_t{5} << 30);
}

// Yields an object's bytes as ordered parts (PartSizeAt). Each part is charged to the
// memory budget until the sink (and whatever the sink hands it to) releases it.
class PartSource {
 public:
  virtual ~PartSource() = default;
  // The next part in order, or nullopt after the last one.
  virtual absl::StatusOr<std::optional<FetchBuffer>> Next() = 0;
};

// Consumes ordered parts. Close() publishes what was written; Abort() discards it, so a
// destination object appears complete or not at all.
class PartSink {
 public:
  virtual ~PartSink() = default;
  virtual absl::Status Write(FetchBuffer part) = 0;
  virtual absl::StatusOr<ObjectMeta> Close() = 0;
  virtual void Abort() = 0;
};

// The parts of one object in a store, read through an ordered fetch batch: up to `ahead`
// parts are submitted beyond the one consumed, and the fetch starts them as its in-flight
// limit and the budget allow, so a part stream holds a bounded number of parts whatever
// the object's size.
class ObjectParts : public PartSource {
 public:
  ObjectParts(FetchScheduler& scheduler, ObjectMeta meta, uint64_t base, int ahead)
      : meta_(std::move(meta)), base_(base), ahead_(ahead), batch_(scheduler.StartBatch()) {
    Submit();
  }

  absl::StatusOr<std::optional<FetchBuffer>> Next() override {
    std::optional<FetchResult> r = batch_->Next();
    if (!r) return std::optional<FetchBuffer>();
    ++taken_;
    Submit();
    if (!r->data.ok()) return r->data.status();
    return std::optional<FetchBuffer>(*std::move(r->data));
  }

 private:
  void Submit() {
    std::vector<FetchItem> items;
    while (offset_ < meta_.size && submitted_ - taken_ < static_cast<uint64_t>(ahead_)) {
      const uint64_t n = std::min(PartSizeAt(base_, submitted_), meta_.size - offset_);
      items.push_back({.key = meta_.key,
                       .range = ByteRange::Of(offset_, n),
                       .size = meta_.size,
                       .etag = meta_.etag});
      offset_ += n;
      ++submitted_;
    }
    if (!items.empty()) batch_->Add(std::move(items));
    if (offset_ >= meta_.size && !closed_) {
      batch_->Close();
      closed_ = true;
    }
  }

  const ObjectMeta meta_;
  const uint64_t base_;
  const int ahead_;
  std::unique_ptr<FetchScheduler::Batch> batch_;
  uint64_t offset_ = 0, submitted_ = 0, taken_ = 0;
  bool closed_ = false;
};

// Waits for a block of `bytes` from the budget (releases anywhere wake the wait).
// The bytes read from a file descriptor (standard input), one part at a time into blocks
// from the budget: a block is reserved (waiting for releases) before it is filled, so the
// parts held by the sink and the one being read stay within the budget.
class FdParts : public PartSource {
 public:
  FdParts(int fd, std::shared_ptr<Runtime> runtime, uint64_t cap, uint64_t base, std::string what)
      : fd_(fd),
        runtime_(std::move(runtime)),
        account_(runtime_->budget().NewAccount(cap, what)),
        base_(base),
        what_(std::move(what)) {}

  absl::StatusOr<std::optional<FetchBuffer>> Next() override {
    if (eof_) return std::optional<FetchBuffer>();
    MemoryBudget& budget = runtime_->budget();
    Block block;
    if (!budget.WaitUntil([&] {
          return static_cast<bool>(block = budget.TryAllocate(account_, PartSizeAt(base_, parts_)));
        })) {
      return absl::CancelledError(absl::StrCat(what_, ": cancelled"));
    }
    uint64_t filled = 0;
    while (filled < block.size()) {
      const ssize_t n = read(fd_, block.data() + filled, block.size() - filled);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return absl::ErrnoToStatus(errno, what_);
      if (n == 0) {
        eof_ = true;
        break;
      }
      filled += n;
    }
    if (filled == 0) return std::optional<FetchBuffer>();
    ++parts_;
    return std::optional<FetchBuffer>(FetchBuffer(block.owner(), block.data(), filled));
  }

 private:
  const int fd_;
  const std::shared_ptr<Runtime> runtime_;
  const std::shared_ptr<MemoryBudget::Account> account_;
  const uint64_t base_;
  const std::string what_;
  uint64_t parts_ = 0;
  bool eof_ = false;
};

// Parts into an ObjectWriter (an S3 multipart upload, a local temporary file). The writer
// keeps each part (zero-copy, still charged to the budget) until its upload completes.
class WriterSink : public PartSink {
 public:
  explicit WriterSink(std::unique_ptr<ObjectWriter> writer) : writer_(std::move(writer)) {}
  absl::Status Write(FetchBuffer part) override {
    const absl::string_view bytes = part.view();
    return writer_->Write(absl::MakeCordFromExternal(bytes, [part = std::move(part)] {}));
  }
  absl::StatusOr<ObjectMeta> Close() override { return writer_->Close(); }
  void Abort() override { writer_->Abort(); }

 private:
  std::unique_ptr<ObjectWriter> writer_;
};

// Parts written to a file descriptor (standard output) as they arrive.
class FdSink : public PartSink {
 public:
  FdSink(int fd, std::string what) : fd_(fd), what_(std::move(what)) {}
  absl::Status Write(FetchBuffer part) override {
    absl::string_view rest = part.view();
    while (!rest.empty()) {
      const ssize_t n = write(fd_, rest.data(), rest.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return absl::ErrnoToStatus(errno, what_);
      rest.remove_prefix(n);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<ObjectMeta> Close() override { return ObjectMeta{}; }
  void Abort() override {}

 private:
  const int fd_;
  const std::string what_;
};

// The pump: every part from `source` into `sink`, in order; `on_bytes` after each part.
// The sink is aborted on any failure.
absl::StatusOr<ObjectMeta> Pump(PartSource& source, PartSink& sink,
                                absl::FunctionRef<void(uint64_t)> on_bytes) {
  while (true) {
    absl::StatusOr<std::optional<FetchBuffer>> part = source.Next();
    if (!part.ok()) {
      sink.Abort();
      return part.status();
    }
    if (!part->has_value()) break;
    const uint64_t n = (*part)->size();
    if (absl::Status s = sink.Write(**std::move(part)); !s.ok()) {
      sink.Abort();
      return s;
    }
    on_bytes(n);
  }
  return sink.Close();
}

// The base part size: the option, else sized from the source's link estimate.
uint64_t PartBase(const TransferOptions& options, ObjectStore& src) {
  if (options.part_size > 0) return options.part_size;
  std::shared_ptr<Runtime> runtime = options.runtime ? options.runtime : Runtime::Default();
  return runtime->link(src.Uri("")).PartSize();
}

// Fetch settings of the part streams: ordered, one request per part (PartSizeAt cuts the
// parts, the fetch never splits them again), and waiting for releases, since the parts
// are held by writers (uploads in flight) that release them as they complete.
FetchOptions PartFetchOptions(const TransferOptions& options) {
  FetchOptions f;
  f.runtime = options.runtime;
  // Parts of one object in flight: 8 x 8 MiB is ~1.3 GB/s per object at 50 ms.
  f.max_in_flight = kPartsInFlight;
  f.memory_budget = options.memory_budget;
  f.split_threshold = std::numeric_limits<uint64_t>::max();
  f.coalesce_gap = 0;
  f.ordered = true;
  f.wait_for_release = true;
  return f;
}

// What the index keeps of a destination object.
DstEntry Entry(const ObjectMeta& m) {
  const std::string md5 = ContentMd5(m);
  return DstEntry{.size = m.size,
                  .etag_hash = HashKey(m.etag),
                  .mtime_s = Seconds(m.mtime),
                  .md5_hash = md5.empty() ? 0 : HashKey(md5),
                  .parts = MultipartEtagParts(m.etag)};
}

// Lists the destination prefix into a DstIndex; with `dirs`, the hashes of the relative
// keys' folders ("a" and "a/b" for "a/b/c") go there too.
absl::StatusOr<DstIndex> IndexDestination(ObjectStore& dst, const std::string& prefix,
                                          const ParallelListOptions& list,
                                          absl::flat_hash_set<uint64_t>* dirs = nullptr) {
  DstIndex index;
  absl::Mutex mu;
  ListOptions range;
  range.prefix = prefix;
  absl::Status s = ParallelList(dst, range, list, [&](std::vector<ObjectMeta> page) {
    absl::MutexLock lock(&mu);
    for (const ObjectMeta& m : page) {
      const absl::string_view rel = absl::string_view(m.key).substr(prefix.size());
      index[HashKey(rel)] = Entry(m);
      if (dirs == nullptr) continue;
      for (size_t p = rel.find('/'); p != absl::string_view::npos; p = rel.find('/', p + 1)) {
        dirs->insert(HashKey(rel.substr(0, p)));
      }
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return index;
}

class Engine {
 public:
  Engine(const TransferEndpoint& src, const TransferEndpoint& dst, const TransferOptions& options,
         TransferObserver* observer)
      : src_(src), dst_(dst), options_(options), observer_(observer), outcome_(observer) {
    if (!options_.runtime) options_.runtime = Runtime::Default();
    same_store_ = src_.store == dst_.store;
    // A server-side copy keeps the source's metadata and settings (ObjectStore::Copy takes no
    // options): with upload options, the bytes go through this machine so that none is
    // silently dropped. Another bucket of the same service, reached with the same
    // credentials, is copied server-side too (CopyFrom), as aws s3 cp copies between buckets.
    server_side_ =
        (same_store_ || dst_.store->CanCopyFrom(*src_.store)) && options_.put.is_default();
    src_local_ = IsLocal(*src_.store);
    dst_local_ = IsLocal(*dst_.store);
    guess_types_ = !dst_local_ && options_.put.content_type.empty() &&
                   options_.guess_content_type && dst_.store->capabilities().put_options;
    op_ = same_store_                 ? "copy"
          : src_local_ && !dst_local_ ? "upload"
          : !src_local_ && dst_local_ ? "download"
                                      : "copy";
    options_.part_size = PartBase(options_, *src_.store);
    inflight_ = options_.inflight > 0 ? options_.inflight : options_.runtime->inflight();
  }

  absl::Status Run(TransferSummary& summary) {
    const absl::Time start = absl::Now();
    summary = TransferSummary{};
    absl::Status status = options_.recursive ? RunPrefix(summary) : RunOne(summary);
    summary.objects = outcome_.objects();
    summary.bytes = outcome_.bytes();
    summary.failed = outcome_.failed();
    // One object: its failure is the status (not counted as it happened).
    if (!status.ok() && !options_.recursive && summary.listed == 1 && summary.objects == 0 &&
        summary.skipped == 0) {
      summary.failed = 1;
    }
    summary.elapsed = absl::Now() - start;
    return status;
  }

 private:
  // Whether the destination's entry (if any) already matches the source.
  bool UpToDate(const ObjectMeta& meta, const DstEntry* have) const {
    if (have == nullptr || have->size != meta.size) return false;
    if (options_.mode == TransferMode::kSync && (src_local_ || dst_local_) && !same_store_) {
      // The content decides where both sides know its MD5 (a local file's listing always
      // does; an object uploaded in one part, a GCS object): a same-size edit within the
      // second of the copy is found (times compare in whole seconds: S3 keeps no finer ones),
      // and a tree synced up and then down again is not downloaded again for its newer
      // object times. Else (an object uploaded in parts) the times decide: a destination at
      // least as new as its source is current (downloads get the object's time).
      const std::string md5 = ContentMd5(meta);
      if (have->md5_hash != 0 && !md5.empty()) return HashKey(md5) == have->md5_hash;
      return have->mtime_s >= SourceSeconds(meta.mtime);
    }
    if (have->etag_hash == HashKey(meta.etag)) return true;
    // ETags of two kinds (a file's MD5 and a GCS generation): the content's MD5 where both
    // sides know it.
    const std::string md5 = ContentMd5(meta);
    if (have->md5_hash != 0 && !md5.empty()) return HashKey(md5) == have->md5_hash;
    // sync between two remote stores where one side knows no MD5 (an object uploaded in
    // parts, a composite GCS object) and the other a tag of another kind (a GCS generation,
    // another part size): nothing compares the bytes without reading them, so a destination
    // at least as new as its source is current, as aws s3 sync decides (a copy is always
    // newer than its source, so a rerun copies nothing twice).
    if (options_.mode == TransferMode::kSync && !src_local_ && !dst_local_ && !same_store_ &&
        meta.mtime != absl::InfinitePast()) {
      return have->mtime_s >= Seconds(meta.mtime);
    }
    return false;
  }

  // Whether UpToDate's "no" may still be the same bytes: the ETags were compared (copy
  // mode, or sync between two remote stores), one side is a local file listed with its MD5
  // and the other an object of the same size uploaded in parts, whose ETag is no MD5.
  bool MaybeSameInParts(const ObjectMeta& meta, const DstEntry* have) const {
    if (have == nullptr || have->size != meta.size || meta.size == 0 || same_store_) return false;
    if (options_.mode == TransferMode::kSync) return false;  // local sides compare times
    if (src_local_ && !dst_local_) return have->parts > 0;
    if (dst_local_ && !src_local_) return MultipartEtagParts(meta.etag) > 0;
    return false;
  }

  // MaybeSameInParts, decided: hashes the local file under the part plans that fit the
  // multipart ETag (MultipartEtags). A file that cannot be read is not the same (it is
  // copied, and the copy reports the failure).
  bool SameInParts(const ObjectMeta& meta, const std::string& dst_key, uint32_t dst_parts,
                   uint64_t dst_etag_hash) {
    if (src_local_) {
      absl::StatusOr<std::vector<std::string>> etags =
          MultipartEtags(*src_.store, meta.key, meta.size, dst_parts, options_.part_size);
      if (!etags.ok()) return false;
      return std::any_of(etags->begin(), etags->end(),
                         [&](const std::string& e) { return HashKey(e) == dst_etag_hash; });
    }
    absl::StatusOr<bool> same =
        MultipartEtagMatches(*dst_.store, dst_key, meta.size, meta.etag, options_.part_size);
    return same.ok() && *same;
  }

  // An object found already at its destination: counted, and told to the observer. With
  // `ask`, the destination's ETag differs from the source's (the same bytes in other parts),
  // so a remote destination is asked for its own description: an observer that records what
  // is there (tier export's marks) must not take the source's ETag for it. Unconfirmed, it
  // is not reported.
  void Skipped(const ObjectMeta& meta, const std::string& dst_key, bool ask = false) {
    if (!observer_) return;
    ObjectMeta dst = meta;
    dst.key = dst_key;
    if (ask && !dst_local_) {
      absl::StatusOr<ObjectMeta> there = dst_.store->Head(dst_key);
      if (!there.ok() || there->size != meta.size) return;
      dst = *std::move(there);
      dst.key = dst_key;
    }
    observer_->OnObjectAt(meta, dst, /*copied=*/false);
  }

  PutOptions PutFor(const ObjectMeta& meta) const {
    PutOptions put = options_.put;
    if (dst_local_ && meta.mtime != absl::InfinitePast()) put.mtime = meta.mtime;
    if (guess_types_) put.content_type = ContentTypeOfKey(meta.key);
    put.source_uri = src_.store->Uri(meta.key);
    put.source_etag = meta.etag;
    put.source_etag_opaque = meta.etag_opaque;
    put.source_md5 = ContentMd5(meta);
    return put;
  }

  // Copies one object: server-side within one store, else as an ordered part stream from
  // `parts` into a writer of the destination.
  // Copies one object (CopyOne), fetching it again (twice at most) when the destination found its
  // bytes damaged on the way (IsSourceMismatch): that is the network's fault, as a reset is.
  // `last`: the damaged put that a first attempt (a small object's) already made.
  absl::Status CopyOneChecked(FetchScheduler& parts, const ObjectMeta& meta,
                              const std::string& dst_key, bool from_head,
                              absl::Status last = absl::OkStatus()) {
    const int tries = last.ok() ? 1 + kDamagedAttempts : kDamagedAttempts;
    for (int attempt = 0; attempt < tries; ++attempt) {
      if (!last.ok()) {
        LogLine(LogLevel::kWarning, absl::StrCat(last.message(), "; fetching it again"));
      }
      last = CopyOne(parts, meta, dst_key, from_head);
      if (!IsSourceMismatch(last)) return last;
    }
    return last;
  }
  static constexpr int kDamagedAttempts = 2;  // fetches after the damaged one

  // `from_head`: `meta` came from a HEAD, whose headers say whether the ETag is opaque (a
  // listing's cannot: an SSE-KMS object lists with an ETag shaped like an MD5 that is none).
  absl::Status CopyOne(FetchScheduler& parts, const ObjectMeta& meta, const std::string& dst_key,
                       bool from_head = false) {
    const std::string src_uri = src_.store->Uri(meta.key);
    const std::string dst_uri = dst_.store->Uri(dst_key);
    const uint64_t max_copy = src_.store->capabilities().max_copy_size;
    if (server_side_ && (max_copy == 0 || meta.size <= max_copy)) {
      // Server-side: no bytes pass through this machine. (Above the store's limit on one
      // copy, S3's 5 GiB, the object streams through a multipart writer below.)
      WHARF_ASSIGN_OR_RETURN(ObjectMeta copied,
                             same_store_ ? src_.store->Copy(meta.key, dst_key)
                                         : dst_.store->CopyFrom(*src_.store, meta.key, dst_key));
      outcome_.Bytes(copied.size);
      outcome_.Stored(meta, src_uri, copied, dst_uri);
      return absl::OkStatus();
    }
    PutOptions put = PutFor(meta);
    // The writer is made before the first GET tells whether the ETag is opaque: a listed
    // ETag is no MD5 to check a file against here (the tier still checks it: source_etag).
    if (!from_head && meta.md5.empty()) put.source_md5.clear();
    WHARF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer,
                           dst_.store->NewWriter(dst_key, std::move(put)));
    ObjectParts source(parts, meta, options_.part_size, kPartsAhead);
    WriterSink sink(std::move(writer));
    WHARF_ASSIGN_OR_RETURN(ObjectMeta stored,
                           Pump(source, sink, [this](uint64_t n) { outcome_.Bytes(n); }));
    if (stored.key.empty()) stored.key = dst_key;
    outcome_.Stored(meta, src_uri, stored, dst_uri);
    return absl::OkStatus();
  }

  absl::Status RunOne(TransferSummary& summary) {
    WHARF_ASSIGN_OR_RETURN(ObjectMeta meta, src_.store->Head(src_.key));
    summary.listed = 1;
    std::string dst_key = dst_.key;
    if (dst_key.empty() || dst_key.back() == '/') dst_key = JoinKey(dst_key, Basename(meta.key));
    if (same_store_ && dst_key == meta.key) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cp ", src_.store->Uri(meta.key), ": source and destination are the same object"));
    }
    if (options_.mode == TransferMode::kSync) {
      absl::StatusOr<ObjectMeta> have = dst_.store->Head(dst_key);
      if (have.ok()) {
        DstEntry entry = Entry(*have);
        entry.seen = true;
        if (UpToDate(meta, &entry)) {
          summary.skipped = 1;
          return absl::OkStatus();
        }
      }
    }
    if (observer_) {
      observer_->OnPlanned(1, meta.size);
      observer_->OnPlanFinal();
    }
    if (options_.dryrun) {
      if (observer_) observer_->OnDryrun(op_, src_.store->Uri(meta.key), dst_.store->Uri(dst_key));
      return absl::OkStatus();
    }
    FetchScheduler parts(src_.store, PartFetchOptions(options_));
    // A failure is the transfer's status, not OnError.
    return CopyOneChecked(parts, meta, dst_key, /*from_head=*/true);
  }

  // The destination key for a listed source key, or nullopt (with the failure reported)
  // for keys that must not be copied.
  std::optional<std::string> Destination(const ObjectMeta& meta, absl::string_view* rel_out) {
    const std::string& key = meta.key;
    absl::string_view rel = key;
    const bool inside = absl::ConsumePrefix(&rel, src_prefix_);
    // A directory marker ("dir/", an empty object some tools create for folders) carries
    // no data: copy it where the destination can hold such keys, skip it otherwise. The
    // source prefix's own marker (rel == "") has no place below the destination at all.
    // A key ending in '/' that holds data is not a marker: where it cannot be a file, it is
    // a failure naming it, never dropped silently.
    const bool marker = absl::EndsWith(rel, "/");
    if (inside && marker && !dst_keeps_markers_ && meta.size > 0) {
      outcome_.Fail(absl::FailedPreconditionError(
          absl::StrCat(op_, " ", src_.store->Uri(key), ": a key ending in '/' that holds ",
                       meta.size, " bytes cannot be a file under ", dst_.store->Uri(dst_prefix_),
                       " (copy it to an object store, or rename it)")));
      return std::nullopt;
    }
    if (inside && (rel.empty() || (marker && !dst_keeps_markers_))) return std::nullopt;
    absl::string_view checked = marker ? rel.substr(0, rel.size() - 1) : rel;
    // Only a file system tree reads a key as a path; an object store's keys are opaque, so
    // "a//b" or "a/../b" is copied there as it is (as aws s3 cp copies it). A NUL byte is
    // refused everywhere (no store's protocol carries it intact).
    const std::string unsafe = !inside          ? "it is not below the source prefix"
                               : dst_file_tree_ ? UnsafeKeyReason(checked)
                               : absl::StrContains(rel, absl::string_view("\0", 1))
                                   ? "a NUL byte cannot be in a key"
                                   : "";
    if (!unsafe.empty()) {
      outcome_.Fail(absl::InvalidArgumentError(
          absl::StrCat(op_, " ", src_.store->Uri(key), ": refusing the key: ", unsafe)));
      return std::nullopt;
    }
    *rel_out = rel;
    return DstKey(rel);
  }

  // The destination key of the source key `rel` (relative to the source prefix): below the
  // destination prefix as it is, or for a file tree as a path (JoinKey: no leading '/').
  std::string DstKey(absl::string_view rel) const {
    return dst_file_tree_ ? JoinKey(dst_prefix_, rel) : absl::StrCat(dst_prefix_, rel);
  }

  bool InShard(absl::string_view rel) const {
    return options_.shard_count <= 1 ||
           TransferShardOf(rel, options_.shard_count) == options_.shard_index;
  }

  // Decides for one listed source object, on the listing thread: refused, filtered out,
  // already present, planned (dry run), copied on a worker (big, or server-side), or
  // fetched whole by the small-object fetch (returns true). Handing an object to a worker
  // waits for room, which holds the listing back: it never runs more than the workers'
  // queue (and PrefixFetch's bound for small objects) ahead of the copies.
  bool Select(const ObjectMeta& meta, Workers& workers, FetchScheduler& parts) {
    std::optional<std::string> dst_key;
    bool skipped = false;
    std::optional<DstEntry> check_parts;  // the destination's entry, to hash against
    std::vector<std::string> conflicts;   // relative keys or folders of extras in the way
    {
      absl::MutexLock lock(&select_mu_);
      absl::string_view rel = meta.key;
      const bool inside = absl::ConsumePrefix(&rel, src_prefix_);
      if (inside && !InShard(rel)) return false;
      ++listed_;
      // Filtered out before anything else: a key the filters exclude is not refused either.
      if (inside && !rel.empty() && !PassesFilters(options_.filters, rel)) return false;
      if (inside) {
        // The source has this key: the destination's object of that name is no extra for
        // --delete, whether it is copied, skipped (a marker) or refused below.
        if (auto it = existing_.find(HashKey(rel)); it != existing_.end()) it->second.seen = true;
      }
      dst_key = Destination(meta, &rel);
      if (!dst_key) return false;
      DstEntry* have = nullptr;
      if (auto it = existing_.find(HashKey(rel)); it != existing_.end()) {
        have = &it->second;
        have->seen = true;
      }
      if (resolve_conflicts_ && !options_.dryrun) {
        // A file where the source has a folder, or a folder where it has a file: the copy
        // could not land until sync --delete removed them, so they go now (see below).
        conflicts = Conflicts(rel, have != nullptr);
      }
      if (UpToDate(meta, have)) {
        ++skipped_;
        skipped = true;
      } else if (MaybeSameInParts(meta, have)) {
        check_parts = *have;
      }
    }
    if (!conflicts.empty()) DeleteConflicts(conflicts);
    if (skipped) {
      Skipped(meta, *dst_key);
      return false;
    }
    if (check_parts) {
      // Hashing a local file takes a while: on a worker, which then copies it or not.
      workers.Run([this, &parts, meta, dst_key = *std::move(dst_key), have = *check_parts] {
        if (SameInParts(meta, dst_key, have.parts, have.etag_hash)) {
          {
            absl::MutexLock lock(&select_mu_);
            ++skipped_;
          }
          Skipped(meta, dst_key, /*ask=*/true);
          return;
        }
        if (observer_) observer_->OnPlanned(1, meta.size);
        if (options_.dryrun) {
          if (observer_)
            observer_->OnDryrun(op_, src_.store->Uri(meta.key), dst_.store->Uri(dst_key));
          return;
        }
        absl::Status s = CopyOne(parts, meta, dst_key);
        if (!s.ok()) outcome_.Fail(s);
      });
      return false;
    }
    if (observer_) observer_->OnPlanned(1, meta.size);
    if (options_.dryrun) {
      if (observer_) observer_->OnDryrun(op_, src_.store->Uri(meta.key), dst_.store->Uri(*dst_key));
      return false;
    }
    if (server_side_ || meta.size > options_.stream_threshold) {
      workers.Run([this, &parts, meta, dst_key = *std::move(dst_key)] {
        absl::Status s = CopyOne(parts, meta, dst_key);
        if (!s.ok()) outcome_.Fail(s);
      });
      return false;
    }
    return true;
  }

  absl::Status RunPrefix(TransferSummary& summary) {
    src_prefix_ = AsPrefix(src_.key);
    dst_prefix_ = AsPrefix(dst_.key);
    const std::string what =
        absl::StrCat(op_, " ", src_.store->Uri(src_prefix_), " to ", dst_.store->Uri(dst_prefix_));
    // Listing a prefix while writing into it could copy the copies, without end.
    if (same_store_ && absl::StartsWith(dst_prefix_, src_prefix_)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the destination is inside the source"));
    }
    // --delete removes what the source does not hold below the destination: the source
    // itself, when it lies there.
    if (same_store_ && options_.delete_extra && absl::StartsWith(src_prefix_, dst_prefix_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": the source is inside the destination, where --delete would remove it"));
    }
    dst_keeps_markers_ = dst_.store->capabilities().trailing_slash_keys;
    dst_file_tree_ = dst_local_ || dst_.store->capabilities().nested_keys_conflict;
    {
      // On a file system a key cannot be both a file and a folder: where sync --delete
      // would remove the one in the way, it is removed before the copy needs its place.
      resolve_conflicts_ = options_.delete_extra && dst_local_;
      absl::flat_hash_set<uint64_t> dirs;
      WHARF_ASSIGN_OR_RETURN(DstIndex index,
                             IndexDestination(*dst_.store, dst_prefix_, ListOptionsFor(*dst_.store),
                                              resolve_conflicts_ ? &dirs : nullptr));
      absl::MutexLock lock(&select_mu_);
      existing_ = std::move(index);
      dst_dirs_ = std::move(dirs);
    }

    ListOptions range;
    range.prefix = src_prefix_;
    absl::Status listing;
    {
      // The pump. One listing thread (PrefixFetch) selects objects; small ones are fetched
      // whole by `small` and put asynchronously by the consumer loop below (no thread per
      // object), big ones and server-side copies go to a few workers, each pumping one
      // object's ordered part stream (`parts`) into a writer. Every byte is charged to the
      // runtime's budget until its put or part upload completes, and the listing waits for
      // room at each stage, so memory is bounded by the budget plus a fixed number of
      // objects' metadata, whatever the count and the sizes.
      FetchScheduler parts(src_.store, PartFetchOptions(options_));
      FetchOptions fo;
      fo.runtime = options_.runtime;
      fo.max_in_flight = inflight_;
      fo.memory_budget = options_.memory_budget;
      // Small objects are at most stream_threshold bytes: each is one request, one buffer.
      fo.split_threshold = std::numeric_limits<uint64_t>::max();
      fo.wait_for_release = true;  // fetched objects are released as their puts complete
      FetchScheduler small(src_.store, fo);
      Workers workers(server_side_ ? std::clamp(inflight_ > 0 ? inflight_ : 32, 1, 32)
                                   : kStreamWorkers);
      // The listing runs this many selected small objects ahead of the puts: enough to keep
      // every request slot busy, few enough that their metadata stays small.
      const size_t ahead = std::max<size_t>(256, 2 * static_cast<size_t>(small.max_in_flight()));
      PrefixFetch fetch(
          src_.store, small, range, ListOptionsFor(*src_.store),
          [&](const ObjectMeta& meta) { return Select(meta, workers, parts); }, ahead);
      PutQueue puts(*dst_.store, std::max(16, small.max_in_flight()), outcome_);
      bool final_reported = false;
      uint64_t taken = 0;
      while (auto r = fetch.Next()) {
        if (++taken % kTrimEvery == 0) ReturnFreedMemory();
        if (!final_reported && fetch.listing_done() && observer_) {
          observer_->OnPlanFinal();  // from now on: a fraction and an ETA
          final_reported = true;
        }
        const ObjectMeta meta = fetch.meta(r->index);
        if (!r->data.ok()) {
          outcome_.Fail(r->data.status());
          continue;
        }
        absl::string_view rel = absl::string_view(meta.key).substr(src_prefix_.size());
        PutOptions put = PutFor(meta);
        if (r->etag_opaque) {  // the GET's headers tell it, not a listing
          put.source_etag_opaque = true;
          if (meta.md5.empty()) put.source_md5.clear();
        }
        puts.Put(DstKey(rel), *std::move(r->data), std::move(put), meta, src_.store->Uri(meta.key));
      }
      puts.Wait();
      workers.Wait();
      // Objects whose bytes arrived damaged: fetched again, one at a time (rare). Their GET
      // said the ETag is an MD5 (it was checked), so the stream checks it too.
      for (PutQueue::Damaged& d : puts.TakeDamaged()) {
        absl::Status s = CopyOneChecked(parts, d.src, d.dst_key, /*from_head=*/true, d.status);
        if (!s.ok()) outcome_.Fail(s);
      }
      listing = fetch.listing_status();
    }
    if (observer_) observer_->OnPlanFinal();
    {
      absl::MutexLock lock(&select_mu_);
      summary.listed = listed_;
      summary.skipped = skipped_;
    }
    // An existing empty local folder is an empty source (sync --delete from it empties the
    // destination, as rsync's would), not a missing one.
    if (summary.listed == 0 && listing.ok() && !IsLocalDirectory(src_.store->Uri(src_prefix_))) {
      return absl::NotFoundError(
          absl::StrCat(op_, " ", src_.store->Uri(src_.key), ": no such object or prefix"));
    }
    {
      absl::MutexLock lock(&select_mu_);
      summary.deleted += deleted_early_;
    }
    WHARF_RETURN_IF_ERROR(Annotate(listing, what));
    // As rsync does after I/O errors, a sync whose copies failed deletes nothing: a failure
    // may come with a source that was not what it seemed (a damaged listing), and a rerun
    // deletes the extras once the copies succeed.
    const bool deletes_held = options_.delete_extra && outcome_.failed() > 0;
    if (options_.delete_extra && !deletes_held) {
      WHARF_RETURN_IF_ERROR(DeleteExtra(summary));
    }
    if (const uint64_t failed = outcome_.failed(); failed > 0) {
      // Each failure went to the observer as it happened; the code is the first one's.
      // Without an observer nobody saw them: the first one's cause goes with the count.
      const absl::Status first = outcome_.first_error();
      return absl::Status(
          first.code(),
          absl::StrCat(what, ": ", failed, " of ", summary.listed, " objects failed",
                       observer_ && observer_->ShowsErrors()
                           ? ""
                           : absl::StrCat(" (the first: ", first.message(), ")"),
                       deletes_held ? "; nothing was deleted for --delete (rerun once the "
                                      "copies succeed)"
                                    : ""));
    }
    return absl::OkStatus();
  }

  // How a transfer lists `store`: a bounded number of pages waiting (the listing never runs
  // far ahead of the copies), and for the local store, whose listing walks directories on
  // the blocking pool, few workers with large pages (each call re-reads the directories it
  // passes through, so many small calls over a big directory cost time and memory).
  ParallelListOptions ListOptionsFor(ObjectStore& store) const {
    ParallelListOptions o;
    o.max_pending_pages = 2;
    if (IsLocal(store)) {
      o.workers = 1;
      o.page_size = 1000;
    } else {
      o.workers = options_.list_workers;
    }
    return o;
  }

  // For a listed source key `rel` (with or without a destination file of its own): the
  // destination's extras in its way, as relative keys: files at its folders ("a" for "a/x"),
  // and, when the destination has a folder at `rel` ("a/..." for "a"), that folder as "a/".
  // Each is one DeleteExtra would remove (not listed by the source so far, selected by the
  // filters and the shard); the files are marked seen, as the source cannot want them.
  std::vector<std::string> Conflicts(absl::string_view rel, bool have_file)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(select_mu_) {
    std::vector<std::string> out;
    for (size_t p = rel.find('/'); p != absl::string_view::npos; p = rel.find('/', p + 1)) {
      const absl::string_view folder = rel.substr(0, p);
      auto it = existing_.find(HashKey(folder));
      if (it == existing_.end() || it->second.seen) continue;
      if (!PassesFilters(options_.filters, folder) || !InShard(folder)) continue;
      it->second.seen = true;
      it->second.size = kGone;  // deleted: never up to date for a source object of this name
      out.emplace_back(folder);
    }
    if (!have_file && dst_dirs_.erase(HashKey(rel)) > 0) out.push_back(absl::StrCat(rel, "/"));
    return out;
  }

  // Deletes Conflicts' extras (a folder: each extra below it), as DeleteExtra would have
  // after the listing. A failure is reported; the copy then reports its own.
  void DeleteConflicts(const std::vector<std::string>& conflicts) {
    std::vector<std::string> doomed;
    for (const std::string& rel : conflicts) {
      const std::string key = JoinKey(dst_prefix_, rel);
      if (!absl::EndsWith(rel, "/")) {
        if (options_.deletable) {
          absl::StatusOr<ObjectMeta> m = dst_.store->Head(key);
          if (!m.ok() || !options_.deletable(*m)) continue;
        }
        doomed.push_back(key);
        continue;
      }
      ListOptions below;
      below.prefix = key;
      absl::StatusOr<ListPage> all = dst_.store->ListAll(below);
      if (!all.ok()) {
        outcome_.Fail(all.status());
        continue;
      }
      absl::MutexLock lock(&select_mu_);
      for (const ObjectMeta& m : all->objects) {
        const absl::string_view sub = absl::string_view(m.key).substr(dst_prefix_.size());
        auto it = existing_.find(HashKey(sub));
        if (it == existing_.end() || it->second.seen) continue;
        if (!PassesFilters(options_.filters, sub) || !InShard(sub)) continue;
        if (options_.deletable && !options_.deletable(m)) continue;
        it->second.seen = true;  // deleted here, not again by DeleteExtra
        it->second.size = kGone;
        doomed.push_back(m.key);
      }
    }
    if (doomed.empty()) return;
    const size_t n = doomed.size();
    if (absl::Status s = dst_.store->DeleteMany(std::move(doomed)); !s.ok()) {
      outcome_.Fail(s);
      return;
    }
    absl::MutexLock lock(&select_mu_);
    deleted_early_ += n;
  }

  // sync --delete: objects below the destination prefix that the source did not list (and
  // that the filters select) are deleted. Runs only after a complete, successful listing.
  // Deleted page by page as the listing goes, so nothing grows with the number of extras.
  absl::Status DeleteExtra(TransferSummary& summary) {
    {
      // Only what the first listing found and the source did not list is deleted: when the
      // source listed all of it (a fresh import, a rerun with nothing gone), a second
      // listing of the destination would find nothing to do.
      absl::MutexLock lock(&select_mu_);
      if (std::none_of(existing_.begin(), existing_.end(),
                       [](const auto& e) { return !e.second.seen; })) {
        return absl::OkStatus();
      }
    }
    ListOptions range;
    range.prefix = dst_prefix_;
    return ParallelList(
        *dst_.store, range, ListOptionsFor(*dst_.store), [&](std::vector<ObjectMeta> page) {
          std::vector<std::string> doomed;
          {
            absl::MutexLock lock(&select_mu_);
            for (const ObjectMeta& m : page) {
              absl::string_view rel = absl::string_view(m.key).substr(dst_prefix_.size());
              if (rel.empty() || !PassesFilters(options_.filters, rel) || !InShard(rel)) {
                continue;
              }
              auto it = existing_.find(HashKey(rel));
              if (it != existing_.end() && !it->second.seen &&
                  (!options_.deletable || options_.deletable(m))) {
                doomed.push_back(m.key);
              }
            }
          }
          if (doomed.empty()) return absl::OkStatus();
          if (options_.dryrun) {
            for (const std::string& key : doomed) {
              if (observer_) observer_->OnDryrun("delete", dst_.store->Uri(key), "");
            }
            return absl::OkStatus();
          }
          const size_t n = doomed.size();
          // A failure is counted (and shown) once, and the other pages are still deleted.
          absl::Status s = dst_.store->DeleteMany(std::move(doomed));
          if (!s.ok()) {
            outcome_.Fail(s);
            return absl::OkStatus();
          }
          summary.deleted += n;
          return absl::OkStatus();
        });
  }

  TransferEndpoint src_, dst_;
  TransferOptions options_;
  TransferObserver* const observer_;
  Outcome outcome_;
  bool same_store_ = false, server_side_ = false, src_local_ = false, dst_local_ = false;
  bool guess_types_ = false;  // uploads get their key's extension's Content-Type
  bool dst_keeps_markers_ = true;
  bool dst_file_tree_ = true;  // keys become paths at the destination (checked: Destination)
  std::string op_;
  int inflight_ = 0;
  std::string src_prefix_, dst_prefix_;

  absl::Mutex select_mu_;
  DstIndex existing_ ABSL_GUARDED_BY(select_mu_);
  // With resolve_conflicts_: the destination's folders (hashes of relative keys) not yet
  // cleared for a source file of the same name.
  bool resolve_conflicts_ = false;
  absl::flat_hash_set<uint64_t> dst_dirs_ ABSL_GUARDED_BY(select_mu_);
  uint64_t deleted_early_ ABSL_GUARDED_BY(select_mu_) = 0;
  uint64_t listed_ ABSL_GUARDED_BY(select_mu_) = 0;
  uint64_t skipped_ ABSL_GUARDED_BY(select_mu_) = 0;
};

}  // namespace

absl::Status TransferWithSummary(const TransferEndpoint& src, const TransferEndpoint& dst,
                                 const TransferOptions& options, TransferSummary* summary,
                                 TransferObserver* observer) {
  *summary = TransferSummary{};
  if (options.shard_count < 1 || options.shard_index < 0 ||
      options.shard_index >= options.shard_count) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", options.shard_index, " of ",
                                                   options.shard_count,
                                                   ": the index must be in [0, count)"));
  }
  Engine engine(src, dst, options, observer);
  return engine.Run(*summary);
}

absl::StatusOr<TransferSummary> Transfer(const TransferEndpoint& src, const TransferEndpoint& dst,
                                         const TransferOptions& options,
                                         TransferObserver* observer) {
  TransferSummary summary;
  WHARF_RETURN_IF_ERROR(TransferWithSummary(src, dst, options, &summary, observer));
  return summary;
}

absl::Status TransferToFd(const TransferEndpoint& src, int fd, const TransferOptions& options,
                          TransferObserver* observer) {
  WHARF_ASSIGN_OR_RETURN(ObjectMeta meta, src.store->Head(src.key));
  if (observer) {
    observer->OnPlanned(1, meta.size);
    observer->OnPlanFinal();
  }
  TransferOptions o = options;
  if (!o.runtime) o.runtime = Runtime::Default();
  FetchScheduler scheduler(src.store, PartFetchOptions(o));
  const std::string uri = src.store->Uri(meta.key);
  ObjectParts source(scheduler, meta, PartBase(o, *src.store), kPartsAhead);
  FdSink sink(fd, absl::StrCat("cp ", uri, " to standard output"));
  WHARF_RETURN_IF_ERROR(Pump(source, sink, [observer](uint64_t n) {
                          if (observer) observer->OnBytes(n);
                        }).status());
  if (observer) observer->OnObjectDone(uri, "-");
  return absl::OkStatus();
}

absl::StatusOr<ObjectMeta> TransferFromFd(int fd, const TransferEndpoint& dst,
                                          const TransferOptions& options,
                                          TransferObserver* observer) {
  std::shared_ptr<Runtime> runtime = options.runtime ? options.runtime : Runtime::Default();
  const std::string uri = dst.store->Uri(dst.key);
  WHARF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer,
                         dst.store->NewWriter(dst.key, options.put));
  FdParts source(fd, runtime, options.memory_budget,
                 options.part_size > 0 ? options.part_size : kDefaultPartSize,
                 absl::StrCat("cp standard input to ", uri));
  WriterSink sink(std::move(writer));
  absl::StatusOr<ObjectMeta> meta = Pump(source, sink, [observer](uint64_t n) {
    if (observer) observer->OnBytes(n);
  });
  if (meta.ok() && observer) observer->OnObjectDone("-", uri);
  return meta;
}

}  // namespace wharf
