// Test helpers: store decorators for tests of code above the store (io/, formats/, dataset/),
// built on the public decorator base ForwardingStore (store/forwarding_store.h).
//
//  - InFlightCounter counts the calls in flight through a decorator, their peak and total.
//  - DelayedGetStore delays every GET by a fixed time on the shared timer (as a network
//    would; no thread sleeps) and counts the GETs in flight and their peak.
//
// Thread-safety: as the inner store; the counters are guarded by a mutex.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/timer.h"
#include "store/forwarding_store.h"
#include "store/object_store.h"

namespace wharf::store_testing {

// Counts calls in flight, their peak and their total. Thread-safe.
class InFlightCounter {
 public:
  // A call starts; returns its number (1-based).
  int Enter() {
    absl::MutexLock lock(&mu_);
    peak_ = std::max(peak_, ++in_flight_);
    return ++calls_;
  }
  void Leave() {
    absl::MutexLock lock(&mu_);
    --in_flight_;
  }
  int peak() {
    absl::MutexLock lock(&mu_);
    return peak_;
  }
  int in_flight() {
    absl::MutexLock lock(&mu_);
    return in_flight_;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int peak_ ABSL_GUARDED_BY(mu_) = 0;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

class DelayedGetStore : public ForwardingStore {
 public:
  // `report_first_byte`: results carry the delay as their time to first byte, as a network
  // store's do (readers that size their work by it see a far store).
  DelayedGetStore(std::shared_ptr<ObjectStore> inner, absl::Duration delay,
                  bool report_first_byte = false)
      : ForwardingStore(std::move(inner)), delay_(delay), report_first_byte_(report_first_byte) {}

  void GetAsync(GetRequest request, Callback<GetResult> done) override {
    OnGet(request);
    gets_.Enter();
    Timer::Global().After(delay_, [this, r = std::move(request), d = std::move(done)]() mutable {
      inner().GetAsync(std::move(r),
                       [this, d = std::move(d)](absl::StatusOr<GetResult> res) mutable {
                         gets_.Leave();
                         if (res.ok() && report_first_byte_) res->time_to_first_byte = delay_;
                         std::move(d)(std::move(res));
                       });
    });
  }

  int peak_in_flight() { return gets_.peak(); }
  int in_flight() { return gets_.in_flight(); }
  int gets() { return gets_.calls(); }

 protected:
  // Called for every GET as it is issued.
  virtual void OnGet(const GetRequest& /*request*/) {}

 private:
  const absl::Duration delay_;
  const bool report_first_byte_;
  InFlightCounter gets_;
};

}  // namespace wharf::store_testing
