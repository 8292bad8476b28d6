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

}  // namespace wharf
