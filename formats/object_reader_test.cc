#include "formats/object_reader.h"

#include <algorithm>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/timer.h"
#include "store/testing/random_bytes.h"
#include "store/testing/temp_store.h"
#include "gtest/gtest.h"
#include "store/testing/delayed_get_store.h"

namespace wharf {
namespace {

using store_testing::TempStore;

using store_testing::RandomBytes;

// Wraps a store: delays every GET (as a network would) and records the peak in flight.
class SlowStore : public store_testing::DelayedGetStore {
 public:
  using DelayedGetStore::DelayedGetStore;
  // The blocking Head must not go through the (default) async wrapper of this class only.
  absl::StatusOr<ObjectMeta> Head(const std::string& key) override { return inner().Head(key); }
};

std::string ReadAllByPeek(ObjectReader& reader) {
  std::string out;
  while (true) {
    auto view = reader.Peek();
    EXPECT_TRUE(view.ok()) << view.status();
    if (!view.ok() || view->empty()) break;
    out.append(view->data(), view->size());
    reader.Consume(view->size());
  }
  return out;
}

TEST(ObjectReaderTest, ReadsEveryByteInOrderForManyChunkSizes) {
  TempStore tmp;
  const std::string data = RandomBytes(30'011, 1);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  for (uint64_t chunk : {1ul, 7ul, 512ul, 4096ul, 30'011ul, 1ul << 20}) {
    for (int read_ahead : {0, 1, 4}) {
      if (chunk == 1 && read_ahead < 4) continue;  // 30k GETs each: slow, and nothing new
      ObjectReaderOptions options{.chunk_size = chunk, .read_ahead = read_ahead};
      auto reader = ObjectReader::Open(tmp.store(), "obj", options);
      ASSERT_TRUE(reader.ok()) << reader.status();
      EXPECT_EQ(ReadAllByPeek(**reader), data) << chunk << " " << read_ahead;
      const ObjectReaderStats stats = (*reader)->stats();
      EXPECT_EQ(stats.requests, (data.size() + chunk - 1) / chunk);
      EXPECT_EQ(stats.bytes_fetched, data.size());
      EXPECT_LE(stats.peak_buffered_bytes, (read_ahead + 1) * chunk);
      EXPECT_EQ((*reader)->remaining(), 0u);
    }
  }
}

TEST(ObjectReaderTest, KeepsReadAheadChunksInFlightUnderTheByteBound) {
  TempStore tmp;
  const std::string data = RandomBytes(64 << 10, 2);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  auto slow = std::make_shared<SlowStore>(tmp.store(), absl::Milliseconds(5));
  {
    auto reader = ObjectReader::Open(slow, "obj", {.chunk_size = 1024, .read_ahead = 4});
    ASSERT_TRUE(reader.ok());
    EXPECT_EQ(ReadAllByPeek(**reader), data);
    EXPECT_EQ(slow->peak_in_flight(), 5);  // the chunk waited for + 4 ahead
    EXPECT_LE((*reader)->stats().peak_buffered_bytes, 5 * 1024u);
  }
  {
    // A byte bound below read_ahead's: 2.5 chunks -> at most 2 held at once.
    auto slow2 = std::make_shared<SlowStore>(tmp.store(), absl::Milliseconds(2));
    auto reader = ObjectReader::Open(
        slow2, "obj", {.chunk_size = 1024, .read_ahead = 8, .max_buffered_bytes = 2560});
    ASSERT_TRUE(reader.ok());
    EXPECT_EQ(ReadAllByPeek(**reader), data);
    EXPECT_EQ(slow2->peak_in_flight(), 2);
    EXPECT_LE((*reader)->stats().peak_buffered_bytes, 2560u);
  }
}

TEST(ObjectReaderTest, ReadCordSharesLargePiecesAndCopiesSmallOnes) {
  TempStore tmp;
  const std::string data = RandomBytes(10'000, 3);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  auto reader = ObjectReader::Open(tmp.store(), "obj", {.chunk_size = 1000});
  ASSERT_TRUE(reader.ok());
  auto small = (*reader)->ReadCord(10);  // 10 of 1000 bytes: copied
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(std::string(*small), data.substr(0, 10));
  EXPECT_EQ((*reader)->stats().bytes_copied, 10u);
  auto big = (*reader)->ReadCord(5000);  // 990 + 4 x 1000 + 10: only the last 10 copied
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(std::string(*big), data.substr(10, 5000));
  EXPECT_EQ((*reader)->stats().bytes_copied, 20u);
  std::string exact(100, '\0');
  ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(exact)).ok());
  EXPECT_EQ(exact, data.substr(5010, 100));
  auto too_much = (*reader)->ReadCord(10'000);
  EXPECT_EQ(too_much.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(absl::StrContains(too_much.status().message(), tmp.store()->Uri("obj")));
  EXPECT_EQ((*reader)->position(), 5110u);  // a refused read consumes nothing
}

TEST(ObjectReaderTest, SkipDoesNotFetchSkippedChunks) {
  TempStore tmp;
  const std::string data = RandomBytes(100'000, 4);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  auto reader = ObjectReader::Open(tmp.store(), "obj", {.chunk_size = 1000, .read_ahead = 1});
  ASSERT_TRUE(reader.ok());
  std::string head(10, '\0');
  ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(head)).ok());
  ASSERT_TRUE((*reader)->Skip(90'000).ok());  // lands in the middle of a chunk
  EXPECT_EQ((*reader)->position(), 90'010u);
  EXPECT_EQ(ReadAllByPeek(**reader), data.substr(90'010));
  EXPECT_LE((*reader)->stats().requests, 2u + 10u);
  EXPECT_EQ((*reader)->Skip(1).code(), absl::StatusCode::kOutOfRange);
}

TEST(ObjectReaderTest, ReadsARangeAndKnownMetaSkipsTheHead) {
  TempStore tmp;
  const std::string data = RandomBytes(5000, 5);
  auto meta = tmp.store()->Put("obj", absl::Cord(data));
  ASSERT_TRUE(meta.ok());
  auto reader = ObjectReader::Open(tmp.store(), *meta,
                                   {.chunk_size = 300, .offset = 1234, .length = 2000});
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(ReadAllByPeek(**reader), data.substr(1234, 2000));
  auto tail = ObjectReader::Open(tmp.store(), "obj", {.chunk_size = 300, .offset = 4900,
                                                      .length = 1000});
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(ReadAllByPeek(**tail), data.substr(4900));
  auto past = ObjectReader::Open(tmp.store(), "obj", {.offset = 5001});
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange);
}

TEST(ObjectReaderTest, EmptyAndMissingObjects) {
  TempStore tmp;
  ASSERT_TRUE(tmp.store()->Put("empty", absl::Cord()).ok());
  auto reader = ObjectReader::Open(tmp.store(), "empty");
  ASSERT_TRUE(reader.ok());
  auto view = (*reader)->Peek();
  ASSERT_TRUE(view.ok());
  EXPECT_TRUE(view->empty());
  EXPECT_EQ((*reader)->stats().requests, 0u);
  auto missing = ObjectReader::Open(tmp.store(), "nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), tmp.store()->Uri("nope")))
      << missing.status();
}

TEST(ObjectReaderTest, AnObjectRewrittenWhileReadIsAnErrorNotAMix) {
  TempStore tmp;
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(RandomBytes(4000, 6))).ok());
  auto reader = ObjectReader::Open(tmp.store(), "obj", {.chunk_size = 1000, .read_ahead = 0});
  ASSERT_TRUE(reader.ok());
  std::string first(1000, '\0');
  ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(first)).ok());
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(RandomBytes(4000, 7))).ok());
  absl::Status status;
  while (status.ok() && (*reader)->remaining() > 0) {
    status = (*reader)->Skip(std::min<uint64_t>(1, (*reader)->remaining()));
    if (status.ok()) status = (*reader)->Peek().status();
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), tmp.store()->Uri("obj"))) << status;
  // Sticky.
  EXPECT_EQ((*reader)->Peek().status(), status);
}

TEST(ObjectReaderTest, DestroyingAReaderWithRequestsInFlightIsSafe) {
  TempStore tmp;
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(RandomBytes(64 << 10, 8))).ok());
  auto slow = std::make_shared<SlowStore>(tmp.store(), absl::Milliseconds(20));
  for (int i = 0; i < 3; ++i) {
    auto reader = ObjectReader::Open(slow, "obj", {.chunk_size = 4096, .read_ahead = 6});
    ASSERT_TRUE(reader.ok());
    if (i > 0) {
      ASSERT_TRUE((*reader)->Skip(5000).ok());
    }
    reader->reset();
    EXPECT_EQ(slow->in_flight(), 0);
  }
}

}  // namespace
}  // namespace wharf
