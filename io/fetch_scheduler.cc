#include "io/fetch_scheduler.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"

namespace wharf {

int FetchOptions::EffectiveMaxInFlight() const {
  if (max_in_flight > 0) return max_in_flight;
  const double objects_per_second =
      target_bytes_per_second / static_cast<double>(std::max<uint64_t>(1, typical_object_bytes));
  const double n = std::ceil(objects_per_second * absl::ToDoubleSeconds(expected_latency));
  return static_cast<int>(std::clamp(n, 8.0, 4096.0));
}

// Blocks from this size on are mappings (see State).
constexpr uint64_t kLargeBlock = uint64_t{4} << 20;

// Memory held by every batch of one scheduler, and its pool of large blocks.
//
// Large blocks (>= kLargeBlock) are mappings populated up front: the kernel zero-fills every
// page of a fresh mapping (~0.2 s per GiB even with MAP_POPULATE, over 1 s with a fault per
// page). A released large block is therefore kept mapped in `pool` and handed to the next
// large object of a similar size, so reading many large objects pays the zero-fill once.
// The bound: held + pooled <= budget at all times. Reserving evicts pooled blocks to keep it,
// a block is charged its whole mapping (a reused one may be up to a quarter larger than
// asked), and a released block is pooled only if it fits. Once the scheduler is destroyed
// (Close), nothing more is pooled: buffers still alive then are unmapped when released.
struct FetchScheduler::State {
  using Mappings = std::vector<std::pair<uint64_t, char*>>;  // (size, address)

  explicit State(uint64_t budget) : budget(budget) {}
  ~State() {
    for (auto& [size, p] : pool) munmap(p, size);
  }
  static void Unmap(const Mappings& mappings) {
    for (const auto& [size, p] : mappings) munmap(p, size);
  }

  const uint64_t budget;
  absl::Mutex mu;
  uint64_t held ABSL_GUARDED_BY(mu) = 0;
  uint64_t peak ABSL_GUARDED_BY(mu) = 0;
  std::multimap<uint64_t, char*> pool ABSL_GUARDED_BY(mu);  // mapping size -> address
  uint64_t pooled ABSL_GUARDED_BY(mu) = 0;
  uint64_t reused ABSL_GUARDED_BY(mu) = 0;  // blocks served from the pool
  bool closed ABSL_GUARDED_BY(mu) = false;

  // A pooled mapping taken by TryReserve for a large block.
  struct Taken {
    char* block = nullptr;
    uint64_t size = 0;
  };

  // Charges `bytes` unless that would pass the budget (one block is always allowed). For a
  // large block, takes a pooled mapping at most a quarter larger into *taken when its whole
  // size can be charged. Pooled blocks that no longer fit beside what is held move to
  // *evicted, for the caller to unmap outside its locks.
  bool TryReserve(uint64_t bytes, Taken* taken, Mappings* evicted) {
    absl::MutexLock lock(&mu);
    if (held > 0 && held + bytes > budget) return false;
    uint64_t charge = bytes;
    if (bytes >= kLargeBlock) {
      auto it = pool.lower_bound(bytes);
      if (it != pool.end() && it->first <= bytes + bytes / 4 &&
          (held == 0 || held + it->first <= budget)) {
        *taken = {.block = it->second, .size = it->first};
        charge = it->first;
        pooled -= it->first;
        pool.erase(it);
        ++reused;
      }
    }
    held += charge;
    peak = std::max(peak, held);
    while (!pool.empty() && held + pooled > budget) {
      auto largest = std::prev(pool.end());
      pooled -= largest->first;
      evicted->push_back(*largest);
      pool.erase(largest);
    }
    return true;
  }
  void Release(uint64_t bytes) {
    absl::MutexLock lock(&mu);
    held -= bytes;
  }
  uint64_t Held() {
    absl::MutexLock lock(&mu);
    return held;
  }
  FetchScheduler::PoolStats Stats() {
    absl::MutexLock lock(&mu);
    return {.reused = reused, .pooled_bytes = pooled};
  }

  // Releases a large block's charge and takes the mapping back, in one step: pooled when it
  // fits the budget beside what is held and pooled (and the scheduler still exists), else
  // unmapped.
  void ReleaseLarge(char* p, uint64_t size) {
    {
      absl::MutexLock lock(&mu);
      held -= size;
      if (!closed && held + pooled + size <= budget) {
        pool.emplace(size, p);
        pooled += size;
        return;
      }
    }
    munmap(p, size);
  }

  // The scheduler is gone: unmap the pool and pool nothing more.
  void Close() {
    Mappings mappings;
    {
      absl::MutexLock lock(&mu);
      closed = true;
      mappings.assign(pool.begin(), pool.end());
      pool.clear();
      pooled = 0;
    }
    Unmap(mappings);
  }
};

namespace {

// A block for `bytes` of fetched data, already charged to `state` by TryReserve (which may
// have taken a pooled mapping), charged until released: large ones are mappings returned to
// the state's pool (see State), small ones come from the heap. `own` tracks what one batch
// holds.
std::shared_ptr<char> AllocateBlock(const std::shared_ptr<FetchScheduler::State>& state,
                                    uint64_t bytes, FetchScheduler::State::Taken taken,
                                    std::shared_ptr<std::atomic<uint64_t>> own) {
  char* p = taken.block;
  uint64_t size = taken.size;
  if (p == nullptr && bytes >= kLargeBlock) {
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (m != MAP_FAILED) {
      p = static_cast<char*>(m);
      size = bytes;
    }
  }
  if (p != nullptr) {
    own->fetch_add(size);
    return std::shared_ptr<char>(p, [state, own, size](char* q) {
      own->fetch_sub(size);
      state->ReleaseLarge(q, size);
    });
  }
  own->fetch_add(bytes);
  return std::shared_ptr<char>(new char[bytes], [state, own, bytes](char* q) {
    delete[] q;
    own->fetch_sub(bytes);
    state->Release(bytes);
  });
}

// Which bytes of a group's buffer one item receives.
struct Slice {
  size_t item;
  uint64_t begin, end;  // object offsets wanted; clipped to the object size on delivery
};

// One buffer filled by one or more store requests (parts), serving one or more items.
struct Group {
  std::string key;
  std::string etag;
  std::optional<uint64_t> object_size;
  uint64_t begin = 0, end = 0;  // extent fetched (end may exceed the object: clipped)
  std::vector<Slice> slices;
  bool needs_head = false;
  size_t first_item = 0;

  // Filled while running.
  std::shared_ptr<char> block;
  int parts = 0, next_part = 0, parts_done = 0;
  uint64_t bytes_received = 0;
  absl::Status status;
  absl::Time started;
  absl::Duration ttfb = absl::ZeroDuration();
  int attempts = 0;
};

// Store calls gathered under the batch's lock and made after releasing it: a store may
// complete a call inline, and its callback takes the lock again.
using Starts = std::vector<absl::AnyInvocable<void() &&>>;

void RunStarts(Starts& starts) {
  for (auto& start : starts) std::move(start)();
  starts.clear();
}

class BatchImpl : public FetchScheduler::Batch,
                  public std::enable_shared_from_this<BatchImpl> {
 public:
  BatchImpl(std::shared_ptr<ObjectStore> store, const FetchOptions& options,
            std::shared_ptr<FetchScheduler::State> state)
      : store_(std::move(store)), options_(options), state_(std::move(state)),
        max_in_flight_(options.EffectiveMaxInFlight()) {}

  // The public handle owns the core through a shared_ptr so that callbacks can keep the
  // core alive after the handle is gone.
  class Handle : public FetchScheduler::Batch {
   public:
    explicit Handle(std::shared_ptr<BatchImpl> core) : core_(std::move(core)) {}
    ~Handle() override { core_->Cancel(); }
    void Add(std::vector<FetchItem> items) override { core_->Add(std::move(items)); }
    void Close() override { core_->Close(); }
    std::optional<FetchResult> Next() override { return core_->Next(); }
    void Cancel() override { core_->Cancel(); }
    FetchStats stats() const override { return core_->stats(); }

   private:
    std::shared_ptr<BatchImpl> core_;
  };

  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    news_ = true;
  }

  void Add(std::vector<FetchItem> items) {
    Starts starts;
    {
      absl::MutexLock lock(&mu_);
      AddLocked(std::move(items), starts);
    }
    RunStarts(starts);
  }

  void AddLocked(std::vector<FetchItem> items, Starts& starts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t first_new = items_.size();
    for (auto& item : items) items_.push_back(std::move(item));
    stats_.items = items_.size();
    const size_t first_group = queue_.size();
    // Items of the same key with known extents may share a request.
    absl::flat_hash_map<std::string, std::vector<std::pair<Slice, const FetchItem*>>> ranged;
    for (size_t i = first_new; i < items_.size(); ++i) {
      const FetchItem& item = items_[i];
      std::optional<std::pair<uint64_t, uint64_t>> extent;
      if (item.size.has_value()) {
        auto resolved = item.range.Resolve(*item.size);
        if (!resolved.ok()) {
          Deliver(ErrorResult(i, Annotate(resolved.status(),
                                          absl::StrCat("get ", store_->Uri(item.key)))));
          continue;
        }
        extent = *resolved;
        if (extent->first == extent->second) {  // an empty object: nothing to fetch
          FetchResult r;
          r.index = i;
          r.key = item.key;
          r.data = FetchBuffer();
          Deliver(std::move(r));
          continue;
        }
      } else if (!item.range.suffix && item.range.length.has_value()) {
        if (*item.range.length == 0) {
          Deliver(ErrorResult(i, absl::OutOfRangeError(absl::StrCat(
                                     "get ", store_->Uri(item.key), ": empty range"))));
          continue;
        }
        extent = {item.range.offset, item.range.offset + *item.range.length};
      }
      if (!extent.has_value()) {  // size needed first
        Group g;
        g.key = item.key;
        g.needs_head = true;
        g.first_item = i;
        g.slices.push_back({i, 0, 0});
        queue_.push_back(std::move(g));
        continue;
      }
      ranged[item.key].push_back({Slice{i, extent->first, extent->second}, &item});
    }
    std::vector<Group> groups;
    for (auto& [key, slices] : ranged) {
      std::sort(slices.begin(), slices.end(), [](const auto& a, const auto& b) {
        return a.first.begin < b.first.begin;
      });
      Group* open = nullptr;
      for (auto& [slice, item] : slices) {
        const bool joins = open != nullptr && options_.coalesce_gap > 0 &&
                           slice.begin <= open->end + options_.coalesce_gap &&
                           std::max(open->end, slice.end) - open->begin <= options_.part_size;
        if (joins) {
          open->end = std::max(open->end, slice.end);
          open->slices.push_back(slice);
          open->first_item = std::min(open->first_item, slice.item);
          continue;
        }
        groups.emplace_back();
        open = &groups.back();
        open->key = key;
        open->etag = item->etag;
        open->object_size = item->size;
        open->begin = slice.begin;
        open->end = slice.end;
        open->first_item = slice.item;
        open->slices.push_back(slice);
      }
    }
    for (auto& g : groups) queue_.push_back(std::move(g));
    // Dispatch in submission order (the order ordered delivery needs).
    std::stable_sort(queue_.begin() + first_group, queue_.end(),
                     [](const Group& a, const Group& b) { return a.first_item < b.first_item; });
    news_ = true;
    PumpLocked(starts);
  }

  std::optional<FetchResult> Next() {
    Starts starts;
    while (true) {
      std::optional<FetchResult> result;
      bool finished = false;
      {
        absl::MutexLock lock(&mu_);
        if (cancelled_) return std::nullopt;
        PumpLocked(starts);
        result = TakeReadyLocked();
        finished = !result && closed_ && delivered_ == items_.size();
        // Only this batch's own results count: budget held by another batch's consumer is
        // waited for, since that consumer may release it.
        if (!result && !finished && in_flight_ == 0 && starts.empty() && !queue_.empty() &&
            own_held_->load() >= state_->Held()) {
          // Nothing running and nothing can start: the budget is held by results the caller
          // still owns. Say so rather than wait forever.
          Group g = std::move(queue_.front());
          queue_.pop_front();
          FailGroupLocked(g, absl::ResourceExhaustedError(absl::StrCat(
                                 "get ", store_->Uri(g.key), ": the fetch memory budget (",
                                 options_.memory_budget,
                                 " bytes) is held by results not yet released")));
          continue;
        }
      }
      RunStarts(starts);
      if (result) return result;
      if (finished) return std::nullopt;
      // Completions set news_; budget released by another batch is seen on the next poll.
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(this, &BatchImpl::HasNewsLocked),
                           absl::Milliseconds(20));
    }
  }

  std::optional<FetchResult> TakeReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (options_.ordered) {
      auto it = ready_by_index_.find(next_index_);
      if (it == ready_by_index_.end()) return std::nullopt;
      FetchResult r = std::move(it->second);
      ready_by_index_.erase(it);
      ++next_index_;
      return r;
    }
    if (ready_.empty()) return std::nullopt;
    FetchResult r = std::move(ready_.front());
    ready_.pop_front();
    return r;
  }

  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    queue_.clear();
    ready_.clear();
    ready_by_index_.clear();
  }

  FetchStats stats() const {
    absl::MutexLock lock(&mu_);
    FetchStats s = stats_;
    s.peak_bytes_held = peak_held_;
    return s;
  }

 private:
  bool HasNewsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cancelled_ || news_;
  }

  FetchResult ErrorResult(size_t index, absl::Status status) {
    FetchResult r;
    r.index = index;
    r.key = items_[index].key;
    r.data = std::move(status);
    return r;
  }

  void Deliver(FetchResult r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++delivered_;
    news_ = true;
    if (r.data.ok()) stats_.bytes += r.data->size();
    if (cancelled_) return;
    if (options_.ordered) {
      ready_by_index_.emplace(r.index, std::move(r));
    } else {
      ready_.push_back(std::move(r));
    }
  }

  void FailGroupLocked(Group& g, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Slice& s : g.slices) Deliver(ErrorResult(s.item, status));
  }

  // Starts requests while the in-flight limit and the memory budget allow.
  void PumpLocked(Starts& starts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    news_ = false;
    // Objects already started first (their parts left over from the in-flight limits), so
    // earlier objects finish first.
    for (auto& g : running_) {
      if (in_flight_ >= max_in_flight_) break;
      if (g->next_part < g->parts) StartPartsLocked(g, starts);
    }
    while (!cancelled_ && !queue_.empty() && in_flight_ < max_in_flight_) {
      Group& front = queue_.front();
      if (front.needs_head) {
        StartHeadLocked(std::move(front), starts);
        queue_.pop_front();
        continue;
      }
      if (!front.block) {
        const uint64_t bytes = front.end - front.begin;
        FetchScheduler::State::Taken taken;
        FetchScheduler::State::Mappings evicted;
        if (!state_->TryReserve(bytes, &taken, &evicted)) break;
        if (!evicted.empty()) {  // unmapped after the lock is released
          starts.push_back([evicted = std::move(evicted)]() mutable {
            FetchScheduler::State::Unmap(evicted);
          });
        }
        // The block releases its budget charge when its last slice is dropped.
        front.block = AllocateBlock(state_, bytes, taken, own_held_);
        peak_held_ = std::max(peak_held_, state_->Held());
        const uint64_t part = front.end - front.begin > options_.split_threshold
                                  ? options_.part_size
                                  : front.end - front.begin;
        front.parts = static_cast<int>((bytes + part - 1) / part);
        front.started = absl::Now();
        running_.push_back(std::make_shared<Group>(std::move(front)));
        queue_.pop_front();
        StartPartsLocked(running_.back(), starts);
        continue;
      }
      break;
    }
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [](const auto& g) { return g->next_part == g->parts; }),
                   running_.end());
  }

  void StartPartsLocked(const std::shared_ptr<Group>& g, Starts& starts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t total = g->end - g->begin;
    const uint64_t part = total > options_.split_threshold ? options_.part_size : total;
    while (g->next_part < g->parts && in_flight_ < max_in_flight_ &&
           g->next_part - g->parts_done < options_.max_parts_per_object) {
      const uint64_t off = static_cast<uint64_t>(g->next_part) * part;
      const uint64_t len = std::min(part, total - off);
      ++g->next_part;
      ++in_flight_;
      ++stats_.requests;
      stats_.peak_in_flight = std::max(stats_.peak_in_flight, in_flight_);
      GetRequest request;
      request.key = g->key;
      // A whole object in one request goes without a Range header: servers work harder for
      // a ranged read (RGW: ~80 us more CPU per GET, ~9% of small-object throughput when it
      // is the bottleneck). An object grown past the buffer then fails (OutOfRange) instead
      // of passing a prefix off as the object.
      const bool whole_object = g->parts == 1 && g->begin == 0 && g->object_size.has_value() &&
                                g->end >= *g->object_size;
      request.range = whole_object ? ByteRange::All() : ByteRange::Of(g->begin + off, len);
      request.buffer = absl::Span<char>(g->block.get() + off, len);
      request.if_match = g->etag;  // every range of one object from the same version
      starts.push_back([self = shared_from_this(), g, request = std::move(request)]() mutable {
        self->store_->GetAsync(std::move(request), [self, g](absl::StatusOr<GetResult> r) {
          self->OnPart(g, std::move(r));
        });
      });
    }
  }

  void OnPart(const std::shared_ptr<Group>& g, absl::StatusOr<GetResult> r) {
    Starts starts;
    {
      absl::MutexLock lock(&mu_);
      OnPartLocked(g, std::move(r), starts);
    }
    RunStarts(starts);
  }

  void OnPartLocked(const std::shared_ptr<Group>& g, absl::StatusOr<GetResult> r, Starts& starts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    --in_flight_;
    news_ = true;
    if (!r.ok()) {
      if (g->status.ok()) g->status = r.status();
    } else {
      if (g->parts_done == 0 || r->time_to_first_byte < g->ttfb) g->ttfb = r->time_to_first_byte;
      g->attempts += r->attempts;
      stats_.retries += r->attempts - 1;
      g->bytes_received += r->bytes;
      g->object_size = r->meta.size;
    }
    if (++g->parts_done < g->parts) {
      PumpLocked(starts);
      return;
    }
    if (g->status.ok()) {
      // Every byte handed out must have been received: a block may be a reused one, and
      // unfilled bytes must never pass for data.
      const uint64_t size = g->object_size.value_or(g->end);
      const uint64_t want = size > g->begin ? std::min(g->end, size) - g->begin : 0;
      if (g->bytes_received < want) {
        g->status = absl::DataLossError(absl::StrCat(
            "get ", store_->Uri(g->key), ": received ", g->bytes_received, " of the ", want,
            " bytes from byte ", g->begin));
      }
    }
    if (!g->status.ok()) {
      // Stop the other parts' buffer from pinning budget, then report.
      g->next_part = g->parts;
      FailGroupLocked(*g, g->status);
      g->block.reset();
    } else {
      const absl::Duration latency = absl::Now() - g->started;
      const uint64_t size = g->object_size.value_or(g->end);
      bool first = true;
      for (const Slice& s : g->slices) {
        FetchResult out;
        out.index = s.item;
        out.key = g->key;
        out.object_size = size;
        out.time_to_first_byte = g->ttfb;
        out.latency = latency;
        if (first) {
          out.requests = g->parts;
          out.attempts = g->attempts;
          first = false;
        }
        if (s.begin >= size) {
          out.data = absl::OutOfRangeError(absl::StrCat("get ", store_->Uri(g->key),
                                                        ": range starts at byte ", s.begin,
                                                        " of a ", size, "-byte object"));
        } else {
          const uint64_t end = std::min(s.end, size);
          out.data = FetchBuffer(g->block, g->block.get() + (s.begin - g->begin), end - s.begin);
        }
        Deliver(std::move(out));
      }
      g->block.reset();
    }
    PumpLocked(starts);
  }

  void StartHeadLocked(Group g, Starts& starts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++in_flight_;
    ++stats_.requests;
    stats_.peak_in_flight = std::max(stats_.peak_in_flight, in_flight_);
    const size_t index = g.first_item;
    starts.push_back([self = shared_from_this(), index, key = g.key]() mutable {
      self->store_->HeadAsync(std::move(key), [self, index](absl::StatusOr<ObjectMeta> m) {
        Starts more;
        {
          absl::MutexLock lock(&self->mu_);
          self->OnHeadLocked(index, std::move(m), more);
        }
        RunStarts(more);
      });
    });
  }

  void OnHeadLocked(size_t index, absl::StatusOr<ObjectMeta> m, Starts& starts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    BatchImpl* self = this;
    {
      --self->in_flight_;
      self->news_ = true;
      if (!m.ok()) {
        self->Deliver(self->ErrorResult(index, m.status()));
      } else {
        // Now that the size is known, plan the item again at the front of the queue.
        FetchItem& item = self->items_[index];
        item.size = m->size;
        item.etag = m->etag;
        auto extent = item.range.Resolve(m->size);
        if (!extent.ok()) {
          self->Deliver(self->ErrorResult(
              index, Annotate(extent.status(), absl::StrCat("get ", self->store_->Uri(item.key)))));
        } else if (extent->first == extent->second) {
          FetchResult r;
          r.index = index;
          r.key = item.key;
          r.data = FetchBuffer();
          self->Deliver(std::move(r));
        } else {
          Group g;
          g.key = item.key;
          g.etag = m->etag;
          g.object_size = m->size;
          g.begin = extent->first;
          g.end = extent->second;
          g.first_item = index;
          g.slices.push_back({index, extent->first, extent->second});
          self->queue_.push_front(std::move(g));
        }
      }
      self->PumpLocked(starts);
    }
  }

  const std::shared_ptr<ObjectStore> store_;
  const FetchOptions options_;
  const std::shared_ptr<FetchScheduler::State> state_;
  const int max_in_flight_;
  // Budget bytes held by this batch's blocks (in flight or delivered, not yet released).
  const std::shared_ptr<std::atomic<uint64_t>> own_held_ =
      std::make_shared<std::atomic<uint64_t>>(0);

  mutable absl::Mutex mu_;
  std::vector<FetchItem> items_ ABSL_GUARDED_BY(mu_);
  std::deque<Group> queue_ ABSL_GUARDED_BY(mu_);                  // not started
  std::vector<std::shared_ptr<Group>> running_ ABSL_GUARDED_BY(mu_);  // parts left to start
  std::deque<FetchResult> ready_ ABSL_GUARDED_BY(mu_);
  std::map<size_t, FetchResult> ready_by_index_ ABSL_GUARDED_BY(mu_);
  size_t next_index_ ABSL_GUARDED_BY(mu_) = 0;
  size_t delivered_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool news_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t peak_held_ ABSL_GUARDED_BY(mu_) = 0;
  FetchStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

FetchScheduler::FetchScheduler(std::shared_ptr<ObjectStore> store, FetchOptions options)
    : store_(std::move(store)), options_(options), state_(std::make_shared<State>(options.memory_budget)) {}

FetchScheduler::~FetchScheduler() { state_->Close(); }

FetchScheduler::PoolStats FetchScheduler::pool_stats() const { return state_->Stats(); }

std::unique_ptr<FetchScheduler::Batch> FetchScheduler::StartBatch() {
  return std::make_unique<BatchImpl::Handle>(
      std::make_shared<BatchImpl>(store_, options_, state_));
}

std::unique_ptr<FetchScheduler::Batch> FetchScheduler::Fetch(std::vector<FetchItem> items) {
  auto batch = StartBatch();
  batch->Add(std::move(items));
  batch->Close();
  return batch;
}

}  // namespace wharf
