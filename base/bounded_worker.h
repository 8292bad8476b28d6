// BoundedWorker: hands tasks to one thread of its own with at most `max_pending` of them
// waiting or running there; a task handed over beyond that runs on the caller's thread. So
// the memory its queue holds stays bounded when tasks come faster than its thread runs them
// (the producer slows to the rate of the work instead), and the producer never waits on the
// queue, which matters when it is an I/O thread: it does one task's work, never more.
// Used for work that must block (file system syscalls) on behalf of callbacks.
//
// Thread-safety: Run() may be called from any thread. The destructor runs every task already
// handed over, then joins the thread.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "base/thread_pool.h"

namespace wharf {

class BoundedWorker {
 public:
  // REQUIRES: max_pending >= 1.
  explicit BoundedWorker(size_t max_pending) : max_pending_(max_pending) {}
  ~BoundedWorker() { pool_.reset(); }
  BoundedWorker(const BoundedWorker&) = delete;
  BoundedWorker& operator=(const BoundedWorker&) = delete;

  // Queues `task` for the worker thread (true), or, with max_pending tasks already there,
  // runs it here before returning (false).
  bool Run(absl::AnyInvocable<void() &&> task) {
    {
      absl::MutexLock lock(&mu_);
      if (pending_ >= max_pending_) {
        ++inline_runs_;
      } else {
        ++pending_;
        pool_->Schedule([this, task = std::move(task)]() mutable {
          std::move(task)();
          absl::MutexLock lock(&mu_);
          --pending_;
        });
        return true;
      }
    }
    std::move(task)();
    return false;
  }

  // Tasks queued or running on the worker thread now, and tasks run by callers so far.
  size_t pending() const {
    absl::MutexLock lock(&mu_);
    return pending_;
  }
  size_t inline_runs() const {
    absl::MutexLock lock(&mu_);
    return inline_runs_;
  }

 private:
  const size_t max_pending_;
  mutable absl::Mutex mu_;
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  size_t inline_runs_ ABSL_GUARDED_BY(mu_) = 0;
  // Last: destroyed (drained and joined) first, while the counters still exist.
  std::unique_ptr<ThreadPool> pool_ = std::make_unique<ThreadPool>(1);
};

}  // namespace wharf
