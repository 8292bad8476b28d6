#include "io/inflight_controller.h"

#include <algorithm>
#include <cmath>

namespace wharf {

InFlightController::InFlightController(Options options)
    : options_(options), limit_(std::clamp(options.initial, options.min, options.max)) {
  absl::MutexLock lock(&mu_);
  hold_ = options_.hold;
}

InFlightController::Stats InFlightController::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void InFlightController::ProbeDown(int from, int64_t now_ns) {
  phase_ = Phase::kProbeDown;
  down_step_ = options_.down;
  Set(static_cast<int>(from / down_step_), now_ns);
}

void InFlightController::Set(int depth, int64_t now_ns) {
  depth = std::clamp(depth, options_.min, options_.max);
  limit_.store(depth, std::memory_order_relaxed);
  // The requests of the old depth drain for about a round trip: the next interval starts
  // after it.
  interval_start_ns_ = now_ns + static_cast<int64_t>(min_ttfb_ * 1e9);
  interval_bytes_ = interval_completions_ = interval_limited_ = 0;
  interval_min_ttfb_ = 0;
}

void InFlightController::OnComplete(int64_t now_ns, uint64_t bytes, absl::Duration ttfb,
                                    int in_flight) {
  absl::MutexLock lock(&mu_);
  if (interval_start_ns_ == 0) interval_start_ns_ = now_ns;
  if (now_ns < interval_start_ns_) return;  // still draining the previous depth
  interval_bytes_ += bytes;
  ++interval_completions_;
  if (in_flight * 10 >= limit() * 9) ++interval_limited_;
  const double t = absl::ToDoubleSeconds(ttfb);
  if (t > 0 && (interval_min_ttfb_ == 0 || t < interval_min_ttfb_)) interval_min_ttfb_ = t;
  // A probe is judged on twice the length: one interval's rate on a shared machine varies by
  // more than the gains it looks for.
  const double length =
      (phase_ == Phase::kSteady ? 1 : 2) *
      std::max(absl::ToDoubleSeconds(options_.min_interval), options_.round_trips * min_ttfb_);
  if (static_cast<double>(now_ns - interval_start_ns_) >= length * 1e9 &&
      interval_completions_ >= 8) {
    EndInterval(now_ns);
  }
}

void InFlightController::EndInterval(int64_t now_ns) {
  const int64_t start_ns = interval_start_ns_;
  const double completions = static_cast<double>(interval_completions_);
  const double rate =
      static_cast<double>(interval_bytes_) / (static_cast<double>(now_ns - start_ns) / 1e9);
  const bool limited = interval_limited_ * 2 >= interval_completions_;
  if (interval_min_ttfb_ > 0) min_ttfb_ = interval_min_ttfb_;
  interval_start_ns_ = now_ns;
  interval_bytes_ = interval_completions_ = interval_limited_ = 0;
  interval_min_ttfb_ = 0;
  const int depth = limit();

  switch (phase_) {
    case Phase::kSteady: {
      if (!limited) return;  // the depth is not what bounds this engine now
      if (settled_rate_ == 0) {
        settled_rate_ = rate;
        return;
      }
      if (rate < options_.drop * settled_rate_) {
        // The rate fell at the same depth: a farther or slower link, or a server that
        // stalled. Probe up now, from this rate: deeper is kept only if it pays.
        ++stats_.probes;
        steady_ = 0;
        hold_ = options_.hold;
        base_depth_ = depth;
        base_rate_ = rate;
        phase_ = Phase::kProbeUp;
        Set(static_cast<int>(std::ceil(depth * options_.up)), now_ns);
        return;
      }
      if (rate > settled_rate_ / options_.drop) {
        // Faster than it settled at: the link changed for the better. Measure it again,
        // and probe soon (a shallower pipe may now do).
        settled_rate_ = rate;
        steady_ = 0;
        hold_ = options_.hold;
        return;
      }
      settled_rate_ = 0.5 * settled_rate_ + 0.5 * rate;
      // Little's law: when the depth is about what the rate needs at the smallest first-byte
      // time, the requests wait on the link, not in a queue: deeper will help, probe now
      // (unless probes have been failing).
      const double objects_per_second =
          completions / (static_cast<double>(now_ns - start_ns) / 1e9);
      if (hold_ == options_.hold && min_ttfb_ > 0 &&
          depth <= 1.5 * objects_per_second * min_ttfb_) {
        steady_ = hold_;
      }
      if (++steady_ < hold_) return;
      steady_ = 0;
      ++stats_.probes;
      base_depth_ = depth;
      base_rate_ = settled_rate_;
      if (depth >= options_.max) {
        ProbeDown(depth, now_ns);
      } else {
        phase_ = Phase::kProbeUp;
        Set(static_cast<int>(std::ceil(depth * options_.up)), now_ns);
      }
      return;
    }
    case Phase::kProbeUp: {
      if (limited && rate > options_.gain * base_rate_) {
        ++stats_.kept;
        hold_ = options_.hold;
        base_depth_ = depth;
        base_rate_ = rate;
        if (depth < options_.max) {
          ++stats_.probes;
          Set(static_cast<int>(std::ceil(depth * options_.up)), now_ns);
          return;
        }
        phase_ = Phase::kSteady;
        settled_rate_ = rate;
        return;
      }
      // No gain (or the engine could not even fill the deeper pipe): try shallower.
      if (base_depth_ <= options_.min) {
        phase_ = Phase::kSteady;
        settled_rate_ = base_rate_;
        Set(base_depth_, now_ns);
        return;
      }
      ++stats_.probes;
      ProbeDown(base_depth_, now_ns);
      return;
    }
    case Phase::kProbeDown: {
      // Kept when it costs (almost) nothing.
      if (rate >= options_.loss * base_rate_) {
        ++stats_.kept;
        hold_ = options_.hold;
        base_depth_ = depth;
        // The next step down is held to the best rate seen, not to this one, so a descent
        // loses at most (1 - loss) in all, and a link that got faster meanwhile raises it.
        base_rate_ = std::max(base_rate_, rate);
        if (depth > options_.min) {
          // A descent that keeps paying speeds up: each kept step makes the next one
          // `down` times larger, up to down^2 (380 -> 253 -> 112 -> 50 -> 22 at loopback,
          // instead of eight steps of 1.5 to reach ~16); a step too far is undone as any.
          ++stats_.probes;
          down_step_ = std::min(down_step_ * options_.down, options_.down * options_.down);
          Set(static_cast<int>(depth / down_step_), now_ns);
          return;
        }
        phase_ = Phase::kSteady;
        settled_rate_ = rate;
        return;
      }
      // The step down cost throughput: back, and probe less often while nothing changes.
      phase_ = Phase::kSteady;
      settled_rate_ = base_rate_;
      hold_ = std::min(hold_ * 2, 8 * options_.hold);
      Set(base_depth_, now_ns);
      return;
    }
  }
}

}  // namespace wharf
