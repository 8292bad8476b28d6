// Order: every random choice of dataset/ (the order of an epoch's samples, the order of its
// shards, the shuffle buffer) and of the demo's synthetic data comes from here: one generator,
// one seed derivation, and the permutations of each order version. See
// docs/design/dataset.md ("Order versions").
//
// The generator is splitmix64 with Lemire's unbiased bounded draws, not std::shuffle or the
// std:: distributions, whose output differs between standard libraries: the same seed gives
// the same order on every platform and build, which resuming a run relies on.
//
// Order versions. A resume state records the version of the order it was taken under, and a
// state continues only under that version (a state from before order versions is version 1):
//  - 1 (legacy): Fisher-Yates over splitmix64, materializing the permutation (4 bytes per
//    element); kept so that states saved by earlier builds continue exactly.
//  - 2 (current): a counter-based permutation (FeistelPermutation): position p's element is
//    computed from (key, p) alone, in O(1) memory, so 10^9 samples need no 4 GB array.
//
// Thread-safety: SplitMix64 and ShuffleBuffer are not thread-safe (one user at a time);
// FeistelPermutation and EpochOrder are immutable (const methods may be called concurrently);
// the free functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace wharf {

// splitmix64 (Steele, Lea, Flood 2014): passes BigCrush; one add and three multiplies.
// Pinned by tests to the reference outputs, since every order depends on it.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, n) without modulo bias (Lemire 2019, "Fast Random Integer Generation in
  // an Interval"). REQUIRES: n > 0.
  uint64_t Uniform(uint64_t n);
  // The generator's whole state: SplitMix64(state()) continues the same sequence.
  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

// splitmix64's output function: a bijection of 64-bit words with full avalanche.
uint64_t Mix64(uint64_t z);

// A seed for one epoch (or worker, or shard) derived from a base seed: well mixed, so
// streams 0, 1, 2 give unrelated sequences. Compose it for several coordinates:
// DeriveSeed(DeriveSeed(seed, epoch), worker).
uint64_t DeriveSeed(uint64_t seed, uint64_t stream);

// ---- order versions ----

inline constexpr uint64_t kOrderFisherYates = 1;  // legacy, see the file comment
inline constexpr uint64_t kOrderCounterBased = 2;
// What new runs use.
inline constexpr uint64_t kCurrentOrder = kOrderCounterBased;

// OK for a version this build computes; otherwise InvalidArgument naming it and the
// supported ones, e.g. "order version 3 is not supported (this build computes order
// versions 1 and 2)".
absl::Status CheckOrderVersion(uint64_t version);

// A pseudorandom bijection of [0, n), evaluated per position in O(1) memory: a keyed
// Feistel network over the smallest power of two >= max(n, 2^10), restricted to [0, n) by
// cycle-walking (re-encrypting until the value falls inside; Black and Rogaway 2002,
// "Ciphers with Arbitrary Finite Domains"). Why it shuffles well enough, and what a
// position costs, is in docs/design/dataset.md.
class FeistelPermutation {
 public:
  static constexpr int kRounds = 8;
  // The permutation of [0, n) selected by `key`. n = 0 is the empty one.
  FeistelPermutation(uint64_t n, uint64_t key);
  uint64_t size() const { return n_; }
  // The element at `position`. REQUIRES: position < size().
  uint64_t operator()(uint64_t position) const;

 private:
  // One pass of the network over the whole power-of-two domain.
  uint64_t Encrypt(uint64_t x) const;

  uint64_t n_;
  int left_bits_;  // the domain's width is left_bits_ + right_bits_
  int right_bits_;
  uint64_t round_keys_[kRounds];
};

// What an order is for. Only order version 1 tells them apart: its two seed derivations.
enum class OrderOf { kSamples, kShards };

// The order of one epoch: position p (in [0, size())) -> element. Cheap to copy (a legacy
// order's table is shared).
class EpochOrder {
 public:
  // The identity of [0, 0).
  EpochOrder() = default;
  // Epoch `epoch`'s order of `n` elements under `version`: the identity without shuffle,
  // otherwise the version's permutation from (seed, epoch):
  //  - version 2: FeistelPermutation(n, DeriveSeed(seed, epoch));
  //  - version 1: Fisher-Yates over SplitMix64 seeded with order_v1::SampleEpochSeed(seed,
  //    epoch) (samples) or DeriveSeed(seed, epoch) (shards); materialized, so n must fit
  //    in 32 bits.
  // InvalidArgument for an unsupported version, or a version 1 order over 2^32 elements.
  static absl::StatusOr<EpochOrder> Create(uint64_t version, OrderOf what, uint64_t n,
                                           uint64_t seed, uint64_t epoch, bool shuffle);

  uint64_t size() const { return n_; }
  uint64_t version() const { return version_; }
  // The element at `position`. REQUIRES: position < size().
  uint64_t At(uint64_t position) const {
    if (table_) return (*table_)[position];
    if (feistel_) return (*feistel_)(position);
    return position;
  }

 private:
  uint64_t version_ = kCurrentOrder;
  uint64_t n_ = 0;
  std::optional<FeistelPermutation> feistel_;
  std::shared_ptr<const std::vector<uint32_t>> table_;  // version 1 only
};

namespace order_v1 {

// Version 1's seed of an epoch's sample order (its shard order used DeriveSeed).
uint64_t SampleEpochSeed(uint64_t seed, uint64_t epoch);
// Version 1's permutation: Fisher-Yates (Durstenfeld) driven by SplitMix64(seed).
// REQUIRES: n <= 2^32 - 1.
std::vector<uint32_t> FisherYates(uint64_t n, uint64_t seed);

}  // namespace order_v1

// Holds up to `capacity` items and releases them in random order. Push() fills the buffer;
// once it is full, each Push() returns one item drawn uniformly from the held items and the
// new one. Pop() drains what is left at the end of the stream. Memory: `capacity` items.
// Deterministic for a given seed and input sequence. capacity 0 passes items straight
// through. (The WebDataset scheme: shuffle the shard order, then mix samples across
// neighbouring shards in a buffer of N samples.)
template <typename T>
class ShuffleBuffer {
 public:
  ShuffleBuffer(size_t capacity, uint64_t seed) : capacity_(capacity), rng_(seed) {
    items_.reserve(capacity);
  }

  std::optional<T> Push(T item) {
    if (items_.size() < capacity_) {
      items_.push_back(std::move(item));
      return std::nullopt;
    }
    const uint64_t j = rng_.Uniform(items_.size() + 1);
    if (j == items_.size()) return item;
    std::swap(items_[j], item);
    return item;
  }

  // A uniformly chosen held item, removed; nullopt when empty.
  std::optional<T> Pop() {
    if (items_.empty()) return std::nullopt;
    const uint64_t j = rng_.Uniform(items_.size());
    std::swap(items_[j], items_.back());
    T out = std::move(items_.back());
    items_.pop_back();
    return out;
  }

  size_t size() const { return items_.size(); }
  size_t capacity() const { return capacity_; }
  // What a resumable reader saves: the held items in their slots, and the generator state.
  // Restore(items(), rng_state()) on a buffer of the same capacity continues exactly where
  // this one stands. REQUIRES for Restore: items.size() <= capacity().
  const std::vector<T>& items() const { return items_; }
  uint64_t rng_state() const { return rng_.state(); }
  void Restore(std::vector<T> items, uint64_t rng_state) {
    items_ = std::move(items);
    items_.reserve(capacity_);
    rng_ = SplitMix64(rng_state);
  }
  bool empty() const { return items_.empty(); }

 private:
  const size_t capacity_;
  SplitMix64 rng_;
  std::vector<T> items_;
};

}  // namespace wharf
