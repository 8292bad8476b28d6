// Fork awareness. Threads do not survive fork(): a child process (a PyTorch DataLoader worker)
// inherits objects whose event-loop and pool threads no longer exist. Process-wide singletons
// that own threads compare ForkGeneration() with the value they were created under and build a
// fresh instance in the child (the parent's copy is leaked there: it cannot be torn down
// safely without its threads).
// Thread-safety: thread-safe.
#pragma once

#include <cstdint>

namespace wharf {

// 0 in the process that first called it; incremented in each child after fork().
uint64_t ForkGeneration();

}  // namespace wharf
