#include "base/timer.h"

#include <utility>
#include <vector>

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
  // The closure runs with the ambient token that was set when it was queued (base/cancel.h).
  fn = BindAmbient(std::move(fn));
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
  // The call's own token and the ambient one (the operation's) both cut the delay short.
  std::vector<CancelToken> tokens;
  if (cancel != nullptr) tokens.push_back(cancel);
  if (const CancelToken& scope = AmbientCancel(); scope != nullptr && scope != cancel) {
    tokens.push_back(scope);
  }
  if (tokens.empty()) return Timer::Global().After(delay, std::move(fn));
  // Run with the ambient token set now, whichever thread's cancel moves it to the timer.
  fn = BindAmbient(std::move(fn));
  struct Once {
    absl::Mutex mu;
    bool ran ABSL_GUARDED_BY(mu) = false;
    std::vector<std::pair<CancelToken, uint64_t>> registered ABSL_GUARDED_BY(mu);
    absl::AnyInvocable<void() &&> fn;
  };
  auto once = std::make_shared<Once>();
  once->fn = std::move(fn);
  auto run = [once] {
    std::vector<std::pair<CancelToken, uint64_t>> registered;
    {
      absl::MutexLock lock(&once->mu);
      if (once->ran) return;
      once->ran = true;
      registered = std::move(once->registered);
    }
    // A no-op for the token whose cancel is what ran us.
    for (auto& [token, id] : registered) token->Forget(id);
    // Moved out so that what it holds (the call, `done`) is released after it ran, not when
    // the other of the timer entry and the cancel callback lets go of `once`.
    absl::AnyInvocable<void()&&> fn = std::move(once->fn);
    std::move(fn)();
  };
  for (const CancelToken& token : tokens) {
    // The cancel callback runs on the canceller's thread: it only moves the work to the timer.
    const uint64_t id =
        token->OnCancel([run]() mutable { Timer::Global().After(absl::ZeroDuration(), run); });
    bool ran;
    {
      absl::MutexLock lock(&once->mu);
      ran = once->ran;
      if (!ran && id != 0) once->registered.emplace_back(token, id);
    }
    if (ran) {  // an earlier token had fired: this registration is not needed
      token->Forget(id);
      break;
    }
  }
  Timer::Global().After(delay, std::move(run));
}

}  // namespace wharf
