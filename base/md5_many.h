// Multi-buffer MD5: the digests of many messages computed together, one message per SIMD lane
// (16 lanes with AVX-512, 8 with AVX2; checked once at run time), so hashing a batch of
// objects costs a fraction of hashing them one after another. MD5 is a chain of dependent
// steps within one message, so a single message cannot go faster than one step per few
// cycles; independent messages fill the vector lanes instead. Used where many whole objects
// wait to be checked against their MD5 ETags at once (the tier's import). Results are
// identical to Md5 (OpenSSL) for every input; small batches and CPUs without AVX2 use it.
// Thread-safety: functions are pure.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/strings/cord.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"

namespace wharf {

using Md5Digest = std::array<uint8_t, 16>;

// The MD5 of each message, in order.
std::vector<Md5Digest> Md5Many(absl::Span<const absl::Cord* const> messages);

// Hashes whole messages handed over one at a time, many at once: a thread of its own (started
// on first use) collects messages until it has `max_batch` of them (or `max_bytes`), none
// has arrived for `gap`, or the oldest has waited `max_wait`; then it hashes them with
// Md5Many and runs each message's `done` on the pool the message came with (the file is
// written there). A stream of puts arriving a few hundred
// microseconds apart is thus hashed 16 at a time, at most `max_wait` later than alone; a
// lone message waits `gap`. For asynchronous puts only: a caller that waits for each put
// before the next should hash where it is. One per runtime (Runtime::Shared).
class Md5Batcher {
 public:
  struct Options {
    size_t max_batch = 16;
    uint64_t max_bytes = uint64_t{32} << 20;
    absl::Duration gap = absl::Milliseconds(2);
    absl::Duration max_wait = absl::Milliseconds(8);
  };
  using Done = absl::AnyInvocable<void(absl::Cord data, const Md5Digest& md5) &&>;

  Md5Batcher() : Md5Batcher(Options()) {}
  explicit Md5Batcher(Options options) : options_(options) {}
  // Hashes what is queued (scheduling its `done`), then joins the thread.
  ~Md5Batcher();
  Md5Batcher(const Md5Batcher&) = delete;
  Md5Batcher& operator=(const Md5Batcher&) = delete;

  // Messages bigger than this gain nothing from waiting for others: hash them where they are.
  uint64_t max_message() const { return options_.max_bytes / 4; }
  // Hashes `data`, then runs `done` with it and its MD5 on `pool` (which must outlive the
  // batcher's work: the runtime's blocking pool).
  void Hash(absl::Cord data, ThreadPool& pool, Done done);

 private:
  struct Job {
    absl::Cord data;
    ThreadPool* pool;
    Done done;
    absl::Time queued;
  };
  void Loop();

  const Options options_;
  absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_arrival_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

namespace internal {
// The implementations, for tests and benchmarks: kScalar (OpenSSL, one message at a time),
// kAvx2 (8 lanes), kAvx512 (16 lanes). Md5ManyWith REQUIRES Md5ManyAvailable(kind).
enum class Md5Kernel { kScalar, kAvx2, kAvx512 };
bool Md5ManyAvailable(Md5Kernel kind);
std::vector<Md5Digest> Md5ManyWith(Md5Kernel kind, absl::Span<const absl::Cord* const> messages);
}  // namespace internal

}  // namespace wharf
