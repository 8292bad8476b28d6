#include "base/timer.h"

#include <utility>

#include "base/fork.h"
#include "base/runtime.h"

namespace wharf {

Timer::Timer() : thread_(StartThread([this] { Loop(); })) {}

Timer::~Timer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

Timer& Timer::Global() { return Runtime::Default()->timer(); }

void Timer::After(absl::Duration delay, absl::AnyInvocable<void() &&> fn) {
  absl::MutexLock lock(&mu_);
  queue_.push(Entry{absl::Now() + delay, next_seq_++, std::move(fn)});
}

void Timer::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (queue_.empty()) {
      mu_.Await(absl::Condition(
          +[](Timer* t)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return t->stopping_ || !t->queue_.empty(); },
          this));
      continue;
    }
    const absl::Time due = queue_.top().due;
    if (absl::Now() < due) {
      // Wakes early when an earlier entry is pushed (the condition sees a new top).
      std::pair<Timer*, absl::Time> arg(this, due);
      mu_.AwaitWithDeadline(
          absl::Condition(
              +[](std::pair<Timer*, absl::Time>* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                return a->first->stopping_ || a->first->queue_.top().due < a->second;
              },
              &arg),
          due);
      continue;
    }
    auto fn = std::move(queue_.top().fn);
    queue_.pop();
    mu_.Unlock();
    std::move(fn)();
    mu_.Lock();
  }
}

void AfterDelayOrCancel(absl::Duration delay, const CancelToken& cancel,
                        absl::AnyInvocable<void() &&> fn) {
  if (cancel == nullptr) return Timer::Global().After(delay, std::move(fn));
  struct Once {
    absl::Mutex mu;
    bool ran ABSL_GUARDED_BY(mu) = false;
    uint64_t cancel_id ABSL_GUARDED_BY(mu) = 0;
    absl::AnyInvocable<void() &&> fn;
  };
  auto once = std::make_shared<Once>();
  once->fn = std::move(fn);
  auto run = [once, cancel] {
    uint64_t id;
    {
      absl::MutexLock lock(&once->mu);
      if (once->ran) return;
      once->ran = true;
      id = once->cancel_id;
    }
    cancel->Forget(id);  // a no-op when the cancel is what ran us
    // Moved out so that what it holds (the call, `done`) is released after it ran, not when
    // the other of the timer entry and the cancel callback lets go of `once`.
    absl::AnyInvocable<void()&&> fn = std::move(once->fn);
    std::move(fn)();
  };
  // The cancel callback runs on the canceller's thread: it only moves the work to the timer.
  const uint64_t id =
      cancel->OnCancel([run]() mutable { Timer::Global().After(absl::ZeroDuration(), run); });
  {
    absl::MutexLock lock(&once->mu);
    if (!once->ran) once->cancel_id = id;
  }
  Timer::Global().After(delay, std::move(run));
}

}  // namespace wharf
