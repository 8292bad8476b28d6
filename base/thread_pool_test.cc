#include "base/thread_pool.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "base/bounded_worker.h"
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

TEST(BoundedWorkerTest, BeyondTheBoundTasksRunOnTheCallersThread) {
  absl::Notification release;
  std::atomic<int> ran{0};
  std::vector<std::thread::id> inline_threads;
  {
    BoundedWorker worker(3);
    // The first task holds the worker's thread: the next two wait behind it, and from then
    // on every task runs at once on the thread that hands it over.
    EXPECT_TRUE(worker.Run([&] {
      release.WaitForNotification();
      ++ran;
    }));
    EXPECT_TRUE(worker.Run([&] { ++ran; }));
    EXPECT_TRUE(worker.Run([&] { ++ran; }));
    EXPECT_EQ(worker.pending(), 3u);
    for (int i = 0; i < 100; ++i) {
      EXPECT_FALSE(worker.Run([&] {
        inline_threads.push_back(std::this_thread::get_id());
        ++ran;
      }));
      EXPECT_EQ(worker.pending(), 3u) << "the queue never grows past its bound";
    }
    EXPECT_EQ(ran.load(), 100);
    EXPECT_EQ(worker.inline_runs(), 100u);
    release.Notify();
  }  // the destructor runs what was queued
  EXPECT_EQ(ran.load(), 103);
  ASSERT_EQ(inline_threads.size(), 100u);
  EXPECT_EQ(inline_threads.front(), std::this_thread::get_id());
}

TEST(BoundedWorkerTest, QueuesAgainOnceTheWorkerCatchesUp) {
  BoundedWorker worker(1);
  absl::Notification done;
  EXPECT_TRUE(worker.Run([&] { done.Notify(); }));
  done.WaitForNotification();
  while (worker.pending() > 0) std::this_thread::yield();
  EXPECT_TRUE(worker.Run([] {}));
  EXPECT_EQ(worker.inline_runs(), 0u);
}

}  // namespace
}  // namespace wharf
