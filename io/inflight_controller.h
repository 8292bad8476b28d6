// InFlightController: how many requests a fetch engine keeps in flight when nobody fixed the
// number (docs/design/profiler.md, "Self-tuning I/O").
//
// Little's law says in flight = throughput x latency, but neither factor is known: the
// latency a client measures includes the server's queue, which grows with the requests in
// flight once the server is saturated, so sizing from measured latency alone feeds on
// itself (measured: rescaling by the change of the first-byte time left one loopback S1 run
// at 387 MiB RSS against 115 MiB at a fixed 380). The controller instead climbs the
// measured throughput:
//  - it counts the bytes completed per interval (at least `min_interval` and `round_trips`
//    x the smallest first byte), using only intervals in which the engine actually had
//    `limit()` requests in flight (a consumer- or budget-bound engine says nothing about the
//    depth);
//  - every `hold` intervals it probes, each probe measured over two intervals (one
//    interval's rate on a shared machine varies by more than the gains it looks for): up
//    (x `up`) and, when that gained less than `gain`, down (/ `down`); a probe is kept when it
//    gained (up) or cost less than `loss` (down), else the depth returns to where it was, and
//    probes come half as often (up to 8 x `hold` intervals apart) until one is kept; a
//    descent speeds up while its steps are kept (each `down` times larger, up to down^2);
//  - Little's law as a hint only: when the depth is about rate x smallest first byte (the
//    requests wait on the link, not in a queue), deeper will help: it probes now;
//  - a rate that falls below `drop` x the settled one (a farther or slower link) starts an
//    upward probe at once, which doubles the depth for as long as each doubling pays; a rate
//    that rises as much is measured afresh.
// The depth stays in [min, max].
//
// Thread-safety: thread-safe; OnComplete is called from store threads (a mutex, held for a
// few arithmetic operations), limit() is one relaxed load.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace wharf {

class InFlightController {
 public:
  struct Options {
    int initial = 64;
    int min = 8;
    int max = 4096;
    // An interval lasts at least this, and at least `round_trips` x the smallest first-byte
    // time of the last interval.
    absl::Duration min_interval = absl::Milliseconds(250);
    double round_trips = 2;
    int hold = 4;        // steady intervals between probes
    double up = 2.0;     // an upward probe multiplies the depth by this
    double down = 1.5;   // a downward probe divides it by this
    double gain = 1.10;  // an upward probe is kept when the rate rose by this factor
    double loss = 0.95;  // a downward probe is kept when the rate stayed above this factor
    double drop = 0.6;   // a steady rate below this x the settled one triggers a probe
  };

  explicit InFlightController(Options options);

  // The depth to keep now.
  int limit() const { return limit_.load(std::memory_order_relaxed); }

  // One completed request at `now_ns` (any monotonic clock) with `bytes` and its time to
  // first byte; `in_flight` is how many requests the engine had outstanding when it ended
  // (counting this one).
  void OnComplete(int64_t now_ns, uint64_t bytes, absl::Duration ttfb, int in_flight);

  // For tests and the profiler: probes kept and reverted so far.
  struct Stats {
    int probes = 0;
    int kept = 0;
  };
  Stats stats() const;

 private:
  enum class Phase { kSteady, kProbeUp, kProbeDown };
  void EndInterval(int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts a descent from `from`: one step of `down` (later steps grow while kept).
  void ProbeDown(int from, int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the depth; the next interval starts once the old depth's requests drained.
  void Set(int depth, int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  std::atomic<int> limit_;
  mutable absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kSteady;
  int64_t interval_start_ns_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t interval_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t interval_completions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t interval_limited_ ABSL_GUARDED_BY(mu_) = 0;  // completions with the engine full
  double interval_min_ttfb_ ABSL_GUARDED_BY(mu_) = 0;   // seconds; 0: none yet
  double min_ttfb_ ABSL_GUARDED_BY(mu_) = 0;            // of the last interval
  int steady_ ABSL_GUARDED_BY(mu_) = 0;                 // steady intervals since the last probe
  int hold_ ABSL_GUARDED_BY(mu_) = 0;             // steady intervals between probes now (backs off)
  double settled_rate_ ABSL_GUARDED_BY(mu_) = 0;  // bytes/s at the current depth
  int base_depth_ ABSL_GUARDED_BY(mu_) = 0;       // the depth a probe returns to
  double base_rate_ ABSL_GUARDED_BY(mu_) = 0;
  double down_step_ ABSL_GUARDED_BY(mu_) = 1;  // the divisor of a descent's last step
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wharf
