#include "store/retry_meter.h"

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

}  // namespace wharf
