// Test helpers: store decorators for tests of code above the store (io/, formats/, dataset/).
//
//  - ForwardingStore forwards every asynchronous call to an inner store; a test decorator
//    derives from it and overrides only the calls it changes. The blocking forms are the
//    ObjectStore defaults, i.e. they go through this decorator's asynchronous forms.
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
#include "store/object_store.h"

namespace wharf::store_testing {

class ForwardingStore : public ObjectStore {
 public:
  // Owns a share of `inner`.
  explicit ForwardingStore(std::shared_ptr<ObjectStore> inner)
      : owner_(std::move(inner)), inner_(owner_.get()) {}
  // Borrows `inner`, which must outlive this store.
  explicit ForwardingStore(ObjectStore& inner) : inner_(&inner) {}

  std::string Uri(absl::string_view key) const override { return inner_->Uri(key); }
  const Capabilities& capabilities() const override { return inner_->capabilities(); }
  void ListAsync(ListOptions options, std::string continuation,
                 Callback<ListPage> done) override {
    inner_->ListAsync(std::move(options), std::move(continuation), std::move(done));
  }
  void HeadAsync(std::string key, Callback<ObjectMeta> done) override {
    inner_->HeadAsync(std::move(key), std::move(done));
  }
  void GetAsync(GetRequest request, Callback<GetResult> done) override {
    inner_->GetAsync(std::move(request), std::move(done));
  }
  // The plain put forms come through the PutOptions forms, so a decorator that changes puts
  // overrides only those.
  void PutAsync(std::string key, absl::Cord data, Callback<ObjectMeta> done) override {
    PutAsync(std::move(key), std::move(data), PutOptions{}, std::move(done));
  }
  void PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                Callback<ObjectMeta> done) override {
    inner_->PutAsync(std::move(key), std::move(data), options, std::move(done));
  }
  void DeleteAsync(std::string key, StatusCallback done) override {
    inner_->DeleteAsync(std::move(key), std::move(done));
  }
  void DeleteManyAsync(std::vector<std::string> keys, StatusCallback done) override {
    inner_->DeleteManyAsync(std::move(keys), std::move(done));
  }
  void CopyAsync(std::string src, std::string dst, Callback<ObjectMeta> done) override {
    inner_->CopyAsync(std::move(src), std::move(dst), std::move(done));
  }
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key) override {
    return NewWriter(std::move(key), PutOptions{});
  }
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key,
                                                          const PutOptions& options) override {
    return inner_->NewWriter(std::move(key), options);
  }

 protected:
  ObjectStore& inner() const { return *inner_; }

 private:
  std::shared_ptr<ObjectStore> owner_;
  ObjectStore* inner_;
};

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
  DelayedGetStore(std::shared_ptr<ObjectStore> inner, absl::Duration delay)
      : ForwardingStore(std::move(inner)), delay_(delay) {}

  void GetAsync(GetRequest request, Callback<GetResult> done) override {
    OnGet(request);
    gets_.Enter();
    Timer::Global().After(delay_, [this, r = std::move(request), d = std::move(done)]() mutable {
      inner().GetAsync(std::move(r), [this, d = std::move(d)](absl::StatusOr<GetResult> res) mutable {
        gets_.Leave();
        std::move(d)(std::move(res));
      });
    });
  }

  int peak_in_flight() { return gets_.peak(); }
  int in_flight() { return gets_.in_flight(); }

 protected:
  // Called for every GET as it is issued.
  virtual void OnGet(const GetRequest& /*request*/) {}

 private:
  const absl::Duration delay_;
  InFlightCounter gets_;
};

}  // namespace wharf::store_testing
