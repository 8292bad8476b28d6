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

namespace wharf {
namespace {

thread_local CancelToken tls_ambient;
thread_local InterruptPoll tls_poll = nullptr;
// The installed poll fired on this thread (it is not called again).
thread_local bool tls_interrupted = false;
thread_local absl::Time tls_last_poll = absl::InfinitePast();

}  // namespace

const CancelToken& AmbientCancel() { return tls_ambient; }

absl::AnyInvocable<void() &&> BindAmbient(absl::AnyInvocable<void() &&> fn) {
  if (tls_ambient == nullptr) return fn;
  return [scope = tls_ambient, fn = std::move(fn)]() mutable {
    ScopedAmbientCancel ambient(std::move(scope));
    std::move(fn)();
  };
}

ScopedAmbientCancel::ScopedAmbientCancel(CancelToken token)
    : previous_(std::exchange(tls_ambient, std::move(token))) {}

ScopedAmbientCancel::~ScopedAmbientCancel() { tls_ambient = std::move(previous_); }

ScopedInterruptPoll::ScopedInterruptPoll(InterruptPoll poll)
    : previous_(std::exchange(tls_poll, poll)),
      previous_interrupted_(std::exchange(tls_interrupted, false)) {}

ScopedInterruptPoll::~ScopedInterruptPoll() {
  tls_poll = previous_;
  tls_interrupted = previous_interrupted_;
}

bool InterruptPollInstalled() { return tls_poll != nullptr; }

bool PollInterrupt() {
  if (tls_poll == nullptr) return false;
  if (tls_interrupted) return true;
  // At most once a period, however often a wait loop comes round.
  const absl::Time now = absl::Now();
  if (now - tls_last_poll < kInterruptPollPeriod) return false;
  tls_last_poll = now;
  // Not re-entered: the poll may run code (Python's signal handlers, and the garbage
  // collection and finalizers that come with them) whose own waits would poll again.
  const InterruptPoll poll = std::exchange(tls_poll, nullptr);
  const bool stop = poll();
  tls_poll = poll;
  if (!stop) return false;
  tls_interrupted = true;
  // A copy: the callbacks Cancel() runs may change this thread's ambient token.
  if (CancelToken token = tls_ambient) token->Cancel();
  return true;
}

void AwaitInterruptibly(absl::Mutex& mu, const absl::Condition& cond) {
  if (tls_poll == nullptr) return mu.Await(cond);
  while (!mu.AwaitWithTimeout(cond, kInterruptPollPeriod)) {
    if (tls_interrupted) continue;  // cancelled already: wait for the work to end
    mu.Unlock();
    PollInterrupt();
    mu.Lock();
  }
}

void WaitInterruptibly(absl::Notification& n) {
  if (tls_poll == nullptr) return n.WaitForNotification();
  while (!n.WaitForNotificationWithTimeout(kInterruptPollPeriod)) PollInterrupt();
}

}  // namespace wharf
