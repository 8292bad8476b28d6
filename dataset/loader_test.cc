#include "dataset/loader.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/testing/delayed_get_store.h"
#include "store/testing/temp_store.h"

namespace wharf {
namespace {

using ::testing::HasSubstr;

// Distinct content per object, of varying size.
std::string Content(int i) {
  return absl::StrCat("sample-", i, "-",
                      std::string(i * 13 % 500, static_cast<char>('a' + i % 26)));
}

class LoaderTest : public testing::Test {
 protected:
  static constexpr int kSamples = 60;

  void SetUp() override {
    for (int i = 0; i < kSamples; ++i) {
      ASSERT_TRUE(store_->Put(absl::StrCat("ds/", 1000 + i, ".bin"), absl::Cord(Content(i))).ok());
    }
    auto index = SampleIndex::FromListing(*store_, "ds/");
    ASSERT_TRUE(index.ok()) << index.status();
    ASSERT_EQ(index->size(), static_cast<size_t>(kSamples));
    index_ = std::make_shared<const SampleIndex>(*std::move(index));
  }
  std::shared_ptr<FetchScheduler> Scheduler(FetchOptions options = {.ordered = true}) {
    return std::make_shared<FetchScheduler>(store_, options);
  }

  // Drains a stream, checking every sample's bytes; returns the sample indices in order.
  std::vector<uint64_t> Drain(SampleStream& stream) {
    std::vector<uint64_t> out;
    while (true) {
      auto s = stream.Next();
      EXPECT_TRUE(s.ok()) << s.status();
      if (!s.ok() || !s->has_value()) break;
      const Sample& sample = **s;
      EXPECT_EQ(sample.key, (*index_)[sample.index].key);
      EXPECT_EQ(sample.data.view(), Content(static_cast<int>(sample.index)));
      out.push_back(sample.index);
    }
    return out;
  }

  store_testing::TempStore temp_;
  const std::shared_ptr<ObjectStore> store_ = temp_.store();
  std::shared_ptr<const SampleIndex> index_;
};

TEST_F(LoaderTest, StreamYieldsTheShareInOrderWithReadAhead) {
  for (bool ordered : {true, false}) {
    const Sampler sampler = *Sampler::Create(kSamples, {.seed = 3});
    const SamplerState state = sampler.State(0, 0);
    const Partition partition{.rank = 1, .world_size = 2, .worker = 0, .num_workers = 2};
    auto shard = sampler.ShardOf(state, partition);
    ASSERT_TRUE(shard.ok());
    auto stream =
        SampleStream::Create(index_, sampler, state, partition,
                             Scheduler({.max_in_flight = 4, .ordered = ordered}), {.prefetch = 8});
    ASSERT_TRUE(stream.ok()) << stream.status();
    auto first = (*stream)->Next();
    ASSERT_TRUE(first.ok() && first->has_value());
    EXPECT_EQ((**first).index, shard->SampleAt(0));
    EXPECT_EQ((*stream)->stats().items, 9u);  // the sample and 8 ahead
    std::vector<uint64_t> rest = Drain(**stream);
    rest.insert(rest.begin(), (**first).index);
    EXPECT_EQ(rest, shard->Samples()) << "ordered=" << ordered;
    EXPECT_EQ((*stream)->remaining(), 0u);
    EXPECT_EQ((*stream)->stats().items, shard->size());
    EXPECT_EQ((*stream)->stats().requests, shard->size());  // sizes known: no HEADs
  }
}

// A worker resuming its own share passes over what it yielded without reading it.
// Auto read-ahead: 64 samples while every sample comes back at once (a local store, the
// tier's hits: no time to first byte); once one's first byte takes kRemoteFirstByte or more,
// twice the engine's depth.
TEST_F(LoaderTest, AutoReadAheadFollowsTheEnginesDepthOnceTheStoreIsFar) {
  // 600 samples: the fixture's objects, each ten times.
  std::vector<std::string> keys;
  for (int round = 0; round < 10; ++round) {
    for (int i = 0; i < kSamples; ++i) keys.push_back(absl::StrCat("ds/", 1000 + i, ".bin"));
  }
  auto index = std::make_shared<const SampleIndex>(SampleIndex::FromKeys(keys));
  const Sampler sampler = *Sampler::Create(keys.size(), {.seed = 3});
  const SamplerState state = sampler.State(0, 0);
  auto far = std::make_shared<store_testing::DelayedGetStore>(store_, absl::Milliseconds(5),
                                                              /*report_first_byte=*/true);
  for (bool remote : {false, true}) {
    for (int depth : {4, 100}) {
      FetchOptions engine{.max_in_flight = depth, .ordered = true};
      auto stream = SampleStream::Create(
          index, sampler, state, Partition{},
          remote ? std::make_shared<FetchScheduler>(far, engine) : Scheduler(engine),
          {.prefetch = StreamOptions::kAutoPrefetch});
      ASSERT_TRUE(stream.ok()) << stream.status();
      auto first = (*stream)->Next();
      ASSERT_TRUE(first.ok() && first->has_value()) << first.status();
      EXPECT_EQ((*stream)->stats().items, 1 + StreamOptions::kNearPrefetch) << depth;
      auto second = (*stream)->Next();
      ASSERT_TRUE(second.ok() && second->has_value()) << second.status();
      // Twice the depth, at least 64, once the first sample showed the store is far. A window
      // that stays 64 is topped up in chunks, not one sample at a time.
      const bool deeper = remote && 2 * depth > 64;
      EXPECT_EQ((*stream)->stats().items, deeper ? 2 + 2 * static_cast<uint64_t>(depth) : 65)
          << depth << " remote=" << remote;
      uint64_t n = 2;
      while (true) {
        auto s = (*stream)->Next();
        ASSERT_TRUE(s.ok()) << s.status();
        if (!s->has_value()) break;
        ++n;
      }
      EXPECT_EQ(n, keys.size());
    }
  }
}

TEST_F(LoaderTest, SkipStartsTheShareLaterWithoutReadingTheSkippedSamples) {
  for (bool ordered : {true, false}) {
    const Sampler sampler = *Sampler::Create(kSamples, {.seed = 5});
    const SamplerState state = sampler.State(1, 0);
    const Partition partition{.rank = 0, .world_size = 1, .worker = 1, .num_workers = 2};
    auto shard = sampler.ShardOf(state, partition);
    ASSERT_TRUE(shard.ok());
    for (uint64_t skip : {uint64_t{0}, uint64_t{7}, uint64_t{shard->size()}}) {
      auto stream = SampleStream::Create(index_, sampler, state, partition,
                                         Scheduler({.max_in_flight = 4, .ordered = ordered}),
                                         {.prefetch = 3, .skip = skip});
      ASSERT_TRUE(stream.ok()) << stream.status();
      EXPECT_EQ((*stream)->yielded(), skip);
      const std::vector<uint64_t> rest = Drain(**stream);
      const std::vector<uint64_t> all = shard->Samples();
      EXPECT_EQ(rest, std::vector<uint64_t>(all.begin() + skip, all.end()))
          << "skip " << skip << " ordered=" << ordered;
      EXPECT_EQ((*stream)->stats().items, shard->size() - skip);
    }
  }
}

TEST_F(LoaderTest, AllSharesTogetherReadEverySampleOnce) {
  const Sampler sampler = *Sampler::Create(kSamples, {.seed = 9, .drop_last = true});
  auto scheduler = Scheduler();
  std::multiset<uint64_t> seen;
  for (int rank = 0; rank < 3; ++rank) {
    for (int worker = 0; worker < 2; ++worker) {
      auto stream =
          SampleStream::Create(index_, sampler, sampler.State(4, 0),
                               {.rank = rank, .world_size = 3, .worker = worker, .num_workers = 2},
                               scheduler, {.prefetch = 5});
      ASSERT_TRUE(stream.ok()) << stream.status();
      for (uint64_t i : Drain(**stream)) seen.insert(i);
    }
  }
  std::multiset<uint64_t> all;
  for (uint64_t i = 0; i < kSamples; ++i) all.insert(i);
  EXPECT_EQ(seen, all);
}

TEST_F(LoaderTest, ResumedStreamsReadExactlyTheUnseenSamples) {
  const Sampler sampler = *Sampler::Create(kSamples, {.seed = 1});
  const auto order = sampler.Permutation(2);
  auto scheduler = Scheduler();
  // World 2 reads 7 samples per rank, then "checkpoints".
  for (int rank = 0; rank < 2; ++rank) {
    auto stream = SampleStream::Create(index_, sampler, sampler.State(2, 0),
                                       {.rank = rank, .world_size = 2}, scheduler);
    ASSERT_TRUE(stream.ok());
    auto batch = (*stream)->NextBatch(7);
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_EQ(batch->size(), 7u);
  }
  const std::string checkpoint = sampler.State(2, ConsumedAfter(0, 7, 2)).ToJson();

  // World 3 (2 workers each) resumes.
  auto state = sampler.Restore(checkpoint);
  ASSERT_TRUE(state.ok()) << state.status();
  std::multiset<uint64_t> seen;
  for (int rank = 0; rank < 3; ++rank) {
    for (int worker = 0; worker < 2; ++worker) {
      auto stream = SampleStream::Create(
          index_, sampler, *state,
          {.rank = rank, .world_size = 3, .worker = worker, .num_workers = 2}, scheduler);
      ASSERT_TRUE(stream.ok());
      for (uint64_t i : Drain(**stream)) seen.insert(i);
    }
  }
  // 60 - 14 = 46 left, padded to 48 with the first two of the order.
  std::multiset<uint64_t> expected(order.begin() + 14, order.end());
  expected.insert(order[0]);
  expected.insert(order[1]);
  EXPECT_EQ(seen, expected);
}

TEST_F(LoaderTest, NextBatchIsOneEngineBatchOfItsSamples) {
  const Sampler sampler = *Sampler::Create(kSamples, {.seed = 2});
  auto stream =
      SampleStream::Create(index_, sampler, sampler.State(0, 0), {},
                           Scheduler({.max_in_flight = 64, .ordered = true}), {.prefetch = 0});
  ASSERT_TRUE(stream.ok());
  auto batch = (*stream)->NextBatch(16);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->size(), 16u);
  const FetchStats stats = (*stream)->stats();
  EXPECT_EQ(stats.items, 16u);
  EXPECT_EQ(stats.requests, 16u);
  const auto order = sampler.Permutation(0);
  for (size_t i = 0; i < 16; ++i) {
    EXPECT_EQ((*batch)[i].index, order[i]);
    EXPECT_EQ((*batch)[i].data.view(), Content(static_cast<int>(order[i])));
  }
  // The tail: fewer than asked, then empty.
  auto tail = (*stream)->NextBatch(1000);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(tail->size(), kSamples - 16u);
  auto end = (*stream)->NextBatch(4);
  ASSERT_TRUE(end.ok());
  EXPECT_TRUE(end->empty());
  auto next = (*stream)->Next();
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->has_value());
}

TEST_F(LoaderTest, ReaderGetBatchIsOneEngineBatch) {
  SampleReader reader(index_, Scheduler({.ordered = false}));
  const std::vector<uint64_t> indices = {5, 59, 0, 17, 5, 33, 2, 41};
  FetchStats stats;
  auto batch = reader.GetBatch(indices, &stats);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->size(), indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    EXPECT_EQ((*batch)[i].index, indices[i]);
    EXPECT_EQ((*batch)[i].data.view(), Content(static_cast<int>(indices[i])));
  }
  EXPECT_EQ(stats.items, indices.size());
  // One GET per distinct sample: the repeated one shares its object's request.
  EXPECT_EQ(stats.requests, indices.size() - 1);

  auto one = reader.Get(17);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->data.view(), Content(17));
  EXPECT_EQ(reader.Get(kSamples).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(LoaderTest, ErrorsNameTheSampleAndKey) {
  // An index entry whose object is gone, and one whose object changed size.
  std::vector<SampleEntry> entries = index_->ToEntries();
  entries.push_back({.key = "ds/missing.bin", .size = 10});
  entries[3].size = *entries[3].size + 1;
  auto index = std::make_shared<const SampleIndex>(std::move(entries));
  SampleReader reader(index, Scheduler());

  auto missing = reader.Get(kSamples);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr(absl::StrCat("sample ", kSamples, " (ds/missing.bin)")));

  // The same version (ETag) with another size: the engine refuses the reply's bytes.
  auto changed = reader.Get(3);
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(changed.status().message()), HasSubstr("(ds/1003.bin)"));
  EXPECT_THAT(std::string(changed.status().message()),
              HasSubstr("a wrong size in the listing or index"));

  // In a stream, a failed sample is consumed and the stream goes on.
  const Sampler sampler = *Sampler::Create(index->size(), {.shuffle = false});
  auto stream = SampleStream::Create(index, sampler, sampler.State(0, kSamples - 1), {},
                                     Scheduler(), {.prefetch = 4});
  ASSERT_TRUE(stream.ok());
  auto last_good = (*stream)->Next();
  ASSERT_TRUE(last_good.ok() && last_good->has_value());
  auto bad = (*stream)->Next();
  EXPECT_THAT(bad.status().message(), HasSubstr("ds/missing.bin"));
  auto end = (*stream)->Next();
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
}

TEST_F(LoaderTest, SmallMemoryBudgetStillStreams) {
  // The budget holds about two samples while 32 are requested ahead: the engine holds
  // requests back until the consumer drops samples.
  const Sampler sampler = *Sampler::Create(kSamples, {.seed = 6});
  auto stream = SampleStream::Create(
      index_, sampler, sampler.State(0, 0), {},
      Scheduler({.max_in_flight = 16, .memory_budget = 1200, .ordered = true}), {.prefetch = 32});
  ASSERT_TRUE(stream.ok());
  EXPECT_EQ(Drain(**stream).size(), static_cast<size_t>(kSamples));
  EXPECT_LE((*stream)->stats().peak_bytes_held, 1200u);
}

TEST_F(LoaderTest, StreamsSharingASchedulerSplitTheBudgetWithPrefetchBytes) {
  // Two live streams on one scheduler, consumed alternately. Each one's read-ahead is held
  // under 600 bytes, so the other's next sample (<= 510 bytes) always fits in the budget.
  const Sampler sampler = *Sampler::Create(kSamples, {.seed = 6});
  auto scheduler = Scheduler({.max_in_flight = 16, .memory_budget = 1200, .ordered = true});
  std::vector<std::unique_ptr<SampleStream>> streams;
  for (int rank = 0; rank < 2; ++rank) {
    auto stream =
        SampleStream::Create(index_, sampler, sampler.State(0, 0), {.rank = rank, .world_size = 2},
                             scheduler, {.prefetch = 32, .prefetch_bytes = 600});
    ASSERT_TRUE(stream.ok());
    streams.push_back(*std::move(stream));
  }
  size_t read = 0;
  for (bool more = true; more;) {
    more = false;
    for (auto& stream : streams) {
      auto s = stream->Next();
      ASSERT_TRUE(s.ok()) << s.status();
      if (!s->has_value()) continue;
      EXPECT_EQ((**s).data.view(), Content(static_cast<int>((**s).index)));
      more = true;
      ++read;
      // Give the read-ahead time to land and hold its share of the budget.
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  EXPECT_EQ(read, static_cast<size_t>(kSamples));
}

TEST_F(LoaderTest, StreamRefusesAMismatchedSampler) {
  const Sampler sampler = *Sampler::Create(kSamples + 1);
  auto stream = SampleStream::Create(index_, sampler, sampler.State(0, 0), {}, Scheduler());
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stream.status().message(), HasSubstr("the index has 60"));
}

}  // namespace
}  // namespace wharf
