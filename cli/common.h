// Helpers shared by the `wharf` verbs: key arithmetic, formatting, listing loops, output to
// stdout, and the one-line progress display of transfers.
//
// The verbs speak only the ObjectStore interface, so everything here works for any scheme.
// Thread-safety: the free functions are pure or touch only their arguments, except the
// stdout writers (call them from one thread). Progress is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "io/transfer.h"
#include "nlohmann/json.hpp"
#include "store/keys.h"
#include "store/object_store.h"

namespace wharf::cli {

// ---- Keys ----

// IsSafeRelativeKey, AsPrefix, JoinKey, Basename: store/keys.h.

// ---- Usage errors ----

// A usage error: the command line, not an operation, is wrong (an argument the verb cannot
// take, flags that exclude each other, a malformed URI). InvalidArgument marked so that main
// exits 2 with a pointer to --help, as for the parser's own errors.
absl::Status UsageError(absl::string_view message);
bool IsUsageError(const absl::Status& status);
// Everything selected was done except entries the source's listing had to leave out (each
// named in a warning line): main exits 2, as `aws s3` does for skipped files, without the
// pointer to --help.
absl::Status SkippedError(absl::string_view message);
bool IsSkippedError(const absl::Status& status);

// ---- Parsing and formatting ----

// Parses an HTTP-style byte range: "START-END" (inclusive), "START-" (to the end), or
// "-N" (the last N bytes). InvalidArgument, naming the text, for anything else.
absl::StatusOr<ByteRange> ParseRange(absl::string_view text);

// "2024-05-01T12:34:56Z" (UTC, whole seconds); "-" for an unknown time.
std::string FormatMtime(absl::Time t);

// Decimal megabytes with one digit after the point: "12.3".
std::string Megabytes(uint64_t bytes);

// Decimal megabytes per second over `elapsed`: "45.6" ("-" for a zero duration).
std::string MegabytesPerSecond(uint64_t bytes, absl::Duration elapsed);

// `text` with control characters escaped ("\n", "\x1b"), so that a hostile key can neither
// split an error message over lines nor drive the terminal.
std::string OneLine(absl::string_view text);

// ---- Listing ----

// Calls `fn` with every page of the listing in order; stops at the first error (of the store
// or of `fn`). Only one page is held at a time.
absl::Status ForEachPage(ObjectStore& store, const ListOptions& options,
                         absl::FunctionRef<absl::Status(ListPage&)> fn);

// Calls `object` or `prefix` for the entries of `page` in key order (a page holds both lists
// sorted, but interleaved in the key space).
void ForEachEntry(const ListPage& page, absl::FunctionRef<void(const ObjectMeta&)> object,
                  absl::FunctionRef<void(const std::string&)> prefix);

// What a key given on the command line names: one object, when the key is non-empty, does not
// end in '/', and an object with exactly that key exists; otherwise the prefix below it
// (the key with '/' appended; "" for the bucket root).
struct Target {
  bool is_object = false;
  ObjectMeta object;   // when is_object
  std::string prefix;  // when !is_object
};
absl::StatusOr<Target> ResolveTarget(ObjectStore& store, const std::string& key);
// The same for a verb that works on a whole prefix (`what`: "cp -r", "rm -r", "sync", ...):
// a key naming both an object and a prefix of other objects (an object store holds `run` and
// `run/x`) is a usage error naming both ways out, rather than a guess of one of them.
absl::StatusOr<Target> ResolveRecursiveTarget(ObjectStore& store, const std::string& key,
                                              absl::string_view what);

// True when at least one object has a key starting with `prefix`.
absl::StatusOr<bool> PrefixHasObjects(ObjectStore& store, const std::string& prefix);

// ---- Output ----

// `j` on one line, newline-terminated. Keys are arbitrary bytes on some stores: invalid UTF-8
// becomes U+FFFD instead of throwing.
std::string JsonLine(const nlohmann::ordered_json& j);

// Writes all of `data` to stdout's buffer. A closed pipe (the reader went away, as in
// `wharf ls | head`) is not an error for the CLI: see StdoutBroken().
void Print(absl::string_view data);

// True once a write to stdout failed because the reader closed the pipe. Verbs stop their
// work quietly when it turns true; main() then exits 0 without a message.
bool StdoutBroken();

// Flushes stdout. OK on success and on a closed pipe (recorded for StdoutBroken()); an
// error naming stdout otherwise (a full disk behind a redirection).
absl::Status FlushStdout();

// ---- Progress ----

// A one-line progress display of a transfer on stderr, redrawn about five times a second:
//   [#######.............]  1234/5000 objects  456.7 MB  89.0 MB/s
// The bar shows the fraction of bytes done once the total is known. While the listing is
// still going the total is only what was found so far: it is shown as "5000+" and the bar
// just moves. It draws only
// when enabled (stderr is a terminal and the user did not ask for quiet); the counters work
// either way, so the caller's summary line uses them.
// Thread-safety: every method may be called from any thread.
//
// Whether shown or not, it watches for a stall: when nothing moves (no object listed, no byte
// moved, no object done) for WHARF_STALL_WARN_SECONDS (default 60), it prints one line saying
// so and what commonly causes it, and again each time the stall doubles. A transfer that waits
// on a destination that blocks writes (a CephFS whose pool is full blocks them instead of
// failing) is then no longer silent.
class Progress {
 public:
  explicit Progress(bool enabled);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // The default for interactive transfers: enabled iff !quiet and isatty(stderr).
  static bool ShouldShow(bool quiet);

  // Objects (and their bytes) discovered so far.
  void AddToTotal(uint64_t objects, uint64_t bytes) {
    total_.fetch_add(objects, std::memory_order_relaxed);
    total_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void TotalIsFinal() { total_final_.store(true, std::memory_order_relaxed); }
  void AddBytes(uint64_t n) { bytes_.fetch_add(n, std::memory_order_relaxed); }
  void ObjectDone() { done_.fetch_add(1, std::memory_order_relaxed); }

  // Prints `line` and a newline on stderr, above the progress line.
  void PrintLine(absl::string_view line);

  // Stops redrawing and erases the progress line. Idempotent.
  void Stop();

  uint64_t objects_done() const { return done_.load(std::memory_order_relaxed); }
  uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  absl::Duration elapsed() const { return absl::Now() - start_; }

 private:
  void Loop();
  void DrawLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Prints the stall line when nothing moved for long enough (see the class comment).
  void CheckStallLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const bool enabled_;
  const absl::Time start_;
  std::atomic<uint64_t> total_{0};
  std::atomic<uint64_t> total_bytes_{0};
  std::atomic<bool> total_final_{false};
  std::atomic<uint64_t> bytes_{0};
  std::atomic<uint64_t> done_{0};

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool drawn_ ABSL_GUARDED_BY(mu_) = false;        // a progress line is on screen
  int ticks_ ABSL_GUARDED_BY(mu_) = 0;             // redraws so far, to animate an open total
  const absl::Duration stall_warn_;                // first warning after this long without a move
  uint64_t seen_ ABSL_GUARDED_BY(mu_) = 0;         // the sum of the counters at the last move
  absl::Time moved_ ABSL_GUARDED_BY(mu_);          // when they last moved
  absl::Duration next_warn_ ABSL_GUARDED_BY(mu_);  // the stall length of the next warning
  std::thread thread_;
};

// A transfer observer for the verbs: progress on stderr, failures one per line above it,
// dry-run lines on stdout.
class ProgressObserver : public TransferObserver {
 public:
  explicit ProgressObserver(Progress& progress) : progress_(progress) {}
  void OnPlanned(uint64_t objects, uint64_t bytes) override {
    progress_.AddToTotal(objects, bytes);
  }
  void OnPlanFinal() override { progress_.TotalIsFinal(); }
  void OnBytes(uint64_t bytes) override { progress_.AddBytes(bytes); }
  void OnObjectDone(const std::string&, const std::string&) override { progress_.ObjectDone(); }
  // The first kMaxErrorLines failures, one line each; then one line saying the rest are
  // counted only (a cause that fails every object, such as a destination nobody may write
  // to, would otherwise print a line per object). The final summary counts them all.
  void OnError(const absl::Status& status) override {
    const uint64_t n = errors_.fetch_add(1, std::memory_order_relaxed);
    if (n < kMaxErrorLines) {
      progress_.PrintLine(absl::StrCat("wharf: ", OneLine(status.message())));
    } else if (n == kMaxErrorLines) {
      progress_.PrintLine(absl::StrCat("wharf: more than ", kMaxErrorLines,
                                       " objects failed; the others are not shown one by one "
                                       "(the summary counts them)"));
    }
  }
  static constexpr uint64_t kMaxErrorLines = 50;
  bool ShowsErrors() const override { return true; }
  void OnDryrun(absl::string_view op, const std::string& src, const std::string& dst) override {
    absl::MutexLock lock(&mu_);
    Print(dst.empty()
              ? absl::StrCat("(dryrun) ", op, " ", OneLine(src), "\n")
              : absl::StrCat("(dryrun) ", op, " ", OneLine(src), " -> ", OneLine(dst), "\n"));
  }

 private:
  Progress& progress_;
  absl::Mutex mu_;
  std::atomic<uint64_t> errors_{0};
};

}  // namespace wharf::cli
