// Sampler: the global sample order of each epoch, its partition across ranks and DataLoader
// workers, and a resumable position in it. See docs/design/dataset.md.
//
// The order. Epoch e of a dataset of N samples visits the samples in the order
// P_e = a permutation of [0, N) that depends only on (seed, e, N): Fisher-Yates driven by
// splitmix64 with Lemire's unbiased bounded integers, so it is the same on every machine,
// compiler and standard library (std::shuffle and the std distributions are not), and the
// same whatever the number of ranks and workers. shuffle=false gives the identity.
// The epoch's sequence extends P_e cyclically: position p holds sample P_e[p mod N];
// positions >= N are padding.
//
// The partition. Samples are consumed from a global cursor `consumed` (0 at the start of an
// epoch). The remaining positions [consumed, end) are dealt round-robin: position
// consumed + j goes to rank j % world_size. `end` makes every rank's count equal:
//  - pad (default, like torch's DistributedSampler): end = consumed + ceil(R / W) * W with
//    R = N - consumed: fewer than W positions of padding, i.e. samples repeated from the
//    start of the order, so no rank runs short and DDP never hangs on an uneven last step;
//  - drop_last: end = consumed + floor(R / W) * W: the tail is dropped, no sample repeats.
// Within a rank, its share is cut into blocks of `worker_block` consecutive samples dealt
// round-robin to its workers. With worker_block = the DataLoader's batch size, a DataLoader
// over an iterable dataset (each worker batches its own share; the loader takes batches from
// workers round-robin) yields exactly the rank's share in order.
//
// Resume. Because the partition is interleaved, after every rank consumed k samples of its
// share the consumed positions are exactly [consumed, consumed + k * W): a single cursor.
// A job that checkpoints SamplerState{epoch, consumed + k * W} and restarts, with any world
// size, resumes with the positions it had not consumed, re-partitioned over the new ranks.
// (A blocked partition, rank r taking a contiguous chunk, would leave W holes instead.)
//
// Thread-safety: Sampler is immutable; const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace wharf {

struct SamplerOptions {
  uint64_t seed = 0;
  // false: every epoch visits the samples in index order.
  bool shuffle = true;
  // false: pad every rank to the same count by repeating samples from the start of the
  // order. true: drop the tail instead.
  bool drop_last = false;
};

// Which share of an epoch a consumer takes.
struct Partition {
  int rank = 0;
  int world_size = 1;
  int worker = 0;  // the DataLoader worker within the rank
  int num_workers = 1;
  // Consecutive samples of the rank's share a worker takes before the next worker's turn.
  // Set it to the DataLoader batch size for iterable datasets batched by the DataLoader.
  uint64_t worker_block = 1;

  // InvalidArgument unless 0 <= rank < world_size, 0 <= worker < num_workers and
  // worker_block >= 1.
  absl::Status Validate() const;
};

// A resumable position: everything needed to continue an epoch where a job stopped.
// `consumed` is the global cursor: how many positions of the epoch's sequence were
// consumed by all ranks together (see ConsumedAfter). consumed >= num_samples means the
// epoch is complete.
struct SamplerState {
  uint64_t num_samples = 0;
  uint64_t seed = 0;
  bool shuffle = true;
  // SampleIndex::Fingerprint() of the dataset, or empty when unknown (not checked).
  std::string fingerprint;
  uint64_t epoch = 0;
  uint64_t consumed = 0;

  // A small JSON object, e.g.
  // {"version":1,"num_samples":1000,"seed":7,"shuffle":true,"fingerprint":"...",
  //  "epoch":2,"consumed":4096}
  std::string ToJson() const;
  // InvalidArgument (naming the field) for malformed JSON, a missing or mistyped field or an
  // unknown version.
  static absl::StatusOr<SamplerState> FromJson(absl::string_view json);

  friend bool operator==(const SamplerState&, const SamplerState&) = default;
};

// The global cursor after every rank took `samples_per_rank` more samples of its share,
// starting from `start` (the state the ranks started or resumed from): start + k * W.
// With the usual synchronous data parallelism all ranks checkpoint after the same number
// of steps, so each rank computes the same value locally, with no communication:
//   consumed = ConsumedAfter(resumed_from, steps * per_rank_batch_size, world_size).
// It may exceed num_samples in the padded tail of an epoch; that means "complete".
uint64_t ConsumedAfter(uint64_t start, uint64_t samples_per_rank, int world_size);

// The samples one (rank, worker) takes from a cursor to the end of an epoch, in order.
struct Shard {
  uint64_t epoch = 0;
  uint64_t start = 0;  // the global cursor it was cut from
  uint64_t end = 0;    // the end of the epoch's sequence for this world size
  Partition partition;
  // Sample indices (into the SampleIndex) in the order to yield them.
  std::vector<uint64_t> samples;
  // How many samples the whole rank takes (every rank takes the same number).
  uint64_t rank_count = 0;

  // The position in the epoch's sequence of samples[i]. REQUIRES: i < samples.size().
  uint64_t GlobalPosition(uint64_t i) const;
};

class Sampler {
 public:
  // InvalidArgument when num_samples does not fit in 32 bits: the permutation is stored
  // as 32-bit indices (4 bytes per sample), and an index of 2^32 keys would not fit in
  // memory anyway.
  static absl::StatusOr<Sampler> Create(uint64_t num_samples, SamplerOptions options = {},
                                        std::string fingerprint = "");

  uint64_t num_samples() const { return num_samples_; }
  const SamplerOptions& options() const { return options_; }

  // The permutation P_epoch of [0, num_samples).
  std::vector<uint32_t> Permutation(uint64_t epoch) const;

  // The end of the epoch's sequence when the positions from `consumed` on are dealt over
  // `world_size` ranks (see the header comment).
  uint64_t EndOfEpoch(uint64_t consumed, int world_size) const;

  // The state at the given cursor, for checkpoints.
  SamplerState State(uint64_t epoch, uint64_t consumed) const;
  // OK when `state` belongs to this sampler: same num_samples, seed, shuffle and (when both
  // are known) fingerprint. Otherwise FailedPrecondition naming the mismatch, e.g.
  //   "sampler state is for a dataset of 1000 samples, this dataset has 999".
  absl::Status Validate(const SamplerState& state) const;
  // FromJson + Validate.
  absl::StatusOr<SamplerState> Restore(absl::string_view json) const;

  // The samples of `partition` from `state` (epoch and cursor) to the end of the epoch;
  // empty once the cursor is past the epoch's end. Materializes the epoch's permutation
  // transiently (4 bytes per sample). FailedPrecondition when `state` is not this
  // sampler's (see Validate), InvalidArgument for an invalid partition.
  absl::StatusOr<Shard> ShardOf(const SamplerState& state, const Partition& partition) const;

 private:
  Sampler(uint64_t num_samples, SamplerOptions options, std::string fingerprint)
      : num_samples_(num_samples), options_(options), fingerprint_(std::move(fingerprint)) {}

  uint64_t num_samples_;
  SamplerOptions options_;
  std::string fingerprint_;
};

namespace internal {

// splitmix64 (Steele, Lea, Flood 2014): the generator behind the permutation. Pinned by
// tests to the reference outputs, since the order of every dataset depends on it.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, bound), unbiased (Lemire 2019, "Fast Random Integer Generation in an
  // Interval"). REQUIRES: bound >= 1.
  uint64_t Bounded(uint64_t bound);

 private:
  uint64_t state_;
};

// The generator's seed for (seed, epoch).
uint64_t EpochSeed(uint64_t seed, uint64_t epoch);

}  // namespace internal
}  // namespace wharf
