// Test helper: reproducible pseudo-random object contents.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>

namespace wharf::store_testing {

// n bytes from a fixed generator: the same (n, seed) gives the same bytes everywhere.
inline std::string RandomBytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  std::mt19937 rng(seed);
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

}  // namespace wharf::store_testing
