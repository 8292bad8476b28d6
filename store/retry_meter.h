// What the retry loops of the network stores (s3://, gs://) share: a counter of retries per
// cause in the runtime's metrics (each cause's counter looked up once: a registry lookup takes
// a lock, retries are rare), and the random samples of their backoff's jitter.
// Thread-safe.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "base/metrics.h"

namespace wharf {

class RetryMeter {
 public:
  // `metric` is a counter with one label, `cause`.
  RetryMeter(std::string metric, std::string help)
      : metric_(std::move(metric)), help_(std::move(help)) {}

  // Adds one to metric{cause}.
  void Count(absl::string_view cause);
  // A uniform sample in [0, 1), for RetryPolicy::Backoff.
  double Uniform01();

 private:
  const std::string metric_;
  const std::string help_;
  absl::Mutex mu_;
  absl::BitGen rng_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Counter*, std::less<>> counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wharf
