#include "io/object_reader.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/runtime.h"
#include "base/timer.h"
#include "gtest/gtest.h"
#include "store/forwarding_store.h"
#include "store/testing/delayed_get_store.h"
#include "store/testing/random_bytes.h"
#include "store/testing/temp_store.h"

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
  auto reader =
      ObjectReader::Open(tmp.store(), *meta, {.chunk_size = 300, .offset = 1234, .length = 2000});
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(ReadAllByPeek(**reader), data.substr(1234, 2000));
  auto tail =
      ObjectReader::Open(tmp.store(), "obj", {.chunk_size = 300, .offset = 4900, .length = 1000});
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

// Counts the requests that reach the inner store.
class CountingStore : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  void HeadAsync(std::string key, Callback<ObjectMeta> done) override {
    ++heads;
    ForwardingStore::HeadAsync(std::move(key), std::move(done));
  }
  void GetAsync(GetRequest request, Callback<GetResult> done) override {
    ++gets;
    if (!request.if_match.empty()) ++pinned;
    if (!strip_etag) return ForwardingStore::GetAsync(std::move(request), std::move(done));
    ForwardingStore::GetAsync(std::move(request),
                              [done = std::move(done)](absl::StatusOr<GetResult> r) mutable {
                                if (r.ok()) r->meta.etag.clear();
                                std::move(done)(std::move(r));
                              });
  }
  std::atomic<int> heads{0}, gets{0}, pinned{0};
  bool strip_etag = false;  // as the GCS emulator: reads do not say which version they served
};

TEST(ObjectReaderTest, OpeningByKeyIsOneGetThatTellsSizeAndEtag) {
  TempStore tmp;
  const std::string data = RandomBytes(5000, 21);
  auto put = tmp.store()->Put("obj", absl::Cord(data));
  ASSERT_TRUE(put.ok());
  ASSERT_TRUE(tmp.store()->Put("empty", absl::Cord()).ok());
  auto counting = std::make_shared<CountingStore>(tmp.store());
  // Chunks smaller than the object: the first (min_chunk bytes) is here when Open returns,
  // the rest pinned to its ETag.
  for (bool adaptive : {false, true}) {
    counting->heads = counting->gets = counting->pinned = 0;
    auto reader = ObjectReader::Open(
        counting, "obj",
        {.chunk_size = 1000, .read_ahead = 0, .adaptive = adaptive, .min_chunk = 700});
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ(counting->heads.load(), 0);
    EXPECT_EQ(counting->gets.load(), 1);
    EXPECT_EQ((*reader)->meta().size, data.size());
    EXPECT_EQ((*reader)->meta().etag, put->etag);
    EXPECT_EQ((*reader)->meta().key, "obj");
    EXPECT_EQ((*reader)->end(), data.size());
    EXPECT_EQ((*reader)->Buffered().size(), 700u);  // min_chunk, adaptive or not
    EXPECT_EQ(ReadAllByPeek(**reader), data);
    EXPECT_EQ(counting->heads.load(), 0);
    EXPECT_EQ(counting->pinned.load(), counting->gets.load() - 1) << "every GET after the first";
    EXPECT_EQ((*reader)->stats().bytes_fetched, data.size());
  }
  // A first chunk larger than the object ends where the object ends; a range's start and
  // length are kept.
  counting->heads = counting->gets = 0;
  auto whole = ObjectReader::Open(counting, "obj", {.chunk_size = 1 << 20});
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(counting->gets.load(), 1);
  EXPECT_EQ((*whole)->Buffered(), data);
  EXPECT_EQ(ReadAllByPeek(**whole), data);
  EXPECT_EQ(counting->gets.load(), 1);
  auto range = ObjectReader::Open(
      counting, "obj", {.chunk_size = 300, .read_ahead = 2, .offset = 4000, .length = 500});
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ((*range)->end(), 4500u);
  EXPECT_EQ(ReadAllByPeek(**range), data.substr(4000, 500));
  auto tail =
      ObjectReader::Open(counting, "obj", {.chunk_size = 300, .offset = 4900, .length = 1000});
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ((*tail)->end(), 5000u);
  EXPECT_EQ(ReadAllByPeek(**tail), data.substr(4900));
  EXPECT_EQ(counting->heads.load(), 0);
  // What the first GET cannot describe is asked with a HEAD: an empty object, a range at its
  // end (empty), and one past it (OutOfRange naming the size).
  auto empty = ObjectReader::Open(counting, "empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ((*empty)->meta().size, 0u);
  EXPECT_EQ(ReadAllByPeek(**empty), "");
  EXPECT_EQ(counting->heads.load(), 1);
  auto at_end = ObjectReader::Open(counting, "obj", {.offset = 5000});
  ASSERT_TRUE(at_end.ok()) << at_end.status();
  EXPECT_EQ((*at_end)->remaining(), 0u);
  auto past = ObjectReader::Open(counting, "obj", {.offset = 5001});
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(absl::StrContains(past.status().message(), "5000-byte object")) << past.status();
  // A store whose reads carry no ETag: the HEAD's is what the later GETs are pinned to.
  counting->strip_etag = true;
  counting->heads = counting->pinned = 0;
  auto unpinned = ObjectReader::Open(counting, "obj", {.chunk_size = 1000, .read_ahead = 0});
  ASSERT_TRUE(unpinned.ok()) << unpinned.status();
  EXPECT_EQ(counting->heads.load(), 1);
  EXPECT_EQ((*unpinned)->meta().etag, put->etag);
  EXPECT_EQ(ReadAllByPeek(**unpinned), data);
  EXPECT_EQ(counting->pinned.load(), 5);
  // Without pinning, the first GET is enough.
  counting->heads = 0;
  auto free = ObjectReader::Open(counting, "obj", {.chunk_size = 1000, .pin_version = false});
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_EQ(counting->heads.load(), 0);
  EXPECT_EQ(ReadAllByPeek(**free), data);
}

TEST(ObjectReaderTest, TheFirstChunkOfAnOpenByKeyIsNoEvidenceOfSequentialReading) {
  TempStore tmp;
  const std::string data = RandomBytes(1 << 20, 23);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  ObjectReaderOptions options{
      .chunk_size = 256 << 10, .read_ahead = 4, .adaptive = true, .min_chunk = 16 << 10};
  // Parquet: the footer first, then a column chunk a few bytes after the magic. The read
  // takes what the first chunk holds and fetches exactly the rest (no read-ahead).
  auto parquet = ObjectReader::Open(tmp.store(), "obj", options);
  ASSERT_TRUE(parquet.ok()) << parquet.status();
  ASSERT_TRUE((*parquet)->Seek(data.size() - 8).ok());
  std::string tail(8, '\0');
  ASSERT_TRUE((*parquet)->ReadExact(absl::MakeSpan(tail)).ok());
  ASSERT_TRUE((*parquet)->Seek(4).ok());
  std::string column(200'000, '\0');
  ASSERT_TRUE((*parquet)->ReadDirect(absl::MakeSpan(column)).ok());
  EXPECT_EQ(column, data.substr(4, 200'000));
  ObjectReaderStats stats = (*parquet)->stats();
  EXPECT_EQ(stats.bytes_fetched, (16u << 10) + (16u << 10) + (4 + 200'000 - (16u << 10)));
  EXPECT_EQ(stats.requests, 3u);
  // torch.load: the magic is read (and the position moved back), then the footer, then the
  // records from the start: sequential reading, so read-ahead ramps.
  auto zip = ObjectReader::Open(tmp.store(), "obj", options);
  ASSERT_TRUE(zip.ok()) << zip.status();
  std::string magic(4, '\0');
  ASSERT_TRUE((*zip)->ReadExact(absl::MakeSpan(magic)).ok());
  ASSERT_TRUE((*zip)->Seek(0).ok());
  ASSERT_TRUE((*zip)->Seek(data.size() - 8).ok());
  ASSERT_TRUE((*zip)->ReadExact(absl::MakeSpan(tail)).ok());
  ASSERT_TRUE((*zip)->Seek(64).ok());
  std::string record(100'000, '\0');
  ASSERT_TRUE((*zip)->ReadDirect(absl::MakeSpan(record)).ok());
  EXPECT_EQ(record, data.substr(64, 100'000));
  stats = (*zip)->stats();
  EXPECT_GT(stats.bytes_fetched, (16u << 10) + (16u << 10) + (64 + 100'000 - (16u << 10)))
      << "read ahead past the record";
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

// A runtime of its own, so the budget's numbers are this test's alone.
std::shared_ptr<Runtime> SmallRuntime(uint64_t budget) {
  return std::make_shared<Runtime>(RuntimeOptions{.memory_budget = budget});
}

TEST(ObjectReaderTest, ChunksAreChargedToTheRuntimeBudget) {
  TempStore tmp;
  const std::string data = RandomBytes(64 << 10, 9);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  auto slow = std::make_shared<SlowStore>(tmp.store(), absl::Milliseconds(2));
  auto rt = SmallRuntime(uint64_t{1} << 30);
  auto reader =
      ObjectReader::Open(slow, "obj", {.chunk_size = 4096, .read_ahead = 3, .runtime = rt});
  ASSERT_TRUE(reader.ok()) << reader.status();
  // The reader's bound is its account's cap; what it started is charged to the budget.
  EXPECT_EQ((*reader)->account().cap(), 4 * 4096u);
  EXPECT_EQ(rt->budget().held(), 4 * 4096u);
  EXPECT_EQ((*reader)->account().held(), 4 * 4096u);
  EXPECT_EQ(ReadAllByPeek(**reader), data);
  EXPECT_GE(rt->budget().peak(), 4 * 4096u);
  EXPECT_LE(rt->budget().peak(), 4 * 4096u);
  EXPECT_EQ((*reader)->stats().peak_buffered_bytes, 4 * 4096u);
  reader->reset();
  EXPECT_EQ(rt->budget().held(), 0u);
}

TEST(ObjectReaderTest, WaitsForRoomInTheBudgetAndNeverPassesIt) {
  TempStore tmp;
  const std::string data = RandomBytes(40'000, 10);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  auto rt = SmallRuntime(16 << 10);
  // Another consumer holds the whole budget: the reader can start nothing.
  auto other = rt->budget().NewAccount(0, "other");
  Block hog = rt->budget().TryAllocate(other, 16 << 10);
  ASSERT_TRUE(hog);
  auto reader =
      ObjectReader::Open(tmp.store(), "obj", {.chunk_size = 4096, .read_ahead = 8, .runtime = rt});
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->stats().requests, 0u);
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(50));
    hog = Block();
  });
  EXPECT_EQ(ReadAllByPeek(**reader), data);  // waited for the release, then read everything
  release.join();
  EXPECT_LE(rt->budget().peak(), 16u << 10);
  // Read-ahead was bounded by the budget (16 KiB = 4 chunks), not by read_ahead (9 chunks).
  EXPECT_LE((*reader)->stats().peak_buffered_bytes, 16u << 10);
}

TEST(ObjectReaderTest, PiecesTheCallerKeepsStayChargedButDoNotStopTheReader) {
  TempStore tmp;
  const std::string data = RandomBytes(64 << 10, 11);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  auto rt = SmallRuntime(uint64_t{1} << 30);
  auto reader = ObjectReader::Open(
      tmp.store(), "obj",
      {.chunk_size = 1024, .read_ahead = 1, .max_buffered_bytes = 2048, .runtime = rt});
  ASSERT_TRUE(reader.ok());
  std::vector<absl::Cord> kept;
  for (int i = 0; i < 64; ++i) {
    auto piece = (*reader)->ReadCord(1024);  // a whole chunk: shared, not copied
    ASSERT_TRUE(piece.ok()) << piece.status();
    kept.push_back(*std::move(piece));
  }
  EXPECT_EQ((*reader)->stats().bytes_copied, 0u);
  EXPECT_EQ(rt->budget().held(), 64u << 10);                 // the kept pieces are still charged
  EXPECT_LE((*reader)->stats().peak_buffered_bytes, 2048u);  // but not as the reader's
  std::string joined;
  for (const auto& c : kept) joined += std::string(c);
  EXPECT_EQ(joined, data);
  kept.clear();
  reader->reset();
  EXPECT_EQ(rt->budget().held(), 0u);
}

TEST(ObjectReaderTest, KeptPiecesFillingTheWholeBudgetAreAnErrorNotAHang) {
  TempStore tmp;
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(RandomBytes(16 << 10, 12))).ok());
  auto rt = SmallRuntime(4096);
  auto reader =
      ObjectReader::Open(tmp.store(), "obj", {.chunk_size = 1024, .read_ahead = 0, .runtime = rt});
  ASSERT_TRUE(reader.ok());
  std::vector<absl::Cord> kept;
  absl::Status status;
  for (int i = 0; i < 16 && status.ok(); ++i) {
    auto piece = (*reader)->ReadCord(1024);
    status = piece.status();
    if (piece.ok()) kept.push_back(*std::move(piece));
  }
  EXPECT_EQ(kept.size(), 4u);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), tmp.store()->Uri("obj"))) << status;
}

TEST(ObjectReaderTest, UnsetChunkSizeAndReadAheadComeFromTheLinkEstimate) {
  TempStore tmp;
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(RandomBytes(1000, 13))).ok());
  auto rt = SmallRuntime(uint64_t{1} << 30);
  {
    // Before any measurement: the prior (50 ms, 100 MB/s) gives 8 MiB chunks, 2 ahead.
    auto reader = ObjectReader::Open(tmp.store(), "obj", {.runtime = rt});
    ASSERT_TRUE(reader.ok());
    EXPECT_EQ((*reader)->stats().chunk_size, uint64_t{8} << 20);
    EXPECT_EQ((*reader)->stats().read_ahead, 2);
    EXPECT_EQ((*reader)->account().cap(), uint64_t{24} << 20);
  }
  // A far, fast link: 200 ms to first byte, 1 GB/s -> 64 MiB chunks (the clamp), and
  // 200 MB in flight per first byte -> 3 chunks ahead.
  LinkEstimator& link = rt->link(tmp.store()->Uri(""));
  for (int i = 0; i < LinkEstimator::kWarmup; ++i) {
    link.Record(absl::Milliseconds(200), uint64_t{100} << 20,
                absl::Milliseconds(200) + absl::Seconds((100 << 20) / 1e9));
  }
  auto reader = ObjectReader::Open(tmp.store(), "obj", {.runtime = rt});
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->stats().chunk_size, uint64_t{64} << 20);
  EXPECT_EQ((*reader)->stats().read_ahead, 3);
  // Options that are set win over the estimate.
  auto fixed =
      ObjectReader::Open(tmp.store(), "obj", {.chunk_size = 4096, .read_ahead = 0, .runtime = rt});
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ((*fixed)->stats().chunk_size, 4096u);
  EXPECT_EQ((*fixed)->stats().read_ahead, 0);
}

TEST(ObjectReaderTest, SeeksAnywhereAndReadsTheSameBytesAsTheObject) {
  TempStore tmp;
  const std::string data = RandomBytes(20'000, 7);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  std::mt19937_64 rng(13);
  for (uint64_t chunk : {1ul, 97ul, 4096ul, 1ul << 20}) {
    for (int read_ahead : {0, 3}) {
      ObjectReaderOptions options{.chunk_size = chunk, .read_ahead = read_ahead};
      auto reader = ObjectReader::Open(tmp.store(), "obj", options);
      ASSERT_TRUE(reader.ok()) << reader.status();
      for (int i = 0; i < 60; ++i) {
        const uint64_t at = rng() % (data.size() + 1);
        ASSERT_TRUE((*reader)->Seek(at).ok()) << at;
        EXPECT_EQ((*reader)->position(), at);
        const uint64_t n = std::min<uint64_t>(rng() % 700, data.size() - at);
        std::string got(n, '\0');
        ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(got)).ok()) << at << " " << n;
        ASSERT_EQ(got, data.substr(at, n)) << chunk << " " << read_ahead << " at " << at;
      }
      EXPECT_LE((*reader)->stats().peak_buffered_bytes, (read_ahead + 1) * chunk);
    }
  }
}

TEST(ObjectReaderTest, SeekRestartsReadAheadAtTheNewPositionAndReusesTheCurrentChunk) {
  TempStore tmp;
  const std::string data = RandomBytes(10'000, 8);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  // A byte bound above the chunks' so that dropped chunks still in flight do not hold back
  // the new read-ahead: the request counts below are then exact.
  ObjectReaderOptions options{.chunk_size = 100, .read_ahead = 2, .max_buffered_bytes = 10'000};
  auto reader = ObjectReader::Open(tmp.store(), "obj", options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->stats().requests, 3u);  // chunks 0, 100, 200 at open
  // Opened by key: the first chunk, whose GET told the size, is here.
  EXPECT_EQ((*reader)->Buffered(), absl::string_view(data).substr(0, 100));
  // Far forward: the chunks ahead are dropped, read-ahead starts at 5000.
  ASSERT_TRUE((*reader)->Seek(5000).ok());
  EXPECT_EQ((*reader)->stats().requests, 6u);
  std::string got(10, '\0');
  ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, data.substr(5000, 10));
  EXPECT_EQ((*reader)->stats().requests, 6u);
  EXPECT_EQ((*reader)->Buffered(), absl::string_view(data).substr(5010, 90));
  // Far backward: everything held is dropped and the new position fetched.
  ASSERT_TRUE((*reader)->Seek(1000).ok());
  EXPECT_EQ((*reader)->stats().requests, 9u);
  ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, data.substr(1000, 10));
  // Back inside the current chunk: no request.
  ASSERT_TRUE((*reader)->Seek(1003).ok());
  EXPECT_EQ((*reader)->Buffered(), absl::string_view(data).substr(1003, 97));
  ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, data.substr(1003, 10));
  EXPECT_EQ((*reader)->stats().requests, 9u);
  // The end is a valid position; past it is not.
  ASSERT_TRUE((*reader)->Seek(data.size()).ok());
  auto view = (*reader)->Peek();
  ASSERT_TRUE(view.ok());
  EXPECT_TRUE(view->empty());
  EXPECT_EQ((*reader)->Seek(data.size() + 1).code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE((*reader)->Seek(0).ok());
  ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, data.substr(0, 10));
}

TEST(ObjectReaderTest, ReadDirectFetchesLargeReadsStraightIntoTheCallersBuffer) {
  TempStore tmp;
  const std::string data = RandomBytes(10'000, 9);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  ObjectReaderOptions options{.chunk_size = 100, .read_ahead = 2};
  auto reader = ObjectReader::Open(tmp.store(), "obj", options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->stats().requests, 3u);  // read-ahead: [0, 300)
  std::string got(1000, '\0');
  ASSERT_TRUE((*reader)->ReadDirect(absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, data.substr(0, 1000));
  // 3 chunks copied, 7 direct GETs, then read-ahead goes on from the end: [1000, 1300).
  EXPECT_EQ((*reader)->stats().requests, 13u);
  EXPECT_EQ((*reader)->position(), 1000u);
  EXPECT_LE((*reader)->stats().peak_buffered_bytes, 300u);  // direct bytes are not held
  EXPECT_EQ((*reader)->stats().bytes_direct, 700u);
  // Small reads go through the chunks; a read of the rest finishes the object.
  std::string small(50, '\0');
  ASSERT_TRUE((*reader)->ReadDirect(absl::MakeSpan(small)).ok());
  EXPECT_EQ(small, data.substr(1000, 50));
  EXPECT_EQ((*reader)->stats().bytes_direct, 700u);  // served from the read-ahead
  std::string rest(data.size() - 1050, '\0');
  ASSERT_TRUE((*reader)->ReadDirect(absl::MakeSpan(rest)).ok());
  EXPECT_EQ(rest, data.substr(1050));
  EXPECT_EQ((*reader)->remaining(), 0u);
  EXPECT_EQ((*reader)->ReadDirect(absl::MakeSpan(small)).code(), absl::StatusCode::kOutOfRange);

  // Random positions and sizes, against the bytes.
  std::mt19937_64 rng(21);
  auto again = ObjectReader::Open(tmp.store(), "obj", options);
  ASSERT_TRUE(again.ok()) << again.status();
  for (int i = 0; i < 100; ++i) {
    const uint64_t at = rng() % data.size();
    const uint64_t n = std::min<uint64_t>(rng() % 2000, data.size() - at);
    ASSERT_TRUE((*again)->Seek(at).ok());
    std::string part(n, '\0');
    ASSERT_TRUE((*again)->ReadDirect(absl::MakeSpan(part)).ok()) << at << " " << n;
    ASSERT_EQ(part, data.substr(at, n)) << at << " " << n;
  }
}

TEST(ObjectReaderTest, ReadDirectOfARewrittenObjectIsAStickyError) {
  TempStore tmp;
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(RandomBytes(10'000, 10))).ok());
  ObjectReaderOptions options{.chunk_size = 100, .read_ahead = 0};
  auto reader = ObjectReader::Open(tmp.store(), "obj", options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(RandomBytes(10'000, 11))).ok());
  ASSERT_TRUE((*reader)->Seek(5000).ok());
  std::string got(1000, '\0');
  const absl::Status status = (*reader)->ReadDirect(absl::MakeSpan(got));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_EQ((*reader)->ReadDirect(absl::MakeSpan(got)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ObjectReaderTest, AdaptiveReadsTheSameBytesUnderRandomAndMixedAccess) {
  TempStore tmp;
  const std::string data = RandomBytes(300'000, 21);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  std::mt19937_64 rng(5);
  for (uint64_t min_chunk : {1ul, 1000ul, 4096ul}) {
    ObjectReaderOptions options{
        .chunk_size = 16384, .read_ahead = 3, .adaptive = true, .min_chunk = min_chunk};
    auto reader = ObjectReader::Open(tmp.store(), "obj", options);
    ASSERT_TRUE(reader.ok()) << reader.status();
    for (int i = 0; i < 200; ++i) {
      const uint64_t at = i % 3 == 0 ? (*reader)->position() : rng() % (data.size() + 1);
      ASSERT_TRUE((*reader)->Seek(at).ok()) << at;
      const uint64_t n = std::min<uint64_t>(rng() % 90'000, data.size() - at);
      std::string got(n, '\0');
      absl::Status s = i % 2 ? (*reader)->ReadDirect(absl::MakeSpan(got))
                             : (*reader)->ReadExact(absl::MakeSpan(got));
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_EQ(got, data.substr(at, n)) << min_chunk << " at " << at;
    }
    EXPECT_LE((*reader)->stats().peak_buffered_bytes, 4 * 16384u);
    EXPECT_GT((*reader)->stats().jumps, 50u);
  }
}

TEST(ObjectReaderTest, AdaptiveRequestsNothingBeforeTheFirstReadAndFetchesSmallAfterAJump) {
  TempStore tmp;
  const std::string data = RandomBytes(1 << 20, 22);
  auto meta = tmp.store()->Put("obj", absl::Cord(data));
  ASSERT_TRUE(meta.ok());
  ObjectReaderOptions options{
      .chunk_size = 256 << 10, .read_ahead = 4, .adaptive = true, .min_chunk = 16 << 10};
  // Opened with its meta (opened by key, the first min_chunk comes with the size).
  auto reader = ObjectReader::Open(tmp.store(), *meta, options);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->stats().requests, 0u);
  // A footer read, as Parquet does: the last 8 bytes, then 20 KiB before them.
  ASSERT_TRUE((*reader)->Seek(data.size() - 8).ok());
  std::string tail(8, '\0');
  ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(tail)).ok());
  EXPECT_EQ(tail, data.substr(data.size() - 8));
  ASSERT_TRUE((*reader)->Seek(100'000).ok());
  std::string small(100, '\0');
  ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(small)).ok());
  EXPECT_EQ(small, data.substr(100'000, 100));
  // A read of known size right after a jump: exactly its bytes.
  ASSERT_TRUE((*reader)->Seek(500'000).ok());
  std::string column(100'000, '\0');
  ASSERT_TRUE((*reader)->ReadDirect(absl::MakeSpan(column)).ok());
  EXPECT_EQ(column, data.substr(500'000, 100'000));
  const ObjectReaderStats stats = (*reader)->stats();
  EXPECT_EQ(stats.requests, 3u);
  // The footer's jump fetched the last min_chunk bytes (see below), the small read after a
  // jump min_chunk, the read of known size exactly its bytes.
  EXPECT_EQ(stats.bytes_fetched, (16u << 10) + (16u << 10) + 100'000u);
  EXPECT_EQ(stats.jumps, 3u);
}

TEST(ObjectReaderTest, AdaptiveFetchesAFooterInOneRequestAndKeepsTheStartForTheReturn) {
  TempStore tmp;
  const std::string data = RandomBytes(1 << 20, 25);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  ObjectReaderOptions options{
      .chunk_size = 256 << 10, .read_ahead = 4, .adaptive = true, .min_chunk = 16 << 10};
  auto reader = ObjectReader::Open(tmp.store(), "obj", options);
  ASSERT_TRUE(reader.ok());
  // As torch.load reads a zip: the first bytes, the end record, then the central directory
  // and local headers before it, each a little further back.
  const uint64_t n = data.size();
  const std::vector<std::pair<uint64_t, size_t>> reads = {
      {0, 8},           {n - 22, 22},   {n - 42, 20},   {n - 98, 56},
      {n - 4151, 4053}, {n - 4317, 30}, {n - 4447, 30}, {n - 4207, 40}};
  for (const auto& [at, len] : reads) {
    ASSERT_TRUE((*reader)->Seek(at).ok());
    std::string got(len, '\0');
    ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(got)).ok());
    EXPECT_EQ(got, data.substr(at, len)) << at;
  }
  // The start's window, and one window ending at the end for everything after.
  EXPECT_EQ((*reader)->stats().requests, 2u);
  EXPECT_EQ((*reader)->stats().bytes_fetched, 2u * (16u << 10));
  // Back to the start (torch.load reads the first records' headers next): the start's
  // window was set aside at the jump, not released, so returning costs no request; and the
  // footer's window is set aside in its turn.
  for (uint64_t at : {uint64_t{4816}, uint64_t{0}, n - 30}) {
    ASSERT_TRUE((*reader)->Seek(at).ok());
    std::string got(30, '\0');
    ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(got)).ok());
    EXPECT_EQ(got, data.substr(at, 30)) << at;
  }
  EXPECT_EQ((*reader)->stats().requests, 2u);
  // A jump elsewhere is a jump again: min_chunk from there.
  ASSERT_TRUE((*reader)->Seek(n - 100'000).ok());
  std::string got(10, '\0');
  ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, data.substr(n - 100'000, 10));
  EXPECT_EQ((*reader)->stats().requests, 3u);
  EXPECT_EQ((*reader)->stats().bytes_fetched, 3u * (16u << 10));
  // A range ending before the object's end: the window ends at the range's end.
  ObjectReaderOptions ranged = options;
  ranged.offset = 1000;
  ranged.length = 10'000;
  auto part = ObjectReader::Open(tmp.store(), "obj", ranged);
  ASSERT_TRUE(part.ok());
  ASSERT_TRUE((*part)->Seek(10'990).ok());
  ASSERT_TRUE((*part)->ReadExact(absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, data.substr(10'990, 10));
  ASSERT_TRUE((*part)->Seek(1000).ok());
  ASSERT_TRUE((*part)->ReadExact(absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, data.substr(1000, 10));
  EXPECT_EQ((*part)->stats().requests, 1u);
  EXPECT_EQ((*part)->stats().bytes_fetched, 10'000u);
}

TEST(ObjectReaderTest, AdaptiveRampsUpToFullReadAheadWhileReadingSequentially) {
  TempStore tmp;
  const std::string data = RandomBytes(4 << 20, 23);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  auto slow = std::make_shared<SlowStore>(tmp.store(), absl::Milliseconds(2));
  ObjectReaderOptions options{
      .chunk_size = 64 << 10, .read_ahead = 4, .adaptive = true, .min_chunk = 4 << 10};
  auto reader = ObjectReader::Open(slow, "obj", options);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(ReadAllByPeek(**reader), data);
  const ObjectReaderStats stats = (*reader)->stats();
  // 4, 8, 16, 32 KiB, then 64 KiB chunks: a handful more requests than fixed chunks.
  EXPECT_LE(stats.requests, data.size() / (64 << 10) + 4);
  EXPECT_EQ(stats.bytes_fetched, data.size());
  EXPECT_EQ(slow->peak_in_flight(), 5);  // the full read-ahead was reached
  EXPECT_EQ(stats.jumps, 0u);
}

TEST(ObjectReaderTest, AdaptiveChunkSetAsideNeverMakesAReaderAtItsCapWait) {
  TempStore tmp;
  const std::string data = RandomBytes(1 << 20, 27);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  // The cap is one first chunk: the one set aside at a jump must give way to the next.
  ObjectReaderOptions options{.chunk_size = 256 << 10,
                              .read_ahead = 4,
                              .max_buffered_bytes = 16 << 10,
                              .adaptive = true,
                              .min_chunk = 16 << 10};
  auto reader = ObjectReader::Open(tmp.store(), "obj", options);
  ASSERT_TRUE(reader.ok());
  for (uint64_t at : {uint64_t{0}, uint64_t{500'000}, uint64_t{100}, uint64_t{900'000}}) {
    ASSERT_TRUE((*reader)->Seek(at).ok());
    std::string got(1000, '\0');
    ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(got)).ok());
    EXPECT_EQ(got, data.substr(at, 1000)) << at;
  }
  EXPECT_LE((*reader)->stats().peak_buffered_bytes, 16u << 10);
}

TEST(ObjectReaderTest, AdaptiveSequentialReadLongerThanTheWindowIsRequestedAtOnce) {
  TempStore tmp;
  const std::string data = RandomBytes(16 << 20, 26);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  auto slow = std::make_shared<SlowStore>(tmp.store(), absl::Milliseconds(20));
  ObjectReaderOptions options{
      .chunk_size = 8 << 20, .read_ahead = 8, .adaptive = true, .min_chunk = 64 << 10};
  auto reader = ObjectReader::Open(slow, "obj", options);
  ASSERT_TRUE(reader.ok());
  std::string head(100, '\0');
  ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(head)).ok());
  EXPECT_EQ((*reader)->stats().requests, 1u);  // the first 64 KiB
  // A record of 4 MiB read sequentially after 100 bytes: the window doubling from 64 KiB
  // chunk after chunk would take 6 more requests one after another, a round trip each; the
  // read's size starts chunks covering it (and as much again) in parallel.
  std::string record(4 << 20, '\0');
  ASSERT_TRUE((*reader)->ReadDirect(absl::MakeSpan(record)).ok());
  EXPECT_EQ(record, data.substr(100, 4 << 20));
  EXPECT_GE(slow->peak_in_flight(), 4);
  EXPECT_EQ((*reader)->stats().jumps, 0u);
  // The rest reads the same bytes.
  std::string rest(data.size() - (4 << 20) - 100, '\0');
  ASSERT_TRUE((*reader)->ReadExact(absl::MakeSpan(rest)).ok());
  EXPECT_EQ(rest, data.substr((4 << 20) + 100));
}

TEST(ObjectReaderTest, AdaptiveRampsPastADerivedReadAheadButNotPastAGivenOne) {
  TempStore tmp;
  const std::string data = RandomBytes(40 << 20, 24);
  ASSERT_TRUE(tmp.store()->Put("obj", absl::Cord(data)).ok());
  for (int given : {-1, 3}) {
    // A fresh runtime: its link estimates are the priors (50 ms x 100 MB/s per connection),
    // which derive 3 chunks of 2 MiB.
    auto runtime = std::make_shared<Runtime>();
    auto slow = std::make_shared<SlowStore>(tmp.store(), absl::Milliseconds(2));
    ObjectReaderOptions options{
        .chunk_size = 2 << 20, .read_ahead = given, .adaptive = true, .runtime = runtime};
    auto reader = ObjectReader::Open(slow, "obj", options);
    ASSERT_TRUE(reader.ok()) << reader.status();
    ASSERT_EQ((*reader)->stats().read_ahead, 3);
    // Records read one after another with small gaps, as torch.load reads a checkpoint.
    uint64_t at = 0;
    std::string got(900'000, '\0');
    while (at + 64 + got.size() <= data.size()) {
      at += 64;
      ASSERT_TRUE((*reader)->Seek(at).ok());
      ASSERT_TRUE((*reader)->ReadDirect(absl::MakeSpan(got)).ok());
      ASSERT_EQ(got, data.substr(at, got.size()));
      at += got.size();
    }
    EXPECT_EQ((*reader)->stats().jumps, 0u) << given;
    if (given < 0) {
      EXPECT_GT(slow->peak_in_flight(), 4) << "the ramp stopped at the derived read-ahead";
    } else {
      EXPECT_LE(slow->peak_in_flight(), 4) << "the ramp passed the read-ahead the caller set";
    }
  }
}

}  // namespace
}  // namespace wharf
