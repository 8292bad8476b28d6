#include "base/timer.h"

#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace wharf {
namespace {

TEST(TimerTest, RunsInDeadlineOrderNotBefore) {
  Timer timer;
  absl::Mutex mu;
  std::vector<int> order;
  absl::BlockingCounter done(3);
  const absl::Time start = absl::Now();
  std::vector<absl::Duration> elapsed(3);
  for (int i : {2, 0, 1}) {
    timer.After(absl::Milliseconds(20 * (i + 1)), [&, i] {
      elapsed[i] = absl::Now() - start;
      absl::MutexLock lock(&mu);
      order.push_back(i);
      done.DecrementCount();
    });
  }
  done.Wait();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  for (int i = 0; i < 3; ++i) EXPECT_GE(elapsed[i], absl::Milliseconds(20 * (i + 1)));
}

}  // namespace
}  // namespace wharf
