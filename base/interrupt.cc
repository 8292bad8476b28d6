#include "base/interrupt.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace wharf {
namespace {

// Seconds the cleanups may take before the process exits regardless (an unreachable server
// would otherwise hold an interrupted run for its retries' whole schedule).
constexpr unsigned kCleanupSeconds = 15;

std::atomic<bool> enabled{false};

// One cleanup. Its own lock is held while it runs, so unregistering it waits for that run
// (what it captured must outlive it) and nothing else: a thread that registers or
// unregisters other work meanwhile is not held up, so a cleanup may wait on threads that do
// (a request's reply, delivered by the transport's thread).
struct Entry {
  absl::Mutex mu;
  absl::AnyInvocable<void()> fn ABSL_GUARDED_BY(mu);
  bool done ABSL_GUARDED_BY(mu) = false;  // ran, or unregistered
};

struct Registry {
  absl::Mutex mu;
  uint64_t next_id ABSL_GUARDED_BY(mu) = 1;
  std::map<uint64_t, std::shared_ptr<Entry>> cleanups ABSL_GUARDED_BY(mu);
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;  // never destroyed: cleanups may run at exit
  return *registry;
}

std::atomic<bool> interrupted{false};
// InterruptCreations alive (sequentially consistent with `interrupted`: either a creation
// sees the signal, or the signal thread sees the creation and waits for it).
std::atomic<int> creating{0};

// SIGINT, SIGTERM and SIGHUP, less those the process inherited as ignored: `nohup`, a shell's
// `trap '' INT` and the background jobs of a non-interactive shell (SIGINT ignored) keep
// their meaning.
sigset_t HandledSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old;
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaddset(&set, sig);
  }
  return set;
}

size_t PendingCleanups() {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  return r.cleanups.size();
}

}  // namespace

InterruptCreation::InterruptCreation() {
  creating.fetch_add(1);
  ok_ = !interrupted.load();
}

InterruptCreation::~InterruptCreation() { creating.fetch_sub(1); }

InterruptCleanup::InterruptCleanup(absl::AnyInvocable<void()> fn) {
  if (!enabled.load(std::memory_order_acquire)) return;
  auto entry = std::make_shared<Entry>();
  {
    absl::MutexLock lock(&entry->mu);
    entry->fn = std::move(fn);
  }
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  id_ = r.next_id++;
  r.cleanups.emplace(id_, std::move(entry));
}

InterruptCleanup& InterruptCleanup::operator=(InterruptCleanup&& other) noexcept {
  if (this != &other) {
    Reset();
    id_ = other.id_;
    other.id_ = 0;
  }
  return *this;
}

void InterruptCleanup::Reset() {
  if (id_ == 0) return;
  std::shared_ptr<Entry> entry;
  {
    Registry& r = GetRegistry();
    absl::MutexLock lock(&r.mu);
    if (auto it = r.cleanups.find(id_); it != r.cleanups.end()) {
      entry = std::move(it->second);
      r.cleanups.erase(it);
    }
  }
  id_ = 0;
  if (entry == nullptr) return;      // ran already, and the run is over
  absl::MutexLock lock(&entry->mu);  // waits while it runs
  entry->done = true;
  entry->fn = nullptr;
}

int RunInterruptCleanups() {
  Registry& r = GetRegistry();
  std::vector<std::pair<uint64_t, std::shared_ptr<Entry>>> entries;
  {
    // Newest first: a file created after an upload started is undone before it. They stay
    // registered while they run, so a Reset finds them and waits.
    absl::MutexLock lock(&r.mu);
    entries.assign(r.cleanups.rbegin(), r.cleanups.rend());
  }
  int ran = 0;
  for (auto& [id, entry] : entries) {
    absl::MutexLock lock(&entry->mu);
    if (entry->done) continue;
    entry->fn();
    entry->done = true;
    entry->fn = nullptr;
    ++ran;
  }
  absl::MutexLock lock(&r.mu);
  for (const auto& [id, entry] : entries) r.cleanups.erase(id);
  return ran;
}

bool InterruptCleanupsEnabled() { return enabled.load(std::memory_order_acquire); }

void EnableInterruptCleanupsForTesting() { enabled.store(true, std::memory_order_release); }

bool Interrupted() { return interrupted.load(std::memory_order_acquire); }

void WaitIfInterrupted() {
  while (Interrupted()) std::this_thread::sleep_for(std::chrono::hours(1));
}

void HandleInterrupts(absl::string_view program) {
  const sigset_t set = HandledSignals();
  if (sigisemptyset(&set)) return;  // every one of them ignored
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  enabled.store(true, std::memory_order_release);
  std::thread([set, name = std::string(program)] {
    int sig = 0;
    while (sigwait(&set, &sig) != 0) {
    }
    interrupted.store(true);
    // What is being created now gets its cleanup registered before the list is taken.
    for (int i = 0; i < 1000 && creating.load() > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // From here a second signal takes its default action (the process ends at once): it is
    // delivered to this thread, the one that no longer blocks it.
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    // Cleanups that hang (a server that stopped answering) end at the deadline, with the
    // exit status of the signal all the same.
    std::thread([sig] {
      std::this_thread::sleep_for(std::chrono::seconds(kCleanupSeconds));
      _exit(128 + sig);
    }).detach();
    const size_t pending = PendingCleanups();
    // On a terminal a progress line may be in the middle of being drawn.
    std::string line = absl::StrCat(isatty(STDERR_FILENO) ? "\n" : "", name, ": interrupted (",
                                    sig == SIGINT    ? "SIGINT"
                                    : sig == SIGTERM ? "SIGTERM"
                                                     : "SIGHUP",
                                    ")");
    if (pending > 0) {
      absl::StrAppend(&line, ": cleaning up ", pending, " transfer", pending == 1 ? "" : "s",
                      " in progress");
    }
    line += "\n";
    (void)!write(STDERR_FILENO, line.data(), line.size());
    RunInterruptCleanups();
    _exit(128 + sig);
  }).detach();
}

}  // namespace wharf
