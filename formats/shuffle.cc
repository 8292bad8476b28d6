#include "formats/shuffle.h"

namespace wharf {

uint64_t ShuffleRng::Next() {
  // SplitMix64 (Steele, Lea, Flood 2014): passes BigCrush, one add and three multiplies.
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t ShuffleRng::Uniform(uint64_t n) {
  // Lemire's multiply-shift with rejection of the biased low products.
  unsigned __int128 m = static_cast<unsigned __int128>(Next()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = -n % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(Next()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

uint64_t DeriveSeed(uint64_t seed, uint64_t stream) {
  ShuffleRng a(seed);
  ShuffleRng b(a.Next() ^ (stream * 0xd1342543de82ef95ull));
  return b.Next();
}

std::vector<size_t> ShardPermutation(size_t n, uint64_t seed, uint64_t epoch) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  ShuffleRng rng(DeriveSeed(seed, epoch));
  for (size_t i = n; i > 1; --i) {
    const size_t j = static_cast<size_t>(rng.Uniform(i));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

std::vector<std::string> ShuffleShards(std::vector<std::string> keys, uint64_t seed,
                                       uint64_t epoch) {
  const std::vector<size_t> order = ShardPermutation(keys.size(), seed, epoch);
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (size_t i : order) out.push_back(std::move(keys[i]));
  return out;
}

}  // namespace wharf
