// Sampler: the global sample order of each epoch, its partition across ranks and DataLoader
// workers, and a resumable position in it. See docs/design/dataset.md.
//
// The order. Epoch e of a dataset of N samples visits the samples in the order
// P_e = a permutation of [0, N) that depends only on (order version, seed, e, N)
// (dataset/order.h: EpochOrder), so it is the same on every machine, compiler and standard
// library, and the same whatever the number of ranks and workers. New samplers use the
// counter-based order (version 2): P_e[p] is computed per position, nothing of size N is
// held. A sampler restoring a state from before order versions uses version 1 (Fisher-Yates,
// the permutation materialized). shuffle=false gives the identity.
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
#include "dataset/order.h"

namespace wharf {

struct SamplerOptions {
  uint64_t seed = 0;
  // false: every epoch visits the samples in index order.
  bool shuffle = true;
  // false: pad every rank to the same count by repeating samples from the start of the
  // order. true: drop the tail instead.
  bool drop_last = false;
  // The order version (dataset/order.h). Keep the default for new runs; a run resuming a
  // state sets the state's `order`, which a state always continues under.
  uint64_t order = kCurrentOrder;
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
  // The order version the epoch is visited in (dataset/order.h).
  uint64_t order = kCurrentOrder;

  // A small JSON object, e.g.
  // {"version":2,"order":2,"num_samples":1000,"seed":7,"shuffle":true,"fingerprint":"...",
  //  "epoch":2,"consumed":4096}
  // (docs/design/dataset.md, "Resume states": version 1 objects, written before order
  // versions, have no "order" and mean order 1.)
  std::string ToJson() const;
  // InvalidArgument (naming the field) for malformed JSON, a missing or mistyped field, an
  // unknown version or an unsupported order version.
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

// The samples one (rank, worker) takes from a cursor to the end of an epoch, in order,
// computed per position: a share of 10^9 samples holds no list of them.
struct Shard {
  uint64_t epoch = 0;
  uint64_t start = 0;  // the global cursor it was cut from
  uint64_t end = 0;    // the end of the epoch's sequence for this world size
  Partition partition;
  // How many samples the whole rank takes (every rank takes the same number).
  uint64_t rank_count = 0;
  // The epoch's order: position -> sample index.
  EpochOrder order;

  // How many samples this (rank, worker) takes.
  uint64_t size() const;
  // The sample index (into the SampleIndex) of the i-th sample to yield:
  // order.At(GlobalPosition(i) mod N). REQUIRES: i < size().
  uint64_t SampleAt(uint64_t i) const;
  // The position in the epoch's sequence of the i-th sample. REQUIRES: i < size().
  uint64_t GlobalPosition(uint64_t i) const;
  // SampleAt(0 .. size()-1): materializes the share (8 bytes a sample), for tests and
  // bindings that hand out a list.
  std::vector<uint64_t> Samples() const;
};

class Sampler {
 public:
  // InvalidArgument for an unsupported options.order, or order 1 over more than 2^32 - 1
  // samples (its permutation is stored as 32-bit indices).
  static absl::StatusOr<Sampler> Create(uint64_t num_samples, SamplerOptions options = {},
                                        std::string fingerprint = "");

  uint64_t num_samples() const { return num_samples_; }
  const SamplerOptions& options() const { return options_; }

  // The order P_epoch of [0, num_samples), evaluated per position.
  EpochOrder Order(uint64_t epoch) const;
  // P_epoch materialized (8 bytes a sample): for tests and small datasets.
  std::vector<uint64_t> Permutation(uint64_t epoch) const;

  // The end of the epoch's sequence when the positions from `consumed` on are dealt over
  // `world_size` ranks (see the header comment).
  uint64_t EndOfEpoch(uint64_t consumed, int world_size) const;

  // The state at the given cursor, for checkpoints.
  SamplerState State(uint64_t epoch, uint64_t consumed) const;
  // OK when `state` belongs to this sampler: same num_samples, seed, shuffle, order version
  // and (when both are known) fingerprint. Otherwise FailedPrecondition naming the
  // mismatch, e.g.
  //   "sampler state is for a dataset of 1000 samples, this dataset has 999".
  absl::Status Validate(const SamplerState& state) const;
  // FromJson + Validate.
  absl::StatusOr<SamplerState> Restore(absl::string_view json) const;

  // The samples of `partition` from `state` (epoch and cursor) to the end of the epoch;
  // empty once the cursor is past the epoch's end. O(1) memory under order 2 (order 1 holds
  // the epoch's permutation, 4 bytes per sample, shared by the shard). FailedPrecondition
  // when `state` is not this sampler's (see Validate), InvalidArgument for an invalid
  // partition.
  absl::StatusOr<Shard> ShardOf(const SamplerState& state, const Partition& partition) const;

 private:
  Sampler(uint64_t num_samples, SamplerOptions options, std::string fingerprint)
      : num_samples_(num_samples), options_(options), fingerprint_(std::move(fingerprint)) {}

  uint64_t num_samples_;
  SamplerOptions options_;
  std::string fingerprint_;
};

}  // namespace wharf
