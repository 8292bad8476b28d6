#include "base/interrupt.h"

#include <vector>

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

}  // namespace
}  // namespace wharf
