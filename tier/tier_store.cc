#include "tier/tier_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/file_io.h"
#include "base/fork.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/status.h"
#include "base/timer.h"
#include "nlohmann/json.hpp"
#include "store/local/temp_object.h"
#include "tier/evict.h"
#include "tier/tree_store.h"

namespace wharf {
using json = nlohmann::json;
namespace {

constexpr int kLockStripes = 1024;
constexpr size_t kSinkChunk = 1 << 20;
constexpr absl::Duration kMaxBackoff = absl::Milliseconds(50);

// True when `rel` can name a file below a directory: no empty, "." or ".." segments, no
// leading or trailing '/'.
bool IsSafeRelativePath(absl::string_view rel) {
  if (rel.empty()) return false;
  for (absl::string_view part : absl::StrSplit(rel, '/')) {
    if (part.empty() || part == "." || part == ".." || part.find('\0') != part.npos) {
      return false;
    }
  }
  return true;
}

// Writes a streamed read into a temporary file.
class FileSink : public ReadSink {
 public:
  explicit FileSink(TempObject* temp) : temp_(temp) {}
  absl::Status Append(absl::string_view chunk) override {
    bytes_ += chunk.size();
    absl::Status s = temp_->Append(chunk);
    if (!s.ok()) failed_ = true;  // the tier's file system, not the fetch
    return s;
  }
  uint64_t bytes() const { return bytes_; }
  // Whether an Append failed writing the tier's file (the GET then fails with its error).
  bool failed() const { return failed_; }

 private:
  TempObject* const temp_;
  uint64_t bytes_ = 0;
  bool failed_ = false;
};

// Streams a whole object of unknown size into the tier. Up to `keep` bytes (or up to the size
// of the reader's own buffer, when it asked for the whole object into one) are only held in
// memory: an object that ends there is written to its file in one write (Finish) and the
// read that filled it is answered from memory, not by reading the new file back. (Writing
// each network chunk as it came cost a write per ~15 KiB, and ext4 zeroed the rest of every
// new page-cache folio a chunk began.) Past `keep`, the bytes go to the whole object's
// temporary file up to `spill_at` (the first block boundary above the block threshold: an
// object that ends before is one entry, or at most that many bytes to cut into blocks), then
// block by block into temporary files of their own, so the bytes of a big object past that
// point are written once, as the blocks they become (their names wait for the object's ETag).
class SpillSink : public ReadSink {
 public:
  // `direct`: the reader's own buffer, when it asked for the whole object: the bytes are
  // held there (no copy of ours, and the reader's answer needs none) as long as they fit.
  SpillSink(TempObject* whole, std::string temp_dir, std::string placeholder, uint64_t block,
            uint64_t threshold, uint64_t keep, absl::Span<char> direct)
      : whole_(whole),
        temp_dir_(std::move(temp_dir)),
        placeholder_(std::move(placeholder)),
        block_(block),
        spill_at_((threshold / block + 1) * block),
        keep_(std::min(keep, spill_at_)),
        direct_(
            direct.subspan(0, static_cast<size_t>(std::min<uint64_t>(direct.size(), spill_at_)))) {}
  absl::Status Append(absl::string_view chunk) override {
    absl::Status s = Write(chunk);
    if (!s.ok()) failed_ = true;  // the tier's file system, not the fetch
    return s;
  }
  // Whether an Append failed writing the tier's files (the GET then fails with its error).
  bool failed() const { return failed_; }

 private:
  absl::Status Write(absl::string_view chunk) {
    if (holding_) {
      if (bytes_ + chunk.size() <= direct_.size()) {
        memcpy(direct_.data() + bytes_, chunk.data(), chunk.size());
        bytes_ += chunk.size();
        return absl::OkStatus();
      }
      if (direct_.empty() && bytes_ + chunk.size() <= keep_) {
        if (kept_.empty()) kept_.reserve(static_cast<size_t>(std::min<uint64_t>(keep_, 128 << 10)));
        kept_.append(chunk.data(), chunk.size());
        bytes_ += chunk.size();
        return absl::OkStatus();
      }
      // Bigger than what can be held: to the file from here on.
      WHARF_RETURN_IF_ERROR(whole_->Append(*held()));
      holding_ = false;
      std::string().swap(kept_);
    }
    while (!chunk.empty()) {
      size_t n;
      if (bytes_ < spill_at_) {
        n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), spill_at_ - bytes_));
        WHARF_RETURN_IF_ERROR(whole_->Append(chunk.substr(0, n)));
      } else {
        const uint64_t index = bytes_ / block_;
        if (bytes_ % block_ == 0) {
          WHARF_ASSIGN_OR_RETURN(auto temp, TempObject::Create(absl::StrCat(placeholder_, index),
                                                               temp_dir_, Checksum::kCrc32c));
          spilled_.push_back(std::move(temp));
        }
        n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), (index + 1) * block_ - bytes_));
        WHARF_RETURN_IF_ERROR(spilled_.back()->Append(chunk.substr(0, n)));
      }
      bytes_ += n;
      chunk.remove_prefix(n);
    }
    return absl::OkStatus();
  }

 public:
  // Writes what is only in memory to the whole object's file. Once, after the last Append.
  absl::Status Finish() {
    if (!holding_ || bytes_ == 0) return absl::OkStatus();
    return whole_->Append(*held());
  }
  uint64_t bytes() const { return bytes_; }
  uint64_t spill_at() const { return spill_at_; }
  // All the bytes received, when they were few enough to hold (in the reader's buffer or
  // ours), else nullopt.
  std::optional<absl::string_view> held() const {
    if (!holding_) return std::nullopt;
    if (!direct_.empty()) return absl::string_view(direct_.data(), bytes_);
    return absl::string_view(kept_);
  }
  // The blocks from spill_at() / block on, in order.
  std::vector<std::unique_ptr<TempObject>>& spilled() { return spilled_; }

 private:
  bool failed_ = false;
  TempObject* const whole_;
  const std::string temp_dir_;
  const std::string placeholder_;
  const uint64_t block_;
  const uint64_t spill_at_;
  const uint64_t keep_;
  const absl::Span<char> direct_;
  bool holding_ = true;  // every byte so far is in direct_ or kept_, none in the file
  uint64_t bytes_ = 0;
  std::string kept_;
  std::vector<std::unique_ptr<TempObject>> spilled_;
};

// Objects up to this size are kept in memory while they are filled (SpillSink's `keep`).
constexpr uint64_t kKeepFilled = 1 << 20;

// Forwards to a writer of the backing store; on Close, forgets the tier's copy.
class ForgettingWriter : public ObjectWriter {
 public:
  ForgettingWriter(std::unique_ptr<ObjectWriter> inner, std::function<void()> forget)
      : inner_(std::move(inner)), forget_(std::move(forget)) {}
  absl::Status Write(absl::Cord data) override { return inner_->Write(std::move(data)); }
  absl::StatusOr<ObjectMeta> Close() override {
    auto meta = inner_->Close();
    forget_();
    return meta;
  }
  void Abort() override { inner_->Abort(); }

 private:
  std::unique_ptr<ObjectWriter> inner_;
  std::function<void()> forget_;
};

// The object's modification time at its source, when the store reported one: an entry's file
// carries it (as downloads do), so reads and HEADs through the tier report the object's time,
// not the fill's. Eviction and staleness go by the entry's attributes, never by the mtime.
std::optional<absl::Time> SourceTime(const ObjectMeta& meta) {
  if (meta.mtime == absl::InfinitePast() || meta.mtime == absl::InfiniteFuture()) {
    return std::nullopt;
  }
  return meta.mtime;
}

// Copies `n` bytes at `file_offset` of the open file `fd` to the request's destination: its
// sink (in order), or its buffer at `buffer_offset`.
absl::Status CopyOut(int fd, uint64_t file_offset, uint64_t n, const GetRequest& req,
                     uint64_t buffer_offset, const std::string& op) {
  std::string chunk;
  const uint64_t end = file_offset + n;
  for (uint64_t off = file_offset; off < end;) {
    if (IsCancelled(req.cancel)) return absl::CancelledError(absl::StrCat(op, ": cancelled"));
    const size_t want = static_cast<size_t>(std::min<uint64_t>(end - off, kSinkChunk));
    char* dst;
    if (req.sink != nullptr) {
      chunk.resize(want);
      dst = chunk.data();
    } else {
      dst = req.buffer.data() + buffer_offset + (off - file_offset);
    }
    const ssize_t got = pread(fd, dst, want, static_cast<off_t>(off));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return got < 0 ? ErrnoToStatus(errno, op)
                     : absl::DataLossError(absl::StrCat(op, ": the tier's copy ended early"));
    }
    if (req.sink != nullptr) {
      WHARF_RETURN_IF_ERROR(req.sink->Append(absl::string_view(chunk.data(), got)));
    }
    off += got;
  }
  return absl::OkStatus();
}

// Copies bytes [begin, begin + n) of `data` to the request's destination, as CopyOut does.
absl::Status CopyOutBytes(absl::string_view data, uint64_t begin, uint64_t n,
                          const GetRequest& req) {
  const absl::string_view part = data.substr(begin, n);
  if (req.sink == nullptr) {
    // A fill held the bytes in the reader's own buffer: they are in place.
    if (part.data() != req.buffer.data()) memcpy(req.buffer.data(), part.data(), part.size());
    return absl::OkStatus();
  }
  return req.sink->Append(part);
}

// What a read of an entry (`size` bytes, `etag`) answers: not modified for a matching
// If-None-Match, else the request's range, copied to its destination by `copy(begin, n)`.
absl::StatusOr<GetResult> Answer(const GetRequest& req, const std::string& op, uint64_t size,
                                 const std::string& etag, absl::Time mtime,
                                 absl::FunctionRef<absl::Status(uint64_t, uint64_t)> copy) {
  GetResult result;
  result.meta.key = req.key;
  result.meta.size = size;
  result.meta.etag = etag;
  result.meta.mtime = mtime;
  if (!req.if_none_match.empty() && req.if_none_match == etag) {
    result.not_modified = true;
    return result;
  }
  auto range = req.range.Resolve(size);
  if (!range.ok()) return Annotate(range.status(), op);
  const auto [begin, end] = *range;
  result.offset = begin;
  result.bytes = end - begin;
  if (req.sink == nullptr && req.buffer.size() < end - begin) {
    return absl::OutOfRangeError(absl::StrCat(op, ": the buffer holds ", req.buffer.size(),
                                              " bytes, the range ", end - begin));
  }
  WHARF_RETURN_IF_ERROR(copy(begin, end - begin));
  return result;
}

// The lock stripe of `path` (a file of the tier) opened, for the single-filler flock.
absl::StatusOr<int> OpenStripe(const Tier& tier, const std::string& path, const std::string& op) {
  const uint64_t stripe = std::hash<std::string>{}(tier.Relative(path)) % kLockStripes;
  const std::string lock_path = tier.MetaPath(absl::StrCat("locks/", stripe));
  const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat(op, ": opening ", lock_path));
  return fd;
}

}  // namespace

struct TierStore::PendingRead {
  GetRequest request;
  Callback<GetResult> done;
  std::vector<std::string> candidates;
  std::string fill_path;
  int lock_fd = -1;  // the stripe's lock file while this read tries to take it
  // Set while this read is its process's filler of fill_path: gives the stripe back and
  // resumes the reads of this process that wait for the same object.
  std::function<void()> release;
  absl::Duration backoff = absl::Milliseconds(1);
  std::unique_ptr<TempObject> temp;
  std::unique_ptr<SpillSink> sink;
  std::optional<TierEntry> stale;  // the copy a fill revalidates (ttl mode)
  // The caller's ambient token (base/cancel.h): a read resumed by another read's fill runs
  // with its own, not with the filler's (which Ctrl-C may have cancelled).
  CancelToken scope;
  // While the read waits for a fill of its process (TierStore::filling_): its callbacks on
  // request.cancel and on scope, which take it out of the wait (TierStore::Park).
  uint64_t parked_on_request = 0;
  uint64_t parked_on_scope = 0;

  bool cancelled() const { return IsCancelled(request.cancel) || IsCancelled(scope); }

  // The outcome goes to the caller when the read's last reference is dropped: every step of
  // a read runs in a task that holds the read and the store, and drops the store first. So
  // when the caller gets its answer no task of its read holds the store any more: a caller
  // that lets go of the store in its callback destroys it there (and its counters are
  // written), not later on a pool thread that process exit may never wait for. The blocks
  // of one read are steps on several threads; whichever ends last delivers.
  ~PendingRead() {
    Unlock();
    if (!done) return;  // never started (the key bypassed the tier)
    if (!result) result = absl::InternalError(absl::StrCat("get ", request.key, ": read dropped"));
    std::move(done)(*std::move(result));
  }
  void Unlock() {
    if (lock_fd >= 0) close(lock_fd);
    lock_fd = -1;
    if (release) std::exchange(release, nullptr)();
  }
  // Records the outcome (delivered when the read is dropped).
  void Finish(absl::StatusOr<GetResult> r) {
    Unlock();
    // A read that went to the backing store says how far it went, as a read of the store
    // itself would (readers size their read-ahead by it).
    if (r.ok() && r->time_to_first_byte == absl::ZeroDuration()) {
      r->time_to_first_byte = fetched_first_byte;
    }
    result = std::move(r);
  }
  // The backing store's time to first byte when this read fetched from it.
  absl::Duration fetched_first_byte = absl::ZeroDuration();
  bool counted = false;  // the read counted as a hit or a miss (by the step that decided)
  std::optional<absl::StatusOr<GetResult>> result;
};

// One block of a big object's read (TierStore::ReadBlocks).
struct TierStore::BlockSlot {
  uint64_t index = 0;
  uint64_t length = 0;  // bytes of the block
  std::string path;
  int fd = -1;       // the block, open and share-locked once it is local
  int lock_fd = -1;  // its stripe, while this read fills it
  absl::Duration backoff = absl::Milliseconds(1);
  std::unique_ptr<TempObject> temp;
  std::unique_ptr<FileSink> sink;
  absl::Status status;
  // The tier could not keep the block (its file system refused a lock, a temporary file, a
  // write or the publish; `status` says why): the read goes around the tier from here.
  bool around = false;

  ~BlockSlot() { Release(); }
  void Unlock() {
    if (lock_fd >= 0) close(lock_fd);
    lock_fd = -1;
  }
  void Release() {
    if (fd >= 0) close(fd);  // releases the reader's lock
    fd = -1;
    Unlock();
  }
};

// A read served from blocks: windows of up to kBlockWindow blocks, each window's blocks made
// local in parallel, then copied out in order.
struct TierStore::BlockRead {
  std::shared_ptr<PendingRead> read;
  Version version;
  std::string uri;
  std::string blocks_dir;       // <fill path>.blocks
  bool retried = false;         // the object was looked up again after its version changed
  bool pinned = false;          // the object's blocks directory is pinned: so are new blocks
  bool filled = false;          // some block was fetched
  uint64_t begin = 0, end = 0;  // the bytes read
  uint64_t next_block = 0, end_block = 0;  // blocks not yet in a window: [next, end)
  std::vector<std::unique_ptr<BlockSlot>> window;
  std::atomic<int> pending{0};  // blocks of the window not yet local (or failed)
  GetResult result;
};

absl::StatusOr<std::shared_ptr<TierStore>> TierStore::Open(std::shared_ptr<ObjectStore> inner,
                                                           std::shared_ptr<Tier> tier,
                                                           std::shared_ptr<Runtime> runtime) {
  WHARF_RETURN_IF_ERROR(MakeDirs(tier->MetaPath("locks")));
  WHARF_ASSIGN_OR_RETURN(std::vector<TierImport> imports, tier->Imports());
  std::sort(imports.begin(), imports.end(), [](const TierImport& a, const TierImport& b) {
    return a.source.size() > b.source.size();
  });
  return std::shared_ptr<TierStore>(
      new TierStore(std::move(inner), std::move(tier), std::move(runtime), std::move(imports)));
}

struct TierStore::Meters {
  explicit Meters(MetricsRegistry& m)
      : hits(m.GetCounter("wharf_tier_hits_total", "Reads the tier served from its copy")),
        misses(m.GetCounter("wharf_tier_misses_total", "Reads that found no fresh copy")),
        fills(m.GetCounter("wharf_tier_fills_total", "Objects and blocks fetched into the tier")),
        fill_bytes(m.GetCounter("wharf_tier_fill_bytes_total", "Bytes fetched into the tier")),
        evictions(m.GetCounter("wharf_tier_evictions_total",
                               "Entries this process's eviction passes removed")),
        revalidated(m.GetCounter("wharf_tier_revalidated_total",
                                 "Stale copies the source confirmed unchanged (304)")),
        bypassed(m.GetCounter("wharf_tier_bypassed_total",
                              "Reads of keys that cannot be paths (not cached)")) {}
  absl::Mutex mu;
  Stats published ABSL_GUARDED_BY(mu);
  Counter *hits, *misses, *fills, *fill_bytes, *evictions, *revalidated, *bypassed;
};

TierStore::TierStore(std::shared_ptr<ObjectStore> inner, std::shared_ptr<Tier> tier,
                     std::shared_ptr<Runtime> runtime, std::vector<TierImport> imports)
    : ForwardingStore(inner),
      inner_(std::move(inner)),
      tier_(std::move(tier)),
      runtime_(std::move(runtime)),
      imports_(std::move(imports)) {
  capabilities_ = inner_->capabilities();
  capabilities_.compose = false;
  Register();
  meters_ = std::make_unique<Meters>(runtime_->metrics());
  collector_ = runtime_->metrics().AddCollector([this] { PublishMetrics(); });
}

void TierStore::PublishMetrics() {
  const Stats now = stats();
  absl::MutexLock lock(&meters_->mu);
  Stats& was = meters_->published;
  meters_->hits->Add(now.hits - was.hits);
  meters_->misses->Add(now.misses - was.misses);
  meters_->fills->Add(now.fills - was.fills);
  meters_->fill_bytes->Add(now.fill_bytes - was.fill_bytes);
  meters_->evictions->Add(now.evicted - was.evicted);
  meters_->revalidated->Add(now.revalidated - was.revalidated);
  meters_->bypassed->Add(now.bypassed - was.bypassed);
  was = now;
}

// The live stores of the process, so their counters reach the tier at exit: a store's last
// reference may be dropped on a pool thread that exit() does not wait for.
namespace {
absl::Mutex live_mu;
std::vector<TierStore*>* live ABSL_GUARDED_BY(live_mu) = nullptr;
bool exiting ABSL_GUARDED_BY(live_mu) = false;
}  // namespace

void TierStore::FlushStatsAtExit() {
  absl::MutexLock lock(&live_mu);
  if (live != nullptr) {
    // Not the stores a forked child inherited: their counters are the parent's to write.
    for (TierStore* store : *live) {
      // (flush_mu_ of an inherited store may have been held by a thread the fork left behind)
      if (store->generation_ != ForkGeneration()) continue;
      absl::MutexLock flush(&store->flush_mu_);
      store->FlushStatsLocked();
    }
  }
  exiting = true;
}

void TierStore::AtExit() {
  FlushStatsAtExit();
  Tier::ReleaseAllAtExit();
}

void TierStore::FlushStatsLocked(bool with_usage) {
  // What this process filled since its last pass counts in the tier's usage hint for the
  // processes after it (best effort, as the counters); not in the flushes of a live store,
  // which would take the usage lock (an flock another process may hold) ~100 times a second.
  if (const uint64_t filled = with_usage ? unrecorded_.exchange(0) : 0; filled > 0) {
    (void)tier_->AddUsage(filled);
  }
  const Stats now = stats();
  Tier::Stats delta{now.hits - flushed_.hits, now.misses - flushed_.misses,
                    now.fills - flushed_.fills, now.fill_bytes - flushed_.fill_bytes};
  if (delta.hits + delta.misses + delta.fills + delta.fill_bytes == 0) return;
  flushed_ = now;
  // Best effort: counters are for `tier status`, not for correctness.
  (void)tier_->AddStats(delta);
}

void TierStore::Count(std::atomic<uint64_t>& counter, uint64_t n) {
  // Sequentially consistent with the flusher's clearing of flush_pending_ (and its fence
  // before it reads the counters): either it counts this change, or this sees the flag
  // cleared and schedules the next flush. On x86 both cost what relaxed ones do.
  counter.fetch_add(n, std::memory_order_seq_cst);
  StatsChanged();
}

// One write of the counters kStatsFlushDelay after the first change since the last one: a
// process reading hard rewrites its small stats file at most ~100 times a second, and a
// status taken just after a read sees it. The write runs on the default runtime's blocking
// pool (it lives as long as the process) and holds no reference to the store: a flush must
// never be what keeps a store alive, or the store would end there, after its owner let go
// (who may be removing the tier's directory by then). The store is looked up among the live
// ones instead, under the lock its destructor takes to leave them.
void TierStore::StatsChanged() {
  // A load first: while a flush is pending (nearly always, under load) a read costs no
  // read-modify-write of a line the flushing thread writes too.
  if (flush_pending_.load(std::memory_order_seq_cst) ||
      flush_pending_.exchange(true, std::memory_order_seq_cst)) {
    return;
  }
  ScopedAmbientCancel unscoped(nullptr);  // bookkeeping of no one operation
  Timer::Global().After(kStatsFlushDelay, [store = this] {
    Runtime::Default()->blocking_pool().Schedule([store] {
      {
        absl::MutexLock lock(&live_mu);
        if (live == nullptr || exiting ||
            std::find(live->begin(), live->end(), store) == live->end() ||
            store->generation_ != ForkGeneration()) {
          return;
        }
        // Still live: its destructor, which leaves the live ones first, then waits for
        // this lock, cannot free it until this flush is done.
        store->flush_mu_.Lock();
      }
      store->flush_pending_.store(false, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      store->FlushStatsLocked(/*with_usage=*/false);
      store->flush_mu_.Unlock();
    });
  });
}

void TierStore::Register() {
  static const bool registered = [] {
    ReleaseAcrossFork(&live_mu);  // a store may be destroyed on a pool thread during fork()
    return std::atexit(&TierStore::FlushStatsAtExit) == 0;
  }();
  (void)registered;
  absl::MutexLock lock(&live_mu);
  if (live == nullptr) live = new std::vector<TierStore*>;
  live->push_back(this);
}

TierStore::~TierStore() {
  runtime_->metrics().RemoveCollector(collector_);
  PublishMetrics();  // what happened since the last snapshot still counts
  bool after_exit;
  {
    absl::MutexLock lock(&live_mu);
    if (live != nullptr) std::erase(*live, this);
    after_exit = exiting;
  }
  // An inherited store's counters are the parent's to write (and its flush_mu_ may have been
  // held by a thread the fork left behind).
  if (generation_ != ForkGeneration()) return;
  absl::MutexLock flush(&flush_mu_);  // waits for a flush in progress
  if (!after_exit) FlushStatsLocked();
}

TierStore::Stats TierStore::stats() const {
  Stats s;
  s.hits = hits_.load(std::memory_order_relaxed);
  s.misses = misses_.load(std::memory_order_relaxed);
  s.fills = fills_.load(std::memory_order_relaxed);
  s.fill_bytes = fill_bytes_.load(std::memory_order_relaxed);
  s.bypassed = bypassed_.load(std::memory_order_relaxed);
  s.evicted = evictions_.load(std::memory_order_relaxed);
  s.revalidated = revalidated_.load(std::memory_order_relaxed);
  s.listed = listed_.load(std::memory_order_relaxed);
  s.block_fills = block_fills_.load(std::memory_order_relaxed);
  return s;
}

std::optional<std::string> TierStore::FillPath(const std::string& key) const {
  return FillPathOfUri(inner_->Uri(key));
}

std::optional<std::string> TierStore::FillPathOfUri(const std::string& uri) const {
  const size_t sep = uri.find("://");
  if (sep == std::string::npos) return std::nullopt;
  absl::string_view rest = absl::string_view(uri).substr(sep + 3);
  absl::ConsumePrefix(&rest, "/");  // file:///abs/path
  if (!IsSafeRelativePath(rest)) return std::nullopt;
  // A segment ending in ".blocks" could name another object's blocks.
  for (absl::string_view part : absl::StrSplit(rest, '/')) {
    if (absl::EndsWith(part, kTierBlocksSuffix)) return std::nullopt;
  }
  if (MakesATier(rest)) return std::nullopt;
  return absl::StrCat(tier_->MetaPath("objects"), "/", uri.substr(0, sep), "/", rest);
}

std::vector<std::string> TierStore::Candidates(const std::string& key) const {
  std::vector<std::string> out;
  const std::string uri = inner_->Uri(key);
  auto fill = FillPathOfUri(uri);
  if (!fill) return out;  // the key cannot be a path: it bypasses the tier
  for (const TierImport& import : imports_) {
    if (!absl::StartsWith(uri, import.source)) continue;
    const absl::string_view rest = absl::string_view(uri).substr(import.source.size());
    if (!IsSafeRelativePath(rest)) continue;
    out.push_back(import.dir.empty() ? absl::StrCat(tier_->root(), "/", rest)
                                     : absl::StrCat(tier_->root(), "/", import.dir, "/", rest));
    break;  // the longest covering import
  }
  // A path through a link below the tier (planted, or a user's) is neither read nor filled:
  // it may lead anywhere. Without its fill path the key bypasses the tier.
  if (!RefuseLinksBelow(tier_->root(), *fill).ok()) return {};
  if (!out.empty() && !RefuseLinksBelow(tier_->root(), out.front()).ok()) out.clear();
  out.push_back(*std::move(fill));
  return out;
}

// ---- Listings from complete imports ----

struct TierStore::TreeListing {
  std::vector<ObjectMeta> objects;  // the source's keys (the backing store's), in key order
};

namespace {

// Continuation tokens of pages the tier answered: the prefix, then 'k' and the last key
// returned or 'p' and the last common prefix (the backing store's tokens are passed through).
constexpr absl::string_view kTierToken = "wharf-tier:";

// One page of `objects` (in key order) as a store pages a listing.
ListPage ListSorted(const std::vector<ObjectMeta>& objects, const ListOptions& options,
                    std::string after, const std::string& last_prefix) {
  ListPage page;
  const size_t limit = static_cast<size_t>(std::max(1, options.page_size));
  after = std::max(after, options.start_after);
  auto it = std::upper_bound(objects.begin(), objects.end(), after,
                             [](const std::string& k, const ObjectMeta& m) { return k < m.key; });
  it = std::max(
      it, std::lower_bound(objects.begin(), objects.end(), options.prefix,
                           [](const ObjectMeta& m, const std::string& k) { return m.key < k; }));
  std::string rolled_last = last_prefix;
  std::string token;
  size_t entries = 0;
  for (; it != objects.end(); ++it) {
    const std::string& key = it->key;
    if (!absl::StartsWith(key, options.prefix)) break;
    if (!options.end_before.empty() && key >= options.end_before) break;
    std::string rolled;
    if (!options.delimiter.empty()) {
      const size_t at = key.find(options.delimiter, options.prefix.size());
      if (at != std::string::npos) rolled = key.substr(0, at + options.delimiter.size());
    }
    if (!rolled.empty() && rolled == rolled_last) continue;
    if (entries == limit) {
      page.continuation = absl::StrCat(kTierToken, token);
      break;
    }
    ++entries;
    if (!rolled.empty()) {
      page.common_prefixes.push_back(rolled);
      rolled_last = rolled;
      token = absl::StrCat("p", rolled);
    } else {
      page.objects.push_back(*it);
      token = absl::StrCat("k", key);
    }
  }
  return page;
}

}  // namespace

// The listing of a complete import, kept once a reader has walked the tree and found every
// object (imports/<name>.listing): later processes (each epoch's, each rank's and worker's)
// read one file instead of a stat and an attribute of every file. A header (JSON, one line)
// names the import's run (source, directory, completion time, objects); a record per object
// follows: key length (u32), the key relative to the source, size (u64), ETag length (u16),
// the ETag, mtime in ns (i64), little-endian. A listing of another run of the import (a
// rerun records a new completion time) or one that does not parse is ignored and rewritten.
// What it lists is the source's listing when the import completed, which is what the walk
// answers for too; an object evicted from the tree since is read through, from the bucket.
namespace {
constexpr absl::string_view kListingVersion = "wharf-import-listing-1";

json ListingHeader(const TierImport& import) {
  json j;
  j["format"] = kListingVersion;
  j["source"] = import.source;
  j["dir"] = import.dir;
  j["completed_us"] = absl::ToUnixMicros(import.completed);
  j["objects"] = import.objects;
  return j;
}

template <typename T>
void PutInt(std::string& out, T v) {
  char b[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i)
    b[i] = static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
  out.append(b, sizeof(T));
}

template <typename T>
bool GetInt(absl::string_view& in, T* v) {
  if (in.size() < sizeof(T)) return false;
  uint64_t x = 0;
  for (size_t i = 0; i < sizeof(T); ++i) x |= uint64_t{static_cast<uint8_t>(in[i])} << (8 * i);
  *v = static_cast<T>(x);
  in.remove_prefix(sizeof(T));
  return true;
}
}  // namespace

std::shared_ptr<const TierStore::TreeListing> TierStore::ReadKeptListing(
    const Tier& tier, const TierImport& import, const std::string& key_prefix) {
  std::string data;
  if (!ReadFile(tier.ImportListingPath(import), &data)) return nullptr;
  absl::string_view in = data;
  const size_t eol = in.find('\n');
  if (eol == absl::string_view::npos) return nullptr;
  const json header = json::parse(in.substr(0, eol), nullptr, /*allow_exceptions=*/false);
  if (header != ListingHeader(import)) return nullptr;
  in.remove_prefix(eol + 1);
  auto listing = std::make_shared<TreeListing>();
  listing->objects.reserve(import.objects);
  while (!in.empty()) {
    uint32_t key_len;
    uint16_t etag_len;
    int64_t mtime_ns;
    ObjectMeta meta;
    if (!GetInt(in, &key_len) || in.size() < key_len) return nullptr;
    meta.key = absl::StrCat(key_prefix, in.substr(0, key_len));
    in.remove_prefix(key_len);
    if (!GetInt(in, &meta.size) || !GetInt(in, &etag_len) || in.size() < etag_len) return nullptr;
    meta.etag = std::string(in.substr(0, etag_len));
    in.remove_prefix(etag_len);
    if (!GetInt(in, &mtime_ns)) return nullptr;
    meta.mtime = absl::FromUnixNanos(mtime_ns);
    listing->objects.push_back(std::move(meta));
  }
  if (listing->objects.size() != import.objects) return nullptr;
  return listing;
}

void TierStore::KeepListing(Tier& tier, const TierImport& import, const std::string& key_prefix,
                            const std::vector<ObjectMeta>& objects) {
  std::string out = ListingHeader(import).dump() + "\n";
  for (const ObjectMeta& meta : objects) {
    const absl::string_view rel = absl::string_view(meta.key).substr(key_prefix.size());
    PutInt<uint32_t>(out, static_cast<uint32_t>(rel.size()));
    out.append(rel.data(), rel.size());
    PutInt<uint64_t>(out, meta.size);
    PutInt<uint16_t>(out, static_cast<uint16_t>(meta.etag.size()));
    out.append(meta.etag);
    PutInt<int64_t>(out, absl::ToUnixNanos(meta.mtime));
  }
  // Best effort: without it the next reader walks the tree again.
  auto temp_dir = tier.TempDir();
  if (!temp_dir.ok()) return;
  auto temp = TempObject::Create(tier.ImportListingPath(import), *temp_dir);
  if (!temp.ok() || !(*temp)->Append(out).ok()) return;
  (void)(*temp)->Commit(std::nullopt, /*fsync=*/false);
}

std::shared_ptr<const TierStore::TreeListing> TierStore::ListingFor(const std::string& prefix) {
  const std::string uri = inner_->Uri(prefix);
  const std::string base = inner_->Uri("");
  const TierConfig& config = tier_->config();
  for (const TierImport& import : imports_) {  // the longest covering source first
    if (!import.complete() || !absl::StartsWith(uri, import.source) ||
        !absl::StartsWith(import.source, base)) {
      continue;
    }
    if (import.objects > kMaxListedImport) return nullptr;
    if (config.mode != TierConfig::Mode::kImmutable &&
        absl::Now() - import.completed > config.ttl) {
      return nullptr;
    }
    {
      absl::MutexLock lock(&listings_mu_);
      if (auto it = listings_.find(import.source); it != listings_.end()) return it->second;
    }
    const std::string key_prefix = import.source.substr(base.size());
    if (auto kept = ReadKeptListing(*tier_, import, key_prefix)) {
      absl::MutexLock lock(&listings_mu_);
      return listings_.try_emplace(import.source, std::move(kept)).first->second;
    }
    // The tree's entries of this source: each file whose entry names its own key's URI.
    const std::string root =
        import.dir.empty() ? tier_->root() : absl::StrCat(tier_->root(), "/", import.dir);
    auto listing = std::make_shared<TreeListing>();
    absl::Status walked =
        WalkTierFiles(*tier_, root, [&](const std::string& path, const struct stat& st) {
          const absl::string_view rel = absl::string_view(path).substr(root.size() + 1);
          const auto entry = ReadEntryAttr(path);
          if (!IsCompleteEntry(entry, st) ||
              entry->source.size() != import.source.size() + rel.size() ||
              !absl::StartsWith(entry->source, import.source) ||
              !absl::EndsWith(entry->source, rel)) {
            return;
          }
          ObjectMeta meta;
          meta.key = absl::StrCat(key_prefix, rel);
          meta.size = entry->size;
          meta.etag = entry->etag;
          meta.mtime = absl::TimeFromTimespec(st.st_mtim);
          listing->objects.push_back(std::move(meta));
        });
    std::shared_ptr<const TreeListing> result;
    if (walked.ok() && listing->objects.size() == import.objects) {
      std::sort(listing->objects.begin(), listing->objects.end(),
                [](const ObjectMeta& a, const ObjectMeta& b) { return a.key < b.key; });
      KeepListing(*tier_, import, key_prefix, listing->objects);
      result = std::move(listing);
    } else {
      std::fprintf(stderr,
                   "wharf: listing %s from the bucket: the tier's import of it at %s holds %zu "
                   "of its %llu objects%s\n",
                   import.source.c_str(), root.c_str(), listing->objects.size(),
                   static_cast<unsigned long long>(import.objects),
                   walked.ok() ? "" : absl::StrCat(" (", walked.message(), ")").c_str());
    }
    absl::MutexLock lock(&listings_mu_);
    return listings_.try_emplace(import.source, std::move(result)).first->second;
  }
  return nullptr;
}

void TierStore::ListAsync(ListOptions options, std::string continuation, Callback<ListPage> done) {
  const bool ours = absl::StartsWith(continuation, kTierToken);
  const bool maybe = std::any_of(imports_.begin(), imports_.end(),
                                 [](const TierImport& i) { return i.complete(); });
  if (!ours && (!continuation.empty() || !maybe)) {
    return inner_->ListAsync(std::move(options), std::move(continuation), std::move(done));
  }
  runtime_->blocking_pool().Schedule([self = shared_from_this(), options = std::move(options),
                                      continuation = std::move(continuation),
                                      done = std::move(done)]() mutable {
    std::string after, last_prefix;
    if (absl::StartsWith(continuation, kTierToken) && continuation.size() > kTierToken.size()) {
      const char kind = continuation[kTierToken.size()];
      after = continuation.substr(kTierToken.size() + 1);
      if (kind == 'p') last_prefix = after;
    }
    std::shared_ptr<const TreeListing> listing = self->ListingFor(options.prefix);
    if (listing == nullptr) {
      // The bucket answers, from where the tier's pages stopped (past a whole common prefix).
      std::shared_ptr<ObjectStore> inner = self->inner_;
      self.reset();
      options.start_after =
          std::max(options.start_after,
                   last_prefix.empty() ? after : absl::StrCat(after, "\xf4\x8f\xbf\xbf"));
      return inner->ListAsync(std::move(options), "", std::move(done));
    }
    self->listed_.fetch_add(1, std::memory_order_relaxed);
    ListPage page = ListSorted(listing->objects, options, std::move(after), last_prefix);
    self.reset();
    std::move(done)(std::move(page));
  });
}

absl::StatusOr<ListPage> TierStore::List(const ListOptions& options,
                                         const std::string& continuation) {
  return WaitFor<ListPage>([&](Callback<ListPage> cb) {
    ListAsync(ListOptions(options), std::string(continuation), std::move(cb));
  });
}

void TierStore::GetAsync(GetRequest request, Callback<GetResult> done) {
  auto read = std::make_shared<PendingRead>();
  read->scope = AmbientCancel();
  read->candidates = Candidates(request.key);
  if (read->candidates.empty()) {
    bypassed_.fetch_add(1, std::memory_order_relaxed);
    return inner_->GetAsync(std::move(request), std::move(done));
  }
  read->fill_path = read->candidates.back();
  read->request = std::move(request);
  read->done = std::move(done);
  runtime_->blocking_pool().Schedule([self = shared_from_this(), read]() mutable {
    if (self->ServeLocal(*read, /*after_fill=*/false)) {
      self->Count(self->hits_);
    } else {
      self->ReadUncached(read);
    }
    self.reset();
    read.reset();
  });
}

void TierStore::ReadUncached(std::shared_ptr<PendingRead> read) {
  const GetRequest& req = read->request;
  // One stat tells whether the object has blocks here (a miss of a small object costs no
  // more than that).
  struct stat st;
  const bool has_blocks = stat(absl::StrCat(read->fill_path, kTierBlocksSuffix).c_str(), &st) == 0;
  if (has_blocks) {
    const uint64_t hint = req.range.suffix ? 0 : req.range.offset / tier_->config().block_size;
    if (auto version = FindBlocks(read->fill_path, inner_->Uri(req.key), req.if_match,
                                  req.max_staleness, hint)) {
      return ReadBlocks(std::move(read), *std::move(version), /*retried=*/false);
    }
  }
  if (auto head = RecentHead(req.key);
      head.has_value() && (req.if_match.empty() || req.if_match == head->etag)) {
    if (head->size > tier_->config().block_threshold) {
      return ReadBlocks(std::move(read), *std::move(head), /*retried=*/false);
    }
    read->counted = true;
    Count(misses_);
    return Acquire(std::move(read));
  }
  // A ranged read must know the object's size before it can tell blocks from a whole copy
  // (and a whole read of an object with blocks, stale ones, would fetch it all again).
  if (!req.range.is_all() || has_blocks) return Discover(std::move(read), /*retried=*/false);
  read->counted = true;
  Count(misses_);
  Acquire(std::move(read));
}

absl::StatusOr<GetResult> TierStore::Get(const GetRequest& request) {
  return WaitFor<GetResult>(
      [&](Callback<GetResult> cb) { GetAsync(GetRequest(request), std::move(cb)); });
}

void TierStore::HeadAsync(std::string key, Callback<ObjectMeta> done) {
  // A fresh entry answers without a round trip to the bucket (loaders HEAD before reading).
  runtime_->blocking_pool().Schedule(
      [self = shared_from_this(), key = std::move(key), done = std::move(done)]() mutable {
        for (const std::string& path : self->Candidates(key)) {
          struct stat st;
          if (stat(path.c_str(), &st) != 0) continue;
          const auto entry = ReadEntryAttr(path);
          if (!IsCompleteEntry(entry, st)) continue;
          if (self->tier_->config().mode != TierConfig::Mode::kImmutable &&
              absl::Now() - entry->filled > self->tier_->config().ttl) {
            continue;
          }
          ObjectMeta meta;
          meta.key = key;
          meta.size = entry->size;
          meta.etag = EntryEtag(*entry);
          meta.mtime = absl::TimeFromTimespec(st.st_mtim);
          self.reset();
          return std::move(done)(std::move(meta));
        }
        if (auto fill = self->FillPath(key)) {
          if (auto version =
                  self->FindBlocks(*fill, self->inner_->Uri(key), "", absl::ZeroDuration(), 0)) {
            ObjectMeta meta;
            meta.key = key;
            meta.size = version->size;
            meta.etag = version->etag;
            // Blocks carry the object's modification time (SourceTime), the first one found.
            const std::string dir =
                absl::StrCat(*fill, kTierBlocksSuffix, "/", TierBlockVersionDir(version->etag));
            std::error_code ec;
            for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
              struct stat st;
              if (stat(e.path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
                meta.mtime = absl::TimeFromTimespec(st.st_mtim);
                break;
              }
            }
            self.reset();
            return std::move(done)(std::move(meta));
          }
        }
        std::shared_ptr<ObjectStore> inner = self->inner_;
        std::string k = key;
        inner->HeadAsync(std::move(key),
                         [self = std::move(self), k = std::move(k),
                          done = std::move(done)](absl::StatusOr<ObjectMeta> meta) mutable {
                           if (meta.ok()) self->RememberHead(k, *meta);
                           self.reset();
                           std::move(done)(std::move(meta));
                         });
      });
}

namespace {

// Whether an MD5 entry's file (an imported one, or data written to the tier) still holds the
// entry's data: its size and mtime are those the file store's ETag cache has the entry's MD5
// for (one attribute read), else its content decides (a file only touched is served, and
// its cache renewed; one edited in place since it was sealed is not the object).
bool HoldsEntryData(int fd, const struct stat& st, const TierEntry& entry) {
  return CachedLocalEtag(fd, "", st) == entry.md5 || !RecheckEntry(fd, st, entry).empty();
}

// A complete entry that `tier verify` has not found damaged: what a read may be answered
// from (or revalidated against) instead of the source.
bool Servable(const std::optional<TierEntry>& entry, const struct stat& st) {
  return IsCompleteEntry(entry, st) && !entry->damaged;
}

}  // namespace

bool TierStore::ServeLocal(PendingRead& read, bool after_fill) {
  const GetRequest& req = read.request;
  const std::string op = absl::StrCat("get ", inner_->Uri(req.key));
  for (const std::string& path : read.candidates) {
    // Right after a fill, only the copy just filled answers (an imported copy is stale).
    if (after_fill && path != read.fill_path) continue;
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    std::optional<TierEntry> entry;
    if (fstat(fd, &st) == 0) entry = ReadEntryAttr(fd);
    const bool complete =
        Servable(entry, st) && (entry->md5.empty() || HoldsEntryData(fd, st, *entry));
    bool fresh = complete && (after_fill || tier_->config().mode == TierConfig::Mode::kImmutable);
    if (complete && !fresh) {
      const absl::Duration ttl = std::max(tier_->config().ttl, req.max_staleness);
      fresh = absl::Now() - entry->filled <= ttl;
    }
    const std::string etag = complete ? EntryEtag(*entry) : "";
    if (fresh && !req.if_match.empty() && req.if_match != etag) {
      if (after_fill) {
        close(fd);
        read.Finish(absl::FailedPreconditionError(
            absl::StrCat(op, ": object changed (etag ", etag, ", expected ", req.if_match, ")")));
        return true;
      }
      fresh = false;  // perhaps changed at the source: fill again
    }
    if (!fresh) {
      close(fd);
      continue;
    }
    // Held while the bytes are read: an eviction pass skips what it cannot lock. Reading a
    // file that was unlinked after it was opened is fine (its data stays until closed).
    flock(fd, LOCK_SH);
    if (!after_fill) TouchEntry(fd, *entry);
    const absl::Time mtime = absl::TimeFromTimespec(st.st_mtim);
    auto answer = Answer(req, op, entry->size, etag, mtime, [&](uint64_t begin, uint64_t n) {
      return CopyOut(fd, begin, n, req, 0, op);
    });
    close(fd);
    read.Finish(std::move(answer));
    return true;
  }
  return false;
}

void TierStore::Acquire(std::shared_ptr<PendingRead> read) {
  const std::string op = absl::StrCat("get ", inner_->Uri(read->request.key));
  if (read->cancelled()) {
    return read->Finish(absl::CancelledError(absl::StrCat(op, ": cancelled")));
  }
  if (Unkeepable(read->fill_path)) {
    // Its fill just failed here: around the tier at once (warned then).
    bypassed_.fetch_add(1, std::memory_order_relaxed);
    read->Unlock();
    inner_->GetAsync(read->request,
                     [read](absl::StatusOr<GetResult> r) { read->Finish(std::move(r)); });
    return;
  }
  const uint64_t stripe = std::hash<std::string>{}(tier_->Relative(read->fill_path)) % kLockStripes;
  // This process's own fills: a read of an object it is filling waits for that fill, and a
  // stripe it already holds (for another object) is shared, not fought over: flock excludes
  // per open file, so two fills of one process on one stripe would otherwise exclude each
  // other for a whole fetch.
  bool owned = false;
  bool parked = false;
  {
    absl::MutexLock lock(&fill_mu_);
    if (auto it = filling_.find(read->fill_path); it != filling_.end()) {
      it->second.push_back(read);
      parked = true;
    } else if (auto it = stripes_.find(stripe); it != stripes_.end()) {
      ++it->second.holders;
      filling_[read->fill_path];
      owned = true;
    }
  }
  if (parked) return Park(std::move(read));
  if (!owned) {
    if (read->lock_fd < 0) {
      auto fd = OpenStripe(*tier_, read->fill_path, op);
      // A tier this process may read but not write (another user's): around it.
      if (!fd.ok()) return ReadAround(read, fd.status());
      read->lock_fd = *fd;
    }
    if (flock(read->lock_fd, LOCK_EX | LOCK_NB) != 0) {
      // Another process fills on this stripe (or a thread of ours took it a moment ago; the
      // next try joins it): wait without holding a thread, then look again.
      const absl::Duration delay = read->backoff;
      read->backoff = std::min(read->backoff * 2, kMaxBackoff);
      runtime_->timer().After(delay, [self = shared_from_this(), read]() mutable {
        ThreadPool& pool = self->runtime_->blocking_pool();
        pool.Schedule([self = std::move(self), read = std::move(read)]() mutable {
          if (!self->ServeLocal(*read, /*after_fill=*/false)) self->Acquire(read);
          self.reset();
          read.reset();
        });
      });
      return;
    }
    absl::MutexLock lock(&fill_mu_);
    stripes_[stripe] = StripeLock{std::exchange(read->lock_fd, -1), 1};
    filling_[read->fill_path];
  }
  read->release = [self = shared_from_this(), stripe, path = read->fill_path] {
    self->ReleaseFill(stripe, path);
  };
  // Ours. Someone may have filled the object while we waited (whole, or as blocks when it
  // was big).
  if (ServeLocal(*read, /*after_fill=*/false)) return;
  const GetRequest& req = read->request;
  if (auto version =
          FindBlocks(read->fill_path, inner_->Uri(req.key), req.if_match, req.max_staleness, 0)) {
    read->Unlock();
    return ReadBlocks(std::move(read), *std::move(version), /*retried=*/false);
  }
  Fill(std::move(read));
}

// A read of an object that another read of this process fills waits for that fill without a
// thread; its cancellation (a fetch batch's, or Ctrl-C through its ambient token) takes it out
// of the wait at once rather than when the fill ends.
void TierStore::Park(std::shared_ptr<PendingRead> read) {
  auto unpark = [weak = weak_from_this(), raw = read.get(), path = read->fill_path]() {
    auto self = weak.lock();
    if (!self) return;
    std::shared_ptr<PendingRead> out;
    std::pair<uint64_t, uint64_t> ids;  // its registrations, as Park recorded them
    {
      absl::MutexLock lock(&self->fill_mu_);
      if (auto it = self->filling_.find(path); it != self->filling_.end()) {
        auto& waiting = it->second;
        for (auto w = waiting.begin(); w != waiting.end(); ++w) {
          if (w->get() != raw) continue;
          out = std::move(*w);
          waiting.erase(w);
          break;
        }
      }
      if (out) {
        ids = {std::exchange(out->parked_on_request, 0), std::exchange(out->parked_on_scope, 0)};
      }
    }
    // Not here: a callback of Cancel() must not block, and the read's end may (its caller's
    // callback runs when the read is dropped); nor may it forget the registration on the
    // other token (Forget waits for that token's callbacks, which may be forgetting ours).
    // The store goes to the pool too, even when the read was released by its fill a moment
    // ago: this reference may be the last, and its destructor must not run in Cancel().
    ThreadPool& pool = self->runtime_->blocking_pool();
    pool.Schedule([self = std::move(self), ids, out = std::move(out)]() mutable {
      if (out) {
        Unpark(*out, ids.first, ids.second);
        out->Finish(absl::CancelledError(
            absl::StrCat("get ", self->inner_->Uri(out->request.key), ": cancelled")));
        out.reset();
      }
      self.reset();
    });
  };
  // Registered with no lock held: a token cancelled already runs the callback inline.
  const uint64_t on_request = read->request.cancel ? read->request.cancel->OnCancel(unpark) : 0;
  const uint64_t on_scope = read->scope ? read->scope->OnCancel(unpark) : 0;
  bool kept = false;
  {
    absl::MutexLock lock(&fill_mu_);
    bool still_parked = false;
    if (auto it = filling_.find(read->fill_path); it != filling_.end()) {
      for (const auto& w : it->second) still_parked |= w.get() == read.get();
    }
    // Resumed and parked again meanwhile, the read may hold the callbacks of its next Park
    // already: they do the same, so ours go.
    if (still_parked && read->parked_on_request == 0 && read->parked_on_scope == 0) {
      read->parked_on_request = on_request;
      read->parked_on_scope = on_scope;
      kept = true;
    }
  }
  // Else its fill ended, or it was cancelled, or its next Park's callbacks stand for ours.
  if (!kept) Unpark(*read, on_request, on_scope);
}

void TierStore::Unpark(PendingRead& read, uint64_t on_request, uint64_t on_scope) {
  if (on_request != 0) read.request.cancel->Forget(on_request);
  if (on_scope != 0) read.scope->Forget(on_scope);
}

void TierStore::ReleaseFill(uint64_t stripe, const std::string& fill_path) {
  std::vector<std::shared_ptr<PendingRead>> waiting;
  std::vector<std::pair<uint64_t, uint64_t>> parked;
  int unlock_fd = -1;
  {
    absl::MutexLock lock(&fill_mu_);
    if (auto it = filling_.find(fill_path); it != filling_.end()) {
      waiting = std::move(it->second);
      filling_.erase(it);
    }
    for (const auto& read : waiting) {
      parked.emplace_back(std::exchange(read->parked_on_request, 0),
                          std::exchange(read->parked_on_scope, 0));
    }
    if (auto it = stripes_.find(stripe); it != stripes_.end() && --it->second.holders == 0) {
      unlock_fd = it->second.fd;
      stripes_.erase(it);
    }
  }
  if (unlock_fd >= 0) close(unlock_fd);  // releases the flock
  for (size_t i = 0; i < waiting.size(); ++i) {
    Unpark(*waiting[i], parked[i].first, parked[i].second);
  }
  for (std::shared_ptr<PendingRead>& read : waiting) {
    ScopedAmbientCancel own(read->scope);
    runtime_->blocking_pool().Schedule(
        [self = shared_from_this(), read = std::move(read)]() mutable {
          if (!self->ServeLocal(*read, /*after_fill=*/false)) self->Acquire(read);
          self.reset();
          read.reset();
        });
  }
}

void TierStore::Fill(std::shared_ptr<PendingRead> read) {
  const std::string& key = read->request.key;
  const std::string op = absl::StrCat("get ", inner_->Uri(key));
  auto temp_dir = tier_->TempDir();
  if (!temp_dir.ok()) return ReadAround(read, Annotate(temp_dir.status(), op));
  // A CRC32C, not an MD5: the entry's ETag is the source's, so the checksum only has to let
  // `verify` find damage, and an MD5 of every filled byte was a fifth of a fill's CPU.
  auto temp = TempObject::Create(read->fill_path, *temp_dir, Checksum::kCrc32c);
  if (!temp.ok()) return ReadAround(read, Annotate(temp.status(), op));
  read->temp = *std::move(temp);
  // A reader of the whole object into a buffer gets the bytes there as they arrive, and the
  // file is written from it. Not with an If-None-Match: a not-modified answer leaves the
  // buffer untouched.
  const GetRequest& req = read->request;
  const bool direct = req.sink == nullptr && req.range.is_all() && req.if_none_match.empty();
  read->sink = std::make_unique<SpillSink>(
      read->temp.get(), *temp_dir, absl::StrCat(read->fill_path, kTierBlocksSuffix, "/spilled-"),
      tier_->config().block_size, tier_->config().block_threshold, kKeepFilled,
      direct ? req.buffer : absl::Span<char>());
  GetRequest whole;
  whole.key = key;
  whole.sink = read->sink.get();
  whole.cancel = read->request.cancel;
  // A stale copy (ttl mode) is revalidated: an unchanged object answers 304 with no body.
  struct stat st;
  if (stat(read->fill_path.c_str(), &st) == 0) {
    read->stale = ReadEntryAttr(read->fill_path);
    // A copy `tier verify` found damaged is fetched whole again, never revalidated.
    if (Servable(read->stale, st) && !read->stale->etag.empty()) {
      whole.if_none_match = read->stale->etag;
    } else {
      read->stale.reset();
    }
  }
  inner_->GetAsync(std::move(whole), [self = shared_from_this(),
                                      read](absl::StatusOr<GetResult> got) mutable {
    // Sealing and publishing are syscalls: off the backing store's thread.
    ThreadPool& pool = self->runtime_->blocking_pool();
    pool.Schedule([self = std::move(self), read = std::move(read), got = std::move(got)]() mutable {
      if (got.ok()) read->fetched_first_byte = got->time_to_first_byte;
      const std::string what =
          absl::StrCat("get ", self->inner_->Uri(read->request.key), ": filling the tier");
      absl::Status written;
      if (got.ok() && !got->not_modified) written = read->sink->Finish();
      if (!got.ok() && read->sink->failed()) {
        // The GET stopped because the tier could not take its bytes (a full disk).
        self->ReadAround(read, got.status());
      } else if (!written.ok()) {
        self->FillFailed(read, *got, Annotate(written, what));
      } else if (got.ok() && !got->not_modified && !got->meta.etag.empty() &&
                 got->meta.size > self->tier_->config().block_threshold) {
        self->PublishAsBlocks(read, *got);
      } else {
        self->Publish(read, got);
      }
      // The store first: the read (and the caller's callback with it) may be delivered when
      // `read` goes, and the caller may drop its last reference to the store there.
      self.reset();
      read.reset();
    });
  });
}

void TierStore::Publish(const std::shared_ptr<PendingRead>& pending,
                        const absl::StatusOr<GetResult>& got) {
  PendingRead& read = *pending;
  const std::string uri = inner_->Uri(read.request.key);
  if (!got.ok()) return read.Finish(got.status());
  if (got->not_modified && read.stale.has_value()) {
    // Unchanged at the source: the copy is current again.
    TierEntry fresh = *read.stale;
    fresh.filled = absl::Now();
    absl::Status s = WriteEntryAttr(read.fill_path, fresh);
    if (!s.ok()) return read.Finish(Annotate(s, absl::StrCat("get ", uri, ": revalidating")));
    revalidated_.fetch_add(1, std::memory_order_relaxed);
    read.temp.reset();
    read.Unlock();
    if (!ServeLocal(read, /*after_fill=*/true)) {
      read.Finish(absl::UnavailableError(
          absl::StrCat("get ", uri, ": the tier's copy vanished while it was revalidated")));
    }
    return;
  }
  if (read.sink->bytes() != got->meta.size) {
    return read.Finish(absl::DataLossError(absl::StrCat(
        "get ", uri, ": received ", read.sink->bytes(), " of ", got->meta.size, " bytes")));
  }
  if (!read.sink->spilled().empty()) {  // big, and no ETag to name its blocks by
    return read.Finish(absl::UnimplementedError(
        absl::StrCat("get ", uri,
                     ": an object above the tier's block threshold without an "
                     "ETag cannot be cached")));
  }
  TierEntry entry;
  absl::Time mtime;
  // A stale copy the user pinned stays pinned when the new version replaces it.
  const bool keep_pin = read.stale.has_value() && IsPinned(read.fill_path);
  auto sealed =
      read.temp->Seal(SourceTime(got->meta), /*fsync=*/false, [&](int fd, const ObjectMeta& m) {
        entry.source = uri;
        entry.etag = got->meta.etag;
        entry.size = m.size;
        entry.crc32c = read.temp->checksum();
        entry.filled = absl::Now();
        struct stat st;
        mtime = fstat(fd, &st) == 0 ? absl::TimeFromTimespec(st.st_mtim) : entry.filled;
        WHARF_RETURN_IF_ERROR(WriteEntryAttr(fd, entry));
        return keep_pin ? SetPinned(read.temp->path(), true) : absl::OkStatus();
      });
  // A small object's bytes are still in memory (ours, or already in the reader's buffer): the
  // read is answered from them (the file holds the same bytes, checked by size), with the
  // attributes a read of the entry gives. Otherwise the read is served from the new entry, under a
  // reader's shared lock taken before it is published: no eviction pass (this process's below, or
  // another's) can take it meanwhile.
  const std::optional<absl::string_view> in_memory = read.sink->held();
  const int held = sealed.ok() && !in_memory.has_value()
                       ? open(read.temp->path().c_str(), O_RDONLY | O_CLOEXEC)
                       : -1;
  if (held >= 0) flock(held, LOCK_SH);
  absl::Status published = sealed.ok() ? read.temp->Publish() : sealed.status();
  if (!published.ok()) {
    if (held >= 0) close(held);
    return FillFailed(pending, *got,
                      Annotate(published, absl::StrCat("get ", uri, ": filling the tier")));
  }
  read.temp.reset();
  Count(fills_);
  Count(fill_bytes_, got->meta.size);
  MaybeEvict(got->meta.size);
  read.Unlock();
  if (in_memory.has_value()) return ServeFilled(read, entry, mtime, *in_memory);
  const bool served = ServeLocal(read, /*after_fill=*/true);
  if (held >= 0) close(held);
  if (!served) {
    read.Finish(absl::UnavailableError(
        absl::StrCat("get ", uri, ": the tier's copy vanished right after it was filled")));
  }
}

void TierStore::FillFailed(const std::shared_ptr<PendingRead>& pending, const GetResult& got,
                           const absl::Status& why) {
  PendingRead& read = *pending;
  // The object was fetched whole: a small one's bytes are still in memory and answer the
  // read; otherwise it is read again, around the tier.
  const std::optional<absl::string_view> in_memory = read.sink->held();
  if (!in_memory.has_value() || in_memory->size() != got.meta.size) {
    return ReadAround(pending, why);
  }
  WarnReadAround(why);
  bypassed_.fetch_add(1, std::memory_order_relaxed);
  RememberUnkeepable(read.fill_path);
  read.temp.reset();
  read.Unlock();
  TierEntry entry;
  entry.source = inner_->Uri(read.request.key);
  entry.etag = got.meta.etag;
  entry.size = got.meta.size;
  ServeFilled(read, entry, got.meta.mtime, *in_memory);
}

void TierStore::ReadAround(const std::shared_ptr<PendingRead>& read, const absl::Status& why) {
  WarnReadAround(why);
  bypassed_.fetch_add(1, std::memory_order_relaxed);
  RememberUnkeepable(read->fill_path);
  read->temp.reset();
  read->Unlock();
  // Delivered through the read (when its last reference goes), as every other outcome.
  inner_->GetAsync(read->request,
                   [read](absl::StatusOr<GetResult> r) { read->Finish(std::move(r)); });
}

void TierStore::RememberUnkeepable(const std::string& fill_path) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&fill_mu_);
  if (unkeepable_.size() >= kMaxUnkeepable) {
    std::erase_if(unkeepable_, [&](const auto& e) { return e.second <= now; });
    if (unkeepable_.size() >= kMaxUnkeepable) unkeepable_.clear();
  }
  unkeepable_[fill_path] = now + kUnkeepableFor;
}

bool TierStore::Unkeepable(const std::string& fill_path) {
  absl::MutexLock lock(&fill_mu_);
  auto it = unkeepable_.find(fill_path);
  if (it == unkeepable_.end()) return false;
  if (it->second > absl::Now()) return true;
  unkeepable_.erase(it);
  return false;
}

void TierStore::WarnReadAround(const absl::Status& why) {
  if (warned_read_around_.exchange(true)) return;
  std::fprintf(stderr,
               "wharf: %s; reading around the tier %s (this process warns once; other "
               "objects it cannot hold are read from the store the same way)\n",
               std::string(why.message()).c_str(), tier_->root().c_str());
}

void TierStore::ServeFilled(PendingRead& read, const TierEntry& entry, absl::Time mtime,
                            absl::string_view data) {
  const GetRequest& req = read.request;
  const std::string op = absl::StrCat("get ", inner_->Uri(req.key));
  const std::string etag = EntryEtag(entry);
  if (!req.if_match.empty() && req.if_match != etag) {
    return read.Finish(absl::FailedPreconditionError(
        absl::StrCat(op, ": object changed (etag ", etag, ", expected ", req.if_match, ")")));
  }
  read.Finish(Answer(req, op, entry.size, etag, mtime, [&](uint64_t begin, uint64_t n) {
    return CopyOutBytes(data, begin, n, req);
  }));
}

void TierStore::MaybeEvict(uint64_t filled) {
  const TierConfig& c = tier_->config();
  if (c.max_size == 0 && c.min_free <= 0) return;
  // Usage is disk space (evict.h): the new entry's until the next pass measures it.
  filled = EstimatedDiskBytes(filled);
  filled_since_pass_.fetch_add(filled, std::memory_order_relaxed);
  unrecorded_.fetch_add(filled, std::memory_order_relaxed);
  filled_since_free_check_.fetch_add(filled, std::memory_order_relaxed);
  // What the tier holds: known after this process's first pass, plus what it filled since.
  // Before that, a tier bounded only by free space is checked with statvfs alone, so a
  // process does not walk the whole tier at its first fill when nothing asks it to.
  // A process's first fill starts from the usage the tier's last pass recorded (read once).
  if (!usage_read_.exchange(true)) {
    if (auto last = tier_->LastUsage()) {
      int64_t unknown = -1;
      usage_.compare_exchange_strong(unknown, static_cast<int64_t>(*last));
    }
  }
  auto over = [&] {
    const int64_t usage = usage_.load(std::memory_order_relaxed);
    if (c.max_size > 0 &&
        (usage < 0 || static_cast<uint64_t>(usage) + filled_since_pass_.load() > c.max_size)) {
      return true;
    }
    return FreeSpaceLow();
  };
  // The pass runs here, in the read that found the tier over its bounds, before that read is
  // delivered: so the fills a program waited for are within bounds when it finishes. One
  // pass at a time per process (a concurrent over-bound fill leaves it to the running pass,
  // which looks again when it ends) and per tier (the pass's flock).
  if (filled_since_pass_.load(std::memory_order_relaxed) <
      fruitless_skip_.load(std::memory_order_relaxed)) {
    return;  // the last pass found nothing it could evict: not yet worth another walk
  }
  while (over() && !evicting_.exchange(true)) {
    filled_since_pass_.store(0);
    const uint64_t unrecorded = unrecorded_.exchange(0);
    std::string warning;
    auto pass = EvictToBounds(*tier_, /*wait=*/false, &warning);
    if (!warning.empty()) std::fprintf(stderr, "wharf: %s\n", warning.c_str());
    const bool ran = pass.ok() && pass->ran;
    if (!ran) unrecorded_.fetch_add(unrecorded);  // no pass measured them: still to record
    if (ran) {
      usage_.store(static_cast<int64_t>(pass->disk_bytes - pass->evicted_disk_bytes));
      evictions_.fetch_add(pass->evicted, std::memory_order_relaxed);
    }
    free_check_skip_.store(0);  // look at the free space again after a pass
    // The pass found the tier within its size bound, and fills published while it walked
    // put it over: look again (the next pass counts them), as when it evicted something.
    const bool filled_during_pass =
        ran && c.max_size > 0 && pass->disk_bytes <= c.max_size &&
        pass->disk_bytes - pass->evicted_disk_bytes + filled_since_pass_.load() > c.max_size;
    // Still over its bounds with nothing evicted: all that is left is in use.
    const bool fruitless = ran && pass->evicted == 0 && !filled_during_pass && over();
    fruitless_skip_.store(fruitless ? std::max<uint64_t>(c.block_size, c.max_size / 100) : 0);
    evicting_.store(false);
    if (fruitless && !warned_over_bound_.exchange(true)) {
      std::fprintf(stderr,
                   "wharf: the tier %s is over its bounds and nothing more can be evicted now "
                   "(%llu entries being read, %llu pinned, %llu not yet exported); reads go "
                   "on and it is evicted again as they end (this process warns once)\n",
                   tier_->root().c_str(), static_cast<unsigned long long>(pass->kept_busy),
                   static_cast<unsigned long long>(pass->kept_pinned),
                   static_cast<unsigned long long>(pass->kept_local));
    }
    // Another process's pass holds the tier (it is seeing to it), or this one could not
    // get closer: what is left is in use until reads end.
    if (!ran || fruitless) break;
  }
}

bool TierStore::FreeSpaceLow() {
  if (tier_->config().min_free <= 0) return false;
  // Not a statvfs per fill (strace: one per fill before). The free space cannot fall
  // below min_free before this process has written the room it last saw above it: it looks
  // again after an eighth of that (other processes filling the same file system count too,
  // hence the margin).
  if (filled_since_free_check_.load(std::memory_order_relaxed) <
      free_check_skip_.load(std::memory_order_relaxed)) {
    return false;
  }
  filled_since_free_check_.store(0, std::memory_order_relaxed);
  const std::optional<int64_t> free = FreeAboveMinFree(*tier_);
  free_check_skip_.store(free.has_value() && *free > 0 ? static_cast<uint64_t>(*free) / 8 : 0,
                         std::memory_order_relaxed);
  return free.has_value() && *free < 0;
}

// ---- Blocks of big objects ----

std::string TierStore::BlockPath(const std::string& fill_path, const std::string& etag,
                                 uint64_t index) const {
  return absl::StrCat(fill_path, kTierBlocksSuffix, "/", TierBlockVersionDir(etag), "/", index);
}

std::optional<TierStore::Version> TierStore::FindBlocks(const std::string& fill_path,
                                                        const std::string& uri,
                                                        const std::string& if_match,
                                                        absl::Duration max_staleness,
                                                        uint64_t hint) const {
  const std::string blocks = absl::StrCat(fill_path, kTierBlocksSuffix);
  std::vector<std::string> versions;
  if (!if_match.empty()) {
    versions.push_back(TierBlockVersionDir(if_match));
  } else {
    DIR* dir = opendir(blocks.c_str());
    if (dir == nullptr) return std::nullopt;
    while (struct dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') versions.emplace_back(e->d_name);
    }
    closedir(dir);
  }
  const TierConfig& c = tier_->config();
  const absl::Duration ttl = std::max(c.ttl, max_staleness);
  const absl::Time now = absl::Now();
  std::optional<Version> best;
  absl::Time best_filled = absl::InfinitePast();
  for (const std::string& version : versions) {
    const std::string dir = absl::StrCat(blocks, "/", version);
    // True when the block at `path` is a fresh block of this object in this directory.
    auto consider = [&](const std::string& path) {
      struct stat st;
      if (stat(path.c_str(), &st) != 0) return false;
      const auto entry = ReadEntryAttr(path);
      if (!IsCompleteEntry(entry, st) || !entry->block || entry->source != uri ||
          entry->object_size == 0 || TierBlockVersionDir(entry->etag) != version ||
          (!if_match.empty() && entry->etag != if_match)) {
        return false;
      }
      if (c.mode != TierConfig::Mode::kImmutable && now - entry->filled > ttl) return false;
      if (entry->filled > best_filled) {
        best = Version{entry->object_size, entry->etag, false};
        best_filled = entry->filled;
      }
      return true;
    };
    if (consider(absl::StrCat(dir, "/", hint))) continue;
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) continue;
    std::vector<std::string> names;
    while (struct dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') names.emplace_back(e->d_name);
    }
    closedir(d);
    for (const std::string& name : names) {
      if (consider(absl::StrCat(dir, "/", name))) break;
    }
  }
  return best;
}

void TierStore::RememberHead(const std::string& key, const ObjectMeta& meta) {
  if (meta.etag.empty()) return;
  absl::MutexLock lock(&heads_mu_);
  if (heads_.size() >= 4096) heads_.clear();  // a memo, not a cache: bounded the simple way
  heads_[key] = HeadMemo{Version{meta.size, meta.etag, true}, absl::Now()};
}

std::optional<TierStore::Version> TierStore::RecentHead(const std::string& key) {
  constexpr absl::Duration kHeadMemo = absl::Seconds(2);
  absl::MutexLock lock(&heads_mu_);
  auto it = heads_.find(key);
  if (it == heads_.end()) return std::nullopt;
  if (absl::Now() - it->second.at > std::min(kHeadMemo, tier_->config().ttl)) {
    heads_.erase(it);
    return std::nullopt;
  }
  return it->second.version;
}

void TierStore::Discover(std::shared_ptr<PendingRead> read, bool retried) {
  std::string key = read->request.key;
  inner_->HeadAsync(std::move(key), [self = shared_from_this(), read,
                                     retried](absl::StatusOr<ObjectMeta> meta) mutable {
    ThreadPool& pool = self->runtime_->blocking_pool();
    pool.Schedule([self = std::move(self), read = std::move(read), retried,
                   meta = std::move(meta)]() mutable {
      const GetRequest& req = read->request;
      if (meta.ok()) self->RememberHead(req.key, *meta);
      if (!meta.ok()) {
        read->Finish(meta.status());
      } else if (!req.if_match.empty() && meta->etag != req.if_match) {
        read->Finish(absl::FailedPreconditionError(
            absl::StrCat("get ", self->inner_->Uri(req.key), ": object changed (etag ", meta->etag,
                         ", expected ", req.if_match, ")")));
      } else if (meta->size > self->tier_->config().block_threshold && !meta->etag.empty()) {
        self->ReadBlocks(read, Version{meta->size, meta->etag, true}, retried);
      } else {
        if (!read->counted) {
          read->counted = true;
          self->Count(self->misses_);
        }
        // Small now: blocks it had are of an older version.
        RemoveBlockVersions(absl::StrCat(read->fill_path, kTierBlocksSuffix), "");
        self->Acquire(read);
      }
      self.reset();
      read.reset();
    });
  });
}

void TierStore::ReadBlocks(std::shared_ptr<PendingRead> read, Version version, bool retried) {
  const GetRequest& req = read->request;
  auto br = std::make_shared<BlockRead>();
  br->uri = inner_->Uri(req.key);
  const std::string op = absl::StrCat("get ", br->uri);
  br->blocks_dir = absl::StrCat(read->fill_path, kTierBlocksSuffix);
  br->retried = retried;
  br->pinned = IsPinned(br->blocks_dir);
  br->result.meta.key = req.key;
  br->result.meta.size = version.size;
  br->result.meta.etag = version.etag;
  br->read = read;
  br->version = std::move(version);
  if (!req.if_none_match.empty() && req.if_none_match == br->version.etag) {
    if (!read->counted) Count(hits_);
    read->counted = true;
    br->result.not_modified = true;
    return read->Finish(std::move(br->result));
  }
  auto range = req.range.Resolve(br->version.size);
  if (!range.ok()) return read->Finish(Annotate(range.status(), op));
  std::tie(br->begin, br->end) = *range;
  if (req.sink == nullptr && req.buffer.size() < br->end - br->begin) {
    return read->Finish(absl::OutOfRangeError(absl::StrCat(
        op, ": the buffer holds ", req.buffer.size(), " bytes, the range ", br->end - br->begin)));
  }
  br->result.offset = br->begin;
  br->result.bytes = br->end - br->begin;
  const uint64_t block = tier_->config().block_size;
  br->next_block = br->begin / block;
  br->end_block = br->end == br->begin ? br->next_block : (br->end - 1) / block + 1;
  StartWindow(std::move(br));
}

void TierStore::StartWindow(std::shared_ptr<BlockRead> br) {
  const uint64_t block = tier_->config().block_size;
  const uint64_t stop = std::min<uint64_t>(br->end_block, br->next_block + kBlockWindow);
  br->window.clear();
  for (uint64_t i = br->next_block; i < stop; ++i) {
    auto slot = std::make_unique<BlockSlot>();
    slot->index = i;
    slot->length = std::min(block, br->version.size - i * block);
    slot->path = BlockPath(br->read->fill_path, br->version.etag, i);
    br->window.push_back(std::move(slot));
  }
  br->next_block = stop;
  if (br->window.empty()) {  // an empty range
    ServeWindow(br);
    return;
  }
  br->pending.store(static_cast<int>(br->window.size()));
  // The first block on this thread, the others on the pool.
  for (size_t i = 1; i < br->window.size(); ++i) {
    BlockSlot* slot = br->window[i].get();
    runtime_->blocking_pool().Schedule([self = shared_from_this(), br, slot]() mutable {
      self->StepBlock(br, *slot);
      self.reset();
      br.reset();
    });
  }
  StepBlock(br, *br->window[0]);
}

bool TierStore::OpenBlock(const BlockRead& br, BlockSlot& slot) {
  const int fd = open(slot.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  std::optional<TierEntry> entry;
  if (fstat(fd, &st) == 0) entry = ReadEntryAttr(fd);
  if (!Servable(entry, st) || !entry->block || entry->etag != br.version.etag ||
      entry->source != br.uri || entry->object_size != br.version.size ||
      entry->block_offset != slot.index * tier_->config().block_size ||
      entry->size != slot.length) {
    close(fd);
    return false;
  }
  // Held while the bytes are read: an eviction pass skips what it cannot lock.
  flock(fd, LOCK_SH);
  TouchEntry(fd, *entry);
  // The source confirmed this version during this read: the block is current again.
  if (br.version.confirmed && tier_->config().mode != TierConfig::Mode::kImmutable &&
      absl::Now() - entry->filled > tier_->config().ttl) {
    entry->filled = absl::Now();
    (void)WriteEntryAttr(fd, *entry);  // best effort: else the next read asks again
  }
  slot.fd = fd;
  return true;
}

void TierStore::StepBlock(const std::shared_ptr<BlockRead>& br, BlockSlot& slot) {
  if (OpenBlock(*br, slot)) return SlotDone(br);
  const std::string op = absl::StrCat("get ", br->uri, " (block ", slot.index, ")");
  if (br->read->cancelled()) {
    slot.status = absl::CancelledError(absl::StrCat(op, ": cancelled"));
    return SlotDone(br);
  }
  if (slot.lock_fd < 0) {
    auto fd = OpenStripe(*tier_, slot.path, op);
    if (!fd.ok()) {
      slot.status = fd.status();
      slot.around = true;
      return SlotDone(br);
    }
    slot.lock_fd = *fd;
  }
  if (flock(slot.lock_fd, LOCK_EX | LOCK_NB) != 0) {
    // Another reader fills this block: wait without holding a thread, then look again.
    const absl::Duration delay = slot.backoff;
    slot.backoff = std::min(slot.backoff * 2, kMaxBackoff);
    runtime_->timer().After(delay, [self = shared_from_this(), br, slot = &slot]() mutable {
      ThreadPool& pool = self->runtime_->blocking_pool();
      pool.Schedule([self = std::move(self), br = std::move(br), slot]() mutable {
        self->StepBlock(br, *slot);
        self.reset();
        br.reset();
      });
    });
    return;
  }
  // Ours. Someone may have filled the block while we waited.
  if (OpenBlock(*br, slot)) {
    slot.Unlock();
    return SlotDone(br);
  }
  FillBlock(br, &slot);
}

void TierStore::FillBlock(std::shared_ptr<BlockRead> br, BlockSlot* slot) {
  const std::string op = absl::StrCat("get ", br->uri, " (block ", slot->index, ")");
  auto temp_dir = tier_->TempDir();
  auto temp = temp_dir.ok() ? TempObject::Create(slot->path, *temp_dir, Checksum::kCrc32c)
                            : absl::StatusOr<std::unique_ptr<TempObject>>(temp_dir.status());
  if (!temp.ok()) {
    slot->status = Annotate(temp.status(), op);
    slot->around = true;
    slot->Unlock();
    return SlotDone(br);
  }
  slot->temp = *std::move(temp);
  slot->sink = std::make_unique<FileSink>(slot->temp.get());
  GetRequest ranged;
  ranged.key = br->read->request.key;
  ranged.range = ByteRange::Of(slot->index * tier_->config().block_size, slot->length);
  ranged.sink = slot->sink.get();
  ranged.if_match = br->version.etag;  // never a block of another version
  ranged.cancel = br->read->request.cancel;
  inner_->GetAsync(std::move(ranged),
                   [self = shared_from_this(), br, slot](absl::StatusOr<GetResult> got) mutable {
                     // Sealing and publishing are syscalls: off the backing store's thread.
                     ThreadPool& pool = self->runtime_->blocking_pool();
                     pool.Schedule([self = std::move(self), br = std::move(br), slot,
                                    got = std::move(got)]() mutable {
                       self->PublishBlock(br, *slot, got);
                       self.reset();
                       br.reset();
                     });
                   });
}

void TierStore::PublishBlock(const std::shared_ptr<BlockRead>& br, BlockSlot& slot,
                             const absl::StatusOr<GetResult>& got) {
  const std::string op = absl::StrCat("get ", br->uri, " (block ", slot.index, ")");
  const uint64_t offset = slot.index * tier_->config().block_size;
  absl::Status status;
  if (!got.ok()) {
    status = got.status();
  } else if (slot.sink->bytes() != slot.length || got->offset != offset) {
    status =
        absl::DataLossError(absl::StrCat(op, ": received ", slot.sink->bytes(), " bytes at ",
                                         got->offset, ", expected ", slot.length, " at ", offset));
  } else if (got->meta.size != br->version.size) {
    status = absl::FailedPreconditionError(absl::StrCat(
        op, ": object changed (size ", got->meta.size, ", expected ", br->version.size, ")"));
  }
  int held = -1;
  // What went wrong from here on (or in writing what was fetched) is the tier's.
  bool tier_failed = !got.ok() && slot.sink->failed();
  if (status.ok()) {
    tier_failed = true;
    auto sealed =
        slot.temp->Seal(SourceTime(got->meta), /*fsync=*/false, [&](int fd, const ObjectMeta& m) {
          TierEntry entry;
          entry.source = br->uri;
          entry.etag = br->version.etag;
          entry.size = m.size;
          entry.crc32c = slot.temp->checksum();
          entry.filled = absl::Now();
          entry.block = true;
          entry.block_offset = offset;
          entry.object_size = br->version.size;
          return WriteEntryAttr(fd, entry);
        });
    status = sealed.status();
    if (status.ok() && br->pinned) status = SetPinned(slot.temp->path(), true);
    // A reader's lock from before it is published until it is served (as whole fills).
    if (status.ok()) held = open(slot.temp->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (held >= 0) flock(held, LOCK_SH);
    if (status.ok()) status = slot.temp->Publish();
    if (!status.ok()) status = Annotate(status, absl::StrCat(op, ": filling the tier"));
  }
  slot.temp.reset();
  slot.sink.reset();
  slot.Unlock();
  if (!status.ok()) {
    if (held >= 0) close(held);
    slot.status = status;
    slot.around = tier_failed;
    return SlotDone(br);
  }
  slot.fd = held;
  br->filled = true;
  Count(fills_);
  block_fills_.fetch_add(1, std::memory_order_relaxed);
  Count(fill_bytes_, slot.length);
  MaybeEvict(slot.length);
  SlotDone(br);
}

void TierStore::SlotDone(const std::shared_ptr<BlockRead>& br) {
  if (br->pending.fetch_sub(1) == 1) ServeWindow(br);
}

void TierStore::ServeWindow(const std::shared_ptr<BlockRead>& br) {
  PendingRead& read = *br->read;
  const GetRequest& req = read.request;
  absl::Status status;
  for (const auto& slot : br->window) {
    if (slot->around) break;  // the bytes before it are served, then the rest goes around
    if (!slot->status.ok()) {
      status = slot->status;
      break;
    }
  }
  const uint64_t block = tier_->config().block_size;
  for (const auto& slot : br->window) {
    if (!status.ok()) break;
    const uint64_t start = slot->index * block;
    if (slot->around) {
      // Bytes up to here were served from blocks; the rest of the read goes around the
      // tier (in order: a sink takes them after what it has).
      const absl::Status why = slot->status;
      br->window.clear();
      return ReadRestAround(br, std::max(br->begin, start), why);
    }
    const uint64_t from = std::max(br->begin, start);
    const uint64_t to = std::min(br->end, start + slot->length);
    if (br->result.meta.mtime == absl::InfinitePast()) {
      struct stat st;
      if (fstat(slot->fd, &st) == 0) br->result.meta.mtime = absl::TimeFromTimespec(st.st_mtim);
    }
    status = CopyOut(slot->fd, from - start, to - from, req, from - br->begin,
                     absl::StrCat("get ", br->uri, " (block ", slot->index, ")"));
  }
  br->window.clear();  // closes the blocks: their reader's locks go
  if (status.ok() && br->next_block < br->end_block) {
    // The next window from a task of its own (not deeper on this stack).
    runtime_->blocking_pool().Schedule(
        [self = shared_from_this(), br = std::shared_ptr<BlockRead>(br)]() mutable {
          self->StartWindow(br);
          self.reset();
          br.reset();
        });
    return;
  }
  if (!read.counted) {
    read.counted = true;
    (br->filled ? misses_ : hits_).fetch_add(1, std::memory_order_relaxed);
  }
  if (!status.ok()) {
    // The object changed at the source since its version was learnt (an immutable tier's
    // blocks of an old version, or a HEAD just before a write): look it up again, once,
    // unless the caller asked for that version.
    if (absl::IsFailedPrecondition(status) && req.if_match.empty() && !br->retried) {
      return Discover(br->read, /*retried=*/true);
    }
    return read.Finish(std::move(status));
  }
  if (br->filled) RemoveBlockVersions(br->blocks_dir, TierBlockVersionDir(br->version.etag));
  read.Finish(std::move(br->result));
}

void TierStore::ReadRestAround(const std::shared_ptr<BlockRead>& br, uint64_t from,
                               const absl::Status& why) {
  WarnReadAround(why);
  bypassed_.fetch_add(1, std::memory_order_relaxed);
  PendingRead& read = *br->read;
  if (!read.counted) {
    read.counted = true;
    Count(misses_);
  }
  GetRequest rest = read.request;
  rest.range = ByteRange::Of(from, br->end - from);
  rest.if_match = br->version.etag;  // the same version as the blocks served before
  rest.if_none_match.clear();
  if (rest.sink == nullptr) rest.buffer = rest.buffer.subspan(from - br->begin);
  inner_->GetAsync(std::move(rest),
                   [self = shared_from_this(), br, from](absl::StatusOr<GetResult> got) mutable {
                     PendingRead& read = *br->read;
                     if (!got.ok()) return read.Finish(got.status());
                     if (got->offset != from || got->bytes != br->end - from) {
                       return read.Finish(absl::DataLossError(
                           absl::StrCat("get ", br->uri, ": received ", got->bytes, " bytes at ",
                                        got->offset, ", expected ", br->end - from, " at ", from)));
                     }
                     if (br->result.meta.mtime == absl::InfinitePast())
                       br->result.meta.mtime = got->meta.mtime;
                     if (!br->filled) return read.Finish(std::move(br->result));
                     // Older versions' blocks go (as after a read served from blocks): syscalls,
                     // off the backing store's thread.
                     self->runtime_->blocking_pool().Schedule([br = std::move(br)]() mutable {
                       RemoveBlockVersions(br->blocks_dir, TierBlockVersionDir(br->version.etag));
                       br->read->Finish(std::move(br->result));
                       br.reset();
                     });
                     self.reset();
                   });
}

void TierStore::PublishAsBlocks(std::shared_ptr<PendingRead> read, const GetResult& got) {
  const std::string uri = inner_->Uri(read->request.key);
  const std::string op = absl::StrCat("get ", uri, ": filling the tier");
  if (read->sink->bytes() != got.meta.size) {
    return read->Finish(absl::DataLossError(absl::StrCat(
        "get ", uri, ": received ", read->sink->bytes(), " of ", got.meta.size, " bytes")));
  }
  auto temp_dir = tier_->TempDir();
  if (!temp_dir.ok()) return ReadAround(read, Annotate(temp_dir.status(), op));
  const int src = open(read->temp->path().c_str(), O_RDONLY | O_CLOEXEC);
  if (src < 0) return ReadAround(read, ErrnoToStatus(errno, op));
  const std::string blocks_dir = absl::StrCat(read->fill_path, kTierBlocksSuffix);
  const bool pinned = IsPinned(blocks_dir);
  const uint64_t block = tier_->config().block_size;
  absl::Status status;
  uint64_t blocks = 0;
  std::string buf;
  // The part of the object in the whole file is cut into blocks (at most about the threshold
  // copied, once per object); the blocks past it were written as blocks while they streamed.
  // Each is an entry of its own, so eviction can drop parts of the object and ranged reads
  // find what they need.
  auto seal_and_publish = [&](TempObject& temp, uint64_t offset) -> absl::Status {
    auto sealed =
        temp.Seal(SourceTime(got.meta), /*fsync=*/false, [&](int fd, const ObjectMeta& m) {
          TierEntry entry;
          entry.source = uri;
          entry.etag = got.meta.etag;
          entry.size = m.size;
          entry.crc32c = temp.checksum();
          entry.filled = absl::Now();
          entry.block = true;
          entry.block_offset = offset;
          entry.object_size = got.meta.size;
          return WriteEntryAttr(fd, entry);
        });
    WHARF_RETURN_IF_ERROR(sealed.status());
    if (pinned) WHARF_RETURN_IF_ERROR(SetPinned(temp.path(), true));
    ++blocks;
    return temp.PublishAt(BlockPath(read->fill_path, got.meta.etag, offset / block));
  };
  const uint64_t in_whole = std::min(got.meta.size, read->sink->spill_at());
  for (uint64_t offset = 0; status.ok() && offset < in_whole; offset += block) {
    const uint64_t length = std::min(block, in_whole - offset);
    auto temp = TempObject::Create(BlockPath(read->fill_path, got.meta.etag, offset / block),
                                   *temp_dir, Checksum::kCrc32c);
    if (!temp.ok()) {
      status = temp.status();
      break;
    }
    for (uint64_t off = offset; status.ok() && off < offset + length;) {
      buf.resize(std::min<uint64_t>(offset + length - off, kSinkChunk));
      const ssize_t n = pread(src, buf.data(), buf.size(), static_cast<off_t>(off));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        status = n < 0 ? ErrnoToStatus(errno, "reading the fetched copy")
                       : absl::DataLossError("the fetched copy ended early");
        break;
      }
      status = (*temp)->Append(absl::string_view(buf.data(), n));
      off += n;
    }
    if (status.ok()) status = seal_and_publish(**temp, offset);
  }
  uint64_t offset = in_whole;
  for (auto& temp : read->sink->spilled()) {
    if (!status.ok()) break;
    status = seal_and_publish(*temp, offset);
    offset += block;
  }
  close(src);
  read->temp.reset();
  read->sink.reset();
  read->Unlock();
  if (!status.ok()) return ReadAround(read, Annotate(status, op));
  Count(fills_, blocks);
  block_fills_.fetch_add(blocks, std::memory_order_relaxed);
  Count(fill_bytes_, got.meta.size);
  RemoveBlockVersions(blocks_dir, TierBlockVersionDir(got.meta.etag));
  if (read->stale.has_value()) unlink(read->fill_path.c_str());  // a whole copy, stale
  MaybeEvict(got.meta.size);
  // Served from the blocks (one the eviction pass took meanwhile is fetched again).
  ReadBlocks(std::move(read), Version{got.meta.size, got.meta.etag, true}, /*retried=*/false);
}

void TierStore::Forget(const std::string& key) {
  if (auto path = FillPath(key)) {
    unlink(path->c_str());
    std::error_code ignored;
    std::filesystem::remove_all(absl::StrCat(*path, kTierBlocksSuffix), ignored);
  }
}

void TierStore::PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                         Callback<ObjectMeta> done) {
  std::string k = key;
  inner_->PutAsync(std::move(key), std::move(data), options,
                   [self = shared_from_this(), k = std::move(k),
                    done = std::move(done)](absl::StatusOr<ObjectMeta> meta) mutable {
                     self->Forget(k);
                     self.reset();
                     std::move(done)(std::move(meta));
                   });
}

absl::StatusOr<std::unique_ptr<ObjectWriter>> TierStore::NewWriter(std::string key,
                                                                   const PutOptions& options) {
  WHARF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer, inner_->NewWriter(key, options));
  return std::make_unique<ForgettingWriter>(
      std::move(writer), [self = shared_from_this(), key] { self->Forget(key); });
}

void TierStore::DeleteAsync(std::string key, StatusCallback done) {
  std::string k = key;
  inner_->DeleteAsync(std::move(key), [self = shared_from_this(), k = std::move(k),
                                       done = std::move(done)](absl::Status s) mutable {
    self->Forget(k);
    self.reset();
    std::move(done)(std::move(s));
  });
}

void TierStore::DeleteManyAsync(std::vector<std::string> keys, StatusCallback done) {
  std::vector<std::string> copy = keys;
  inner_->DeleteManyAsync(std::move(keys), [self = shared_from_this(), copy = std::move(copy),
                                            done = std::move(done)](absl::Status s) mutable {
    for (const std::string& k : copy) self->Forget(k);
    self.reset();
    std::move(done)(std::move(s));
  });
}

void TierStore::CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) {
  std::string k = dst_key;
  inner_->CopyAsync(std::move(src_key), std::move(dst_key),
                    [self = shared_from_this(), k = std::move(k),
                     done = std::move(done)](absl::StatusOr<ObjectMeta> meta) mutable {
                      self->Forget(k);
                      self.reset();
                      std::move(done)(std::move(meta));
                    });
}

void RegisterTierCache(StoreRegistry& registry) {
  registry.SetCacheDecorator(
      [](std::shared_ptr<ObjectStore> store, const std::string& dir,
         std::shared_ptr<Runtime> runtime) -> absl::StatusOr<std::shared_ptr<ObjectStore>> {
        // A mistyped cache path should not silently become a second cache: creating a tier
        // says so.
        bool created = false;
        auto tier = Tier::FindOrCreate(dir, &created);
        if (!tier.ok()) return Annotate(tier.status(), absl::StrCat("cache=", dir));
        if (created) {
          LogLine(
              LogLevel::kWarning,
              absl::StrCat("cache=", dir, ": no tier was there; created one at ", (*tier)->root(),
                           " with the default settings (see `wharf tier status`, change them "
                           "with `wharf tier init`)"));
        }
        auto cached = TierStore::Open(std::move(store), *std::move(tier), std::move(runtime));
        if (!cached.ok()) return Annotate(cached.status(), absl::StrCat("cache=", dir));
        return std::shared_ptr<ObjectStore>(*std::move(cached));
      });
}

}  // namespace wharf
