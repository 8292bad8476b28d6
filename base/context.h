// Shared limits and executors handed to every store (convention 6: limits are shared resources).
// One Context is normally shared by all stores in a process; stores keep a shared_ptr to it
// because their asynchronous work may outlive the code that opened them.
// Thread-safety: all methods are thread-safe.
#pragma once

#include <memory>

#include "absl/synchronization/mutex.h"
#include "base/thread_pool.h"

namespace wharf {

struct ContextOptions {
  // Threads for operations that must block in the kernel (local file I/O). File reads of
  // small objects are latency-bound on the page cache and disk queue, so more threads than
  // cores keep the device busy; 16 saturates an NVMe queue in practice.
  int blocking_threads = 16;
};

class Context {
 public:
  explicit Context(ContextOptions options = {});
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // The process-wide default context, created on first use.
  static std::shared_ptr<Context> Default();

  const ContextOptions& options() const { return options_; }

  // The pool for blocking work; created on first use so a process that never touches
  // local files starts no threads.
  ThreadPool& blocking_pool();

 private:
  const ContextOptions options_;
  absl::Mutex mu_;
  std::unique_ptr<ThreadPool> blocking_pool_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wharf
