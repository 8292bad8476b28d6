#include "base/thread_pool.h"

#include <atomic>

#include "absl/synchronization/blocking_counter.h"
#include "gtest/gtest.h"

namespace wharf {
namespace {

TEST(ThreadPoolTest, RunsEverythingScheduled) {
  std::atomic<int> sum{0};
  {
    ThreadPool pool(4);
    for (int i = 1; i <= 1000; ++i) pool.Schedule([&sum, i] { sum += i; });
  }  // the destructor drains the queue
  EXPECT_EQ(sum.load(), 500500);
}

TEST(ThreadPoolTest, ClosuresMayScheduleMore) {
  ThreadPool pool(2);
  absl::BlockingCounter done(2);
  pool.Schedule([&] {
    pool.Schedule([&] { done.DecrementCount(); });
    done.DecrementCount();
  });
  done.Wait();
}

}  // namespace
}  // namespace wharf
