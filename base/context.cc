#include "base/context.h"

#include "base/fork.h"

namespace wharf {

Context::Context(ContextOptions options) : options_(options) {}

std::shared_ptr<Context> Context::Default() {
  // Rebuilt in a forked child, whose copy of the parent's pool has no threads (base/fork.h).
  static absl::Mutex mu(absl::kConstInit);
  static auto* context = new std::shared_ptr<Context>;
  static uint64_t generation = 0;
  absl::MutexLock lock(&mu);
  if (*context == nullptr || generation != ForkGeneration()) {
    if (*context != nullptr) new std::shared_ptr<Context>(*context);  // leak: see fork.h
    generation = ForkGeneration();
    *context = std::make_shared<Context>();
  }
  return *context;
}

ThreadPool& Context::blocking_pool() {
  absl::MutexLock lock(&mu_);
  if (!blocking_pool_) blocking_pool_ = std::make_unique<ThreadPool>(options_.blocking_threads);
  return *blocking_pool_;
}

}  // namespace wharf
