#include "base/context.h"

namespace wharf {

Context::Context(ContextOptions options) : options_(options) {}

std::shared_ptr<Context> Context::Default() {
  static auto* const context = new std::shared_ptr<Context>(std::make_shared<Context>());
  return *context;
}

ThreadPool& Context::blocking_pool() {
  absl::MutexLock lock(&mu_);
  if (!blocking_pool_) blocking_pool_ = std::make_unique<ThreadPool>(options_.blocking_threads);
  return *blocking_pool_;
}

}  // namespace wharf
