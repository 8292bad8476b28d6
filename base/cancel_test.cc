#include "base/cancel.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
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

}  // namespace
}  // namespace wharf
