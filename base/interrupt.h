// Interrupts: what a process undoes when a signal ends it early. A command-line run stopped
// with Ctrl-C (SIGINT), SIGTERM or SIGHUP would otherwise die with S3 multipart uploads open
// (their parts stay stored, and billed, until someone aborts them) and temporary files on
// disk. Work that leaves such things behind registers an InterruptCleanup for as long as
// they exist; HandleInterrupts() (the CLI's main, before any other thread starts) blocks the
// signals and starts a thread that waits for one, runs every registered cleanup, and exits
// with 128 + the signal's number, as a shell reports a process killed by it.
//
// A second signal during the cleanups ends the process at once (default action), and a
// watchdog ends it after 15 s of cleanups (exit status 128 + the first signal). Signals the
// process inherited as ignored (nohup, `trap '' INT`, a non-interactive shell's background
// jobs) stay ignored. Where HandleInterrupts() was never called (the Python
// package: Python owns its signals) registering costs nothing and nothing runs. kill -9
// cannot be caught: what it leaves is collected later (temporary files by the next listing
// of their folder, uploads by the next export or checkpoint save below their prefix).
//
// Thread-safety: thread-safe. A cleanup runs on the signal thread while the work it belongs
// to may still be running on others; it must use only what it captured (copies, or objects
// that outlive its registration, such as the store of a writer), and unregistering it waits
// while it runs, so nothing it captured is destroyed under it. Other registrations are not
// held up meanwhile, so a cleanup may wait for a reply that another thread delivers.
#pragma once

#include <cstdint>

#include "absl/functional/any_invocable.h"
#include "absl/strings/string_view.h"

namespace wharf {

class InterruptCleanup {
 public:
  InterruptCleanup() = default;
  // Registers `fn` when HandleInterrupts() is active; otherwise holds nothing.
  explicit InterruptCleanup(absl::AnyInvocable<void()> fn);
  InterruptCleanup(InterruptCleanup&& other) noexcept : id_(other.id_) { other.id_ = 0; }
  InterruptCleanup& operator=(InterruptCleanup&& other) noexcept;
  InterruptCleanup(const InterruptCleanup&) = delete;
  InterruptCleanup& operator=(const InterruptCleanup&) = delete;
  // Unregisters (Reset).
  ~InterruptCleanup() { Reset(); }

  // Unregisters the cleanup: it will not run. Waits while the cleanups are running.
  void Reset();

 private:
  uint64_t id_ = 0;
};

// Held by work for the moment between creating something a cleanup must undo (a temporary
// file) and registering that cleanup: the signal thread waits (up to a second) for such
// moments to end before it takes the list of cleanups, so nothing is created that no cleanup
// knows of. ok() is false when a signal has arrived already: create nothing then.
class InterruptCreation {
 public:
  InterruptCreation();
  ~InterruptCreation();
  InterruptCreation(const InterruptCreation&) = delete;
  InterruptCreation& operator=(const InterruptCreation&) = delete;
  bool ok() const { return ok_; }

 private:
  bool ok_ = true;
};

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (and so in every thread it starts
// later) and starts the thread that handles them: it prints one line "<program>: interrupted
// (SIGINT): cleaning up N transfers in progress" on stderr, runs the cleanups and calls
// _exit(128 + signal). Call once, first thing in main.
void HandleInterrupts(absl::string_view program);

// Whether a handled signal arrived: the run is ending, and what fails from here on (requests
// whose uploads the cleanups aborted) need not be reported.
bool Interrupted();

// When a handled signal arrived, blocks for good: the signal thread ends the process once its
// cleanups ran (a verb that failed because of them must not exit first, with its own status).
void WaitIfInterrupted();

// Runs every registered cleanup once (newest first) and forgets them; returns how many ran.
// What the signal thread does; exposed for tests.
int RunInterruptCleanups();

// Whether HandleInterrupts() is active (registering does something).
bool InterruptCleanupsEnabled();

// For tests: registering does something without a signal thread.
void EnableInterruptCleanupsForTesting();

}  // namespace wharf
