// ComposedReads: many small objects read with one GET, by composing them on the server first
// (GCS `compose`, Capabilities::compose), as Google's Dataflux does (docs/design/gcs.md).
//
// One read: compose up to 32 sources into a temporary object, GET it whole into the caller's
// buffer (the sources' bytes back to back, split by their listed sizes by the caller), delete
// the temporary. Three requests instead of N GETs; the win is where each request costs a round
// trip and per-request overhead that the bytes do not (small objects, remote store).
//
// Litter: temporaries live under `.wharf-compose/<host>/<pid>-<start>/` in the bucket. Every
// temporary this object creates is deleted before its destructor returns (deletes in flight
// are waited for), whatever became of the read (failed, cancelled). A process killed mid-read
// leaves its temporaries: the first composed read of a later process sweeps what dead
// processes of this host left, and anything older than an hour from any host.
//
// Permission: credentials that can read but not write cannot compose. The first compose
// answered PermissionDenied turns composition off for this object (disabled()) with one
// warning; callers then read the objects one by one.
//
// Thread-safety: thread-safe. Callbacks run on store threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/cancel.h"
#include "store/object_store.h"

namespace wharf {

// WHARF_GS_COMPOSE: "auto" (the default: compose where it pays), "off", or "on" (compose every
// eligible batch, for tests and benchmarks).
enum class ComposeMode { kAuto, kOff, kOn };
// The mode from WHARF_GS_COMPOSE; unset or empty is kAuto. InvalidArgument for other values.
absl::StatusOr<ComposeMode> ComposeModeFromEnv();

class ComposedReads {
 public:
  struct Source {
    std::string key;
    uint64_t size = 0;
  };
  // GCS composes at most 32 sources into one object.
  static constexpr int kMaxSources = 32;
  // Where temporaries live, under the bucket's root.
  static constexpr const char* kTempRoot = kComposeTempRoot;

  // REQUIRES: store->capabilities().compose.
  explicit ComposedReads(std::shared_ptr<ObjectStore> store);
  // Does not wait: deletes in flight finish on their own (they keep what they need alive).
  ~ComposedReads();

  // Waits until every temporary created so far is deleted (and the sweep is done), bounded by
  // the store's retries. Call it before the process may end (FetchScheduler's destructor does).
  // REQUIRES: not on a store callback thread.
  void WaitIdle();
  ComposedReads(const ComposedReads&) = delete;
  ComposedReads& operator=(const ComposedReads&) = delete;

  // Composes `sources` into a temporary, reads it into `buffer`, deletes it. `done` gets the
  // read's result, or the first failure (the temporary is deleted either way). DataLoss when
  // the composed object is not the sum of the listed sizes (a source changed since listing).
  // REQUIRES: 2..kMaxSources sources; buffer.size() == the sum of their sizes; `buffer` valid
  // until `done` runs.
  void ReadAsync(std::vector<Source> sources, absl::Span<char> buffer, CancelToken cancel,
                 Callback<GetResult> done);

  // True once a compose was refused for lack of permission.
  bool disabled() const { return shared_->disabled.load(std::memory_order_relaxed); }

  // Temporaries created and deleted so far.
  uint64_t created() const { return created_.load(std::memory_order_relaxed); }

  // Deletes the temporaries under kTempRoot that no running process will delete: those of
  // processes of this host that are gone, and any older than `max_age`. Returns how many.
  static absl::StatusOr<int> Sweep(ObjectStore& store, absl::Duration max_age = absl::Hours(1));

 private:
  // What callbacks may outlive this object with.
  struct Shared {
    std::shared_ptr<ObjectStore> store;
    std::atomic<bool> disabled{false};
    absl::Mutex mu;
    int pending ABSL_GUARDED_BY(mu) = 0;  // deletes and the sweep in flight
    void DeleteTemp(const std::shared_ptr<Shared>& self, std::string key);
    void Done();
  };
  void StartSweepOnce();

  const std::shared_ptr<Shared> shared_;
  const std::string prefix_;  // kTempRoot + host/pid-start/
  std::atomic<uint64_t> next_{0};
  std::atomic<uint64_t> created_{0};
  std::atomic<bool> swept_{false};
};

}  // namespace wharf
