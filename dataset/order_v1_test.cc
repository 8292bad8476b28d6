// Resume states saved before order versions continue exactly. The states and what follows
// them are committed data (tests/data/order_v1/*.json), emitted by the code before this
// change and cross-checked by a pure-Python model of it (generate.py there); the record
// states read the committed shards in tests/data/order_v1/shards, placed where they were
// taken (/tmp/wharf-order-v1/shards: a local store's keys, hence the shard list's
// fingerprint in a state, include the path).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/runtime.h"
#include "dataset/index.h"
#include "dataset/order.h"
#include "dataset/records.h"
#include "dataset/sampler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "store/local/local_store.h"

namespace wharf {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

Json Load(const std::string& name) {
  std::ifstream in(std::string(WHARF_ORDER_V1_DATA) + "/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}

TEST(OrderV1SamplerTest, SavedStatesContinueExactly) {
  const Json cases = Load("sampler.json");
  ASSERT_GE(cases.size(), 8u);
  for (const Json& c : cases) {
    const std::string json = c["state"].get<std::string>();
    SCOPED_TRACE(json);
    auto state = SamplerState::FromJson(json);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(state->order, kOrderFisherYates);  // no "order" field: version 1
    EXPECT_EQ(state->consumed, c["consumed"].get<uint64_t>());
    const SamplerOptions options{.seed = c["seed"].get<uint64_t>(),
                                 .shuffle = c["shuffle"].get<bool>(),
                                 .drop_last = c["drop_last"].get<bool>(),
                                 .order = state->order};
    auto sampler = Sampler::Create(c["num_samples"].get<uint64_t>(), options);
    ASSERT_TRUE(sampler.ok()) << sampler.status();
    auto restored = sampler->Restore(json);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(sampler->Permutation(state->epoch), c["permutation"].get<std::vector<uint64_t>>());
    for (const Json& resume : c["resume"]) {
      for (const Json& share : resume["shares"]) {
        const Partition partition{.rank = share["rank"].get<int>(),
                                  .world_size = resume["world_size"].get<int>(),
                                  .worker = share["worker"].get<int>(),
                                  .num_workers = resume["num_workers"].get<int>(),
                                  .worker_block = resume["worker_block"].get<uint64_t>()};
        auto shard = sampler->ShardOf(*restored, partition);
        ASSERT_TRUE(shard.ok()) << shard.status();
        EXPECT_EQ(shard->Samples(), share["samples"].get<std::vector<uint64_t>>())
            << "rank " << partition.rank << "/" << partition.world_size << " worker "
            << partition.worker << "/" << partition.num_workers;
      }
    }
    // Re-saved, the state says which order it is in; loaded again, it is the same.
    const std::string again = restored->ToJson();
    EXPECT_THAT(again, HasSubstr("\"version\":2,\"order\":1,"));
    EXPECT_EQ(*SamplerState::FromJson(again), *restored);
    // A sampler of the current order does not silently continue it in another order.
    SamplerOptions current = options;
    current.order = kCurrentOrder;
    auto other = Sampler::Create(c["num_samples"].get<uint64_t>(), current)->Restore(json);
    EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(other.status().message(), HasSubstr("order version 1"));
  }
}

constexpr char kShardsAt[] = "/tmp/wharf-order-v1/shards";

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class OrderV1RecordsTest : public testing::Test {
 protected:
  void SetUp() override {
    // The committed shards, copied to where the states were taken; each file replaced
    // atomically, so concurrent runs (which write the same bytes) never see a partial one.
    namespace fs = std::filesystem;
    fs::create_directories(kShardsAt);
    const std::string from = std::string(WHARF_ORDER_V1_DATA) + "/shards";
    for (const auto& entry : fs::directory_iterator(from)) {
      const std::string data = ReadFile(entry.path());
      const fs::path to = fs::path(kShardsAt) / entry.path().filename();
      if (fs::exists(to) && ReadFile(to) == data) continue;
      const fs::path tmp = absl::StrCat(to.string(), ".", getpid(), ".tmp");
      std::ofstream(tmp, std::ios::binary) << data;
      fs::rename(tmp, to);
    }
    auto store = LocalStore::Open("/", Runtime::Default());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::shared_ptr<ObjectStore>(*std::move(store));
  }

  // The shard list of `keys` (relative to kShardsAt), as the states' index had it.
  static std::shared_ptr<const SampleIndex> Index(const std::vector<std::string>& keys) {
    std::vector<std::string> full;
    for (const std::string& k : keys) full.push_back(absl::StrCat(kShardsAt + 1, "/", k));
    return std::make_shared<const SampleIndex>(SampleIndex::FromKeys(std::move(full)));
  }

  std::shared_ptr<ObjectStore> store_;
};

RecordStreamOptions OptionsOf(const Json& c, uint64_t order) {
  RecordStreamOptions o;
  o.format = "jsonl";
  o.seed = c["seed"].get<uint64_t>();
  o.epoch = c["epoch"].get<uint64_t>();
  o.shuffle = c["shuffle"].get<bool>();
  o.shuffle_buffer = c["shuffle_buffer"].get<size_t>();
  o.rank = c["rank"].get<int>();
  o.world_size = c["world_size"].get<int>();
  o.worker = c["worker"].get<int>();
  o.num_workers = c["num_workers"].get<int>();
  o.order = order;
  return o;
}

TEST_F(OrderV1RecordsTest, SavedStatesContinueExactly) {
  const Json cases = Load("records.json");
  ASSERT_GE(cases.size(), 6u);
  for (const Json& c : cases) {
    const std::string json = c["state"].get<std::string>();
    SCOPED_TRACE(json);
    const std::vector<std::string> keys = c["shards"].get<std::vector<std::string>>();
    auto shards = Index(keys);
    auto state = RecordStreamState::FromJson(json);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(state->order, kOrderFisherYates);

    auto stream = RecordStream::Create(store_, shards, OptionsOf(c, state->order), &*state);
    ASSERT_TRUE(stream.ok()) << stream.status();
    std::vector<std::string> assigned;
    for (size_t s : (*stream)->assigned()) assigned.push_back(keys[s]);
    EXPECT_EQ(assigned, c["assigned"].get<std::vector<std::string>>());
    std::vector<Json> after;
    while (true) {
      auto r = (*stream)->Next();
      ASSERT_TRUE(r.ok()) << r.status();
      if (!r->has_value()) break;
      after.push_back(
          Json::array({keys[(*r)->shard], (*r)->offset, std::string(*(*r)->Find("data"))}));
    }
    EXPECT_EQ(Json(after), c["after"]);

    // From the start of the epoch, order 1 gives the records before the state, then these.
    auto whole = RecordStream::Create(store_, shards, OptionsOf(c, kOrderFisherYates));
    ASSERT_TRUE(whole.ok()) << whole.status();
    std::vector<Json> all;
    while (true) {
      auto r = (*whole)->Next();
      ASSERT_TRUE(r.ok()) << r.status();
      if (!r->has_value()) break;
      all.push_back(Json::array({keys[(*r)->shard], (*r)->offset}));
    }
    std::vector<Json> expected = c["before"].get<std::vector<Json>>();
    for (const Json& a : c["after"]) expected.push_back(Json::array({a[0], a[1]}));
    EXPECT_EQ(Json(all), Json(expected));

    // The current order refuses it, naming the difference.
    auto refused = RecordStream::Create(store_, shards, OptionsOf(c, kCurrentOrder), &*state);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.status().message(), HasSubstr("order version 1 in the state, 2 here"));
  }
}

// States of the current layout: the order version round-trips, order 2 resumes exactly too,
// and an unknown order version is refused when parsed.
TEST_F(OrderV1RecordsTest, CurrentStatesCarryTheirOrder) {
  const Json c = Load("records.json")[1];  // a shuffle buffer, two ranks
  const std::vector<std::string> keys = c["shards"].get<std::vector<std::string>>();
  auto shards = Index(keys);
  auto first = RecordStream::Create(store_, shards, OptionsOf(c, kCurrentOrder));
  ASSERT_TRUE(first.ok()) << first.status();
  for (int i = 0; i < 5; ++i) {
    auto r = (*first)->Next();
    ASSERT_TRUE(r.ok() && r->has_value());
  }
  const RecordStreamState state = (*first)->State();
  EXPECT_EQ(state.order, kOrderCounterBased);
  const std::string json = state.ToJson();
  EXPECT_THAT(json, HasSubstr("{\"version\":2,\"order\":2,"));
  auto parsed = RecordStreamState::FromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->ToJson(), json);
  auto resumed = RecordStream::Create(store_, shards, OptionsOf(c, kCurrentOrder), &*parsed);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  while (true) {
    auto a = (*first)->Next();
    auto b = (*resumed)->Next();
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->has_value(), b->has_value());
    if (!a->has_value()) break;
    EXPECT_EQ((*a)->shard, (*b)->shard);
    EXPECT_EQ((*a)->offset, (*b)->offset);
  }

  std::string unknown = json;
  unknown.replace(unknown.find("\"order\":2"), 9, "\"order\":7");
  auto bad = RecordStreamState::FromJson(unknown);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("order version 7 is not supported (this build computes order versions "
                        "1 and 2)"));
  std::string no_order = json;
  no_order.erase(no_order.find("\"order\":2,"), 10);
  EXPECT_THAT(RecordStreamState::FromJson(no_order).status().message(),
              HasSubstr("missing \"order\""));
  RecordStreamOptions o = OptionsOf(c, 5);
  EXPECT_EQ(RecordStream::Create(store_, shards, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace wharf
