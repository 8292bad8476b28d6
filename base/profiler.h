// Profiler: where the time of a data-loading run goes, stage by stage, and what bounds it
// (docs/design/profiler.md).
//
// Stages are recorded where they happen: store requests (listing pages, time to first byte,
// transfer) by MeteredStore, budget waits by MemoryBudget and the fetch engine, the reader
// blocked on bytes by ObjectReader, record parsing by the record streams, and the Python
// stages (transform, collate, the consumer's wait and its step) by wharf.torch through
// _wharf. Each stage adds to per-stage sums, and each event goes to a bounded buffer for a
// Chrome/Perfetto trace. Report() turns the sums, the wall time and the process's CPU time
// (getrusage) into a table and a one-word verdict of what bounds throughput.
//
// The profiler measures a process, like getrusage, so there is one per process (Get()).
// Off by default: a hook costs one relaxed load (Active()) when it is off. Processes it
// starts (DataLoader workers) spool their sums and events into a folder (SpoolJson) that
// the parent merges when it stops (MergeSpool).
//
// Thread-safety: thread-safe. Record may be called from any thread, including store event
// loops; Start/Stop from one thread at a time.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace wharf {

enum class ProfileStage : uint8_t {
  kList,          // a listing page: request to response
  kBudget,        // waiting for the memory budget to admit a buffer
  kFirstByte,     // a GET from sending to its first byte (store latency)
  kTransfer,      // a GET from its first byte to its last
  kIoWait,        // a reader (dataset, record stream) blocked on bytes not yet fetched
  kParse,         // decoding records out of fetched bytes (tar, TFRecord, rows)
  kTransform,     // the user's per-sample transform
  kCollate,       // the DataLoader's collate_fn
  kConsumerWait,  // the consumer (training loop) waiting for its next sample or batch
  kStep,          // the consumer's own time between two batches (the training step)
  kCount,
};
inline constexpr int kProfileStages = static_cast<int>(ProfileStage::kCount);

// Stable ids ("list", "budget", ...): what the Python edge and the spool use; the table and
// the trace show labels ("listing", "budget wait", ...).
absl::string_view ProfileStageId(ProfileStage stage);
std::optional<ProfileStage> ProfileStageFromId(absl::string_view id);

// Where a trace goes: $WHARF_PROFILE_TRACE, else wharf-trace-<pid>.json in the working
// directory.
std::string DefaultProfileTracePath();
// WHARF_PROFILE is set to a true value ("1", "true", "yes", "on").
bool ProfileRequestedByEnvironment();

// CLOCK_MONOTONIC in nanoseconds: the clock of every event (Python's time.perf_counter_ns()
// and time.monotonic_ns() read the same clock on Linux).
int64_t MonotonicNanos();

// What a profile found: sums per stage over one or more processes, and the verdict.
struct ProfileReport {
  struct Stage {
    double seconds = 0;
    uint64_t count = 0;
    uint64_t bytes = 0;
  };
  std::array<Stage, kProfileStages> stages{};
  double wall_seconds = 0;
  double cpu_seconds = 0;  // user + system of every process merged
  int cores = 1;           // CPUs this process may run on
  int processes = 1;
  uint64_t events = 0;          // trace events kept
  uint64_t dropped_events = 0;  // trace events over the buffer's bound (sums still count them)

  // One of "store-latency", "bandwidth", "client-cpu", "parse", "consumer", and the numbers
  // that decided it.
  std::string verdict;
  std::string reason;

  const Stage& operator[](ProfileStage s) const { return stages[static_cast<int>(s)]; }
  // Fills verdict and reason from the numbers above.
  void Decide();
  // A fixed-width table: stage, seconds, % of wall, count, mean, MB; then the verdict.
  std::string Table() const;
  std::string ToJson() const;
};

class Profiler {
 public:
  static Profiler& Get();
  static bool Active() { return Get().active_.load(std::memory_order_relaxed); }

  // Starts a profile of this process: clears the sums and events and notes the wall and CPU
  // clocks. FailedPrecondition when one is running.
  absl::Status Start();
  // Stops (if running) and returns the report of this process alone (see MergeSpool).
  // The events stay until the next Start, for WriteTrace.
  ProfileReport Stop();
  // In a child process (a forked DataLoader worker): starts a fresh profile of the child,
  // whether or not the parent's was running when it forked.
  void StartInChild();

  // One span of `stage` on the calling thread.
  void Record(ProfileStage stage, int64_t start_ns, int64_t end_ns, uint64_t bytes = 0);
  // One store request: kFirstByte from start to first byte, kTransfer from there to end
  // (first_byte_ns == 0: kList or another request without a body, all as `stage`). Drawn as
  // an async track in the trace, since requests overlap.
  void RecordRequest(ProfileStage stage, int64_t start_ns, int64_t first_byte_ns, int64_t end_ns,
                     uint64_t bytes);

  // Nanoseconds the calling thread spent in kIoWait since it started; a record stream
  // subtracts the waits inside a parse call from the call's time.
  static int64_t ThreadIoWaitNanos();

  // This process's sums and events as JSON, for a parent to merge (a DataLoader worker
  // writes it into the parent's spool folder when it ends).
  std::string SpoolJson(absl::string_view process_name = "DataLoader worker");
  // This process's events as a JSON array in Chrome's trace event format, led by a
  // process_name event.
  std::string EventsText(absl::string_view process_name);
  // Merges every "<pid>.json" in `folder` into `report` and the trace, deleting each file
  // (one that is not a spool file is dropped). A missing folder merges nothing.
  void MergeSpool(const std::string& folder, ProfileReport& report);
  // The Chrome trace event format (JSON object with "traceEvents"), which Perfetto and
  // chrome://tracing open: this process's events and those merged from the spool. Written
  // whole or not at all, mode 0600.
  absl::Status WriteTrace(const std::string& path);

  // At most this many events are kept per process; later ones are counted as dropped.
  static constexpr size_t kMaxEvents = 250000;

 private:
  Profiler() = default;
  struct Event {
    int64_t start_ns;
    int64_t end_ns;
    int64_t mid_ns;  // RecordRequest: the first byte (0: none)
    uint64_t bytes;
    uint32_t tid;  // Record: the thread; requests get lanes instead
    ProfileStage stage;
    bool request;
  };
  void Add(ProfileStage stage, int64_t ns, uint64_t bytes);
  void Push(const Event& e);  // keeps it, or counts it as dropped past kMaxEvents
  void Reset() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::atomic<bool> active_{false};
  std::array<std::atomic<int64_t>, kProfileStages> ns_{};
  std::array<std::atomic<uint64_t>, kProfileStages> count_{};
  std::array<std::atomic<uint64_t>, kProfileStages> bytes_{};
  std::atomic<uint64_t> dropped_{0};
  int64_t start_ns_ = 0;
  double start_cpu_ = 0;
  absl::Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
  // Trace events of merged processes, each a serialized JSON array.
  std::vector<std::string> merged_ ABSL_GUARDED_BY(mu_);
};

// A span of `stage` on this thread, from construction (or from the first Begin(), for one
// that starts only if a wait happens) to destruction; recorded only if the profiler was
// running when it began.
class ProfileSpan {
 public:
  explicit ProfileSpan(ProfileStage stage, bool begin = true) : stage_(stage) {
    if (begin) Begin();
  }
  ~ProfileSpan() {
    if (start_ns_ != 0) Profiler::Get().Record(stage_, start_ns_, MonotonicNanos());
  }
  ProfileSpan(const ProfileSpan&) = delete;
  ProfileSpan& operator=(const ProfileSpan&) = delete;
  void Begin() {
    if (start_ns_ == 0 && Profiler::Active()) start_ns_ = MonotonicNanos();
  }

 private:
  const ProfileStage stage_;
  int64_t start_ns_ = 0;
};

}  // namespace wharf
