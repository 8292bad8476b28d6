#include "formats/shuffle.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wharf {
namespace {

TEST(ShuffleTest, ShardPermutationIsAFixedPermutationPerSeedAndEpoch) {
  const std::vector<size_t> a = ShardPermutation(1000, 42);
  std::vector<size_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<size_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(a, identity);
  EXPECT_EQ(ShardPermutation(1000, 42), a);
  EXPECT_NE(ShardPermutation(1000, 43), a);
  EXPECT_NE(ShardPermutation(1000, 42, /*epoch=*/1), a);
  EXPECT_TRUE(ShardPermutation(0, 1).empty());
  EXPECT_EQ(ShardPermutation(1, 1), std::vector<size_t>{0});
  // Pinned (values from an independent Python model of SplitMix64 + Lemire): the order must
  // not change between builds or platforms, since resuming a run relies on it.
  EXPECT_THAT(ShardPermutation(8, 2024), testing::ElementsAre(7, 0, 2, 5, 1, 6, 3, 4));
  EXPECT_THAT(ShardPermutation(10, 1, 3), testing::ElementsAre(7, 3, 4, 5, 8, 1, 9, 0, 2, 6));
}

TEST(ShuffleTest, ShuffleShardsPermutesKeys) {
  std::vector<std::string> keys;
  for (int i = 0; i < 50; ++i) keys.push_back(absl::StrCat("shard-", 1000 + i, ".tar"));
  const auto shuffled = ShuffleShards(keys, 7);
  EXPECT_THAT(shuffled, testing::UnorderedElementsAreArray(keys));
  EXPECT_NE(shuffled, keys);
  EXPECT_EQ(ShuffleShards(keys, 7), shuffled);
  const auto order = ShardPermutation(keys.size(), 7);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(shuffled[i], keys[order[i]]);
}

TEST(ShuffleTest, UniformIsUnbiasedEnough) {
  ShuffleRng rng(1);
  std::vector<int> counts(6);
  for (int i = 0; i < 60'000; ++i) ++counts[rng.Uniform(6)];
  for (int c : counts) EXPECT_NEAR(c, 10'000, 500);
  // First element of a 4-permutation: each value about a quarter of the time.
  std::vector<int> first(4);
  for (uint64_t seed = 0; seed < 4000; ++seed) ++first[ShardPermutation(4, seed)[0]];
  for (int c : first) EXPECT_NEAR(c, 1000, 120);
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

TEST(ShuffleTest, ShuffleBufferIsBoundedDeterministicAndLosesNothing) {
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

TEST(ShuffleTest, ShuffleBufferEdgeCases) {
  EXPECT_EQ(RunBuffer(0, 1, 5), (std::vector<int>{0, 1, 2, 3, 4}));  // pass-through
  std::vector<int> small = RunBuffer(10, 1, 3);                       // never fills
  std::sort(small.begin(), small.end());
  EXPECT_EQ(small, (std::vector<int>{0, 1, 2}));
  ShuffleBuffer<std::string> strings(2, 9);
  EXPECT_FALSE(strings.Push("a").has_value());
  EXPECT_FALSE(strings.Push("b").has_value());
  EXPECT_TRUE(strings.Push("c").has_value());
  EXPECT_EQ(strings.size(), 2u);
}

}  // namespace
}  // namespace wharf
