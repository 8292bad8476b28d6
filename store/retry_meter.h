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
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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

  // Warns (LogLevel::kWarning) that `what` ("get s3://b/k") failed with `failure` after
  // `took` and is sent again as attempt `next` of `max`, when `took` is 10 s or more, or the
  // transport's whole `stall_timeout` if that is shorter: a stalled or unreachable server
  // would otherwise keep a command silent for minutes. At most
  // one line per 10 s per meter (many requests stall together); the next line counts the
  // retries it left unsaid.
  void WarnSlowRetry(absl::string_view what, const absl::Status& failure, absl::Duration took,
                     absl::Duration stall_timeout, int next, int max);

 private:
  const std::string metric_;
  const std::string help_;
  absl::Mutex mu_;
  absl::BitGen rng_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Counter*, std::less<>> counters_ ABSL_GUARDED_BY(mu_);
  absl::Time last_warning_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int unsaid_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace wharf
