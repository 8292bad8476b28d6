#include "io/transfer.h"

#include <errno.h>
#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "io/fetch_scheduler.h"
#include "io/parallel_list.h"
#include "io/prefix_fetch.h"
#include "store/keys.h"

namespace wharf {

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

// What the destination holds below its prefix, 32 bytes per object: the relative key's
// hash -> size, ETag hash, modification time, and whether the source listed it (sync
// --delete removes the others). A 64-bit hash collision could only make an object look
// present when size, ETag (or time) also agree.
struct DstEntry {
  uint64_t size = 0;
  uint64_t etag_hash = 0;
  int64_t mtime_s = 0;
  bool seen = false;
};
using DstIndex = absl::flat_hash_map<uint64_t, DstEntry>;

uint64_t HashKey(absl::string_view s) {
  return std::hash<std::string_view>()(std::string_view(s.data(), s.size()));
}

int64_t Seconds(absl::Time t) {
  return t == absl::InfinitePast() ? 0 : absl::ToUnixSeconds(t);
}

bool IsLocal(const ObjectStore& store) { return absl::StartsWith(store.Uri(""), "file://"); }

// Failures and counts, updated from many threads.
class Outcome {
 public:
  explicit Outcome(TransferObserver* observer) : observer_(observer) {}
  void Fail(const absl::Status& status) {
    if (observer_) observer_->OnError(status);
    absl::MutexLock lock(&mu_);
    if (failed_++ == 0) first_error_ = status.code();
  }
  void Done(uint64_t bytes, const std::string& src, const std::string& dst) {
    objects_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
    if (observer_) observer_->OnObjectDone(src, dst);
  }
  void Bytes(uint64_t n) {
    if (observer_) observer_->OnBytes(n);
  }
  uint64_t failed() const {
    absl::MutexLock lock(&mu_);
    return failed_;
  }
  absl::StatusCode first_error() const {
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
  absl::StatusCode first_error_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kOk;
};

// A fixed set of threads for work that blocks (server-side copies, streamed objects).
// Run() blocks while 2 x threads tasks are queued or running, which keeps a listing only a
// little ahead of the work; Run(fn, false) queues without waiting (for callers that must
// not block, e.g. under the lock of a fetch whose consumer must go on).
class Workers {
 public:
  explicit Workers(int threads) : limit_(2 * threads), pool_(threads) {}
  ~Workers() { Wait(); }
  void Run(absl::AnyInvocable<void() &&> fn, bool wait_for_room = true) {
    {
      absl::MutexLock lock(&mu_);
      auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ < limit_; };
      if (wait_for_room) mu_.Await(absl::Condition(&room));
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
    mu_.Await(absl::Condition(&idle));
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

  void Put(std::string dst_key, FetchBuffer data, PutOptions options, std::string src_uri) {
    {
      absl::MutexLock lock(&mu_);
      auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ < max_pending_; };
      mu_.Await(absl::Condition(&room));
      ++pending_;
    }
    const uint64_t size = data.size();
    // Zero-copy: the Cord keeps the fetched block (and its budget charge) until written.
    absl::Cord cord = absl::MakeCordFromExternal(data.view(), [data] {});
    std::string dst_uri = dst_.Uri(dst_key);
    dst_.PutAsync(std::move(dst_key), std::move(cord), options,
                  [this, size, src_uri = std::move(src_uri),
                   dst_uri = std::move(dst_uri)](absl::StatusOr<ObjectMeta> meta) {
                    if (meta.ok()) {
                      outcome_.Bytes(size);
                      outcome_.Done(size, src_uri, dst_uri);
                    } else {
                      outcome_.Fail(meta.status());
                    }
                    absl::MutexLock lock(&mu_);
                    --pending_;
                  });
  }

  void Wait() {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
    mu_.Await(absl::Condition(&idle));
  }

 private:
  ObjectStore& dst_;
  const int max_pending_;
  Outcome& outcome_;
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
};

FetchOptions StreamFetchOptions(const TransferOptions& options, uint64_t part_size) {
  FetchOptions f;
  f.runtime = options.runtime;
  // Parts of one object in flight: 8 x 8 MiB is ~1.3 GB/s per object at 50 ms.
  f.max_in_flight = 8;
  f.memory_budget = options.memory_budget;
  f.part_size = part_size;
  f.split_threshold = part_size;
  f.coalesce_gap = 0;
  f.ordered = true;
  // Written parts are held by the writer (multipart uploads in flight) and released as they
  // complete: wait for them instead of failing.
  f.wait_for_release = true;
  return f;
}

// Copies one object as ordered parts from `scheduler` into a writer. The writer publishes
// the object only at Close(); any failure aborts it, so nothing partial is ever visible.
absl::Status StreamObject(FetchScheduler& scheduler, ObjectStore& dst, const ObjectMeta& meta,
                          const std::string& dst_key, const PutOptions& put, uint64_t part_size,
                          Outcome& outcome) {
  WHARF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer, dst.NewWriter(dst_key, put));
  std::vector<FetchItem> parts;
  for (uint64_t off = 0; off < meta.size; off += part_size) {
    parts.push_back({.key = meta.key,
                     .range = ByteRange::Of(off, std::min(part_size, meta.size - off)),
                     .size = meta.size,
                     .etag = meta.etag});
  }
  auto batch = scheduler.Fetch(std::move(parts));
  while (auto r = batch->Next()) {
    if (!r->data.ok()) {
      writer->Abort();
      return r->data.status();
    }
    const uint64_t n = r->data->size();
    FetchBuffer data = *std::move(r->data);
    absl::Status s = writer->Write(absl::MakeCordFromExternal(data.view(), [data] {}));
    if (!s.ok()) {
      writer->Abort();
      return s;
    }
    outcome.Bytes(n);
  }
  WHARF_RETURN_IF_ERROR(writer->Close().status());
  return absl::OkStatus();
}

// Lists the destination prefix into a DstIndex.
absl::StatusOr<DstIndex> IndexDestination(ObjectStore& dst, const std::string& prefix,
                                          int workers) {
  DstIndex index;
  absl::Mutex mu;
  ListOptions range;
  range.prefix = prefix;
  absl::Status s = ParallelList(dst, range, {.workers = workers}, [&](std::vector<ObjectMeta> page) {
    absl::MutexLock lock(&mu);
    for (const ObjectMeta& m : page) {
      index[HashKey(absl::string_view(m.key).substr(prefix.size()))] = {
          m.size, HashKey(m.etag), Seconds(m.mtime), false};
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
    src_local_ = IsLocal(*src_.store);
    dst_local_ = IsLocal(*dst_.store);
    op_ = same_store_ ? "copy" : src_local_ && !dst_local_ ? "upload"
                                : !src_local_ && dst_local_ ? "download"
                                                            : "copy";
    if (options_.part_size == 0) {
      options_.part_size = options_.runtime->link(src_.store->Uri("")).PartSize();
    }
    inflight_ = options_.inflight > 0 ? options_.inflight : options_.runtime->inflight();
  }

  absl::StatusOr<TransferSummary> Run() {
    const absl::Time start = absl::Now();
    TransferSummary summary;
    absl::Status status = options_.recursive ? RunPrefix(summary) : RunOne(summary);
    summary.objects = outcome_.objects();
    summary.bytes = outcome_.bytes();
    summary.failed = outcome_.failed();
    summary.elapsed = absl::Now() - start;
    if (!status.ok()) return status;
    return summary;
  }

 private:
  // Whether the destination's entry (if any) already matches the source.
  bool UpToDate(const ObjectMeta& meta, const DstEntry* have) const {
    if (have == nullptr || have->size != meta.size) return false;
    if (options_.mode == TransferMode::kSync && (src_local_ || dst_local_) && !same_store_) {
      // Local files carry times, not comparable ETags for multipart objects: a destination
      // at least as new as its source is current (downloads get the object's time).
      return have->mtime_s >= Seconds(meta.mtime);
    }
    return have->etag_hash == HashKey(meta.etag);
  }

  PutOptions PutFor(const ObjectMeta& meta) const {
    PutOptions put = options_.put;
    if (dst_local_ && meta.mtime != absl::InfinitePast()) put.mtime = meta.mtime;
    return put;
  }

  absl::Status CopyOne(FetchScheduler* stream, const ObjectMeta& meta, const std::string& dst_key) {
    const std::string src_uri = src_.store->Uri(meta.key);
    const std::string dst_uri = dst_.store->Uri(dst_key);
    if (same_store_) {
      // Server-side: no bytes pass through this machine.
      WHARF_ASSIGN_OR_RETURN(ObjectMeta copied, src_.store->Copy(meta.key, dst_key));
      outcome_.Bytes(copied.size);
      outcome_.Done(copied.size, src_uri, dst_uri);
      return absl::OkStatus();
    }
    WHARF_RETURN_IF_ERROR(StreamObject(*stream, *dst_.store, meta, dst_key, PutFor(meta),
                                       options_.part_size, outcome_));
    outcome_.Done(meta.size, src_uri, dst_uri);
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
        DstEntry entry{have->size, HashKey(have->etag), Seconds(have->mtime), true};
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
    FetchScheduler stream(src_.store, StreamFetchOptions(options_, options_.part_size));
    absl::Status s = CopyOne(&stream, meta, dst_key);
    if (!s.ok()) outcome_.Fail(s);
    return s;
  }

  // The destination key for a listed source key, or nullopt (with the failure reported)
  // for keys that must not be copied.
  std::optional<std::string> Destination(const std::string& key, absl::string_view* rel_out) {
    absl::string_view rel = key;
    const bool inside = absl::ConsumePrefix(&rel, src_prefix_);
    // A directory marker ("dir/", an empty object some tools create for folders) carries
    // no data: copy it where the destination can hold such keys, skip it otherwise. The
    // source prefix's own marker (rel == "") has no place below the destination at all.
    const bool marker = absl::EndsWith(rel, "/");
    if (inside && (rel.empty() || (marker && !dst_keeps_markers_))) return std::nullopt;
    absl::string_view checked = marker ? rel.substr(0, rel.size() - 1) : rel;
    if (!inside || !IsSafeRelativeKey(checked)) {
      outcome_.Fail(absl::InvalidArgumentError(absl::StrCat(
          op_, " ", src_.store->Uri(key), ": refusing key that would escape the destination")));
      return std::nullopt;
    }
    *rel_out = rel;
    return JoinKey(dst_prefix_, rel);
  }

  // Decides for one listed source object: refused, filtered out, already present, planned
  // (dry run), streamed (big or server-side), or fetched by the engine (returns true).
  bool Select(const ObjectMeta& meta, Workers& workers, FetchScheduler& stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(select_mu_) {
    ++listed_;
    absl::string_view rel;
    std::optional<std::string> dst_key = Destination(meta.key, &rel);
    if (!dst_key) return false;
    DstEntry* have = nullptr;
    if (auto it = existing_.find(HashKey(rel)); it != existing_.end()) {
      have = &it->second;
      have->seen = true;
    }
    if (!PassesFilters(options_.filters, rel)) return false;
    if (UpToDate(meta, have)) {
      ++skipped_;
      return false;
    }
    if (observer_) observer_->OnPlanned(1, meta.size);
    if (options_.dryrun) {
      if (observer_) observer_->OnDryrun(op_, src_.store->Uri(meta.key), dst_.store->Uri(*dst_key));
      return false;
    }
    if (same_store_ || meta.size > options_.stream_threshold) {
      // Server-side copies are listed on a thread of their own, which may wait for room;
      // big objects are selected under the fetch's lock and must not (the consumer of the
      // small objects, whose releases the streams may wait for, needs that lock).
      workers.Run(
          [this, &stream, meta, dst_key = *std::move(dst_key)] {
            absl::Status s = CopyOne(&stream, meta, dst_key);
            if (!s.ok()) outcome_.Fail(s);
          },
          /*wait_for_room=*/same_store_);
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
      return absl::InvalidArgumentError(absl::StrCat(what, ": the destination is inside the source"));
    }
    dst_keeps_markers_ = dst_.store->capabilities().trailing_slash_keys;
    {
      WHARF_ASSIGN_OR_RETURN(DstIndex index,
                             IndexDestination(*dst_.store, dst_prefix_, options_.list_workers));
      absl::MutexLock lock(&select_mu_);
      existing_ = std::move(index);
    }

    ListOptions range;
    range.prefix = src_prefix_;
    absl::Status listing;
    {
      // Server-side copies and streamed big objects block a thread each; the engine needs
      // none for the rest.
      FetchScheduler stream(src_.store, StreamFetchOptions(options_, options_.part_size));
      Workers workers(same_store_ ? std::clamp(inflight_ > 0 ? inflight_ : 32, 1, 32) : 4);
      if (same_store_) {
        listing = ParallelList(*src_.store, range, {.workers = options_.list_workers},
                               [&](std::vector<ObjectMeta> page) {
                                 for (const ObjectMeta& meta : page) {
                                   absl::MutexLock lock(&select_mu_);
                                   Select(meta, workers, stream);
                                 }
                                 return absl::OkStatus();
                               });
      } else {
        FetchOptions fo;
        fo.runtime = options_.runtime;
        fo.max_in_flight = inflight_;
        fo.memory_budget = options_.memory_budget;
        fo.wait_for_release = true;  // fetched objects are released as their puts complete
        FetchScheduler scheduler(src_.store, fo);
        PrefixFetch fetch(src_.store, scheduler, range, {.workers = options_.list_workers},
                          [&](const ObjectMeta& meta) {
                            absl::MutexLock lock(&select_mu_);
                            return Select(meta, workers, stream);
                          });
        PutQueue puts(*dst_.store, std::max(16, scheduler.max_in_flight()), outcome_);
        bool final_reported = false;
        while (auto r = fetch.Next()) {
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
          puts.Put(JoinKey(dst_prefix_, rel), *std::move(r->data), PutFor(meta),
                   src_.store->Uri(meta.key));
        }
        puts.Wait();
        listing = fetch.listing_status();
      }
      workers.Wait();
    }
    if (observer_) observer_->OnPlanFinal();
    {
      absl::MutexLock lock(&select_mu_);
      summary.listed = listed_;
      summary.skipped = skipped_;
    }
    if (summary.listed == 0 && listing.ok()) {
      return absl::NotFoundError(
          absl::StrCat(op_, " ", src_.store->Uri(src_.key), ": no such object or prefix"));
    }
    WHARF_RETURN_IF_ERROR(Annotate(listing, what));
    if (options_.mode == TransferMode::kSync && options_.delete_extra) {
      WHARF_RETURN_IF_ERROR(DeleteExtra(summary));
    }
    if (const uint64_t failed = outcome_.failed(); failed > 0) {
      return absl::Status(outcome_.first_error(),
                          absl::StrCat(what, ": ", failed, " of ", summary.listed,
                                       " objects failed"));
    }
    return absl::OkStatus();
  }

  // sync --delete: objects below the destination prefix that the source did not list (and
  // that the filters select) are deleted. Runs only after a complete, successful listing.
  absl::Status DeleteExtra(TransferSummary& summary) {
    std::vector<std::string> doomed;
    ListOptions range;
    range.prefix = dst_prefix_;
    absl::Mutex mu;
    WHARF_RETURN_IF_ERROR(ParallelList(
        *dst_.store, range, {.workers = options_.list_workers}, [&](std::vector<ObjectMeta> page) {
          absl::MutexLock lock(&mu);
          for (const ObjectMeta& m : page) {
            absl::string_view rel = absl::string_view(m.key).substr(dst_prefix_.size());
            if (rel.empty() || !PassesFilters(options_.filters, rel)) continue;
            absl::MutexLock select_lock(&select_mu_);
            auto it = existing_.find(HashKey(rel));
            if (it != existing_.end() && !it->second.seen) doomed.push_back(m.key);
          }
          return absl::OkStatus();
        }));
    std::sort(doomed.begin(), doomed.end());
    for (const std::string& key : doomed) {
      if (options_.dryrun) {
        if (observer_) observer_->OnDryrun("delete", dst_.store->Uri(key), "");
        continue;
      }
    }
    if (!options_.dryrun && !doomed.empty()) {
      absl::Status s = dst_.store->DeleteMany(doomed);
      if (!s.ok()) {
        outcome_.Fail(s);
        return s;
      }
      summary.deleted = doomed.size();
    }
    return absl::OkStatus();
  }

  TransferEndpoint src_, dst_;
  TransferOptions options_;
  TransferObserver* const observer_;
  Outcome outcome_;
  bool same_store_ = false, src_local_ = false, dst_local_ = false;
  bool dst_keeps_markers_ = true;
  std::string op_;
  int inflight_ = 0;
  std::string src_prefix_, dst_prefix_;

  absl::Mutex select_mu_;
  DstIndex existing_ ABSL_GUARDED_BY(select_mu_);
  uint64_t listed_ ABSL_GUARDED_BY(select_mu_) = 0;
  uint64_t skipped_ ABSL_GUARDED_BY(select_mu_) = 0;
};

// Waits for a block of `bytes` from the budget (releases anywhere wake the wait).
Block AllocateWaiting(MemoryBudget& budget, const std::shared_ptr<MemoryBudget::Account>& account,
                      uint64_t bytes) {
  Block block = budget.TryAllocate(account, bytes);
  if (block) return block;
  struct Wake {
    absl::Mutex mu;
    bool released = false;
  };
  auto wake = std::make_shared<Wake>();
  const uint64_t id = budget.AddListener([wake] {
    absl::MutexLock lock(&wake->mu);
    wake->released = true;
  });
  while (!(block = budget.TryAllocate(account, bytes))) {
    absl::MutexLock lock(&wake->mu);
    wake->mu.AwaitWithTimeout(absl::Condition(&wake->released), absl::Seconds(1));
    wake->released = false;
  }
  budget.RemoveListener(id);
  return block;
}

}  // namespace

absl::StatusOr<TransferSummary> Transfer(const TransferEndpoint& src, const TransferEndpoint& dst,
                                         const TransferOptions& options,
                                         TransferObserver* observer) {
  Engine engine(src, dst, options, observer);
  return engine.Run();
}

absl::Status TransferToFd(const TransferEndpoint& src, int fd, const TransferOptions& options,
                          TransferObserver* observer) {
  WHARF_ASSIGN_OR_RETURN(ObjectMeta meta, src.store->Head(src.key));
  if (observer) {
    observer->OnPlanned(1, meta.size);
    observer->OnPlanFinal();
  }
  FetchScheduler scheduler(src.store, StreamFetchOptions(options, options.part_size));
  std::vector<FetchItem> parts;
  for (uint64_t off = 0; off < meta.size; off += options.part_size) {
    parts.push_back({.key = meta.key,
                     .range = ByteRange::Of(off, std::min(options.part_size, meta.size - off)),
                     .size = meta.size,
                     .etag = meta.etag});
  }
  auto batch = scheduler.Fetch(std::move(parts));
  while (auto r = batch->Next()) {
    if (!r->data.ok()) return r->data.status();
    absl::string_view rest = r->data->view();
    while (!rest.empty()) {
      const ssize_t n = write(fd, rest.data(), rest.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::ErrnoToStatus(errno, absl::StrCat("cp ", src.store->Uri(meta.key),
                                                       " to standard output"));
      }
      rest.remove_prefix(n);
    }
    if (observer) observer->OnBytes(r->data->size());
  }
  if (observer) observer->OnObjectDone(src.store->Uri(meta.key), "-");
  return absl::OkStatus();
}

absl::StatusOr<ObjectMeta> TransferFromFd(int fd, const TransferEndpoint& dst,
                                          const TransferOptions& options,
                                          TransferObserver* observer) {
  std::shared_ptr<Runtime> runtime = options.runtime ? options.runtime : Runtime::Default();
  MemoryBudget& budget = runtime->budget();
  auto account = budget.NewAccount(options.memory_budget, "upload from standard input");
  const std::string uri = dst.store->Uri(dst.key);
  WHARF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer,
                         dst.store->NewWriter(dst.key, options.put));
  uint64_t total = 0;
  bool eof = false;
  while (!eof) {
    // One part at a time from the budget; the writer holds it until its upload completes.
    Block block = AllocateWaiting(budget, account, options.part_size);
    uint64_t filled = 0;
    while (filled < block.size()) {
      const ssize_t n = read(fd, block.data() + filled, block.size() - filled);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        writer->Abort();
        return absl::ErrnoToStatus(errno, absl::StrCat("cp standard input to ", uri));
      }
      if (n == 0) {
        eof = true;
        break;
      }
      filled += n;
    }
    if (filled == 0) break;
    absl::Status s = writer->Write(
        absl::MakeCordFromExternal(absl::string_view(block.data(), filled), [block] {}));
    if (!s.ok()) {
      writer->Abort();
      return s;
    }
    total += filled;
    if (observer) observer->OnBytes(filled);
  }
  absl::StatusOr<ObjectMeta> meta = writer->Close();
  if (meta.ok() && observer) observer->OnObjectDone("-", uri);
  return meta;
}

}  // namespace wharf
