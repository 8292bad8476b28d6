// MemoryBudget::WaitUntil records how long a consumer waited for room in the histogram the
// runtime gives it; a wait that was not needed records nothing. A waiter whose ambient token
// is cancelled (Ctrl-C in Python) stops waiting.
#include "base/memory_budget.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "base/cancel.h"
#include "base/metrics.h"
#include "gtest/gtest.h"

namespace wharf {
namespace {

TEST(MemoryBudget, WaitUntilRecordsTheWaitsItHadToMake) {
  auto budget = std::make_shared<MemoryBudget>(1 << 20);
  Histogram waits({0.001, 0.01, 0.1, 1, 10});
  budget->SetWaitHistogram(&waits);
  auto account = budget->NewAccount(0, "test");
  Block first;
  EXPECT_TRUE(budget->WaitUntil(
      [&] { return static_cast<bool>(first = budget->TryAllocate(account, 1 << 20)); }));
  EXPECT_EQ(waits.count(), 0u);  // room at once: no wait
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(50));
    first = Block();
  });
  Block second;
  EXPECT_TRUE(budget->WaitUntil(
      [&] { return static_cast<bool>(second = budget->TryAllocate(account, 1 << 20)); }));
  releaser.join();
  EXPECT_EQ(waits.count(), 1u);
  EXPECT_GE(waits.sum(), 0.04);
}

// A wait for room that another consumer holds ends, without room, when the waiter's ambient
// token is cancelled (by another thread, or by the interrupt poll the waiting edge installed).
TEST(MemoryBudget, WaitUntilEndsWhenTheCallersTokenIsCancelled) {
  auto budget = std::make_shared<MemoryBudget>(1 << 20);
  auto account = budget->NewAccount(0, "test");
  Block held = budget->TryAllocate(account, 1 << 20);  // never released during the waits
  ASSERT_TRUE(held);
  Block wanted;
  auto attempt = [&] { return static_cast<bool>(wanted = budget->TryAllocate(account, 1 << 20)); };

  CancelToken token = NewCancelToken();
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(50));
    token->Cancel();
  });
  {
    ScopedAmbientCancel scope(token);
    EXPECT_FALSE(budget->WaitUntil(attempt));
  }
  canceller.join();
  EXPECT_FALSE(wanted);

  static std::atomic<int> polls{0};
  polls = 0;
  CancelToken polled = NewCancelToken();
  {
    ScopedAmbientCancel scope(polled);
    ScopedInterruptPoll poll(+[] { return ++polls >= 3; });
    const absl::Time start = absl::Now();
    EXPECT_FALSE(budget->WaitUntil(attempt));
    // Polled every 50 ms (3 polls: ~0.1 s), not at the 1 s safety net (3 polls: 2 s).
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(1800));
  }
  EXPECT_TRUE(polled->cancelled());
  EXPECT_EQ(polls.load(), 3);
  EXPECT_FALSE(wanted);

  // With no token there is nothing to cancel: room released later is taken.
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(50));
    held = Block();
  });
  EXPECT_TRUE(budget->WaitUntil(attempt));
  releaser.join();
  EXPECT_TRUE(wanted);
}

}  // namespace
}  // namespace wharf
