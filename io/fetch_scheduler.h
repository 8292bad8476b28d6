// FetchScheduler: reads many objects (or byte ranges of them) from one ObjectStore with
// thousands of requests in flight under a fixed memory budget.
//
// Cloud stores answer each request after tens of milliseconds, so throughput comes from
// concurrency (Little's law: in flight = rate x latency), not from the wire. The scheduler
//  - keeps up to `max_in_flight` store requests outstanding, all asynchronous (no thread
//    per request: the store's event loop or blocking pool does the work);
//  - takes every buffer from the runtime's one memory budget (base/runtime.h) through an
//    account capped at `memory_budget` (buffers in flight + results delivered but not yet
//    released by the consumer): a request starts only when its buffer fits both, and
//    releasing a result lets the next one start; large buffers come from the budget's pool
//    of populated mappings, so the kernel zero-fills them once, not per object;
//  - splits objects above `split_threshold` into `part_size` ranged parts fetched
//    concurrently into one buffer; every request of an item with a known ETag carries
//    If-Match, so parts and ranges of two versions are never mixed;
//  - coalesces nearby ranges of the same object (gap <= `coalesce_gap`) into one request,
//    handing each caller range a zero-copy slice of the shared buffer;
//  - delivers results as they complete, or in submission order;
//  - is cancellable, and records per-request time to first byte, bytes and attempts.
//
// Thread-safety: a FetchScheduler may be shared; each Batch is consumed by one thread at a
// time (Next()), while completions arrive on store threads. A Batch may be destroyed at any
// time: it is cancelled, and its buffers are freed as its outstanding requests end.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/runtime.h"
#include "io/composed_read.h"
#include "store/object_store.h"

namespace wharf {

struct FetchOptions {
  // The runtime whose budget, metrics and link estimates are used; null: Runtime::Default().
  std::shared_ptr<Runtime> runtime;
  // Most store requests outstanding at once. 0: the runtime's `inflight` setting
  // (--inflight, WHARF_INFLIGHT) if set, else derived from the three numbers below and the
  // store's measured time to first byte (whichever asks for more).
  int max_in_flight = 0;
  // What max_in_flight is derived from: Little's law, in flight = target rate x latency,
  // with the rate in objects (target_bytes_per_second / typical_object_bytes). The defaults
  // (50 ms first-byte latency, 2 GB/s, 256 KiB objects) give ~380.
  absl::Duration expected_latency = absl::Milliseconds(50);
  double target_bytes_per_second = 2e9;
  uint64_t typical_object_bytes = 256 << 10;

  // This scheduler's cap on bytes in flight plus bytes delivered and not yet released, inside
  // the runtime's budget; 0: the whole budget. One request larger than the cap still runs,
  // alone, so progress is always possible.
  uint64_t memory_budget = 0;
  // What Next() does when nothing can start because this scheduler's own delivered results
  // fill the cap: false (a consumer that keeps results) fails the next item with
  // ResourceExhausted instead of waiting for itself; true (results are released elsewhere,
  // e.g. by uploads in flight) waits for releases.
  bool wait_for_release = false;
  // Objects larger than split_threshold are fetched as part_size ranges in parallel.
  uint64_t part_size = uint64_t{8} << 20;
  uint64_t split_threshold = uint64_t{16} << 20;
  // Parts of one object in flight at once (16 x 8 MiB per round trip is ~2.6 GB/s at 50 ms);
  // more only adds connections and wakeups (measured: 128 parts of one 1 GiB object on
  // loopback ran ~15% slower than 16). Other objects proceed in parallel.
  int max_parts_per_object = 16;
  // Ranges of one object closer than this are fetched with one request (0 disables).
  uint64_t coalesce_gap = uint64_t{1} << 20;
  // Deliver results in submission order instead of completion order.
  bool ordered = false;

  // Composed reads (io/composed_read.h), on stores that compose (gs:// over the JSON API):
  // whole small objects of known size are composed on the server 2 to 32 at a time (at most
  // part_size bytes together) and each group read with one GET. nullopt: WHARF_GS_COMPOSE
  // (auto unless set). kAuto composes objects up to compose_max_object_bytes once the store's
  // measured time to first byte (or, before any measurement, expected_latency) is at least
  // compose_min_latency: where a request costs a round trip, three requests for 32 objects
  // beat 32; on a fast local link they do not.
  std::optional<ComposeMode> compose;
  uint64_t compose_max_object_bytes = uint64_t{1} << 20;
  absl::Duration compose_min_latency = absl::Milliseconds(2);

  // The depth derived from the expected latency and rates above (the prior, before any
  // measurement).
  int EffectiveMaxInFlight() const;
};

struct FetchItem {
  std::string key;
  ByteRange range;  // default: the whole object
  // From a listing: the read is planned at once (without it, the first GET, of 256 KiB,
  // tells the size, and a longer object takes a second, sized read), split into parts when
  // large, and pinned to the version (If-Match). Leave unset when unknown.
  std::optional<uint64_t> size;
  std::string etag;
};

// An owned, read-only byte buffer charged against the runtime's memory budget until it
// (and every slice sharing its block) is destroyed.
class FetchBuffer {
 public:
  FetchBuffer() = default;
  FetchBuffer(std::shared_ptr<const char> block, const char* data, size_t size)
      : block_(std::move(block)), data_(data), size_(size) {}

  const char* data() const { return data_; }
  size_t size() const { return size_; }
  absl::string_view view() const { return absl::string_view(data_, size_); }
  // Shares ownership of the block (zero-copy), e.g. to hand the bytes to Python.
  std::shared_ptr<const char> block() const { return block_; }

 private:
  std::shared_ptr<const char> block_;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

struct FetchResult {
  size_t index = 0;  // position in the submitted batch
  std::string key;
  absl::StatusOr<FetchBuffer> data;
  uint64_t object_size = 0;  // size of the whole object
  absl::Duration time_to_first_byte = absl::ZeroDuration();
  absl::Duration latency = absl::ZeroDuration();  // submission of its request to completion
  int requests = 0;  // store requests it took (parts), 0 if it shared a coalesced one
  int attempts = 0;  // attempts over those requests (1 each unless retried)
  // A reply said the object's etag is no MD5 of its content (ObjectMeta::etag_opaque).
  bool etag_opaque = false;
};

struct FetchStats {
  uint64_t items = 0;
  uint64_t requests = 0;          // store GETs (+ HEADs) issued
  uint64_t composed_reads = 0;    // GETs of composed temporaries (each also in `requests`)
  uint64_t composed_objects = 0;  // objects delivered from them
  uint64_t bytes = 0;             // payload bytes delivered
  uint64_t retries = 0;
  int peak_in_flight = 0;
  uint64_t peak_bytes_held = 0;
};

class FetchScheduler {
 public:
  // REQUIRES: store != nullptr.
  FetchScheduler(std::shared_ptr<ObjectStore> store, FetchOptions options = {});
  ~FetchScheduler();
  FetchScheduler(const FetchScheduler&) = delete;
  FetchScheduler& operator=(const FetchScheduler&) = delete;

  class Batch {
   public:
    virtual ~Batch() = default;
    // Adds items (their indices continue after the earlier ones); requests start at once.
    // Lets a listing feed the batch while results are consumed.
    // REQUIRES: Close() not called yet.
    virtual void Add(std::vector<FetchItem> items) = 0;
    // No more Add() calls: Next() returns nullopt once everything added was delivered.
    virtual void Close() = 0;
    // Blocks until the next result is ready; nullopt once the batch is closed and every item
    // was delivered, or the batch was cancelled.
    virtual std::optional<FetchResult> Next() = 0;
    // Starts no new request and cancels the GETs in flight through the one CancelToken they
    // share (GetRequest::cancel: the transport aborts them); results not yet delivered are
    // dropped.
    virtual void Cancel() = 0;
    virtual FetchStats stats() const = 0;
  };

  // Starts fetching `items` as a closed batch. Requests start immediately, up to the limits.
  std::unique_ptr<Batch> Fetch(std::vector<FetchItem> items);
  // An open batch, fed with Batch::Add() and ended with Batch::Close().
  std::unique_ptr<Batch> StartBatch();

  const FetchOptions& options() const { return options_; }
  // Requests in flight this scheduler allows now: fixed by the options or the runtime, else
  // tuned while it runs (io/inflight_controller.h).
  int max_in_flight() const;
  // The runtime budget's pool of released large blocks (>= 4 MiB, already populated).
  struct PoolStats {
    uint64_t reused = 0;        // blocks served from the pool instead of a new mapping
    uint64_t pooled_bytes = 0;  // bytes mapped in the pool now
  };
  PoolStats pool_stats() const;
  // Bytes this scheduler's batches hold now (in flight + delivered, not yet released).
  uint64_t bytes_held() const { return account_->held(); }

  // Shared by the scheduler's batches (defined in the .cc).
  struct Common;

 private:
  std::shared_ptr<ObjectStore> store_;
  FetchOptions options_;
  std::shared_ptr<MemoryBudget::Account> account_;
  std::shared_ptr<Common> common_;
};

}  // namespace wharf
