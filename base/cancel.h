// Cancellation: a shared flag that asynchronous work checks and registers callbacks on. A GET
// carries a CancelToken in its read options; the transport aborts the transfer when it fires,
// retries stop, and a fetch batch cancels its token in Cancel() so its requests stop on the
// wire instead of running to completion unobserved.
//
// Thread-safety: thread-safe. Callbacks run once, on the thread that calls Cancel() (or inline
// in OnCancel when the token is already cancelled); they must be short and must not block.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace wharf {

class Cancellation {
 public:
  Cancellation() = default;
  Cancellation(const Cancellation&) = delete;
  Cancellation& operator=(const Cancellation&) = delete;

  // Idempotent: the first call runs the registered callbacks.
  void Cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  // Runs `fn` at cancellation (now, inline, if already cancelled, in which case 0 is
  // returned). Otherwise returns an id for Forget().
  uint64_t OnCancel(absl::AnyInvocable<void() &&> fn);
  // Unregisters a callback that has not run. After it returns the callback is not running.
  void Forget(uint64_t id);

 private:
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  std::map<uint64_t, absl::AnyInvocable<void() &&>> callbacks_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  std::thread::id runner_ ABSL_GUARDED_BY(mu_);
};

// Shared by the canceller and the work it may cancel; null means "not cancellable".
using CancelToken = std::shared_ptr<Cancellation>;

inline CancelToken NewCancelToken() { return std::make_shared<Cancellation>(); }
inline bool IsCancelled(const CancelToken& token) { return token && token->cancelled(); }

}  // namespace wharf
