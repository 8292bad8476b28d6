// Timer: runs closures after a delay on one shared thread (retry backoff, deadlines), so no
// event-loop or pool thread ever sleeps. Closures must be short: hand real work elsewhere.
// Thread-safety: thread-safe. The runtime owns the timer (Runtime::timer()); the default
// runtime's lives for the whole process.
#pragma once

#include <queue>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/cancel.h"

namespace wharf {

class Timer {
 public:
  Timer();
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // The default runtime's timer (base/runtime.h).
  static Timer& Global();

  // Runs `fn` on the timer thread no earlier than `delay` from now.
  void After(absl::Duration delay, absl::AnyInvocable<void() &&> fn);

 private:
  struct Entry {
    absl::Time due;
    uint64_t seq;  // FIFO among equal deadlines
    mutable absl::AnyInvocable<void() &&> fn;
    bool operator>(const Entry& o) const { return due != o.due ? due > o.due : seq > o.seq; }
  };
  void Loop();

  absl::Mutex mu_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Runs `fn` on the global timer after `delay`, or as soon as `cancel` fires if that comes
// first (so a cancelled call does not sit out its retry backoff); exactly once either way.
// The ambient token (base/cancel.h) cuts the delay short too; with neither, it is a plain
// Timer::Global().After.
void AfterDelayOrCancel(absl::Duration delay, const CancelToken& cancel,
                        absl::AnyInvocable<void() &&> fn);

}  // namespace wharf
