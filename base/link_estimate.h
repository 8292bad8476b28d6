// LinkEstimator: what one store's link does, learned from completed requests: time to first
// byte and per-connection bandwidth (docs/design/runtime.md, "Sizing from measurements").
// Every sizing decision (requests in flight, part size, read-ahead) reads it, so a process
// that talks to a slow, far bucket sizes itself for it and one on loopback does not pay for
// a bucket it does not have.
// Thread-safety: thread-safe; Record is lock-free (a CAS per field).
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace wharf {

class LinkEstimator {
 public:
  // Until this many requests were recorded, the estimates are the priors below.
  static constexpr int kWarmup = 8;
  static constexpr double kPriorTtfbSeconds = 0.050;
  static constexpr double kPriorBytesPerSecond = 100e6;
  // Transfers shorter than this say little about bandwidth (they are all first byte).
  static constexpr uint64_t kBandwidthSampleBytes = uint64_t{1} << 20;

  // One completed request: time to first byte, bytes received, and total duration.
  void Record(absl::Duration ttfb, uint64_t bytes, absl::Duration duration);

  absl::Duration time_to_first_byte() const;
  double bytes_per_second() const;  // per connection
  uint64_t samples() const { return samples_.load(std::memory_order_relaxed); }

  // Requests to keep in flight to move `target_bytes_per_second` in objects of
  // `object_bytes`: rate x time to first byte (Little's law), in [32, 4096]. The time to
  // first byte used is never below the prior, so a fast link keeps the default depth.
  int InFlightFor(double target_bytes_per_second, uint64_t object_bytes) const;
  // Part size for split reads and streamed writes: at least bandwidth x time to first byte,
  // in MiB, clamped to [8, 64] MiB.
  uint64_t PartSize() const;

 private:
  static void Blend(std::atomic<double>& slot, double sample, bool first);
  std::atomic<uint64_t> samples_{0};
  std::atomic<uint64_t> bandwidth_samples_{0};
  std::atomic<double> ttfb_seconds_{kPriorTtfbSeconds};
  std::atomic<double> bytes_per_second_{kPriorBytesPerSecond};
};

}  // namespace wharf
