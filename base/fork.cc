#include "base/fork.h"

#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>

#include "absl/base/internal/low_level_scheduling.h"
#include "absl/base/internal/sysinfo.h"
#include "absl/synchronization/internal/create_thread_identity.h"

namespace wharf {
namespace {
std::atomic<uint64_t> generation{0};

// Debian's libabsl is built without NDEBUG, so absl::Mutex runs its debug deadlock detection:
// every Lock and Unlock takes one process-wide spinlock (the lock graph's). A child forked while
// any thread of the parent was inside a Mutex operation inherits that spinlock held, and its
// first Mutex operation spins forever (seen: a forked child stuck in Mutex::Unlock ->
// SpinLock::SlowLock). It also costs 56-68 ns per uncontended lock and unlock against 9-16 ns
// without it, measured here, and serializes every thread's locking. Release builds of absl
// have it off; so does wharf, before any thread exists (static initialization).
const bool no_lock_graph = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();

// The registered mutexes. registry_mu guards the list and is taken first by fork(), so a
// registration never races a fork.
absl::Mutex registry_mu(absl::kConstInit);
absl::Mutex* mutexes[kMaxForkMutexes] ABSL_GUARDED_BY(registry_mu) = {};
int count ABSL_GUARDED_BY(registry_mu) = 0;

// Held while a thread makes its absl identity (EnsureThreadIdentity) and across fork(). A
// pthread mutex, not an absl one: waiting on it needs no identity. Taken by fork() after the
// registered mutexes, and its holders wait for nothing else, so the order cannot deadlock.
pthread_mutex_t identity_gate = PTHREAD_MUTEX_INITIALIZER;
thread_local bool has_identity = false;

void Prepare() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  registry_mu.Lock();
  for (int i = 0; i < count; ++i) mutexes[i]->Lock();
  pthread_mutex_lock(&identity_gate);
  // absl's process-wide one-time initializations on the paths of a thread's first waits (each
  // behind a once-flag: a child forked while another thread runs one waits on it forever at
  // its own first wait). Each call returns at once when its initialization is done, runs it
  // when it has not started, and waits for it when another thread is running it, so none is
  // inherited half-done: the thread-identity key and absl's allocator (a first identity),
  // Mutex's spin limits and the CPU count (a first contended Lock), and the cycle clock's
  // frequency (a first Await or CondVar wait, for contention profiling; seen in gdb).
  absl::synchronization_internal::GetOrCreateCurrentThreadIdentity();
  (void)absl::synchronization_internal::MutexDelay(0, /*GENTLE=*/1);
  (void)absl::base_internal::NominalCPUFrequency();
}

void ReleaseInParent() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  pthread_mutex_unlock(&identity_gate);
  for (int i = count - 1; i >= 0; --i) mutexes[i]->Unlock();
  registry_mu.Unlock();
}

// In the child the mutexes are made anew instead of unlocked: threads of the parent may be
// queued on them, and an Unlock would try to wake threads that do not exist here.
void InChild() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  generation.fetch_add(1);
  pthread_mutex_init(&identity_gate, nullptr);
  for (int i = count - 1; i >= 0; --i) new (mutexes[i]) absl::Mutex;
  new (&registry_mu) absl::Mutex;
}

// One set of fork handlers for both services, installed on first use of either (the
// singletons call them when they are created, before any fork that matters).
void InstallHandlers() {
  static const bool installed = [] {
    pthread_atfork(&Prepare, &ReleaseInParent, &InChild);
    return true;
  }();
  (void)installed;
}
}  // namespace

uint64_t ForkGeneration() {
  InstallHandlers();
  return generation.load(std::memory_order_acquire);
}

void EnsureThreadIdentity() {
  if (has_identity) return;
  InstallHandlers();
  pthread_mutex_lock(&identity_gate);
  absl::synchronization_internal::GetOrCreateCurrentThreadIdentity();
  pthread_mutex_unlock(&identity_gate);
  has_identity = true;
}

void ReleaseAcrossFork(absl::Mutex* mu) {
  InstallHandlers();
  absl::MutexLock lock(&registry_mu);
  for (int i = 0; i < count; ++i) {
    if (mutexes[i] == mu) return;
  }
  if (count == kMaxForkMutexes) {
    std::fprintf(stderr, "wharf: more than %d mutexes registered with ReleaseAcrossFork\n",
                 kMaxForkMutexes);
    std::abort();
  }
  mutexes[count++] = mu;
}

}  // namespace wharf
