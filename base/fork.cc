#include "base/fork.h"

#include <pthread.h>

#include <atomic>

namespace wharf {
namespace {
std::atomic<uint64_t> generation{0};
}  // namespace

uint64_t ForkGeneration() {
  // Registered on first use, which the singletons guarantee happens before any fork that
  // matters (they call this when they are created).
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, [] { generation.fetch_add(1); });
    return true;
  }();
  (void)registered;
  return generation.load(std::memory_order_acquire);
}

}  // namespace wharf
