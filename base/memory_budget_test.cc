// MemoryBudget::WaitUntil records how long a consumer waited for room in the histogram the
// runtime gives it; a wait that was not needed records nothing.
#include "base/memory_budget.h"

#include <thread>

#include "absl/time/clock.h"
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
  budget->WaitUntil(
      [&] { return static_cast<bool>(first = budget->TryAllocate(account, 1 << 20)); });
  EXPECT_EQ(waits.count(), 0u);  // room at once: no wait
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(50));
    first = Block();
  });
  Block second;
  budget->WaitUntil(
      [&] { return static_cast<bool>(second = budget->TryAllocate(account, 1 << 20)); });
  releaser.join();
  EXPECT_EQ(waits.count(), 1u);
  EXPECT_GE(waits.sum(), 0.04);
}

}  // namespace
}  // namespace wharf
