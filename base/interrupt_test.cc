#include "base/interrupt.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace wharf {
namespace {

TEST(InterruptCleanupTest, RunsRegisteredCleanupsNewestFirstAndForgetsThem) {
  EnableInterruptCleanupsForTesting();
  std::vector<int> ran;
  InterruptCleanup first([&] { ran.push_back(1); });
  InterruptCleanup second([&] { ran.push_back(2); });
  InterruptCleanup reset([&] { ran.push_back(3); });
  reset.Reset();
  {
    InterruptCleanup gone([&] { ran.push_back(4); });  // unregistered when it goes
  }
  InterruptCleanup moved([&] { ran.push_back(5); });
  InterruptCleanup target = std::move(moved);
  EXPECT_EQ(RunInterruptCleanups(), 3);
  EXPECT_EQ(ran, (std::vector<int>{5, 2, 1}));
  EXPECT_EQ(RunInterruptCleanups(), 0);  // each runs once
  EXPECT_EQ(ran.size(), 3u);
}

TEST(InterruptCleanupTest, ACleanupMayWaitForAThreadThatRegistersOtherWork) {
  // A cleanup waiting for a reply that the transport's thread delivers, while that thread
  // registers or unregisters work of its own (a temporary file): no deadlock.
  EnableInterruptCleanupsForTesting();
  absl::Notification registered;
  std::thread other;
  InterruptCleanup waits([&] {
    other = std::thread([&] {
      InterruptCleanup more([] {});
      registered.Notify();
    });
    EXPECT_TRUE(registered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  });
  EXPECT_EQ(RunInterruptCleanups(), 1);
  other.join();
}

TEST(InterruptCleanupTest, UnregisteringWaitsForItsRunningCleanup) {
  EnableInterruptCleanupsForTesting();
  absl::Notification started;
  std::atomic<bool> finished{false};
  auto cleanup = std::make_unique<InterruptCleanup>([&] {
    started.Notify();
    absl::SleepFor(absl::Milliseconds(200));
    finished = true;
  });
  std::thread run([] { RunInterruptCleanups(); });
  started.WaitForNotification();
  cleanup.reset();  // what the cleanup captured may go only once it returned
  EXPECT_TRUE(finished);
  run.join();
}

}  // namespace
}  // namespace wharf
