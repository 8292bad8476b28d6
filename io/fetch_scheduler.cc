#include "io/fetch_scheduler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"
#include "base/profiler.h"
#include "base/status.h"
#include "io/inflight_controller.h"

namespace wharf {

int FetchOptions::EffectiveMaxInFlight() const {
  if (max_in_flight > 0) return max_in_flight;
  const double objects_per_second =
      target_bytes_per_second / static_cast<double>(std::max<uint64_t>(1, typical_object_bytes));
  const double n = std::ceil(objects_per_second * absl::ToDoubleSeconds(expected_latency));
  return static_cast<int>(std::clamp(n, 8.0, 4096.0));
}

// What every batch of one scheduler shares: the runtime, the account its buffers are
// charged to, and where completed requests are recorded.
struct FetchScheduler::Common {
  std::shared_ptr<Runtime> runtime;
  std::shared_ptr<MemoryBudget> budget;
  std::shared_ptr<MemoryBudget::Account> account;
  LinkEstimator* link = nullptr;
  // The depth: fixed (options or runtime), or tuned by `controller` from measured throughput.
  int fixed_in_flight = 0;
  std::unique_ptr<InFlightController> controller;
  int MaxInFlight() const { return controller ? controller->limit() : fixed_in_flight; }
  Counter* requests = nullptr;
  Counter* bytes = nullptr;
  Counter* retries = nullptr;
  Counter* errors = nullptr;
  Histogram* ttfb = nullptr;
  Gauge* in_flight = nullptr;
  // From the first request the budget refused until one fits again: how long the engine
  // stalled on memory (a sign the budget, not the store, bounds throughput).
  Histogram* budget_wait = nullptr;
  // Composed reads, on stores that compose and unless turned off (FetchOptions::compose).
  ComposeMode compose_mode = ComposeMode::kOff;
  std::unique_ptr<ComposedReads> composer;
  Counter* composed_reads = nullptr;
};

namespace {

// Wakes a batch's consumer. Its lock is a leaf: it is never held while a buffer is released,
// so the budget may signal it from any release (MemoryBudget listeners).
class Waker {
 public:
  void Signal() {
    absl::MutexLock lock(&mu_);
    signaled_ = true;
  }
  // Returns once signalled since the last Wait (or after `timeout`, a safety net): whether
  // it was signalled.
  bool Wait(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    const bool signaled = mu_.AwaitWithTimeout(absl::Condition(&signaled_), timeout);
    signaled_ = false;
    return signaled;
  }
  // The budget listener signals only while the consumer waits for a release.
  std::atomic<bool> wants_release{false};

 private:
  absl::Mutex mu_;
  bool signaled_ ABSL_GUARDED_BY(mu_) = false;
};

// Which bytes of a group's buffer one item receives.
struct Slice {
  size_t item;
  uint64_t begin, end;  // object offsets wanted; clipped to the object size on delivery
  // A composed group's slices are whole objects of their own: the key, and its etag (kept to
  // read the object alone if the composed read fails). Empty for the group's own key.
  std::string key;
  std::string etag;
};

// One buffer filled by one or more store requests (parts), serving one or more items.
struct Group {
  std::string key;
  std::string etag;
  bool etag_opaque = false;  // a reply said the etag is no MD5 (ObjectMeta::etag_opaque)
  std::optional<uint64_t> object_size;
  uint64_t begin = 0, end = 0;  // extent fetched (end may exceed the object: clipped)
  std::vector<Slice> slices;
  // Set when the size must be asked first (HEAD): the item, planned again from its answer.
  std::optional<FetchItem> head_item;
  // Set for a whole object (or its tail from an offset) of unknown size: [begin, end) is the
  // first kProbeBytes from the item's offset. The GET's answer tells the object's size and
  // ETag; an object that ends inside it is delivered from it, a longer one is planned again
  // (as after a HEAD), and one the GET cannot describe (empty; the offset past its end) gets
  // the HEAD.
  std::optional<FetchItem> probe_item;
  // A composed group: these objects, composed on the server and read with one GET into the
  // group's buffer ([begin, end) = [0, their total size)), one slice each.
  std::vector<ComposedReads::Source> composed;
  size_t first_item = 0;
  // Planned from a probe's answer: the probe's buffer, whose `prefilled` bytes are the
  // first of [begin, end). They are copied into the group's buffer when it gets one, and its
  // GETs fetch only the rest (the probe's bytes are not read twice).
  Block prefill;
  uint64_t prefilled = 0;

  // Filled while running.
  Block block;
  int parts = 0, next_part = 0, parts_done = 0;
  uint64_t bytes_received = 0;
  absl::Status status;
  absl::Time started;
  absl::Duration ttfb = absl::ZeroDuration();
  int attempts = 0;
};

// Store calls gathered under the batch's lock and made after releasing it: a store may
// complete a call inline, and its callback takes the lock again. Buffers dropped under the
// lock are parked here too, so no release (which runs budget listeners) happens under it.
struct Deferred {
  std::vector<absl::AnyInvocable<void() &&>> calls;
  std::vector<Block> garbage;
  std::vector<FetchResult> dropped;
  bool empty() const { return calls.empty(); }
  void Run() {
    for (auto& call : calls) std::move(call)();
    calls.clear();
    garbage.clear();
    dropped.clear();
  }
};

class BatchImpl : public FetchScheduler::Batch, public std::enable_shared_from_this<BatchImpl> {
 public:
  // Coalesced wake-ups of the consumer (WakeConsumerLocked).
  static constexpr int kWakeBatch = 8;
  static constexpr absl::Duration kCoalesceWait = absl::Milliseconds(2);
  // Results delivered in completion order and not yet taken by Next(): while they hold this
  // much, no new object starts. A consumer slower than the store (a local one, a tier) let
  // them pile up to the whole budget: `wharf fetch -r` of 5,000 local 100 KiB files held
  // 409 MB, and ran half as fast as with a 64 MiB budget (0.23 s against 0.11 s; likely the
  // fresh memory paged in). Ordered batches are left alone: their results wait for the head of the
  // line, and their consumers bound how far ahead they submit.
  static constexpr uint64_t kMaxReadyBytes = uint64_t{64} << 20;
  // The GET that stands in for the HEAD of an object of unknown size reads this much: one
  // round trip, not two, for objects up to it (most samples); a longer one costs that much
  // more transfer and the round trip the HEAD cost. A block of it is reserved per request.
  static constexpr uint64_t kProbeBytes = uint64_t{256} << 10;

  BatchImpl(std::shared_ptr<ObjectStore> store, const FetchOptions& options,
            std::shared_ptr<FetchScheduler::Common> common)
      : store_(std::move(store)), options_(options), common_(std::move(common)) {
    // Releases anywhere in the process may let this batch go on.
    listener_ = common_->budget->AddListener([waker = waker_] {
      if (waker->wants_release.exchange(false, std::memory_order_relaxed)) waker->Signal();
    });
  }
  ~BatchImpl() override { common_->budget->RemoveListener(listener_); }

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

  void Close() override {
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
    }
    waker_->Signal();
  }

  void Add(std::vector<FetchItem> items) override {
    Deferred deferred;
    {
      absl::MutexLock lock(&mu_);
      AddLocked(std::move(items), deferred);
    }
    deferred.Run();
    waker_->Signal();
  }

  void AddLocked(std::vector<FetchItem> items, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t first_new = added_;
    added_ += items.size();
    stats_.items = added_;
    const size_t first_group = queue_.size();
    // Items of the same key with known extents may share a request.
    absl::flat_hash_map<std::string, std::vector<std::pair<Slice, const FetchItem*>>> ranged;
    // Whole small objects, read in composed groups where that pays.
    const bool compose = ComposeNowLocked();
    std::vector<std::pair<Slice, const FetchItem*>> composable;
    for (size_t n = 0; n < items.size(); ++n) {
      const size_t i = first_new + n;
      FetchItem& item = items[n];
      std::optional<std::pair<uint64_t, uint64_t>> extent;
      if (item.size.has_value()) {
        auto resolved = item.range.Resolve(*item.size);
        if (!resolved.ok()) {
          Deliver(
              ErrorResult(i, item.key,
                          Annotate(resolved.status(), absl::StrCat("get ", store_->Uri(item.key)))),
              deferred);
          continue;
        }
        extent = *resolved;
        if (extent->first == extent->second) {  // an empty object: nothing to fetch
          FetchResult r;
          r.index = i;
          r.key = item.key;
          r.data = FetchBuffer();
          Deliver(std::move(r), deferred);
          continue;
        }
      } else if (!item.range.suffix && item.range.length.has_value()) {
        if (*item.range.length == 0) {
          Deliver(ErrorResult(i, item.key,
                              absl::OutOfRangeError(
                                  absl::StrCat("get ", store_->Uri(item.key), ": empty range"))),
                  deferred);
          continue;
        }
        extent = {item.range.offset, item.range.offset + *item.range.length};
      }
      if (!extent.has_value()) {  // size needed first
        if (item.range.suffix) {
          queue_.push_back(HeadGroup(i, std::move(item)));
          continue;
        }
        Group g;
        g.key = item.key;
        g.first_item = i;
        g.etag = item.etag;
        g.begin = item.range.offset;
        g.end = g.begin + kProbeBytes;
        g.slices.push_back({i, g.begin, g.end});
        g.probe_item = std::move(item);
        queue_.push_back(std::move(g));
        continue;
      }
      if (compose && item.size.has_value() && extent->first == 0 && extent->second == *item.size &&
          *item.size <= options_.compose_max_object_bytes) {
        composable.push_back({Slice{i, 0, *item.size, item.key, item.etag}, &item});
        continue;
      }
      ranged[item.key].push_back({Slice{i, extent->first, extent->second}, &item});
    }
    std::vector<Group> groups;
    // Composed groups, in submission order: up to kMaxSources objects of at most part_size.
    for (size_t n = 0; n < composable.size();) {
      size_t m = n;
      uint64_t total = 0;
      while (m < composable.size() && m - n < ComposedReads::kMaxSources &&
             (m == n || total + composable[m].first.end <= options_.part_size)) {
        total += composable[m].first.end;
        ++m;
      }
      if (m - n == 1) {  // alone: an ordinary read
        auto& [slice, item] = composable[n];
        ranged[item->key].push_back({Slice{slice.item, 0, slice.end}, item});
        n = m;
        continue;
      }
      Group g;
      g.key = composable[n].first.key;
      g.begin = 0;
      g.end = total;
      g.object_size = total;
      g.first_item = composable[n].first.item;
      uint64_t offset = 0;
      for (size_t k = n; k < m; ++k) {
        Slice slice = composable[k].first;
        g.composed.push_back({slice.key, slice.end});
        slice.begin = offset;
        slice.end = offset + slice.end;
        offset = slice.end;
        g.first_item = std::min(g.first_item, slice.item);
        g.slices.push_back(std::move(slice));
      }
      groups.push_back(std::move(g));
      n = m;
    }
    for (auto& [key, slices] : ranged) {
      std::sort(slices.begin(), slices.end(),
                [](const auto& a, const auto& b) { return a.first.begin < b.first.begin; });
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
    PumpLocked(deferred);
  }

  std::optional<FetchResult> Next() override {
    // The caller blocked on bytes not yet fetched: one span from its first wait to the return.
    ProfileSpan io_wait(ProfileStage::kIoWait, /*begin=*/false);
    while (true) {
      Deferred deferred;
      std::optional<FetchResult> result;
      bool finished = false;
      bool coalescing = false;
      {
        absl::MutexLock lock(&mu_);
        if (cancelled_) return std::nullopt;
        // Armed before pumping: a release after a failed reservation below signals.
        waker_->wants_release.store(true, std::memory_order_relaxed);
        PumpLocked(deferred);
        result = TakeReadyLocked();
        if (result) PumpLocked(deferred);  // taking it may have made room (kMaxReadyBytes)
        finished = !result && closed_ && delivered_ == added_;
        if (!result && !finished && in_flight_ == 0 && deferred.empty() && !queue_.empty() &&
            !options_.wait_for_release && OwnResultsFillLocked(queue_.front())) {
          // Nothing running and nothing can start: this batch's cap (or the budget) is held
          // by results the caller still owns. Say so rather than wait forever.
          Group g = std::move(queue_.front());
          queue_.pop_front();
          FailGroupLocked(g,
                          absl::ResourceExhaustedError(absl::StrCat(
                              "get ", store_->Uri(g.key), ": the fetch memory budget (",
                              FormatSize(CapLocked()), ") is held by results not yet released")),
                          deferred);
          continue;
        }
        coalescing = !options_.ordered && in_flight_ > 0;
      }
      deferred.Run();
      if (result) return result;
      if (finished) return std::nullopt;
      // Add/Close/Cancel signal, completions do when WakeConsumerLocked says so, and so does
      // any release in the budget while a reservation is wanted. While completions are
      // coalesced the wait is short (see WakeConsumerLocked); otherwise the timeout is only a
      // safety net.
      io_wait.Begin();
      // A caller that Ctrl-C may interrupt polls for it (base/cancel.h): cancelling its
      // ambient token fails this batch's requests, whose results then end the wait.
      const bool signaled = waker_->Wait(coalescing                 ? kCoalesceWait
                                         : InterruptPollInstalled() ? kInterruptPollPeriod
                                                                    : absl::Seconds(1));
      if (!signaled) PollInterrupt();
    }
  }

  void Cancel() override {
    Deferred deferred;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      queue_.clear();
      for (auto& r : ready_) deferred.dropped.push_back(std::move(r));
      for (auto& [i, r] : ready_by_index_) deferred.dropped.push_back(std::move(r));
      ready_.clear();
      ready_by_index_.clear();
      ready_bytes_ = 0;
    }
    cancel_->Cancel();  // outside mu_: the token's callbacks run here
    deferred.Run();
    waker_->Signal();
  }

  FetchStats stats() const override {
    absl::MutexLock lock(&mu_);
    FetchStats s = stats_;
    s.peak_bytes_held = peak_held_;
    return s;
  }

 private:
  uint64_t CapLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return options_.memory_budget > 0 ? options_.memory_budget : common_->budget->limit();
  }

  // True when what blocks `g` is bytes this scheduler's consumer holds: its account is at
  // the cap, or it holds everything the budget holds.
  bool OwnResultsFillLocked(const Group& g) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t own = common_->account->held();
    if (own == 0) return false;
    const uint64_t bytes = g.end - g.begin;
    return own + bytes > CapLocked() || own >= common_->budget->held();
  }

  // Whether whole small objects added now are read in composed groups (FetchOptions::compose).
  bool ComposeNowLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (common_->composer == nullptr || common_->composer->disabled()) return false;
    if (common_->compose_mode == ComposeMode::kOn) return true;
    const absl::Duration latency = common_->link->samples() >= LinkEstimator::kWarmup
                                       ? common_->link->time_to_first_byte()
                                       : options_.expected_latency;
    return latency >= options_.compose_min_latency;
  }

  // A composed read failed (a source changed or vanished, no permission to compose, ...): its
  // objects are read one by one instead, at the front of the queue, so each gets its own
  // result or error.
  void RequeueComposedLocked(Group& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = g.slices.rbegin(); it != g.slices.rend(); ++it) {
      Group single;
      single.key = it->key;
      single.etag = it->etag;
      single.object_size = it->end - it->begin;
      single.begin = 0;
      single.end = it->end - it->begin;
      single.first_item = it->item;
      single.slices.push_back({it->item, 0, single.end});
      queue_.push_front(std::move(single));
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
    if (r.data.ok()) ready_bytes_ -= r.data->size();
    return r;
  }

  FetchResult ErrorResult(size_t index, std::string key, absl::Status status) {
    FetchResult r;
    r.index = index;
    r.key = std::move(key);
    r.data = std::move(status);
    return r;
  }

  void Deliver(FetchResult r, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++delivered_;
    if (r.data.ok()) {
      stats_.bytes += r.data->size();
    } else {
      common_->errors->Add();
    }
    if (cancelled_) {
      deferred.dropped.push_back(std::move(r));
      return;
    }
    if (options_.ordered) {
      ready_by_index_.emplace(r.index, std::move(r));
    } else {
      if (r.data.ok()) ready_bytes_ += r.data->size();
      ready_.push_back(std::move(r));
    }
  }

  void FailGroupLocked(Group& g, const absl::Status& status, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Slice& s : g.slices) {
      Deliver(ErrorResult(s.item, s.key.empty() ? g.key : s.key, status), deferred);
    }
  }

  // Starts requests while the in-flight limit and the memory budget allow.
  void PumpLocked(Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Objects already started first (their parts left over from the in-flight limits), so
    // earlier objects finish first.
    for (auto& g : running_) {
      if (in_flight_ >= common_->MaxInFlight()) break;
      if (g->next_part < g->parts) StartPartsLocked(g, deferred);
    }
    while (!cancelled_ && !queue_.empty() && in_flight_ < common_->MaxInFlight() &&
           ready_bytes_ < kMaxReadyBytes) {
      Group& front = queue_.front();
      if (front.head_item.has_value()) {
        StartHeadLocked(std::move(front), deferred);
        queue_.pop_front();
        continue;
      }
      const uint64_t bytes = front.end - front.begin;
      // The ticket: the request's buffer, reserved before the request is scheduled.
      Block block = common_->budget->TryAllocate(common_->account, bytes);
      if (!block && front.prefilled > 0) {
        // The probe's buffer may be what the budget lacks: give it up and read those bytes
        // again (the release wakes this batch).
        deferred.garbage.push_back(std::move(front.prefill));
        front.prefilled = 0;
      }
      if (!block) {
        if (budget_stalled_since_ == absl::InfiniteFuture()) budget_stalled_since_ = absl::Now();
        break;
      }
      if (budget_stalled_since_ != absl::InfiniteFuture()) {
        const absl::Duration stalled = absl::Now() - budget_stalled_since_;
        common_->budget_wait->Observe(absl::ToDoubleSeconds(stalled));
        if (Profiler::Active()) {
          const int64_t now = MonotonicNanos();
          Profiler::Get().Record(ProfileStage::kBudget, now - absl::ToInt64Nanoseconds(stalled),
                                 now);
        }
        budget_stalled_since_ = absl::InfiniteFuture();
      }
      front.block = std::move(block);
      peak_held_ = std::max(peak_held_, common_->account->held());
      if (front.prefilled > 0) {
        std::memcpy(front.block.data(), front.prefill.data(), front.prefilled);
        deferred.garbage.push_back(std::move(front.prefill));
        front.bytes_received = front.prefilled;
      }
      const uint64_t fetch = bytes - front.prefilled;
      // A probe is one GET whatever its size: its answer is what tells the object's size.
      const uint64_t part = fetch > options_.split_threshold && !front.probe_item.has_value()
                                ? options_.part_size
                                : fetch;
      front.parts = static_cast<int>((fetch + part - 1) / part);
      front.started = absl::Now();
      running_.push_back(std::make_shared<Group>(std::move(front)));
      queue_.pop_front();
      StartPartsLocked(running_.back(), deferred);
    }
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [](const auto& g) { return g->next_part == g->parts; }),
                   running_.end());
  }

  void StartPartsLocked(const std::shared_ptr<Group>& g, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t total = g->end - g->begin - g->prefilled;  // what the GETs fetch
    const uint64_t part = total > options_.split_threshold ? options_.part_size : total;
    while (g->next_part < g->parts && in_flight_ < common_->MaxInFlight() &&
           g->next_part - g->parts_done < options_.max_parts_per_object) {
      const uint64_t off = static_cast<uint64_t>(g->next_part) * part;
      const uint64_t len = std::min(part, total - off);
      ++g->next_part;
      ++in_flight_;
      ++stats_.requests;
      common_->requests->Add();
      common_->in_flight->Add(1);
      stats_.peak_in_flight = std::max(stats_.peak_in_flight, in_flight_);
      if (!g->composed.empty()) {
        ++stats_.composed_reads;
        common_->composed_reads->Add();
        deferred.calls.push_back([self = shared_from_this(), g, sent = absl::Now()]() mutable {
          self->common_->composer->ReadAsync(
              g->composed, absl::Span<char>(g->block.data(), g->end - g->begin), self->cancel_,
              [self, g, sent](absl::StatusOr<GetResult> r) {
                self->OnPart(g, std::move(r), sent);
              });
        });
        continue;
      }
      GetRequest request;
      request.key = g->key;
      // A whole object in one request goes without a Range header: servers work harder for
      // a ranged read (RGW: ~80 us more CPU per GET, ~9% of small-object throughput when it
      // is the bottleneck). An object grown past the buffer then fails (OutOfRange) instead
      // of passing a prefix off as the object.
      const bool whole_object = g->parts == 1 && g->begin == 0 && g->prefilled == 0 &&
                                g->object_size.has_value() && g->end >= *g->object_size;
      const uint64_t at = g->prefilled + off;  // from the group's first byte
      request.range = whole_object ? ByteRange::All() : ByteRange::Of(g->begin + at, len);
      request.buffer = absl::Span<char>(g->block.data() + at, len);
      request.if_match = g->etag;  // every range of one object from the same version
      request.cancel = cancel_;
      deferred.calls.push_back([self = shared_from_this(), g, request = std::move(request),
                                sent = absl::Now()]() mutable {
        self->store_->GetAsync(std::move(request), [self, g, sent](absl::StatusOr<GetResult> r) {
          self->OnPart(g, std::move(r), sent);
        });
      });
    }
  }

  void OnPart(const std::shared_ptr<Group>& g, absl::StatusOr<GetResult> r, absl::Time sent) {
    common_->in_flight->Add(-1);
    if (r.ok()) {
      common_->bytes->Add(r->bytes);
      if (r->attempts > 1) common_->retries->Add(r->attempts - 1);
      if (r->time_to_first_byte > absl::ZeroDuration()) {
        common_->ttfb->Observe(absl::ToDoubleSeconds(r->time_to_first_byte));
        common_->link->Record(r->time_to_first_byte, r->bytes, absl::Now() - sent);
      }
    }
    Deferred deferred;
    bool wake;
    {
      absl::MutexLock lock(&mu_);
      if (common_->controller != nullptr && r.ok()) {
        common_->controller->OnComplete(MonotonicNanos(), r->bytes, r->time_to_first_byte,
                                        in_flight_);
      }
      OnPartLocked(g, std::move(r), deferred);
      wake = WakeConsumerLocked();
    }
    deferred.Run();
    if (wake) waker_->Signal();
  }

  // Whether a completion wakes the consumer now. Waking it for every result of a stream of
  // small objects costs a sleep and a wake-up (two context switches) per object, which showed
  // as ~15% more CPU per object than waking it once per several results. So in completion
  // order, while many requests are in flight, the consumer is woken once kWakeBatch results
  // are deliverable, and otherwise finds them when its short wait (kCoalesceWait) ends: a
  // result waits at most that long, against tens of milliseconds to a first byte from an
  // object store. With few requests in flight (a draining or narrow batch) every result
  // wakes it at once.
  bool WakeConsumerLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cancelled_) return true;
    // In submission order only the next result can be taken: wake the consumer when it is
    // there (a dataset waits for exactly that one), never for results it cannot take yet.
    if (options_.ordered) return ready_by_index_.find(next_index_) != ready_by_index_.end();
    return in_flight_ < kWakeBatch || ready_.size() >= size_t{kWakeBatch};
  }

  void OnPartLocked(const std::shared_ptr<Group>& g, absl::StatusOr<GetResult> r,
                    Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    --in_flight_;
    if (!r.ok()) {
      if (g->status.ok()) g->status = r.status();
    } else {
      if (g->parts_done == 0 || r->time_to_first_byte < g->ttfb) g->ttfb = r->time_to_first_byte;
      g->attempts += r->attempts;
      stats_.retries += r->attempts - 1;
      g->bytes_received += r->bytes;
      g->etag_opaque |= r->meta.etag_opaque;
      if (g->composed.empty() && !g->probe_item.has_value() && g->object_size.has_value() &&
          !g->etag.empty() && r->meta.etag == g->etag && r->meta.size != *g->object_size &&
          g->status.ok()) {
        // The version planned from (a listing's, a HEAD's) answers with another size: a reply
        // whose own length is short (a proxy's, a server's truncated body) is not the object.
        g->status = absl::DataLossError(
            absl::StrCat("get ", store_->Uri(g->key), ": the reply has ", r->meta.size,
                         " bytes of version ", g->etag, ", which was listed with ", *g->object_size,
                         " (a truncated reply, or a wrong size in the listing or index)"));
      }
      g->object_size = r->meta.size;
      // A probe's one GET has gone: the version it saw pins the reads planned from it.
      if (g->probe_item.has_value() && g->etag.empty()) g->etag = r->meta.etag;
    }
    if (++g->parts_done < g->parts) {
      PumpLocked(deferred);
      return;
    }
    if (g->status.ok()) {
      // Every byte handed out must have been received: a block may be a reused one, and
      // unfilled bytes must never pass for data.
      const uint64_t size = g->object_size.value_or(g->end);
      const uint64_t want = size > g->begin ? std::min(g->end, size) - g->begin : 0;
      if (g->bytes_received < want) {
        g->status = absl::DataLossError(absl::StrCat("get ", store_->Uri(g->key), ": received ",
                                                     g->bytes_received, " of the ", want,
                                                     " bytes from byte ", g->begin));
      }
    }
    if (g->probe_item.has_value() && !cancelled_ &&
        (g->status.ok() ? *g->object_size > g->end
                        : g->status.code() == absl::StatusCode::kOutOfRange)) {
      // Longer than the probe: read it as a HEAD's answer would have it read. Not described
      // by the probe (empty; the offset at or past the end): the HEAD decides.
      if (g->status.ok()) {
        ObjectMeta meta;
        meta.size = *g->object_size;
        meta.etag = g->etag;
        const uint64_t probed = g->end - g->begin;
        PlanLocked(g->first_item, *std::move(g->probe_item), meta, deferred, g->begin,
                   std::move(g->block), probed);
      } else {
        queue_.push_front(HeadGroup(g->first_item, *std::move(g->probe_item)));
      }
    } else if (!g->status.ok() && !g->composed.empty() && !cancelled_ &&
               g->status.code() != absl::StatusCode::kCancelled) {
      RequeueComposedLocked(*g);
    } else if (!g->status.ok()) {
      // Stop the other parts' buffer from pinning budget, then report.
      g->next_part = g->parts;
      FailGroupLocked(*g, g->status, deferred);
    } else {
      const absl::Duration latency = absl::Now() - g->started;
      const uint64_t size = g->object_size.value_or(g->end);
      const std::shared_ptr<const char> owner = g->block.owner();
      bool first = true;
      for (const Slice& s : g->slices) {
        FetchResult out;
        out.index = s.item;
        out.key = s.key.empty() ? g->key : s.key;
        out.object_size = g->composed.empty() ? size : s.end - s.begin;
        if (!g->composed.empty()) ++stats_.composed_objects;
        out.time_to_first_byte = g->ttfb;
        out.latency = latency;
        out.etag_opaque = g->etag_opaque && g->composed.empty();
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
          out.data = FetchBuffer(owner, owner.get() + (s.begin - g->begin), end - s.begin);
        }
        Deliver(std::move(out), deferred);
      }
    }
    if (g->block.owner().use_count() > 1) {
      // The results hold the buffer (none can be taken before this lock goes): the group lets
      // go of it now, so the budget is released the moment the consumer drops the last one.
      // Left to `deferred`, a consumer woken by its short wait could take and drop them all
      // before this thread ran it, find the budget held by that last reference with nothing
      // in flight, and fail the next object as if its own results blocked it.
      g->block = Block();
    } else {
      deferred.garbage.push_back(std::move(g->block));  // released outside the lock
    }
    PumpLocked(deferred);
  }

  void StartHeadLocked(Group g, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++in_flight_;
    ++stats_.requests;
    common_->requests->Add();
    stats_.peak_in_flight = std::max(stats_.peak_in_flight, in_flight_);
    const size_t index = g.first_item;
    deferred.calls.push_back(
        [self = shared_from_this(), index, item = *std::move(g.head_item)]() mutable {
          std::string key = item.key;
          self->store_->HeadAsync(std::move(key), [self, index, item = std::move(item)](
                                                      absl::StatusOr<ObjectMeta> m) mutable {
            Deferred more;
            {
              absl::MutexLock lock(&self->mu_);
              self->OnHeadLocked(index, std::move(item), std::move(m), more);
            }
            more.Run();
            self->waker_->Signal();
          });
        });
  }

  void OnHeadLocked(size_t index, FetchItem item, absl::StatusOr<ObjectMeta> m, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    --in_flight_;
    if (!m.ok()) {
      Deliver(ErrorResult(index, item.key, m.status()), deferred);
    } else {
      PlanLocked(index, std::move(item), *m, deferred);
    }
    PumpLocked(deferred);
  }

  // A group that asks the object's size with a HEAD, then plans `item` from the answer.
  static Group HeadGroup(size_t index, FetchItem item) {
    Group g;
    g.key = item.key;
    g.first_item = index;
    g.slices.push_back({index, 0, 0});
    g.head_item = std::move(item);
    return g;
  }

  // Now that the size is known (a HEAD, or a probe's answer), plans the item again at the
  // front of the queue. The caller pumps.
  // `prefill`: a probe's buffer holding the `prefilled` bytes from `prefill_begin`.
  void PlanLocked(size_t index, FetchItem item, const ObjectMeta& m, Deferred& deferred,
                  uint64_t prefill_begin = 0, Block prefill = Block(), uint64_t prefilled = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto extent = item.range.Resolve(m.size);
    if (!extent.ok()) {
      Deliver(ErrorResult(index, item.key,
                          Annotate(extent.status(), absl::StrCat("get ", store_->Uri(item.key)))),
              deferred);
    } else if (extent->first == extent->second) {
      FetchResult r;
      r.index = index;
      r.key = item.key;
      r.data = FetchBuffer();
      Deliver(std::move(r), deferred);
    } else {
      Group g;
      g.key = item.key;
      g.etag = m.etag;
      g.object_size = m.size;
      g.begin = extent->first;
      g.end = extent->second;
      g.first_item = index;
      g.slices.push_back({index, extent->first, extent->second});
      if (prefill && prefill_begin == g.begin && prefilled < g.end - g.begin) {
        g.prefill = std::move(prefill);
        g.prefilled = prefilled;
      }
      queue_.push_front(std::move(g));
    }
    if (prefill) deferred.garbage.push_back(std::move(prefill));  // released outside the lock
  }

  const std::shared_ptr<ObjectStore> store_;
  const FetchOptions options_;
  const std::shared_ptr<FetchScheduler::Common> common_;
  const std::shared_ptr<Waker> waker_ = std::make_shared<Waker>();
  uint64_t listener_ = 0;

  mutable absl::Mutex mu_;
  size_t added_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Group> queue_ ABSL_GUARDED_BY(mu_);                      // not started
  std::vector<std::shared_ptr<Group>> running_ ABSL_GUARDED_BY(mu_);  // parts left to start
  std::deque<FetchResult> ready_ ABSL_GUARDED_BY(mu_);
  std::map<size_t, FetchResult> ready_by_index_ ABSL_GUARDED_BY(mu_);
  uint64_t ready_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // of the results in ready_
  size_t next_index_ ABSL_GUARDED_BY(mu_) = 0;
  size_t delivered_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Carried by every GET of the batch: Cancel() fires it, so they stop on the wire.
  const CancelToken cancel_ = NewCancelToken();
  uint64_t peak_held_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time budget_stalled_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  FetchStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

FetchScheduler::FetchScheduler(std::shared_ptr<ObjectStore> store, FetchOptions options)
    : store_(std::move(store)), options_(std::move(options)) {
  if (!options_.runtime) options_.runtime = Runtime::Default();
  Runtime& rt = *options_.runtime;
  common_ = std::make_shared<Common>();
  common_->runtime = options_.runtime;
  common_->budget = rt.shared_budget();
  account_ = common_->account =
      common_->budget->NewAccount(options_.memory_budget, "fetch " + store_->Uri(""));
  common_->link = &rt.link(store_->Uri(""));
  const std::string scheme = store_->Uri("").substr(0, store_->Uri("").find(':'));
  const MetricLabels labels = {{"scheme", scheme}};
  MetricsRegistry& m = rt.metrics();
  common_->requests = m.GetCounter("wharf_fetch_requests_total",
                                   "Store requests (GET and HEAD) issued by fetch engines", labels);
  common_->bytes = m.GetCounter("wharf_fetch_bytes_total", "Payload bytes fetched", labels);
  common_->retries =
      m.GetCounter("wharf_fetch_retries_total", "Request attempts beyond the first", labels);
  common_->errors =
      m.GetCounter("wharf_fetch_errors_total", "Items delivered with an error", labels);
  common_->ttfb = m.GetHistogram("wharf_fetch_time_to_first_byte_seconds",
                                 "Time from sending a GET to its first response byte",
                                 Histogram::LatencyBounds(), labels);
  common_->in_flight =
      m.GetGauge("wharf_fetch_requests_in_flight", "GET requests outstanding", labels);
  common_->budget_wait =
      m.GetHistogram("wharf_fetch_budget_wait_seconds",
                     "Stalls of a fetch engine on the memory budget (queued work, no room)",
                     Histogram::LatencyBounds(), labels);
  common_->composed_reads =
      m.GetCounter("wharf_fetch_composed_reads_total",
                   "GETs of temporaries composed on the server from several small objects "
                   "(each also counted in wharf_fetch_requests_total)",
                   labels);
  if (store_->capabilities().compose) {
    if (options_.compose.has_value()) {
      common_->compose_mode = *options_.compose;
    } else if (auto mode = ComposeModeFromEnv(); mode.ok()) {
      common_->compose_mode = *mode;
    } else {
      LogLine(LogLevel::kWarning, absl::StrCat(mode.status().message(), "; using auto"));
      common_->compose_mode = ComposeMode::kAuto;
    }
    if (common_->compose_mode != ComposeMode::kOff) {
      common_->composer = std::make_unique<ComposedReads>(store_);
    }
  }
  if (options_.max_in_flight > 0) {
    common_->fixed_in_flight = options_.max_in_flight;
  } else if (rt.inflight() > 0) {
    common_->fixed_in_flight = rt.inflight();
  } else {
    // Starts where the prior (or a measured link slower to answer than the prior) puts it;
    // the controller takes it from there.
    int initial = options_.EffectiveMaxInFlight();
    if (common_->link->samples() >= LinkEstimator::kWarmup) {
      initial = std::max(initial, common_->link->InFlightFor(options_.target_bytes_per_second,
                                                             options_.typical_object_bytes));
    }
    common_->controller =
        std::make_unique<InFlightController>(InFlightController::Options{.initial = initial});
  }
}

int FetchScheduler::max_in_flight() const { return common_->MaxInFlight(); }

FetchScheduler::~FetchScheduler() {
  // Temporaries of composed reads are deleted before the scheduler is gone (and so before the
  // process may end).
  if (common_->composer != nullptr) common_->composer->WaitIdle();
}

FetchScheduler::PoolStats FetchScheduler::pool_stats() const {
  return {.reused = common_->budget->reused(), .pooled_bytes = common_->budget->pooled()};
}

std::unique_ptr<FetchScheduler::Batch> FetchScheduler::StartBatch() {
  return std::make_unique<BatchImpl::Handle>(
      std::make_shared<BatchImpl>(store_, options_, common_));
}

std::unique_ptr<FetchScheduler::Batch> FetchScheduler::Fetch(std::vector<FetchItem> items) {
  auto batch = StartBatch();
  batch->Add(std::move(items));
  batch->Close();
  return batch;
}

}  // namespace wharf
