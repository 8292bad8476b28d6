#include "tier/tier_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "store/local/temp_object.h"
#include "tier/evict.h"
#include "tier/tree_store.h"

namespace wharf {
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
    return temp_->Append(chunk);
  }
  uint64_t bytes() const { return bytes_; }

 private:
  TempObject* const temp_;
  uint64_t bytes_ = 0;
};

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

}  // namespace

struct TierStore::PendingRead {
  GetRequest request;
  Callback<GetResult> done;
  std::vector<std::string> candidates;
  std::string fill_path;
  int lock_fd = -1;
  absl::Duration backoff = absl::Milliseconds(1);
  std::unique_ptr<TempObject> temp;
  std::unique_ptr<FileSink> sink;
  std::optional<TierEntry> stale;  // the copy a fill revalidates (ttl mode)

  ~PendingRead() { Unlock(); }
  void Unlock() {
    if (lock_fd >= 0) close(lock_fd);  // releases the flock
    lock_fd = -1;
  }
  // Records the outcome; Deliver() hands it to the caller. The steps of a read run in
  // tasks that hold the store; each task drops its hold before it delivers, so a caller that
  // lets go of the store in its callback destroys it there (and its counters are written),
  // not later on a pool thread that process exit may never wait for.
  void Finish(absl::StatusOr<GetResult> r) {
    Unlock();
    result = std::move(r);
  }
  void Deliver() {
    if (!result) return;
    absl::StatusOr<GetResult> r = *std::move(result);
    result.reset();
    std::move(done)(std::move(r));
  }
  std::optional<absl::StatusOr<GetResult>> result;
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

TierStore::TierStore(std::shared_ptr<ObjectStore> inner, std::shared_ptr<Tier> tier,
                     std::shared_ptr<Runtime> runtime, std::vector<TierImport> imports)
    : ForwardingStore(inner),
      inner_(std::move(inner)),
      tier_(std::move(tier)),
      runtime_(std::move(runtime)),
      imports_(std::move(imports)) {
  Register();
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
    for (TierStore* store : *live) store->FlushStatsLocked();
  }
  exiting = true;
}

void TierStore::FlushStatsLocked() {
  const Stats now = stats();
  Tier::Stats delta{now.hits - flushed_.hits, now.misses - flushed_.misses,
                    now.fills - flushed_.fills, now.fill_bytes - flushed_.fill_bytes};
  if (delta.hits + delta.misses == 0) return;
  flushed_ = now;
  // Best effort: counters are for `tier status`, not for correctness.
  (void)tier_->AddStats(delta);
}

void TierStore::Register() {
  static const bool registered = [] { return std::atexit(&TierStore::FlushStatsAtExit) == 0; }();
  (void)registered;
  absl::MutexLock lock(&live_mu);
  if (live == nullptr) live = new std::vector<TierStore*>;
  live->push_back(this);
}

TierStore::~TierStore() {
  absl::MutexLock lock(&live_mu);
  if (live != nullptr) std::erase(*live, this);
  if (!exiting) FlushStatsLocked();
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
    // The tree's entries of this source: each file whose entry names its own key's URI.
    const std::string key_prefix = import.source.substr(base.size());
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
      self->hits_.fetch_add(1, std::memory_order_relaxed);
    } else {
      self->misses_.fetch_add(1, std::memory_order_relaxed);
      self->Acquire(read);
    }
    self.reset();
    read->Deliver();
  });
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
        std::shared_ptr<ObjectStore> inner = self->inner_;
        self.reset();
        inner->HeadAsync(std::move(key), std::move(done));
      });
}

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
    const bool complete = IsCompleteEntry(entry, st);
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
    GetResult result;
    result.meta.key = req.key;
    result.meta.size = entry->size;
    result.meta.etag = etag;
    result.meta.mtime = absl::TimeFromTimespec(st.st_mtim);
    if (!req.if_none_match.empty() && req.if_none_match == etag) {
      close(fd);
      result.not_modified = true;
      read.Finish(std::move(result));
      return true;
    }
    absl::Status status;
    auto range = req.range.Resolve(entry->size);
    if (!range.ok()) {
      status = Annotate(range.status(), op);
    } else {
      const auto [begin, end] = *range;
      result.offset = begin;
      result.bytes = end - begin;
      if (req.sink == nullptr && req.buffer.size() < end - begin) {
        status = absl::OutOfRangeError(absl::StrCat(op, ": the buffer holds ", req.buffer.size(),
                                                    " bytes, the range ", end - begin));
      }
      std::string chunk;
      for (uint64_t off = begin; status.ok() && off < end;) {
        if (IsCancelled(req.cancel)) {
          status = absl::CancelledError(absl::StrCat(op, ": cancelled"));
          break;
        }
        const size_t want = static_cast<size_t>(std::min<uint64_t>(end - off, kSinkChunk));
        char* dst;
        if (req.sink != nullptr) {
          chunk.resize(want);
          dst = chunk.data();
        } else {
          dst = req.buffer.data() + (off - begin);
        }
        const ssize_t n = pread(fd, dst, want, static_cast<off_t>(off));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          status = n < 0 ? ErrnoToStatus(errno, op)
                         : absl::DataLossError(absl::StrCat(op, ": the tier's copy ended early"));
          break;
        }
        if (req.sink != nullptr) {
          status = req.sink->Append(absl::string_view(chunk.data(), n));
        }
        off += n;
      }
    }
    close(fd);
    if (status.ok()) {
      read.Finish(std::move(result));
    } else {
      read.Finish(std::move(status));
    }
    return true;
  }
  return false;
}

void TierStore::Acquire(std::shared_ptr<PendingRead> read) {
  const std::string op = absl::StrCat("get ", inner_->Uri(read->request.key));
  if (IsCancelled(read->request.cancel)) {
    return read->Finish(absl::CancelledError(absl::StrCat(op, ": cancelled")));
  }
  if (read->lock_fd < 0) {
    const std::string rel = tier_->Relative(read->fill_path);
    const uint64_t stripe = std::hash<std::string>{}(rel) % kLockStripes;
    const std::string lock_path = tier_->MetaPath(absl::StrCat("locks/", stripe));
    read->lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (read->lock_fd < 0) {
      return read->Finish(ErrnoToStatus(errno, absl::StrCat(op, ": opening ", lock_path)));
    }
  }
  if (flock(read->lock_fd, LOCK_EX | LOCK_NB) != 0) {
    // Another filler holds the stripe: wait without holding a thread, then look again.
    const absl::Duration delay = read->backoff;
    read->backoff = std::min(read->backoff * 2, kMaxBackoff);
    runtime_->timer().After(delay, [self = shared_from_this(), read]() mutable {
      ThreadPool& pool = self->runtime_->blocking_pool();
      pool.Schedule([self = std::move(self), read]() mutable {
        if (!self->ServeLocal(*read, /*after_fill=*/false)) self->Acquire(read);
        self.reset();
        read->Deliver();
      });
    });
    return;
  }
  // Ours. Someone may have filled the object while we waited.
  if (ServeLocal(*read, /*after_fill=*/false)) return;
  Fill(std::move(read));
}

void TierStore::Fill(std::shared_ptr<PendingRead> read) {
  const std::string& key = read->request.key;
  const std::string op = absl::StrCat("get ", inner_->Uri(key));
  auto temp_dir = tier_->TempDir();
  if (!temp_dir.ok()) return read->Finish(Annotate(temp_dir.status(), op));
  // A CRC32C, not an MD5: the entry's ETag is the source's, so the checksum only has to let
  // `verify` find damage, and an MD5 of every filled byte was a fifth of a fill's CPU.
  auto temp = TempObject::Create(read->fill_path, *temp_dir, Checksum::kCrc32c);
  if (!temp.ok()) return read->Finish(Annotate(temp.status(), op));
  read->temp = *std::move(temp);
  read->sink = std::make_unique<FileSink>(read->temp.get());
  GetRequest whole;
  whole.key = key;
  whole.sink = read->sink.get();
  whole.cancel = read->request.cancel;
  // A stale copy (ttl mode) is revalidated: an unchanged object answers 304 with no body.
  struct stat st;
  if (stat(read->fill_path.c_str(), &st) == 0) {
    read->stale = ReadEntryAttr(read->fill_path);
    if (IsCompleteEntry(read->stale, st) && !read->stale->etag.empty()) {
      whole.if_none_match = read->stale->etag;
    } else {
      read->stale.reset();
    }
  }
  inner_->GetAsync(std::move(whole),
                   [self = shared_from_this(), read](absl::StatusOr<GetResult> got) mutable {
                     // Sealing and publishing are syscalls: off the backing store's thread.
                     ThreadPool& pool = self->runtime_->blocking_pool();
                     pool.Schedule([self = std::move(self), read, got = std::move(got)]() mutable {
                       self->Publish(*read, got);
                       self.reset();
                       read->Deliver();
                     });
                   });
}

void TierStore::Publish(PendingRead& read, const absl::StatusOr<GetResult>& got) {
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
  auto sealed = read.temp->Seal(std::nullopt, /*fsync=*/false, [&](int fd, const ObjectMeta& m) {
    TierEntry entry;
    entry.source = uri;
    entry.etag = got->meta.etag;
    entry.size = m.size;
    entry.crc32c = read.temp->checksum();
    entry.filled = absl::Now();
    return WriteEntryAttr(fd, entry);
  });
  // A reader's shared lock on the new entry from before it is published until this read is
  // served: no eviction pass (this process's below, or another's) can take it meanwhile.
  const int held = sealed.ok() ? open(read.temp->path().c_str(), O_RDONLY | O_CLOEXEC) : -1;
  if (held >= 0) flock(held, LOCK_SH);
  absl::Status published = sealed.ok() ? read.temp->Publish() : sealed.status();
  if (!published.ok()) {
    if (held >= 0) close(held);
    return read.Finish(Annotate(published, absl::StrCat("get ", uri, ": filling the tier")));
  }
  read.temp.reset();
  fills_.fetch_add(1, std::memory_order_relaxed);
  fill_bytes_.fetch_add(got->meta.size, std::memory_order_relaxed);
  MaybeEvict(got->meta.size);
  read.Unlock();
  const bool served = ServeLocal(read, /*after_fill=*/true);
  if (held >= 0) close(held);
  if (!served) {
    read.Finish(absl::UnavailableError(
        absl::StrCat("get ", uri, ": the tier's copy vanished right after it was filled")));
  }
}

void TierStore::MaybeEvict(uint64_t filled) {
  const TierConfig& c = tier_->config();
  if (c.max_size == 0 && c.min_free <= 0) return;
  filled_since_pass_.fetch_add(filled, std::memory_order_relaxed);
  // What the tier holds: known after this process's first pass, plus what it filled since.
  // Before that, a tier bounded only by free space is checked with statvfs alone, so a
  // process does not walk the whole tier at its first fill when nothing asks it to.
  // A process's first fill starts from the usage the tier's last pass recorded.
  if (usage_.load(std::memory_order_relaxed) < 0) {
    if (auto last = tier_->LastUsage()) {
      int64_t unknown = -1;
      usage_.compare_exchange_strong(unknown, static_cast<int64_t>(*last));
    }
  }
  auto over = [&] {
    const int64_t usage = usage_.load(std::memory_order_relaxed);
    if (usage < 0) return c.max_size > 0 || OverBounds(*tier_, 0);
    return OverBounds(*tier_, static_cast<uint64_t>(usage) + filled_since_pass_.load());
  };
  // The pass runs here, in the read that found the tier over its bounds, before that read is
  // delivered: so the fills a program waited for are within bounds when it finishes. One
  // pass at a time per process (a concurrent over-bound fill leaves it to the running pass,
  // which looks again when it ends) and per tier (the pass's flock).
  while (over() && !evicting_.exchange(true)) {
    filled_since_pass_.store(0);
    std::string warning;
    auto pass = EvictToBounds(*tier_, /*wait=*/false, &warning);
    if (!warning.empty()) std::fprintf(stderr, "wharf: %s\n", warning.c_str());
    const bool ran = pass.ok() && pass->ran;
    if (ran) {
      usage_.store(static_cast<int64_t>(pass->bytes - pass->evicted_bytes));
      evictions_.fetch_add(pass->evicted, std::memory_order_relaxed);
    }
    evicting_.store(false);
    if (!ran) break;  // another process's pass holds the tier: it is seeing to it
  }
}

void TierStore::Forget(const std::string& key) {
  if (auto path = FillPath(key)) unlink(path->c_str());
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
        auto tier = Tier::FindOrCreate(dir);
        if (!tier.ok()) return Annotate(tier.status(), absl::StrCat("cache=", dir));
        auto cached = TierStore::Open(std::move(store), *std::move(tier), std::move(runtime));
        if (!cached.ok()) return Annotate(cached.status(), absl::StrCat("cache=", dir));
        return std::shared_ptr<ObjectStore>(*std::move(cached));
      });
}

}  // namespace wharf
