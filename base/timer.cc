#include "base/timer.h"

#include <utility>

#include "base/runtime.h"

namespace wharf {

Timer::Timer() : thread_([this] { Loop(); }) {}

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

}  // namespace wharf
