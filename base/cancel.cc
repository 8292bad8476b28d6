#include "base/cancel.h"

#include <utility>
#include <vector>

namespace wharf {

void Cancellation::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_.exchange(true, std::memory_order_acq_rel)) return;
    running_ = true;
    runner_ = std::this_thread::get_id();
  }
  // One at a time, each taken out under the lock: a callback forgotten before its turn (by
  // an earlier callback, or by another thread) never runs. None is added meanwhile:
  // OnCancel runs new ones inline once cancelled_ is set.
  while (true) {
    absl::AnyInvocable<void() &&> fn;
    {
      absl::MutexLock lock(&mu_);
      if (callbacks_.empty()) {
        running_ = false;
        return;
      }
      fn = std::move(callbacks_.begin()->second);
      callbacks_.erase(callbacks_.begin());
    }
    std::move(fn)();
  }
}

uint64_t Cancellation::OnCancel(absl::AnyInvocable<void() &&> fn) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_.load(std::memory_order_acquire)) {
      const uint64_t id = next_++;
      callbacks_.emplace(id, std::move(fn));
      return id;
    }
  }
  std::move(fn)();
  return 0;
}

void Cancellation::Forget(uint64_t id) {
  if (id == 0) return;
  absl::MutexLock lock(&mu_);
  if (callbacks_.erase(id) > 0) return;
  // Already taken by Cancel(): wait until the callbacks have run, unless this thread is the
  // one running them (a callback forgetting another).
  if (!running_ || runner_ == std::this_thread::get_id()) return;
  mu_.Await(absl::Condition(
      +[](bool* running) { return !*running; }, &running_));
}

}  // namespace wharf
