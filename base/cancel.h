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
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

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

// ---- The ambient token: cancellation that follows an operation across threads ----
// A blocking call at an edge that can be interrupted (the Python package's, with Ctrl-C)
// sets a token for the work it starts. HTTP requests sent while it is set carry it
// (HttpRequest::scope), and it follows the work: the transport runs a request's callback
// with it set, ThreadPool::Schedule and the timer run a closure with the token that was set
// when it was queued. So the retries, parts and pages that callbacks start belong to the same
// operation, and cancelling the token stops all of it. Work shared by several operations (a
// credential fetch) runs with none, and so does the cleanup of a cancelled operation (aborting
// its multipart upload must not be cancelled with it). Null almost everywhere: the CLI has
// its own handling of signals (base/interrupt.h).
const CancelToken& AmbientCancel();

// `fn`, made to run with the ambient token set now (unchanged when none is): what an
// executor does with each closure it queues.
absl::AnyInvocable<void() &&> BindAmbient(absl::AnyInvocable<void() &&> fn);

// Sets the calling thread's ambient token for its lifetime, then restores the previous one.
class ScopedAmbientCancel {
 public:
  explicit ScopedAmbientCancel(CancelToken token);
  ~ScopedAmbientCancel();
  ScopedAmbientCancel(const ScopedAmbientCancel&) = delete;
  ScopedAmbientCancel& operator=(const ScopedAmbientCancel&) = delete;

 private:
  CancelToken previous_;
};

// ---- Interruptible waits ----
// An edge whose blocked thread can be interrupted (Python's main thread: Ctrl-C raises
// KeyboardInterrupt there, but only once the thread runs Python again) installs a poll for as
// long as it blocks. The waits of the engine that such a call reaches (WaitFor, the readers'
// and the loaders' waits) call it every kInterruptPollPeriod; the first time it returns true,
// the ambient token is cancelled. A wait never returns early because of it: what it waits for
// may write into the waiter's stack. It goes on until the cancelled work has ended, which
// is soon: requests are aborted, retries and backoff stop, nothing new is sent.
inline constexpr absl::Duration kInterruptPollPeriod = absl::Milliseconds(50);

// Returns true when the blocked thread is to stop (it has captured what it will raise).
// Called without any lock of the engine held.
using InterruptPoll = bool (*)();

class ScopedInterruptPoll {
 public:
  explicit ScopedInterruptPoll(InterruptPoll poll);
  ~ScopedInterruptPoll();
  ScopedInterruptPoll(const ScopedInterruptPoll&) = delete;
  ScopedInterruptPoll& operator=(const ScopedInterruptPoll&) = delete;

 private:
  InterruptPoll previous_;
  bool previous_interrupted_;
};

// Whether a poll is installed on this thread (a wait must then wake up to call it).
bool InterruptPollInstalled();

// Calls the installed poll, if any and if it has not fired yet; when it fires, cancels the
// ambient token. Returns whether this thread has been interrupted. REQUIRES: no lock held
// that the cancelled work's callbacks take.
bool PollInterrupt();

// mu.Await(cond), calling PollInterrupt() every kInterruptPollPeriod (with `mu` released)
// while a poll is installed. REQUIRES: `mu` held.
void AwaitInterruptibly(absl::Mutex& mu, const absl::Condition& cond)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

// n.WaitForNotification(), polling the same way.
void WaitInterruptibly(absl::Notification& n);

}  // namespace wharf
