// Fork awareness. Threads do not survive fork(): a child process (a PyTorch DataLoader worker)
// inherits objects whose event-loop and pool threads no longer exist. Process-wide singletons
// that own threads compare ForkGeneration() with the value they were created under and build a
// fresh instance in the child (the parent's copy is leaked there: it cannot be torn down
// safely without its threads).
//
// A mutex that another thread held at the moment of fork() stays locked in the child forever.
// The process-wide mutexes a child takes (the default runtime's, the registries of live tiers
// and stores, the profiler's) are registered with ReleaseAcrossFork: fork() then waits until
// no other thread holds them, and both sides continue with them released.
//
// absl gives a thread its per-thread identity on the thread's first wait (a contended Mutex, a
// CondVar), allocated under a process-wide spinlock of absl's own allocator, and sets some
// process-wide values once, behind once-flags, on the first waits of the process (Mutex spin
// limits, the cycle clock's frequency). A fork() while another thread is inside either leaves
// the child's threads spinning forever at their first wait (seen in gdb: a DataLoader-like
// child whose new pool threads all hung there). So identities are made behind a gate that
// fork() waits for: every thread wharf starts (StartThread) and every thread that enters the
// default runtime or releases the GIL in a binding makes its identity first, through
// EnsureThreadIdentity; and fork() asks for each once-set value first, which waits for one
// being set.
// Thread-safety: thread-safe.
#pragma once

#include <cstdint>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"

namespace wharf {

// 0 in the process that first called it; incremented in each child after fork().
uint64_t ForkGeneration();

// Makes fork() take `mu` before it forks (in registration order, after the mutexes registered
// earlier) and release it in the parent and the child. For process-wide mutexes that live for
// the rest of the process, held only briefly, and never held while waiting for another
// registered mutex that was registered earlier (that would deadlock fork()). A mutex is
// registered once, at most kMaxForkMutexes in all (more is a programming error: aborts).
void ReleaseAcrossFork(absl::Mutex* mu);
inline constexpr int kMaxForkMutexes = 16;

// Gives the calling thread its absl identity now, unless it has one, while fork() cannot
// happen. Cheap after the first call on a thread (a thread-local flag).
void EnsureThreadIdentity();

// std::thread running `fn` on a thread that has its absl identity before anything else runs.
// Every thread wharf starts is started through it.
template <typename F>
std::thread StartThread(F&& fn) {
  return std::thread([fn = std::forward<F>(fn)]() mutable {
    EnsureThreadIdentity();
    std::move(fn)();
  });
}

}  // namespace wharf
