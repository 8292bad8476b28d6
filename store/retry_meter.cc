#include "store/retry_meter.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/log.h"
#include "base/runtime.h"

namespace wharf {

void RetryMeter::Count(absl::string_view cause) {
  Counter* counter;
  {
    absl::MutexLock lock(&mu_);
    auto it = counters_.find(cause);
    if (it == counters_.end()) {
      it = counters_
               .emplace(std::string(cause), Runtime::Default()->metrics().GetCounter(
                                                metric_, help_, {{"cause", std::string(cause)}}))
               .first;
    }
    counter = it->second;
  }
  counter->Add();
}

double RetryMeter::Uniform01() {
  absl::MutexLock lock(&mu_);
  return absl::Uniform<double>(rng_, 0.0, 1.0);
}

void RetryMeter::WarnSlowRetry(absl::string_view what, const absl::Status& failure,
                               absl::Duration took, absl::Duration stall_timeout, int next,
                               int max) {
  if (took < std::min(absl::Seconds(10), stall_timeout) || !LogEnabled(LogLevel::kWarning)) {
    return;
  }
  int unsaid;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now - last_warning_ < absl::Seconds(10)) {
      ++unsaid_;
      return;
    }
    last_warning_ = now;
    unsaid = std::exchange(unsaid_, 0);
  }
  LogLine(
      LogLevel::kWarning,
      absl::StrCat(what, ": ", failure.message(),
                   absl::StrFormat(" (after %.0f s); retrying, attempt %d of %d",
                                   absl::ToDoubleSeconds(took), next, max),
                   unsaid > 0 ? absl::StrCat(" (", unsaid, " more slow requests retried)") : ""));
}

}  // namespace wharf
