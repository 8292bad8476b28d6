#include "dataset/order.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wharf {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<uint64_t> Materialize(const EpochOrder& order) {
  std::vector<uint64_t> out(order.size());
  for (uint64_t p = 0; p < out.size(); ++p) out[p] = order.At(p);
  return out;
}

EpochOrder Order(uint64_t version, OrderOf what, uint64_t n, uint64_t seed, uint64_t epoch,
                 bool shuffle = true) {
  auto order = EpochOrder::Create(version, what, n, seed, epoch, shuffle);
  EXPECT_TRUE(order.ok()) << order.status();
  return *std::move(order);
}

TEST(SplitMix64Test, MatchesTheReferenceOutputs) {
  // splitmix64.c (Vigna) seeded with 0.
  SplitMix64 rng(0);
  EXPECT_EQ(rng.Next(), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(rng.Next(), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(rng.Next(), 0x06c45d188009454fULL);
  // The state is the whole generator.
  SplitMix64 copy(rng.state());
  EXPECT_EQ(copy.Next(), rng.Next());
}

TEST(SplitMix64Test, UniformIsInRangeAndRoughlyUniform) {
  SplitMix64 rng(42);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(rng.Uniform(1), 0u);
  std::vector<int> counts(7, 0);
  constexpr int kDraws = 70000;
  for (int i = 0; i < kDraws; ++i) {
    const uint64_t x = rng.Uniform(7);
    ASSERT_LT(x, 7u);
    ++counts[x];
  }
  for (int c : counts) EXPECT_NEAR(c, kDraws / 7, 500);  // ~5 sigma
  // A bound near 2^64 exercises the rejection path.
  const uint64_t big = (uint64_t{1} << 63) + 12345;
  for (int i = 0; i < 1000; ++i) EXPECT_LT(rng.Uniform(big), big);
}

TEST(DeriveSeedTest, StreamsAreUnrelatedAndPinned) {
  EXPECT_NE(DeriveSeed(1, 0), DeriveSeed(1, 1));
  EXPECT_NE(DeriveSeed(1, 2), DeriveSeed(2, 1));
  EXPECT_EQ(DeriveSeed(7, 3), DeriveSeed(7, 3));
}

TEST(OrderVersionTest, UnknownVersionsAreRefusedNamingTheSupportedOnes) {
  EXPECT_TRUE(CheckOrderVersion(1).ok());
  EXPECT_TRUE(CheckOrderVersion(2).ok());
  for (uint64_t v : {uint64_t{0}, uint64_t{3}, uint64_t{1} << 40}) {
    const absl::Status s = CheckOrderVersion(v);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("order version ", v, " is not supported")));
    EXPECT_THAT(s.message(), HasSubstr("order versions 1 and 2"));
  }
  EXPECT_EQ(EpochOrder::Create(3, OrderOf::kSamples, 10, 0, 0, true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Order 1 is what builds before order versions computed; pinned by an independent Python
// model of splitmix64 + Lemire + Fisher-Yates (tests/data/order_v1/generate.py).
TEST(OrderV1Test, IsPinned) {
  EXPECT_THAT(Materialize(Order(1, OrderOf::kShards, 8, 2024, 0)),
              ElementsAre(7, 0, 2, 5, 1, 6, 3, 4));
  EXPECT_THAT(Materialize(Order(1, OrderOf::kShards, 10, 1, 3)),
              ElementsAre(7, 3, 4, 5, 8, 1, 9, 0, 2, 6));
  EXPECT_THAT(Materialize(Order(1, OrderOf::kSamples, 10, 0, 0)),
              ElementsAre(1, 0, 2, 3, 8, 5, 4, 9, 6, 7));
  // Materialized as 32-bit indices: larger orders are refused.
  EXPECT_EQ(EpochOrder::Create(1, OrderOf::kSamples, uint64_t{1} << 32, 0, 0, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Without shuffle, nothing is materialized, whatever the size.
  EXPECT_EQ(Order(1, OrderOf::kSamples, uint64_t{1} << 40, 0, 0, false).At(12345), 12345u);
}

TEST(OrderV1Test, FirstElementIsRoughlyUniform) {
  std::vector<int> first(4);
  for (uint64_t seed = 0; seed < 4000; ++seed) {
    ++first[Order(1, OrderOf::kShards, 4, seed, 0).At(0)];
  }
  for (int c : first) EXPECT_NEAR(c, 1000, 120);
}

TEST(OrderV2Test, IsPinned) {
  // The counter-based order is part of every state saved from now on: a change here breaks
  // them (add an order version instead).
  EXPECT_THAT(Materialize(Order(2, OrderOf::kSamples, 10, 0, 0)),
              ElementsAre(2, 5, 9, 7, 1, 0, 8, 6, 4, 3));
  EXPECT_EQ(Order(2, OrderOf::kSamples, 1'000'000'000, 7, 3).At(123'456'789), 270'614'315u);
  // Samples and shards share the one derivation under order 2.
  EXPECT_EQ(Materialize(Order(2, OrderOf::kShards, 100, 5, 1)),
            Materialize(Order(2, OrderOf::kSamples, 100, 5, 1)));
}

// Every position maps to a distinct element of [0, n): a bijection, for sizes around the
// powers of two where the Feistel domain changes width, and for several keys.
TEST(FeistelPermutationTest, IsABijectionForManySizes) {
  std::set<uint64_t> sizes = {0, 1, 2, 3, 7, 1000, 100003};
  for (int k = 1; k <= 17; ++k) {
    const uint64_t p = uint64_t{1} << k;
    sizes.insert({p - 1, p, p + 1});
  }
  for (uint64_t n : sizes) {
    for (uint64_t key : {uint64_t{0}, uint64_t{1}, uint64_t{0xdeadbeef}, ~uint64_t{0}}) {
      const FeistelPermutation perm(n, key);
      ASSERT_EQ(perm.size(), n);
      std::vector<bool> hit(n, false);
      for (uint64_t p = 0; p < n; ++p) {
        const uint64_t x = perm(p);
        ASSERT_LT(x, n) << "n " << n << " key " << key;
        ASSERT_FALSE(hit[x]) << "n " << n << " key " << key << ": " << x << " twice";
        hit[x] = true;
      }
    }
  }
}

TEST(FeistelPermutationTest, SeedsAndEpochsGiveDifferentOrders) {
  const auto a = Materialize(Order(2, OrderOf::kSamples, 1000, 7, 0));
  EXPECT_EQ(Materialize(Order(2, OrderOf::kSamples, 1000, 7, 0)), a);
  EXPECT_NE(Materialize(Order(2, OrderOf::kSamples, 1000, 7, 1)), a);
  EXPECT_NE(Materialize(Order(2, OrderOf::kSamples, 1000, 8, 0)), a);
  // Seed and epoch are not interchangeable.
  EXPECT_NE(Materialize(Order(2, OrderOf::kSamples, 1000, 1, 2)),
            Materialize(Order(2, OrderOf::kSamples, 1000, 2, 1)));
  // Different epochs share few positions (a random pair of orders: ~1 in expectation).
  const auto b = Materialize(Order(2, OrderOf::kSamples, 1000, 7, 1));
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  EXPECT_LT(same, 10);
  // The identity without shuffle.
  const EpochOrder identity = Order(2, OrderOf::kSamples, 1000, 7, 0, false);
  for (uint64_t p = 0; p < 1000; ++p) ASSERT_EQ(identity.At(p), p);
}

// 10^9 samples: positions are evaluated one by one, no table (this test would need 4 GB for
// one). Likewise at the top of the 64-bit range.
TEST(FeistelPermutationTest, HugeSizesEvaluatePositionsInConstantMemory) {
  for (uint64_t n : {uint64_t{1'000'000'000}, ~uint64_t{0}}) {
    const EpochOrder order = Order(2, OrderOf::kSamples, n, 42, 1);
    EXPECT_EQ(order.size(), n);
    std::set<uint64_t> seen;
    for (uint64_t p = 0; p < 20000; ++p) {
      const uint64_t at = p < 10000 ? p : n - 1 - (p - 10000) * 99991;
      const uint64_t x = order.At(at);
      ASSERT_LT(x, n);
      seen.insert(x);
    }
    EXPECT_EQ(seen.size(), 20000u);  // distinct positions, distinct elements
    // Consecutive positions land far apart (a shuffle, not a rotation).
    uint64_t near = 0;
    for (uint64_t p = 0; p + 1 < 1000; ++p) {
      const uint64_t a = order.At(p), b = order.At(p + 1);
      near += (a > b ? a - b : b - a) < n / 1000;
    }
    EXPECT_LT(near, 20u);
  }
}

// Statistical sanity: over many keys, the element at each position is uniform (a chi-square
// over the position x element table), and every order of 5 elements comes about equally
// often. Bounds are ~5 standard deviations of the chi-square: a correct implementation
// fails them with probability < 1e-5, a structured one (e.g. without the domain's minimum
// width, measured: chi-square 694 for the orders of 5) fails them.
TEST(FeistelPermutationTest, PositionsAreUniformOverKeys) {
  constexpr uint64_t kN = 10;
  constexpr int kKeys = 10000;
  std::vector<std::vector<int>> table(kN, std::vector<int>(kN, 0));
  for (int key = 0; key < kKeys; ++key) {
    const EpochOrder order = Order(2, OrderOf::kSamples, kN, 1, static_cast<uint64_t>(key));
    for (uint64_t p = 0; p < kN; ++p) ++table[p][order.At(p)];
  }
  double chi = 0;
  const double expected = static_cast<double>(kKeys) / kN;
  for (const auto& row : table) {
    for (int c : row) chi += (c - expected) * (c - expected) / expected;
  }
  const double df = (kN - 1) * (kN - 1);
  EXPECT_LT(chi, df + 5 * std::sqrt(2 * df)) << "chi-square over positions x elements";

  constexpr int kOrders = 12000;
  std::map<std::vector<uint64_t>, int> counts;
  for (int key = 0; key < kOrders; ++key) {
    ++counts[Materialize(Order(2, OrderOf::kShards, 5, static_cast<uint64_t>(key), 9))];
  }
  EXPECT_EQ(counts.size(), 120u);  // every order of 5 elements is reachable
  double chi5 = 0;
  const double e5 = kOrders / 120.0;
  for (const auto& [order, c] : counts) chi5 += (c - e5) * (c - e5) / e5;
  chi5 += (120 - counts.size()) * e5;
  EXPECT_LT(chi5, 119 + 5 * std::sqrt(2 * 119.0)) << "chi-square over the 120 orders";
}

// Within one order: no local structure. The number of ascents (p with P[p] < P[p+1]) of a
// uniform permutation has mean (n-1)/2 and variance (n+1)/12; the lag-1 correlation of
// values is ~N(0, 1/n).
TEST(FeistelPermutationTest, OneOrderHasNoLocalStructure) {
  for (uint64_t n : {uint64_t{1000}, (uint64_t{1} << 16) + 1, uint64_t{1} << 20}) {
    const auto order = Materialize(Order(2, OrderOf::kSamples, n, 3, 0));
    uint64_t ascents = 0;
    double mean = (n - 1) / 2.0, cov = 0, var = 0;
    for (uint64_t p = 0; p + 1 < n; ++p) {
      ascents += order[p] < order[p + 1];
      cov += (order[p] - mean) * (order[p + 1] - mean);
      var += (order[p] - mean) * (order[p] - mean);
    }
    EXPECT_NEAR(static_cast<double>(ascents), (n - 1) / 2.0, 5 * std::sqrt((n + 1) / 12.0))
        << "n " << n;
    EXPECT_LT(std::abs(cov / var), 5 / std::sqrt(static_cast<double>(n))) << "n " << n;
  }
}

std::vector<int> RunBuffer(size_t capacity, uint64_t seed, int n) {
  ShuffleBuffer<int> buffer(capacity, seed);
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    if (auto item = buffer.Push(i)) out.push_back(*item);
    EXPECT_LE(buffer.size(), capacity);
  }
  while (auto item = buffer.Pop()) out.push_back(*item);
  return out;
}

TEST(ShuffleBufferTest, IsBoundedDeterministicAndLosesNothing) {
  const std::vector<int> a = RunBuffer(100, 5, 1000);
  ASSERT_EQ(a.size(), 1000u);
  std::vector<int> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(sorted[i], i);
  EXPECT_EQ(RunBuffer(100, 5, 1000), a);
  EXPECT_NE(RunBuffer(100, 6, 1000), a);
  // Output i is always one of the first i + capacity + 1 inputs.
  for (size_t i = 0; i + 100 < a.size(); ++i) EXPECT_LE(a[i], static_cast<int>(i + 100));
  // Mixing: a sizeable displacement on average.
  double displacement = 0;
  for (size_t i = 0; i < a.size(); ++i) displacement += std::abs(a[i] - static_cast<int>(i));
  EXPECT_GT(displacement / a.size(), 20);
}

TEST(ShuffleBufferTest, EdgeCases) {
  EXPECT_EQ(RunBuffer(0, 1, 5), (std::vector<int>{0, 1, 2, 3, 4}));  // pass-through
  std::vector<int> small = RunBuffer(10, 1, 3);                      // never fills
  std::sort(small.begin(), small.end());
  EXPECT_EQ(small, (std::vector<int>{0, 1, 2}));
  ShuffleBuffer<std::string> strings(2, 9);
  EXPECT_FALSE(strings.Push("a").has_value());
  EXPECT_FALSE(strings.Push("b").has_value());
  EXPECT_TRUE(strings.Push("c").has_value());
  EXPECT_EQ(strings.size(), 2u);
}

TEST(ShuffleBufferTest, RestoreContinuesExactly) {
  ShuffleBuffer<int> a(8, 3);
  for (int i = 0; i < 20; ++i) a.Push(i);
  ShuffleBuffer<int> b(8, 999);
  b.Restore(a.items(), a.rng_state());
  for (int i = 20; i < 40; ++i) EXPECT_EQ(a.Push(i), b.Push(i));
  while (!a.empty()) EXPECT_EQ(a.Pop(), b.Pop());
}

}  // namespace
}  // namespace wharf
