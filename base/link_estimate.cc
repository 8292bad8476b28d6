#include "base/link_estimate.h"

#include <algorithm>
#include <cmath>

namespace wharf {

void LinkEstimator::Blend(std::atomic<double>& slot, double sample, bool first) {
  double old = slot.load(std::memory_order_relaxed);
  while (true) {
    // Exponentially weighted: each sample moves the estimate 1/16 of the way.
    const double next = first ? sample : old + (sample - old) / 16;
    if (slot.compare_exchange_weak(old, next, std::memory_order_relaxed)) return;
  }
}

void LinkEstimator::Record(absl::Duration ttfb, uint64_t bytes, absl::Duration duration) {
  const uint64_t n = samples_.fetch_add(1, std::memory_order_relaxed);
  if (ttfb > absl::ZeroDuration()) Blend(ttfb_seconds_, absl::ToDoubleSeconds(ttfb), n == 0);
  const absl::Duration transfer = duration - ttfb;
  if (bytes >= kBandwidthSampleBytes && transfer > absl::ZeroDuration()) {
    const uint64_t m = bandwidth_samples_.fetch_add(1, std::memory_order_relaxed);
    Blend(bytes_per_second_, bytes / absl::ToDoubleSeconds(transfer), m == 0);
  }
}

absl::Duration LinkEstimator::time_to_first_byte() const {
  if (samples() < kWarmup) return absl::Seconds(kPriorTtfbSeconds);
  return absl::Seconds(ttfb_seconds_.load(std::memory_order_relaxed));
}

double LinkEstimator::bytes_per_second() const {
  if (bandwidth_samples_.load(std::memory_order_relaxed) < kWarmup) return kPriorBytesPerSecond;
  return bytes_per_second_.load(std::memory_order_relaxed);
}

int LinkEstimator::InFlightFor(double target_bytes_per_second, uint64_t object_bytes) const {
  const double ttfb = std::max(kPriorTtfbSeconds, absl::ToDoubleSeconds(time_to_first_byte()));
  const double objects_per_second =
      target_bytes_per_second / static_cast<double>(std::max<uint64_t>(1, object_bytes));
  return static_cast<int>(std::clamp(std::ceil(objects_per_second * ttfb), 32.0, 4096.0));
}

uint64_t LinkEstimator::PartSize() const {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  const double bdp = bytes_per_second() * absl::ToDoubleSeconds(time_to_first_byte());
  const uint64_t mib = static_cast<uint64_t>(std::ceil(bdp / kMiB));
  return std::clamp<uint64_t>(mib, 8, 64) * kMiB;
}

}  // namespace wharf
