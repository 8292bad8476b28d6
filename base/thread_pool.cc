#include "base/thread_pool.h"

#include <utility>

#include "base/cancel.h"
#include "base/fork.h"

namespace wharf {

ThreadPool::ThreadPool(int num_threads) {
  threads_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) threads_.push_back(StartThread([this] { WorkLoop(); }));
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : threads_) t.join();
}

void ThreadPool::Schedule(absl::AnyInvocable<void() &&> fn) {
  // The closure runs with the ambient token that was set when it was queued (base/cancel.h).
  fn = BindAmbient(std::move(fn));
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(fn));
}

void ThreadPool::WorkLoop() {
  while (true) {
    absl::AnyInvocable<void() &&> fn;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and everything queued has run
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(fn)();
  }
}

}  // namespace wharf
