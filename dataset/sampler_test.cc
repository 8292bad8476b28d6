#include "dataset/sampler.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wharf {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

Sampler MakeSampler(uint64_t n, SamplerOptions options = {}) {
  auto s = Sampler::Create(n, options);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

// The epoch's sequence: position p holds P[p mod N].
std::vector<uint64_t> Sequence(const Sampler& sampler, uint64_t epoch, uint64_t begin,
                               uint64_t end) {
  const auto order = sampler.Permutation(epoch);
  std::vector<uint64_t> out;
  for (uint64_t p = begin; p < end; ++p) out.push_back(order[p % order.size()]);
  return out;
}

// Every (rank, worker) share of `state`, keyed by rank then worker.
std::vector<std::vector<Shard>> AllShards(const Sampler& sampler, const SamplerState& state,
                                          int world, int workers, uint64_t block = 1) {
  std::vector<std::vector<Shard>> out(world);
  for (int r = 0; r < world; ++r) {
    for (int w = 0; w < workers; ++w) {
      auto shard = sampler.ShardOf(state, {.rank = r,
                                           .world_size = world,
                                           .worker = w,
                                           .num_workers = workers,
                                           .worker_block = block});
      EXPECT_TRUE(shard.ok()) << shard.status();
      out[r].push_back(*std::move(shard));
    }
  }
  return out;
}

// A rank's share in order, rebuilt from its workers the way a DataLoader does: blocks of
// `block` samples taken from the workers round-robin.
std::vector<uint64_t> RankOrderFromWorkers(const std::vector<Shard>& workers, uint64_t block) {
  std::vector<uint64_t> out;
  std::vector<size_t> next(workers.size(), 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (size_t w = 0; w < workers.size(); ++w) {
      const auto s = workers[w].Samples();
      for (uint64_t i = 0; i < block && next[w] < s.size(); ++i, ++next[w]) {
        out.push_back(s[next[w]]);
        progress = true;
      }
    }
  }
  return out;
}

// The global order rebuilt from the ranks' shares: position start + j * W + r is rank r's
// j-th sample.
std::vector<uint64_t> Interleave(const std::vector<std::vector<uint64_t>>& ranks) {
  std::vector<uint64_t> out;
  for (size_t j = 0; j < ranks[0].size(); ++j) {
    for (const auto& r : ranks) out.push_back(r[j]);
  }
  return out;
}

TEST(PermutationTest, IsAPermutation) {
  for (uint64_t version : {kOrderFisherYates, kOrderCounterBased}) {
    for (uint64_t n : {0, 1, 2, 3, 10, 1000, 4097}) {
      auto order = MakeSampler(n, {.seed = 3, .order = version}).Permutation(5);
      ASSERT_EQ(order.size(), n);
      std::vector<uint64_t> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i);
    }
  }
}

TEST(PermutationTest, IsPinned) {
  // The order is part of the resume contract: a checkpoint taken by one build must mean the
  // same samples to the next. A change here is a breaking change of every saved state.
  // Order 1: cross-checked against an independent Python transcription of the algorithm
  // (tests/data/order_v1/generate.py).
  EXPECT_THAT(MakeSampler(10, {.seed = 0, .order = kOrderFisherYates}).Permutation(0),
              ElementsAre(1, 0, 2, 3, 8, 5, 4, 9, 6, 7));
  EXPECT_THAT(MakeSampler(10, {.seed = 1234, .order = kOrderFisherYates}).Permutation(7),
              ElementsAre(5, 9, 7, 4, 1, 3, 0, 8, 6, 2));
  // Order 2 (the default): pinned to what this build computes.
  EXPECT_THAT(
      MakeSampler(10, {.seed = 0}).Permutation(0),
      ElementsAreArray(MakeSampler(10, {.seed = 0, .order = kOrderCounterBased}).Permutation(0)));
  EXPECT_THAT(MakeSampler(10, {.seed = 0}).Permutation(0),
              ElementsAre(2, 5, 9, 7, 1, 0, 8, 6, 4, 3));
  EXPECT_THAT(MakeSampler(10, {.seed = 1234}).Permutation(7),
              ElementsAre(1, 3, 2, 5, 0, 9, 4, 8, 7, 6));
}

TEST(PermutationTest, DeterministicAndDependsOnSeedAndEpoch) {
  for (uint64_t version : {kOrderFisherYates, kOrderCounterBased}) {
    SCOPED_TRACE(testing::Message() << "order " << version);
    const Sampler a = MakeSampler(500, {.seed = 7, .order = version});
    const Sampler b = MakeSampler(500, {.seed = 7, .order = version});
    const Sampler c = MakeSampler(500, {.seed = 8, .order = version});
    EXPECT_EQ(a.Permutation(0), b.Permutation(0));
    EXPECT_EQ(a.Permutation(3), b.Permutation(3));
    EXPECT_NE(a.Permutation(0), a.Permutation(1));
    EXPECT_NE(a.Permutation(0), c.Permutation(0));
    // Seed and epoch are not interchangeable.
    EXPECT_NE(MakeSampler(500, {.seed = 1, .order = version}).Permutation(2),
              MakeSampler(500, {.seed = 2, .order = version}).Permutation(1));
    // And it really shuffles: few fixed points.
    const auto order = a.Permutation(0);
    int fixed = 0;
    for (size_t i = 0; i < order.size(); ++i) fixed += order[i] == i;
    EXPECT_LT(fixed, 10);
  }
}

TEST(PermutationTest, NoShuffleIsTheIdentity) {
  std::vector<uint64_t> identity(100);
  std::iota(identity.begin(), identity.end(), uint64_t{0});
  for (uint64_t version : {kOrderFisherYates, kOrderCounterBased}) {
    EXPECT_EQ(MakeSampler(100, {.seed = 9, .shuffle = false, .order = version}).Permutation(4),
              identity);
  }
}

TEST(SamplerTest, OnlyOrderOneIsLimitedTo32BitsOfSamples) {
  EXPECT_FALSE(Sampler::Create(uint64_t{1} << 32, {.order = kOrderFisherYates}).ok());
  EXPECT_TRUE(Sampler::Create((uint64_t{1} << 32) - 1, {.order = kOrderFisherYates}).ok());
  EXPECT_TRUE(Sampler::Create(uint64_t{1} << 40).ok());
  auto unknown = Sampler::Create(10, {.order = 3});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("order version 3 is not supported"));
}

// A share of 10^9 samples (and one of 2^40) holds no list of them: its samples are computed
// per position (a vector of 10^9 would take 8 GB here, 4 GB as 32-bit indices).
TEST(SamplerTest, HugeSharesAreComputedPerPosition) {
  for (uint64_t n : {uint64_t{1'000'000'000}, uint64_t{1} << 40}) {
    const Sampler sampler = MakeSampler(n, {.seed = 17});
    auto shard = sampler.ShardOf(
        sampler.State(3, 12345),
        {.rank = 1, .world_size = 4, .worker = 2, .num_workers = 3, .worker_block = 8});
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_EQ(shard->rank_count, (n - 12345 + 3) / 4);
    std::set<uint64_t> seen;
    for (uint64_t i : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{8}, shard->size() / 2,
                       shard->size() - 1}) {
      const uint64_t sample = shard->SampleAt(i);
      ASSERT_LT(sample, n);
      EXPECT_EQ(sample, sampler.Order(3).At(shard->GlobalPosition(i) % n));
      seen.insert(sample);
    }
    EXPECT_EQ(seen.size(), 6u);
  }
}

// The heart of the contract: for any world size and worker count, the shares put back
// together (workers round-robin by block into ranks, ranks interleaved) are the global order.
TEST(PartitionTest, SharesReassembleIntoTheGlobalOrder) {
  for (uint64_t n : {0, 1, 5, 64, 101}) {
    for (bool drop_last : {false, true}) {
      const Sampler sampler = MakeSampler(n, {.seed = 11, .drop_last = drop_last});
      const SamplerState state = sampler.State(/*epoch=*/2, /*consumed=*/0);
      for (int world = 1; world <= 8; ++world) {
        const uint64_t end = sampler.EndOfEpoch(0, world);
        for (int workers = 1; workers <= 4; ++workers) {
          for (uint64_t block : {1, 3}) {
            SCOPED_TRACE(testing::Message()
                         << "n=" << n << " drop_last=" << drop_last << " world=" << world
                         << " workers=" << workers << " block=" << block);
            auto shards = AllShards(sampler, state, world, workers, block);
            std::vector<std::vector<uint64_t>> ranks;
            for (const auto& rank : shards) {
              ranks.push_back(RankOrderFromWorkers(rank, block));
              ASSERT_EQ(ranks.back().size(), rank[0].rank_count);
              // GlobalPosition agrees with where each sample really sits.
              for (const Shard& s : rank) {
                const std::vector<uint64_t> samples = s.Samples();
                ASSERT_EQ(samples.size(), s.size());
                for (uint64_t i = 0; i < samples.size(); ++i) {
                  const uint64_t p = s.GlobalPosition(i);
                  ASSERT_LT(p, end);
                  ASSERT_EQ(samples[i], Sequence(sampler, 2, p, p + 1)[0]);
                }
              }
            }
            // Equal counts on every rank.
            for (const auto& r : ranks) ASSERT_EQ(r.size(), ranks[0].size());
            EXPECT_EQ(Interleave(ranks), Sequence(sampler, 2, 0, end));
          }
        }
      }
    }
  }
}

TEST(PartitionTest, DropLastSeesEverySampleAtMostOnceAndDropsOnlyTheTail) {
  for (uint64_t n : {1, 7, 64, 101}) {
    const Sampler sampler = MakeSampler(n, {.seed = 1, .drop_last = true});
    const auto order = sampler.Permutation(0);
    for (int world = 1; world <= 8; ++world) {
      std::multiset<uint64_t> seen;
      for (const auto& rank : AllShards(sampler, sampler.State(0, 0), world, 3)) {
        for (const Shard& s : rank) {
          const auto samples = s.Samples();
          seen.insert(samples.begin(), samples.end());
        }
      }
      const uint64_t kept = n / world * world;
      ASSERT_EQ(seen.size(), kept);
      std::multiset<uint64_t> expected(order.begin(), order.begin() + kept);
      EXPECT_EQ(seen, expected) << "world " << world;
    }
  }
  // A world size that divides N: every sample exactly once.
  const Sampler sampler = MakeSampler(96, {.seed = 1, .drop_last = true});
  for (int world : {1, 2, 3, 4, 6, 8}) {
    std::multiset<uint64_t> seen;
    for (const auto& rank : AllShards(sampler, sampler.State(0, 0), world, 2)) {
      for (const Shard& s : rank) {
        const auto samples = s.Samples();
        seen.insert(samples.begin(), samples.end());
      }
    }
    std::multiset<uint64_t> all;
    for (uint64_t i = 0; i < 96; ++i) all.insert(i);
    EXPECT_EQ(seen, all);
  }
}

TEST(PartitionTest, PadRepeatsTheFewestSamplesFromTheStartOfTheOrder) {
  for (uint64_t n : {1, 5, 101}) {
    const Sampler sampler = MakeSampler(n, {.seed = 4});
    const auto order = sampler.Permutation(0);
    for (int world = 1; world <= 8; ++world) {
      const uint64_t end = sampler.EndOfEpoch(0, world);
      ASSERT_GE(end, n);
      ASSERT_LT(end - n, static_cast<uint64_t>(world));  // minimal padding
      ASSERT_EQ(end % world, 0u);
      std::multiset<uint64_t> seen;
      for (const auto& rank : AllShards(sampler, sampler.State(0, 0), world, 2)) {
        uint64_t count = 0;
        for (const Shard& s : rank) {
          const auto samples = s.Samples();
          seen.insert(samples.begin(), samples.end());
          count += s.size();
        }
        EXPECT_EQ(count, end / world);
      }
      // Every sample once, plus the padding: the start of the order, cyclically.
      std::multiset<uint64_t> expected(order.begin(), order.end());
      for (uint64_t p = n; p < end; ++p) expected.insert(order[p % n]);
      EXPECT_EQ(seen, expected) << "n " << n << " world " << world;
    }
  }
}

TEST(PartitionTest, ValidatesThePartition) {
  const Sampler sampler = MakeSampler(10);
  const SamplerState state = sampler.State(0, 0);
  EXPECT_THAT(sampler.ShardOf(state, {.rank = 2, .world_size = 2}).status().message(),
              HasSubstr("rank 2 of world size 2"));
  EXPECT_FALSE(sampler.ShardOf(state, {.world_size = 0}).ok());
  EXPECT_THAT(sampler.ShardOf(state, {.worker = 3, .num_workers = 3}).status().message(),
              HasSubstr("worker 3 of 3 workers"));
  EXPECT_FALSE(sampler.ShardOf(state, {.worker_block = 0}).ok());
}

// Consume k samples per rank with one world size, checkpoint, resume with another: the
// resumed shares reassemble into exactly order[consumed:] (then padding).
TEST(ResumeTest, ChangingTheWorldSizeYieldsExactlyTheUnseenSamples) {
  for (bool drop_last : {false, true}) {
    const uint64_t n = 103;
    const Sampler sampler = MakeSampler(n, {.seed = 21, .drop_last = drop_last});
    const auto order = sampler.Permutation(1);
    for (uint64_t k : {0, 1, 10, 50}) {
      SCOPED_TRACE(testing::Message() << "drop_last=" << drop_last << " k=" << k);
      // World 2: each rank consumes its first k samples.
      std::multiset<uint64_t> seen_before;
      for (const auto& rank : AllShards(sampler, sampler.State(1, 0), 2, 1)) {
        const auto samples = rank[0].Samples();
        ASSERT_GE(samples.size(), k);
        seen_before.insert(samples.begin(), samples.begin() + k);
      }
      const uint64_t consumed = ConsumedAfter(0, k, 2);
      EXPECT_EQ(seen_before, std::multiset<uint64_t>(order.begin(), order.begin() + consumed));

      // Checkpoint, restore, resume with world 3 and 2 workers per rank.
      const std::string json = sampler.State(1, consumed).ToJson();
      auto restored = sampler.Restore(json);
      ASSERT_TRUE(restored.ok()) << restored.status();
      EXPECT_EQ(restored->consumed, consumed);
      EXPECT_EQ(restored->epoch, 1u);
      std::vector<std::vector<uint64_t>> ranks;
      for (const auto& rank : AllShards(sampler, *restored, 3, 2)) {
        ranks.push_back(RankOrderFromWorkers(rank, 1));
      }
      const std::vector<uint64_t> after = Interleave(ranks);
      const uint64_t remaining = n - consumed;
      if (drop_last) {
        ASSERT_EQ(after.size(), remaining / 3 * 3);
        EXPECT_THAT(after, ElementsAreArray(order.begin() + consumed,
                                            order.begin() + consumed + after.size()));
      } else {
        ASSERT_EQ(after.size(), (remaining + 2) / 3 * 3);
        // order[consumed:], then the padding from the start of the order.
        EXPECT_THAT(std::vector<uint64_t>(after.begin(), after.begin() + remaining),
                    ElementsAreArray(order.begin() + consumed, order.end()));
        for (uint64_t i = remaining; i < after.size(); ++i) {
          EXPECT_EQ(after[i], order[i - remaining]);
        }
      }
    }
  }
}

TEST(ResumeTest, ChainedResumesSeeEverySampleOnce) {
  // 2 ranks, then 3, then 5: with drop_last=false every sample is seen exactly once before
  // the padding of the last leg.
  const uint64_t n = 200;
  const Sampler sampler = MakeSampler(n, {.seed = 5});
  std::multiset<uint64_t> seen;
  uint64_t consumed = 0;
  for (auto [world, per_rank] : {std::pair{2, 17}, std::pair{3, 20}, std::pair{5, 1000}}) {
    auto state = sampler.Restore(sampler.State(0, consumed).ToJson());
    ASSERT_TRUE(state.ok());
    uint64_t took = 0;
    for (const auto& rank : AllShards(sampler, *state, world, 1)) {
      const auto s = rank[0].Samples();
      took = std::min<uint64_t>(per_rank, s.size());
      seen.insert(s.begin(), s.begin() + took);
    }
    consumed = ConsumedAfter(consumed, took, world);
  }
  EXPECT_GE(consumed, n);
  std::set<uint64_t> distinct(seen.begin(), seen.end());
  EXPECT_EQ(distinct.size(), n);
  EXPECT_LT(seen.size() - n, 5u);  // only the last leg's padding repeats
  // A finished epoch has nothing left.
  auto shard = sampler.ShardOf(sampler.State(0, consumed), {.world_size = 4});
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(shard->size(), 0u);
}

TEST(StateTest, RoundTripsThroughJson) {
  SamplerState s{.num_samples = 1000,
                 .seed = 0xfedcba9876543210ULL,
                 .shuffle = false,
                 .fingerprint = "abc",
                 .epoch = 3,
                 .consumed = 4096};
  const std::string json = s.ToJson();
  EXPECT_THAT(json, HasSubstr("\"consumed\":4096"));
  auto back = SamplerState::FromJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);
  EXPECT_THAT(json, HasSubstr("\"version\":2,\"order\":2,"));
  s.order = kOrderFisherYates;
  EXPECT_EQ(*SamplerState::FromJson(s.ToJson()), s);
}

// A state written before order versions: {"version":1,...} without "order" is order 1.
TEST(StateTest, VersionOneStatesAreOrderOne) {
  auto legacy = SamplerState::FromJson(
      R"({"version":1,"num_samples":10,"seed":0,"shuffle":true,"fingerprint":"",)"
      R"("epoch":0,"consumed":4})");
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  EXPECT_EQ(legacy->order, kOrderFisherYates);
  // Only a sampler of that order continues it; the default one names the difference.
  auto r = MakeSampler(10).Restore(legacy->ToJson());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("order version 1, this sampler computes order "
                                              "version 2"));
  EXPECT_TRUE(MakeSampler(10, {.order = kOrderFisherYates}).Restore(legacy->ToJson()).ok());
}

TEST(StateTest, RestoreNamesTheMismatch) {
  const Sampler sampler = *Sampler::Create(999, {.seed = 7}, "fp-a");
  auto other_size = MakeSampler(1000, {.seed = 7}).State(0, 10).ToJson();
  auto r = sampler.Restore(other_size);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("dataset of 1000 samples, this dataset has 999"));

  r = sampler.Restore(MakeSampler(999, {.seed = 8}).State(0, 10).ToJson());
  EXPECT_THAT(r.status().message(), HasSubstr("seed 8, this sampler has seed 7"));

  r = sampler.Restore(MakeSampler(999, {.seed = 7, .shuffle = false}).State(0, 10).ToJson());
  EXPECT_THAT(r.status().message(), HasSubstr("shuffle=false"));

  r = sampler.Restore(Sampler::Create(999, {.seed = 7}, "fp-b")->State(0, 10).ToJson());
  EXPECT_THAT(r.status().message(), HasSubstr("fingerprint fp-b, this dataset has fp-a"));

  // No fingerprint on either side: not checked.
  EXPECT_TRUE(sampler.Restore(MakeSampler(999, {.seed = 7}).State(0, 10).ToJson()).ok());
}

TEST(StateTest, MalformedStatesAreInvalidArgument) {
  const Sampler sampler = MakeSampler(10);
  for (const auto& [json, message] : std::vector<std::pair<std::string, std::string>>{
           {"not json", "not valid JSON"},
           {"[1,2]", "expected a JSON object"},
           {R"({"num_samples":10})", "missing \"version\""},
           {R"({"version":3})", "unsupported version 3"},
           {R"({"version":2,"num_samples":10,"seed":0,"shuffle":true,"epoch":0,"consumed":0})",
            "missing \"order\""},
           {R"({"version":2,"order":3,"num_samples":10,"seed":0,"shuffle":true,"epoch":0,)"
            R"("consumed":0})",
            "order version 3 is not supported (this build computes order versions 1 and 2)"},
           {R"({"version":1,"num_samples":10,"seed":0,"epoch":0})", "missing \"consumed\""},
           {R"({"version":1,"num_samples":10,"seed":0,"epoch":-1,"consumed":0})",
            "\"epoch\" must be a non-negative integer"},
           {R"({"version":1,"num_samples":10,"seed":0,"epoch":0,"consumed":0})",
            "missing \"shuffle\""},
           {R"({"version":1,"num_samples":10,"seed":0,"epoch":0,"consumed":0,"shuffle":1})",
            "\"shuffle\" must be true or false"},
       }) {
    auto r = sampler.Restore(json);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_THAT(r.status().message(), HasSubstr(message)) << json;
  }
}

TEST(ConsumedAfterTest, IsTheGlobalCursor) {
  // 10 steps of 32 samples per rank on 8 ranks, resumed from 1000.
  EXPECT_EQ(ConsumedAfter(1000, 10 * 32, 8), 1000u + 2560u);
}

}  // namespace
}  // namespace wharf
