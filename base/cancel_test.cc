#include "base/cancel.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "base/thread_pool.h"
#include "base/timer.h"
#include "gtest/gtest.h"

namespace wharf {
namespace {

TEST(CancelTest, CallbacksRunOnceAtCancelAndInlineAfterwards) {
  CancelToken token = NewCancelToken();
  EXPECT_FALSE(IsCancelled(token));
  EXPECT_FALSE(IsCancelled(nullptr));
  int runs = 0;
  const uint64_t id = token->OnCancel([&] { ++runs; });
  EXPECT_NE(id, 0u);
  EXPECT_EQ(runs, 0);
  token->Cancel();
  token->Cancel();  // idempotent
  EXPECT_TRUE(IsCancelled(token));
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(token->OnCancel([&] { ++runs; }), 0u);  // already cancelled: inline
  EXPECT_EQ(runs, 2);
  token->Forget(id);  // already run: a no-op
  token->Forget(0);
}

TEST(CancelTest, ForgottenCallbacksNeverRun) {
  CancelToken token = NewCancelToken();
  bool ran = false;
  token->Forget(token->OnCancel([&] { ran = true; }));
  token->Cancel();
  EXPECT_FALSE(ran);
}

TEST(CancelTest, ForgetWaitsForACallbackRunningOnAnotherThread) {
  CancelToken token = NewCancelToken();
  absl::Notification started, release;
  std::atomic<bool> finished{false};
  const uint64_t id = token->OnCancel([&] {
    started.Notify();
    release.WaitForNotification();
    finished = true;
  });
  std::thread canceller([&] { token->Cancel(); });
  started.WaitForNotification();
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(50));
    release.Notify();
  });
  token->Forget(id);  // returns only once the callback is done
  EXPECT_TRUE(finished.load());
  canceller.join();
  releaser.join();
}

TEST(CancelTest, ACallbackMayForgetAnotherWithoutDeadlock) {
  CancelToken token = NewCancelToken();
  uint64_t second = 0;
  bool first_ran = false, second_ran = false;
  token->OnCancel([&] {
    first_ran = true;
    token->Forget(second);
  });
  second = token->OnCancel([&] { second_ran = true; });
  token->Cancel();
  EXPECT_TRUE(first_ran);
  EXPECT_FALSE(second_ran);  // forgotten before its turn: never runs
}

bool PollSaysStop() { return true; }
bool PollSaysGoOn() { return false; }
int g_polls = 0;
bool CountingPoll() {
  ++g_polls;
  return g_polls >= 3;
}

TEST(AmbientCancelTest, ScopesNestAndRestore) {
  EXPECT_EQ(AmbientCancel(), nullptr);
  CancelToken outer = NewCancelToken(), inner = NewCancelToken();
  {
    ScopedAmbientCancel a(outer);
    EXPECT_EQ(AmbientCancel(), outer);
    {
      ScopedAmbientCancel b(inner);
      EXPECT_EQ(AmbientCancel(), inner);
      ScopedAmbientCancel none(nullptr);
      EXPECT_EQ(AmbientCancel(), nullptr);
    }
    EXPECT_EQ(AmbientCancel(), outer);
  }
  EXPECT_EQ(AmbientCancel(), nullptr);
}

TEST(AmbientCancelTest, AnInterruptedWaitCancelsTheAmbientTokenAndWaitsForTheWork) {
  CancelToken scope = NewCancelToken();
  absl::Mutex mu;
  bool finished = false;
  // The "work": ends a little after its token is cancelled, as cancelled requests do.
  std::thread worker;
  scope->OnCancel([&] {
    worker = std::thread([&] {
      absl::SleepFor(absl::Milliseconds(100));
      absl::MutexLock lock(&mu);
      finished = true;
    });
  });
  g_polls = 0;
  {
    ScopedAmbientCancel ambient(scope);
    ScopedInterruptPoll poll(&CountingPoll);
    EXPECT_TRUE(InterruptPollInstalled());
    absl::MutexLock lock(&mu);
    AwaitInterruptibly(mu, absl::Condition(&finished));
    EXPECT_TRUE(finished);         // never returns before the work ended
    EXPECT_TRUE(PollInterrupt());  // interrupted: it stays so, without asking again
  }
  worker.join();
  EXPECT_TRUE(scope->cancelled());
  EXPECT_EQ(g_polls, 3);  // polled until it said stop, then no more
  EXPECT_FALSE(InterruptPollInstalled());
  EXPECT_FALSE(PollInterrupt());
}

TEST(AmbientCancelTest, WaitsWithoutAPollOrWithOneThatSaysGoOnJustWait) {
  absl::Notification n;
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(120));
    n.Notify();
  });
  CancelToken scope = NewCancelToken();
  {
    ScopedAmbientCancel ambient(scope);
    ScopedInterruptPoll poll(&PollSaysGoOn);
    WaitInterruptibly(n);
  }
  t.join();
  EXPECT_FALSE(scope->cancelled());
  absl::Notification already;
  already.Notify();
  ScopedInterruptPoll poll(&PollSaysStop);
  WaitInterruptibly(already);  // done at once: the poll is not needed
  EXPECT_FALSE(IsCancelled(AmbientCancel()));
}

TEST(AmbientCancelTest, ThePoolAndTheTimerRunClosuresWithTheTokenSetWhenQueued) {
  CancelToken scope = NewCancelToken();
  ThreadPool pool(1);
  Timer timer;
  absl::Notification in_pool, in_timer, plain;
  CancelToken seen_pool, seen_timer, seen_plain = scope;
  {
    ScopedAmbientCancel ambient(scope);
    pool.Schedule([&] {
      seen_pool = AmbientCancel();
      in_pool.Notify();
    });
    timer.After(absl::Milliseconds(1), [&] {
      seen_timer = AmbientCancel();
      in_timer.Notify();
    });
  }
  pool.Schedule([&] {
    seen_plain = AmbientCancel();
    plain.Notify();
  });
  in_pool.WaitForNotification();
  in_timer.WaitForNotification();
  plain.WaitForNotification();
  EXPECT_EQ(seen_pool, scope);
  EXPECT_EQ(seen_timer, scope);
  EXPECT_EQ(seen_plain, nullptr);
}

TEST(AmbientCancelTest, TheAmbientTokenCutsARetryBackoffShort) {
  CancelToken scope = NewCancelToken();
  absl::Notification ran;
  CancelToken seen;
  {
    ScopedAmbientCancel ambient(scope);
    AfterDelayOrCancel(absl::Seconds(600), nullptr, [&] {
      seen = AmbientCancel();
      ran.Notify();
    });
  }
  EXPECT_FALSE(ran.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  scope->Cancel();  // from a thread with no ambient token
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(seen, scope);  // the retry it ran still belongs to the operation
  // Both tokens: the call's own one fires first here; the other registration is dropped.
  CancelToken own = NewCancelToken(), other = NewCancelToken();
  absl::Notification ran2;
  {
    ScopedAmbientCancel ambient(other);
    AfterDelayOrCancel(absl::Seconds(600), own, [&] { ran2.Notify(); });
  }
  own->Cancel();
  EXPECT_TRUE(ran2.WaitForNotificationWithTimeout(absl::Seconds(10)));
  other->Cancel();  // runs nothing more
}

int g_reentered = 0;
bool ReenteringPoll() {
  // A wait inside the poll (a finalizer's) sees no poll installed, so it does not recurse.
  EXPECT_FALSE(InterruptPollInstalled());
  ++g_reentered;
  EXPECT_FALSE(PollInterrupt());
  return true;
}

TEST(AmbientCancelTest, APollIsNotReentered) {
  CancelToken scope = NewCancelToken();
  g_reentered = 0;
  {
    ScopedAmbientCancel ambient(scope);
    ScopedInterruptPoll poll(&ReenteringPoll);
    EXPECT_TRUE(PollInterrupt());
    EXPECT_TRUE(InterruptPollInstalled());  // back after it ran
  }
  EXPECT_EQ(g_reentered, 1);
  EXPECT_TRUE(scope->cancelled());
}

}  // namespace
}  // namespace wharf
