#include "base/fork.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "base/runtime.h"
#include "gtest/gtest.h"

namespace wharf {
namespace {

// Forks `n` children while `busy` runs on another thread; each child runs `child` (which must
// return within 3 s: a child stuck on a mutex inherited locked dies of SIGALRM) and exits 0.
// Returns how many children exited 0.
template <typename Busy, typename Child>
int ForkWhileBusy(int n, Busy busy, Child child) {
  std::atomic<bool> stop{false};
  std::thread thread([&] {
    while (!stop.load(std::memory_order_relaxed)) busy();
  });
  int ok = 0;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(3);
      child();
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) ++ok;
  }
  stop.store(true);
  thread.join();
  return ok;
}

TEST(ForkTest, TheChildCountsAnotherGeneration) {
  const uint64_t parent = ForkGeneration();
  const pid_t pid = fork();
  if (pid == 0) _exit(ForkGeneration() == parent + 1 ? 0 : 1);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(ForkGeneration(), parent);
}

// A registered mutex that another thread holds most of the time is free in every child.
TEST(ForkTest, ARegisteredMutexIsNeverInheritedLocked) {
  static absl::Mutex mu(absl::kConstInit);
  ReleaseAcrossFork(&mu);
  ReleaseAcrossFork(&mu);  // once is enough; again is a no-op
  const int ok = ForkWhileBusy(
      100,
      [] {
        absl::MutexLock lock(&mu);
        absl::SleepFor(absl::Microseconds(200));
      },
      [] { absl::MutexLock lock(&mu); });
  EXPECT_EQ(ok, 100);
}

// Any mutex works in a child forked while another thread locks and unlocks mutexes without
// pause: no process-wide lock of absl's (its debug lock graph, on in Debian's build) is
// inherited held.
TEST(ForkTest, MutexesWorkInAChildForkedWhileAnotherThreadLocks) {
  static absl::Mutex busy_mu(absl::kConstInit);
  const int ok = ForkWhileBusy(
      50,
      [] {
        busy_mu.Lock();
        busy_mu.Unlock();
      },
      [] {
        absl::Mutex mu;
        absl::MutexLock lock(&mu);
      });
  EXPECT_EQ(ok, 50);
}

// A DataLoader worker forked while the parent's threads use the default runtime gets a
// runtime of its own: before default_mu was registered, a child forked while another thread
// was inside Runtime::Default() waited for it forever.
TEST(ForkTest, AChildGetsItsOwnDefaultRuntimeWhileOtherThreadsUseTheParents) {
  std::shared_ptr<Runtime> parent = Runtime::Default();
  const int ok = ForkWhileBusy(
      50, [] { (void)Runtime::Default(); },
      [&] {
        std::shared_ptr<Runtime> own = Runtime::Default();
        if (own == nullptr || own == parent) _exit(2);
        // Its threads exist: a task on its pool runs.
        std::atomic<bool> ran{false};
        own->blocking_pool().Schedule([&] { ran.store(true); });
        while (!ran.load()) absl::SleepFor(absl::Milliseconds(1));
      });
  EXPECT_EQ(ok, 50);
}

// Threads that enter wharf for the first time (a user's threads: Python's, a DataLoader's pin
// thread) while the process forks: absl makes each one's identity at its first wait, under a
// spinlock of its allocator that a child inheriting it held would spin on forever at its own
// threads' first waits. Such threads are made to take their identity while fork() cannot run.
TEST(ForkTest, ThreadsEnteringTheRuntimeAsItForksLeaveTheChildAbleToStartThreads) {
  std::shared_ptr<Runtime> parent = Runtime::Default();
  absl::Mutex mu;
  bool done = false;
  std::vector<std::thread> entered;
  const int ok = ForkWhileBusy(
      50,
      [&] {
        if (entered.size() >= 400) return absl::SleepFor(absl::Microseconds(100));
        // A plain std::thread, as a user's would be; it stays until the end, so no thread's exit
        // races the fork.
        entered.emplace_back([&] {
          (void)Runtime::Default();
          absl::MutexLock lock(&mu);
          mu.Await(absl::Condition(&done));
        });
      },
      [&] {
        std::shared_ptr<Runtime> own = Runtime::Default();
        std::atomic<bool> ran{false};
        own->blocking_pool().Schedule([&] { ran.store(true); });
        while (!ran.load()) absl::SleepFor(absl::Milliseconds(1));
      });
  {
    absl::MutexLock lock(&mu);
    done = true;
  }
  for (std::thread& t : entered) t.join();
  EXPECT_EQ(ok, 50);
}

}  // namespace
}  // namespace wharf
