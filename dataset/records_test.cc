// RecordStream over shards of every format of the registry (a test-only format included, which
// dataset/ knows nothing about) on file://: partitions cover every record once, and a stream
// restored from State() after any number of records, with and without a shuffle buffer,
// yields exactly the rest.
#include "dataset/records.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "formats/registry.h"
#include "formats/testing/record_objects.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/testing/delayed_get_store.h"
#include "store/testing/temp_store.h"

namespace wharf {
namespace {

using store_testing::TempStore;

using ::testing::HasSubstr;

constexpr int kShards = 8;

// Records per shard vary (3..10) so that shares differ in length.
int RecordsIn(int shard) { return 3 + (shard * 5) % 8; }

std::string Payload(int shard, int i) {
  return absl::StrCat("s", shard, "r", i, "-", std::string((shard * 31 + i * 17) % 700, 'x'));
}

std::vector<std::string> Payloads(int shard) {
  std::vector<std::string> out;
  for (int i = 0; i < RecordsIn(shard); ++i) out.push_back(Payload(shard, i));
  return out;
}

// One record as a comparable string: where it came from and what it holds.
std::string Describe(const Record& r) {
  std::string out = absl::StrCat(r.shard, "@", r.offset, ":", r.key, ":");
  for (const auto& [name, bytes] : r.fields) {
    absl::StrAppend(&out, name, "=", std::string(bytes), ";");
  }
  return out;
}

struct FormatCase {
  std::string format;
  bool header;
};

// Every format of the registry (row formats with and without a header row), the test-only
// one included: a format added to formats/ is tested here without a change to this file.
std::vector<FormatCase> AllFormats(bool header_only = false) {
  EXPECT_TRUE(formats_testing::RegisterTestFormat().ok());
  std::vector<FormatCase> out;
  for (const RecordFormatSpec* spec : RecordFormats()) {
    if (!header_only) out.push_back({spec->name, false});
    if (spec->rows) out.push_back({spec->name, true});
  }
  return out;
}

std::string CaseName(const testing::TestParamInfo<FormatCase>& info) {
  std::string name = info.param.format + (info.param.header ? "_header" : "");
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

class RecordStreamTest : public testing::TestWithParam<FormatCase> {
 protected:
  void SetUp() override {
    const FormatCase c = GetParam();
    ASSERT_TRUE(formats_testing::RegisterTestFormat().ok());
    auto spec = FindRecordFormat(c.format);
    ASSERT_TRUE(spec.ok()) << spec.status();
    const std::string suffix = (*spec)->suffixes.empty() ? "" : (*spec)->suffixes.front();
    std::vector<std::string> keys;
    for (int s = 0; s < kShards; ++s) {
      const std::string key = absl::StrCat("shards/", 100 + s, suffix);
      keys.push_back(key);
      auto object = formats_testing::EncodeRecords(c.format, Payloads(s), c.header);
      ASSERT_TRUE(object.ok()) << object.status();
      ASSERT_TRUE(temp_.store()->Put(key, *object).ok());
    }
    shards_ = std::make_shared<const SampleIndex>(SampleIndex::FromKeys(keys));
  }

  RecordStreamOptions Options(int rank, int world, int worker, int workers, size_t buffer) {
    RecordStreamOptions o;
    o.format = GetParam().format;
    o.header = GetParam().header;
    o.seed = 7;
    o.epoch = 3;
    o.shuffle_buffer = buffer;
    o.rank = rank;
    o.world_size = world;
    o.worker = worker;
    o.num_workers = workers;
    o.io.chunk_size = 1000;  // many chunks per shard: records straddle chunk boundaries
    return o;
  }

  std::unique_ptr<RecordStream> Open(const RecordStreamOptions& o,
                                     const RecordStreamState* resume = nullptr) {
    auto s = RecordStream::Create(temp_.store(), shards_, o, resume);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  // Up to n records (all when n < 0), by Next() or by NextBatch(batch).
  static std::vector<std::string> Read(RecordStream& s, int n, size_t batch = 0) {
    std::vector<std::string> out;
    while (n < 0 || static_cast<int>(out.size()) < n) {
      if (batch > 0) {
        size_t want = batch;
        if (n >= 0) want = std::min(want, static_cast<size_t>(n) - out.size());
        auto got = s.NextBatch(want);
        EXPECT_TRUE(got.ok()) << got.status();
        if (!got.ok() || got->empty()) break;
        for (const Record& r : *got) out.push_back(Describe(r));
        continue;
      }
      auto r = s.Next();
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok() || !r->has_value()) break;
      out.push_back(Describe(**r));
    }
    return out;
  }

  TempStore temp_;
  std::shared_ptr<const SampleIndex> shards_;
};

TEST_P(RecordStreamTest, SharesCoverEveryRecordOnce) {
  int total = 0;
  for (int s = 0; s < kShards; ++s) total += RecordsIn(s);
  for (size_t buffer : {size_t{0}, size_t{5}}) {
    std::map<std::string, int> seen;
    for (int rank = 0; rank < 2; ++rank) {
      for (int worker = 0; worker < 2; ++worker) {
        auto s = Open(Options(rank, 2, worker, 2, buffer));
        ASSERT_NE(s, nullptr);
        for (const std::string& r : Read(*s, -1)) ++seen[r];
        EXPECT_EQ(s->State().shards_done, s->assigned().size());
      }
    }
    EXPECT_EQ(static_cast<int>(seen.size()), total) << "buffer " << buffer;
    for (const auto& [r, n] : seen) EXPECT_EQ(n, 1) << r;
  }
}

// The heart of resume: stop after k records, save, restore in a new stream, read the rest.
TEST_P(RecordStreamTest, ResumeAfterAnyRecordYieldsExactlyTheRest) {
  for (size_t buffer : {size_t{0}, size_t{5}}) {
    for (size_t batch : {size_t{0}, size_t{4}}) {
      const RecordStreamOptions o = Options(1, 2, 0, 2, buffer);
      auto full_stream = Open(o);
      ASSERT_NE(full_stream, nullptr);
      const std::vector<std::string> full = Read(*full_stream, -1, batch);
      ASSERT_GT(full.size(), 6u);
      for (size_t k = 0; k <= full.size(); ++k) {
        SCOPED_TRACE(absl::StrCat("buffer ", buffer, " batch ", batch, " stop after ", k));
        auto first = Open(o);
        ASSERT_NE(first, nullptr);
        std::vector<std::string> got = Read(*first, static_cast<int>(k), batch);
        ASSERT_EQ(got.size(), k);
        // Through JSON, as a checkpoint would carry it.
        auto state = RecordStreamState::FromJson(first->State().ToJson());
        ASSERT_TRUE(state.ok()) << state.status();
        EXPECT_EQ(state->yielded, k);
        first.reset();
        auto second = Open(o, &*state);
        ASSERT_NE(second, nullptr);
        for (std::string& r : Read(*second, -1, batch)) got.push_back(std::move(r));
        EXPECT_EQ(got, full);
        EXPECT_EQ(second->yielded(), full.size());
      }
    }
  }
}

// Resume with a shuffle buffer over compressed shards: the buffered records of a shard are
// read in one pass over it (a reader per record would inflate the shard once per record),
// and the rest of the epoch is exactly what an uninterrupted stream yields.
TEST(RecordStreamCompressedTest, ResumeReadsABufferedShardOnceAndYieldsExactlyTheRest) {
  for (const std::string format : {"tar", "tfrecord"}) {
    SCOPED_TRACE(format);
    TempStore temp;
    std::vector<std::string> keys;
    uint64_t state = 12345;
    for (int s = 0; s < 2; ++s) {
      std::vector<std::string> payloads;
      for (int i = 0; i < 40; ++i) {
        std::string p(600, '\0');
        for (char& c : p) {  // incompressible, so the shard spans many chunks
          state = state * 6364136223846793005ULL + 1442695040888963407ULL;
          c = static_cast<char>('a' + (state >> 59));
        }
        payloads.push_back(absl::StrCat("s", s, "r", i, "-", p));
      }
      auto object = formats_testing::EncodeRecords(format, payloads);
      ASSERT_TRUE(object.ok()) << object.status();
      const std::string key = absl::StrCat("gz/", s, format == "tar" ? ".tar.gz" : ".tfrecord.gz");
      ASSERT_TRUE(temp.store()
                      ->Put(key, absl::Cord(formats_testing::Deflate(
                                     std::string(*object), formats_testing::Deflated::kGzip)))
                      .ok());
      keys.push_back(key);
    }
    auto shards = std::make_shared<const SampleIndex>(SampleIndex::FromKeys(keys));
    auto counted =
        std::make_shared<store_testing::DelayedGetStore>(temp.store(), absl::ZeroDuration());
    RecordStreamOptions o;
    o.format = format;
    o.seed = 3;
    o.shuffle_buffer = 16;
    o.io.chunk_size = 1000;
    o.io.read_ahead = 0;
    auto open = [&](const RecordStreamState* resume) {
      auto s = RecordStream::Create(counted, shards, o, resume);
      EXPECT_TRUE(s.ok()) << s.status();
      return s.ok() ? *std::move(s) : nullptr;
    };
    std::vector<std::string> full;
    {
      auto s = open(nullptr);
      ASSERT_NE(s, nullptr);
      while (true) {
        auto r = s->Next();
        ASSERT_TRUE(r.ok()) << r.status();
        if (!r->has_value()) break;
        full.push_back(Describe(**r));
      }
    }
    ASSERT_EQ(full.size(), 80u);
    const int pass = counted->gets() / 2;  // GETs of one pass over one shard, about
    for (size_t k : {size_t{10}, size_t{30}, size_t{55}}) {
      SCOPED_TRACE(absl::StrCat("stop after ", k));
      auto first = open(nullptr);
      ASSERT_NE(first, nullptr);
      std::vector<std::string> got;
      for (size_t i = 0; i < k; ++i) got.push_back(Describe(**first->Next()));
      auto saved = RecordStreamState::FromJson(first->State().ToJson());
      ASSERT_TRUE(saved.ok()) << saved.status();
      ASSERT_GE(saved->buffered.size(), 8u);
      first.reset();
      const int before = counted->gets();
      auto second = open(&*saved);
      ASSERT_NE(second, nullptr);
      // The buffered records (of up to two shards) in one pass each, plus the current shard
      // reopened at its offset: about three passes, not one per buffered record.
      EXPECT_LE(counted->gets() - before, 3 * pass + 6);
      while (true) {
        auto r = second->Next();
        ASSERT_TRUE(r.ok()) << r.status();
        if (!r->has_value()) break;
        got.push_back(Describe(**r));
      }
      EXPECT_EQ(got, full);
    }
  }
}

class RecordHeaderTest : public RecordStreamTest {};

TEST_P(RecordHeaderTest, HeaderSurvivesAResumeMidShard) {
  const RecordStreamOptions o = Options(0, 1, 0, 1, 0);
  auto first = Open(o);
  ASSERT_NE(first, nullptr);
  Read(*first, 2);
  const RecordStreamState state = first->State();
  ASSERT_TRUE(state.last_offset.has_value());
  ASSERT_GT(*state.last_offset, 0u);
  auto second = Open(o, &state);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->header(), std::optional<std::string>("name,value"));
}

INSTANTIATE_TEST_SUITE_P(Formats, RecordStreamTest, testing::ValuesIn(AllFormats()), CaseName);

INSTANTIATE_TEST_SUITE_P(RowFormats, RecordHeaderTest,
                         testing::ValuesIn(AllFormats(/*header_only=*/true)), CaseName);

class RecordStreamStateTest : public RecordStreamTest {};

TEST_P(RecordStreamStateTest, AStateForAnotherShareIsRefusedNamingTheDifference) {
  auto first = Open(Options(0, 2, 0, 1, 3));
  ASSERT_NE(first, nullptr);
  Read(*first, 2);
  const RecordStreamState state = first->State();
  RecordStreamOptions other = Options(0, 2, 0, 1, 3);
  other.epoch = 4;
  auto s = RecordStream::Create(temp_.store(), shards_, other, &state);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("epoch 3 in the state, 4 here"));
  s = RecordStream::Create(temp_.store(), shards_, Options(1, 2, 0, 1, 3), &state);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("rank 0 in the state, 1 here"));
}

TEST_P(RecordStreamStateTest, AShardRewrittenSinceTheCheckpointIsAnError) {
  const RecordStreamOptions o = Options(0, 1, 0, 1, 0);
  auto first = Open(o);
  ASSERT_NE(first, nullptr);
  Read(*first, 2);
  const RecordStreamState state = first->State();
  ASSERT_TRUE(state.last_offset.has_value());
  const std::string key = (*shards_)[first->assigned()[state.shards_done]].key;
  first.reset();
  ASSERT_TRUE(temp_.store()->Put(key, absl::Cord(std::string(3000, '\0'))).ok());
  auto s = RecordStream::Create(temp_.store(), shards_, o, &state);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr(key));
}

// Rewritten with the same layout (same sizes, same record boundaries), so only the ETag in
// the state can tell.
TEST_P(RecordStreamStateTest, AShardRewrittenWithTheSameLayoutIsRefusedByItsETag) {
  for (size_t buffer : {size_t{0}, size_t{4}}) {
    const RecordStreamOptions o = Options(0, 1, 0, 1, buffer);
    auto first = Open(o);
    ASSERT_NE(first, nullptr);
    Read(*first, 6);
    const RecordStreamState state = first->State();
    ASSERT_FALSE(state.etags.empty());
    const size_t shard = state.etags.front().first;
    const std::string key = (*shards_)[shard].key;
    first.reset();
    auto data = temp_.store()->Read(key);
    ASSERT_TRUE(data.ok()) << data.status();
    const std::string original = *data;
    std::vector<std::string> payloads = Payloads(static_cast<int>(shard));
    for (std::string& payload : payloads) payload[1] = 'X';  // same length, other bytes
    auto out = formats_testing::EncodeRecords(GetParam().format, payloads, GetParam().header);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), original.size());
    ASSERT_NE(std::string(*out), original);
    ASSERT_TRUE(temp_.store()->Put(key, *out).ok());
    auto s = RecordStream::Create(temp_.store(), shards_, o, &state);
    ASSERT_FALSE(s.ok()) << "buffer " << buffer;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.status().message(), HasSubstr("changed since the checkpoint"));
    EXPECT_THAT(s.status().message(), HasSubstr(key));
    ASSERT_TRUE(temp_.store()->Put(key, absl::Cord(original)).ok());
  }
}

// An error in the middle of a batch: the records taken before it come back, the error with
// the next call, and the state still counts exactly what was returned.
TEST_P(RecordStreamStateTest, ABatchStoppedByAnErrorReturnsWhatItTook) {
  RecordStreamOptions o = Options(0, 1, 0, 1, 0);
  o.shuffle = false;
  auto probe = Open(o);
  ASSERT_NE(probe, nullptr);
  const std::string second = (*shards_)[probe->assigned()[1]].key;
  probe.reset();
  ASSERT_TRUE(temp_.store()->Delete(second).ok());
  auto s = Open(o);
  ASSERT_NE(s, nullptr);
  auto batch = s->NextBatch(1000);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->size(), static_cast<size_t>(RecordsIn(0)));  // all of the first shard
  EXPECT_EQ(s->State().yielded, batch->size());
  auto next = s->NextBatch(1000);
  ASSERT_FALSE(next.ok());
  EXPECT_THAT(next.status().message(), HasSubstr(second));
}

TEST_P(RecordStreamStateTest, MalformedStatesAreInvalidArgument) {
  for (const char* json :
       {"", "[]", "{\"version\":1}", "{\"version\":2}",
        R"({"version":1,"format":"zip","num_shards":1,"fingerprint":"","seed":0,"epoch":0,
            "shuffle":true,"shuffle_buffer":0,"rank":0,"world_size":1,"worker":0,
            "num_workers":1,"yielded":0,"shards_done":0,"last_offset":null,"buffered":[],
            "rng":"0","etags":[]})"}) {
    auto s = RecordStreamState::FromJson(json);
    ASSERT_FALSE(s.ok()) << json;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.status().message(), HasSubstr("record stream state"));
  }
  auto first = Open(Options(0, 1, 0, 1, 4));
  ASSERT_NE(first, nullptr);
  Read(*first, 6);
  const RecordStreamState state = first->State();
  EXPECT_EQ(state.buffered.size(), 4u);
  auto back = RecordStreamState::FromJson(state.ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), state.ToJson());
}

INSTANTIATE_TEST_SUITE_P(Formats, RecordStreamStateTest, testing::ValuesIn(AllFormats()), CaseName);

// memory_budget caps what the stream's readers hold at once (the current shard's, the next
// one's read ahead, and the group of reads that restores a shuffle buffer) inside the
// runtime's budget; without it the same stream holds more. The budget's peak also counts
// record bytes the shuffle buffer keeps when they share a chunk (records of at least half a
// chunk are not copied), which the cap leaves out: at most the 2 chunks of 4 KiB each
// restored 4000-byte record spans.
TEST(RecordStreamBudgetTest, MemoryBudgetCapsWhatTheReadersHold) {
  constexpr uint64_t kCap = 64 << 10;
  TempStore temp;
  std::vector<std::string> keys;
  for (int s = 0; s < 4; ++s) {
    std::vector<std::string> payloads;
    for (int i = 0; i < 40; ++i) payloads.push_back(std::string(4000 + s * 10 + i, 'a' + s));
    auto object = formats_testing::EncodeRecords("tfrecord", payloads);
    ASSERT_TRUE(object.ok()) << object.status();
    keys.push_back(absl::StrCat("big/", s, ".tfrecord"));
    ASSERT_TRUE(temp.store()->Put(keys.back(), *object).ok());
  }
  auto shards = std::make_shared<const SampleIndex>(SampleIndex::FromKeys(keys));
  // Reads everything (stopping after `stop` records to resume there, when given) and returns
  // the budget's peak and the records read.
  auto run = [&](uint64_t cap, std::optional<size_t> stop, size_t buffer) {
    auto runtime = std::make_shared<Runtime>(RuntimeOptions{.memory_budget = 64 << 20});
    RecordStreamOptions o;
    o.format = "tfrecord";
    o.seed = 1;
    o.shuffle_buffer = buffer;
    o.memory_budget = cap;
    o.io.runtime = runtime;
    size_t read = 0;
    auto drain = [&](RecordStream& s, std::optional<size_t> n) {
      while (!n || read < *n) {
        auto r = s.Next();
        EXPECT_TRUE(r.ok()) << r.status();
        if (!r.ok() || !r->has_value()) break;
        ++read;
      }
    };
    auto first = RecordStream::Create(temp.store(), shards, o);
    EXPECT_TRUE(first.ok()) << first.status();
    if (!first.ok()) return std::pair<uint64_t, size_t>{0, 0};
    drain(**first, stop);
    if (stop) {
      const RecordStreamState state = (*first)->State();
      first->reset();
      auto second = RecordStream::Create(temp.store(), shards, o, &state);
      EXPECT_TRUE(second.ok()) << second.status();
      if (second.ok()) drain(**second, std::nullopt);
    }
    return std::pair<uint64_t, size_t>{runtime->budget().peak(), read};
  };
  const auto [uncapped_peak, all] = run(0, std::nullopt, 8);
  EXPECT_EQ(all, 160u);
  EXPECT_GT(uncapped_peak, kCap);  // the cap below is what keeps the peak under it
  const auto [capped_peak, capped_all] = run(kCap, std::nullopt, 8);
  EXPECT_EQ(capped_all, 160u);
  EXPECT_GT(capped_peak, 0u);
  EXPECT_LE(capped_peak, kCap);
  const auto [resumed_peak, resumed_all] = run(kCap, 50, 0);
  EXPECT_EQ(resumed_all, 160u);
  EXPECT_LE(resumed_peak, kCap);
  // 40 records buffered: restored in groups whose chunks fit the cap.
  const auto [restored_peak, restored_all] = run(kCap, 90, 40);
  EXPECT_EQ(restored_all, 160u);
  EXPECT_LE(restored_peak, kCap + 40 * 2 * (4 << 10));
}

TEST(RecordStreamFormatTest, AnUnknownFormatIsRefusedListingTheKnownOnes) {
  TempStore temp;
  RecordStreamOptions o;
  o.format = "zip";
  auto s = RecordStream::Create(
      temp.store(), std::make_shared<const SampleIndex>(SampleIndex::FromKeys({"a.zip"})), o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("record format \"zip\": expected \"tar\""));
  for (const RecordFormatSpec* spec : RecordFormats()) {
    EXPECT_THAT(s.status().message(), HasSubstr(absl::StrCat("\"", spec->name, "\"")));
  }
}

}  // namespace
}  // namespace wharf
