// Deterministic shuffling for training input: a permutation of shard keys per (seed, epoch),
// and a bounded shuffle buffer for the samples inside shards (the WebDataset scheme: shuffle
// the shard order, then mix samples across neighbouring shards in a buffer of N samples).
//
// Both use ShuffleRng (SplitMix64 with unbiased bounded draws), not std::shuffle or
// std::uniform_int_distribution, whose output differs between standard libraries: the same
// seed gives the same order on every platform and build, which resuming a run relies on.
//
// Thread-safety: ShuffleRng and ShuffleBuffer are not thread-safe (one user at a time); the
// free functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace wharf {

class ShuffleRng {
 public:
  explicit ShuffleRng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, n) without modulo bias. REQUIRES: n > 0.
  uint64_t Uniform(uint64_t n);
  // The generator's whole state: ShuffleRng(state()) continues the same sequence.
  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

// A seed for one epoch (or worker, or shard) derived from a base seed: well mixed, so epochs
// 0, 1, 2 give unrelated orders.
uint64_t DeriveSeed(uint64_t seed, uint64_t stream);

// A uniformly random permutation of 0..n-1 (Fisher-Yates), fixed by (seed, epoch).
std::vector<size_t> ShardPermutation(size_t n, uint64_t seed, uint64_t epoch = 0);
// `keys` reordered by ShardPermutation(keys.size(), seed, epoch). The result depends on the
// input order: pass keys in a canonical order (a listing's key order).
std::vector<std::string> ShuffleShards(std::vector<std::string> keys, uint64_t seed,
                                       uint64_t epoch = 0);

// Holds up to `capacity` items and releases them in random order. Push() fills the buffer;
// once it is full, each Push() returns one item drawn uniformly from the held items and the
// new one. Pop() drains what is left at the end of the stream. Memory: `capacity` items.
// Deterministic for a given seed and input sequence. capacity 0 passes items straight through.
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
    rng_ = ShuffleRng(rng_state);
  }
  bool empty() const { return items_.empty(); }

 private:
  const size_t capacity_;
  ShuffleRng rng_;
  std::vector<T> items_;
};

}  // namespace wharf
