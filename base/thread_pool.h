// A fixed-size pool of worker threads running queued closures in FIFO order.
// Used for work that must block (file system syscalls), never one thread per request.
// Thread-safety: Schedule() may be called from any thread, including pool threads.
// The destructor runs every closure already queued, then joins the threads.
#pragma once

#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace wharf {

class ThreadPool {
 public:
  // REQUIRES: num_threads >= 1.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(absl::AnyInvocable<void() &&> fn);
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void WorkLoop();

  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace wharf
