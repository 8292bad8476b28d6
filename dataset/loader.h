// Sample readers over the fetch engine: the bytes of a dataset's samples, zero-copy.
//
//  - SampleStream: the samples of one (rank, worker) share of an epoch (a Shard from the
//    Sampler), in the share's order, read ahead by `prefetch` samples through one open
//    FetchScheduler batch. What backs an iterable dataset: each DataLoader worker owns one.
//  - SampleReader: random access by sample index, Get(i) and GetBatch(indices), each call
//    one FetchScheduler batch. What backs a map-style dataset (__getitem__, __getitems__),
//    where the DataLoader's sampler decides the order.
//
// Samples hold FetchBuffers: slices of blocks charged against the scheduler's memory budget
// until the last slice is dropped, so a consumer that keeps samples alive holds back the
// read-ahead (and, past the budget, gets ResourceExhausted instead of a hang). The binding
// hands the blocks to Python without copying.
//
// All calls block; none calls back into the caller, so a binding may run them with the
// interpreter lock released.
//
// Errors name the sample and its key, e.g.
//   "sample 17 (train/a.jpg): get file:///data/train/a.jpg: No such file or directory",
// and an object whose size differs from the index's is FailedPrecondition (it changed
// since indexing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "dataset/index.h"
#include "dataset/sampler.h"
#include "io/fetch_scheduler.h"

namespace wharf {

struct Sample {
  uint64_t index = 0;  // position in the SampleIndex
  std::string key;
  FetchBuffer data;
};

// Random access to samples. The index and the scheduler are shared: one scheduler (one
// memory budget and in-flight limit) typically serves several readers and streams of a
// process, and a binding releases them in no particular order.
// Thread-safety: thread-safe; concurrent calls use separate engine batches.
class SampleReader {
 public:
  // REQUIRES: index != nullptr, scheduler != nullptr, and the scheduler reads the store the
  // index's keys belong to.
  SampleReader(std::shared_ptr<const SampleIndex> index, std::shared_ptr<FetchScheduler> scheduler);

  // One sample. OutOfRange when index >= the index's size.
  absl::StatusOr<Sample> Get(uint64_t index) const;

  // The samples `indices` (repeats allowed), in that order, fetched as ONE engine batch so
  // that a batch of small objects has all its requests in flight together. When a sample
  // fails, the error of the first failing one (in `indices` order) is returned. `stats`,
  // when given, receives the engine batch's statistics.
  absl::StatusOr<std::vector<Sample>> GetBatch(absl::Span<const uint64_t> indices,
                                               FetchStats* stats = nullptr) const;

  const SampleIndex& index() const { return *index_; }

 private:
  std::shared_ptr<const SampleIndex> index_;
  std::shared_ptr<FetchScheduler> scheduler_;
};

struct StreamOptions {
  // prefetch: follow the store. While no sample comes from across a network (the tier's
  // hits and local files report no time to first byte), kNearPrefetch ahead: 64 keep tens of
  // thousands of samples a second fed, and a deeper window only spreads the epoch over more
  // fresh memory (a first epoch of 3,000 x 100 KiB from a tier with 768 ahead took ~17,000
  // more page faults than with 64, and 1.3-1.8x its time). Once a sample's first byte took
  // kRemoteFirstByte or more (a bucket, a tier's miss), the window follows the engine for
  // the rest of the stream: twice the requests it keeps in flight now, so a depth the engine
  // tunes up has samples to fill it. (A request's whole latency is no such signal: local
  // reads queue behind each other, so theirs grows with the window.)
  static constexpr size_t kAutoPrefetch = ~size_t{0};
  static constexpr size_t kNearPrefetch = 64;
  static constexpr absl::Duration kRemoteFirstByte = absl::Milliseconds(2);
  // Samples requested ahead of the one being consumed (0: none; NextBatch(n) still fetches
  // its n samples together). The scheduler's memory budget bounds the bytes; this bounds
  // the count, so small budgets and large samples are both safe.
  size_t prefetch = 64;
  // When non-zero, the read-ahead also stops before its samples' sizes (from the index;
  // unknown sizes count as 0) would exceed this many bytes. The samples being consumed are
  // always requested. Set it when several streams share one scheduler and are consumed
  // concurrently: keep the streams' sum under the scheduler's memory_budget, or one
  // stream's read-ahead can hold the whole budget while another stream's read fails with
  // ResourceExhausted (the engine cannot tell a budget held by another live batch from a
  // deadlock).
  uint64_t prefetch_bytes = 0;
  // Samples at the start of the share to pass over without reading them: a DataLoader
  // worker resuming its own share after yielding that many (clipped to the share's size).
  uint64_t skip = 0;
};

// The samples of one Shard, in order, with read-ahead.
// Thread-safety: not thread-safe; one thread at a time (each DataLoader worker owns one).
class SampleStream {
 public:
  // The share of `partition` of `state`'s epoch from its cursor. FailedPrecondition when the
  // sampler or the state does not match the index (sizes or fingerprints), InvalidArgument
  // for a bad partition.
  // REQUIRES: index != nullptr, scheduler != nullptr.
  static absl::StatusOr<std::unique_ptr<SampleStream>> Create(
      std::shared_ptr<const SampleIndex> index, const Sampler& sampler, const SamplerState& state,
      const Partition& partition, std::shared_ptr<FetchScheduler> scheduler,
      StreamOptions options = {});

  // The samples of `shard` (which must index into `index`: InvalidArgument otherwise).
  static absl::StatusOr<std::unique_ptr<SampleStream>> Create(
      std::shared_ptr<const SampleIndex> index, Shard shard,
      std::shared_ptr<FetchScheduler> scheduler, StreamOptions options = {});

  ~SampleStream();
  SampleStream(const SampleStream&) = delete;
  SampleStream& operator=(const SampleStream&) = delete;

  // The next sample; nullopt at the end of the share. A failed sample is consumed: the next
  // call goes on with the following one.
  absl::StatusOr<std::optional<Sample>> Next();

  // The next min(n, remaining()) samples, fetched together (and with the read-ahead behind
  // them); empty at the end. On error, the batch's samples are consumed.
  absl::StatusOr<std::vector<Sample>> NextBatch(size_t n);

  // Positions of the share passed so far (skipped at creation, yielded or failed), and left.
  uint64_t yielded() const { return yielded_; }
  uint64_t remaining() const { return shard_.size() - yielded_; }
  const Shard& shard() const { return shard_; }
  // The engine batch's statistics so far (every sample of the stream goes through one).
  FetchStats stats() const;

 private:
  SampleStream(std::shared_ptr<const SampleIndex> index, Shard shard,
               std::shared_ptr<FetchScheduler> scheduler, StreamOptions options);

  // Adds samples to the engine batch: all of them up to position `required`, then read-ahead
  // up to `ahead` within options_.prefetch_bytes (both capped at the share's end).
  void FillTo(uint64_t required, uint64_t ahead);
  uint64_t SizeAt(uint64_t position) const;
  // Samples to read ahead now (options_.prefetch, or see kAutoPrefetch).
  size_t Prefetch() const;
  // Notes how far the store of a taken result is (see kAutoPrefetch).
  void Observe(const FetchResult& r);
  // Waits for the sample at position yielded_ and consumes it.
  absl::StatusOr<Sample> TakeOne();

  const std::shared_ptr<const SampleIndex> index_;
  const Shard shard_;
  const std::shared_ptr<FetchScheduler> scheduler_;
  const StreamOptions options_;

  std::unique_ptr<FetchScheduler::Batch> batch_;  // created on first use
  // Engine item i of batch_ is the share's position base_ + i (base_ = options_.skip).
  uint64_t base_ = 0;
  uint64_t added_ = 0;
  uint64_t yielded_ = 0;
  uint64_t window_bytes_ = 0;  // known sizes of samples added and not yet yielded
  bool remote_ = false;        // a sample's first byte took kRemoteFirstByte or more
  // Results that arrived ahead of their turn (only with an unordered scheduler).
  std::map<uint64_t, FetchResult> early_;
};

}  // namespace wharf
