// Composed reads through the fetch engine against the GCS emulator that ./run test starts
// (scripts/gcs-server): the bytes each item gets, the GETs it takes, the temporaries it leaves
// (none), the fallback when composing fails, and the sweep of what a dead process left.
#include "io/composed_read.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "http/curl_transport.h"
#include "io/fetch_scheduler.h"
#include "store/forwarding_store.h"
#include "store/gcs/gcs_json_store.h"

namespace wharf {
namespace {

std::string RandomBucketName() {
  static std::mt19937_64 rng(std::random_device{}());
  return absl::StrCat("wharf-compose-", absl::Hex(rng(), absl::kZeroPad16));
}

class ComposedReadTest : public testing::Test {
 protected:
  void SetUp() override {
    const char* host = std::getenv("STORAGE_EMULATOR_HOST");
    ASSERT_TRUE(host != nullptr && *host != '\0')
        << "STORAGE_EMULATOR_HOST is not set: scripts/gcs-server start, or ./run test";
    gcs::GcsJsonConfig config;
    config.endpoint = host;
    auto store = gcs::GcsJsonStore::Open(RandomBucketName(), config, SharedCurlTransport());
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->CreateBucket().ok());
    store_ = std::shared_ptr<gcs::GcsJsonStore>(*std::move(store));
  }
  void TearDown() override {
    if (!store_) return;
    auto listed = store_->ListAll({});
    ASSERT_TRUE(listed.ok());
    std::vector<std::string> keys;
    for (const auto& o : listed->objects) keys.push_back(o.key);
    EXPECT_TRUE(store_->DeleteMany(keys).ok());
    EXPECT_TRUE(store_->DeleteBucket().ok());
  }

  // `n` objects "d/NNN" of 1000 + 37 * i bytes; their FetchItems with listed sizes.
  std::vector<FetchItem> PutObjects(int n) {
    std::vector<FetchItem> items;
    for (int i = 0; i < n; ++i) {
      const std::string key = absl::StrCat("d/", absl::Dec(i, absl::kZeroPad3));
      auto meta = store_->Put(key, absl::Cord(Content(i)));
      EXPECT_TRUE(meta.ok()) << meta.status();
      items.push_back({.key = key, .size = meta->size, .etag = meta->etag});
    }
    return items;
  }
  static std::string Content(int i) {
    return std::string(1000 + 37 * i, static_cast<char>('a' + i % 26));
  }
  std::vector<std::string> Temporaries() {
    auto listed = store_->ListAll({.prefix = ComposedReads::kTempRoot});
    EXPECT_TRUE(listed.ok()) << listed.status();
    std::vector<std::string> keys;
    if (listed.ok()) {
      for (const auto& o : listed->objects) keys.push_back(o.key);
    }
    return keys;
  }

  std::shared_ptr<gcs::GcsJsonStore> store_;
};

TEST_F(ComposedReadTest, SmallObjectsComeFromOneGetPerThirtyTwoAndLeaveNothing) {
  std::vector<FetchItem> items = PutObjects(70);
  FetchStats stats;
  {
    FetchScheduler scheduler(store_, {.ordered = true, .compose = ComposeMode::kOn});
    auto batch = scheduler.Fetch(items);
    for (int i = 0; i < 70; ++i) {
      auto r = batch->Next();
      ASSERT_TRUE(r.has_value());
      ASSERT_TRUE(r->data.ok()) << r->data.status();
      EXPECT_EQ(r->index, static_cast<size_t>(i));
      EXPECT_EQ(r->key, items[i].key);
      EXPECT_EQ(r->object_size, items[i].size);
      EXPECT_EQ(r->data->view(), Content(i));
    }
    EXPECT_FALSE(batch->Next().has_value());
    stats = batch->stats();
  }
  // 32 + 32 + 6: three composed GETs, nothing else.
  EXPECT_EQ(stats.composed_reads, 3u);
  EXPECT_EQ(stats.requests, 3u);
  EXPECT_EQ(stats.composed_objects, 70u);
  EXPECT_TRUE(Temporaries().empty());
}

TEST_F(ComposedReadTest, OffReadsOneByOne) {
  std::vector<FetchItem> items = PutObjects(5);
  FetchScheduler scheduler(store_, {.compose = ComposeMode::kOff});
  auto batch = scheduler.Fetch(items);
  int n = 0;
  while (auto r = batch->Next()) {
    ASSERT_TRUE(r->data.ok());
    ++n;
  }
  EXPECT_EQ(n, 5);
  EXPECT_EQ(batch->stats().composed_reads, 0u);
  EXPECT_EQ(batch->stats().requests, 5u);
}

TEST_F(ComposedReadTest, ASourceChangedSinceListingFallsBackToSingleReads) {
  std::vector<FetchItem> items = PutObjects(10);
  // Object 3 grows after it was listed: the composed size disagrees with the listing.
  ASSERT_TRUE(store_->Put(items[3].key, absl::Cord(Content(3) + "more")).ok());
  FetchScheduler scheduler(store_, {.ordered = true, .compose = ComposeMode::kOn});
  auto batch = scheduler.Fetch(items);
  for (int i = 0; i < 10; ++i) {
    auto r = batch->Next();
    ASSERT_TRUE(r.has_value());
    if (i == 3) {
      // Read alone with its stale size: refused, never a truncated object.
      EXPECT_FALSE(r->data.ok());
    } else {
      ASSERT_TRUE(r->data.ok()) << r->data.status();
      EXPECT_EQ(r->data->view(), Content(i));
    }
  }
  EXPECT_EQ(batch->stats().composed_reads, 1u);
  EXPECT_EQ(batch->stats().requests, 11u);  // the composed GET, then ten single ones
  batch.reset();
  EXPECT_TRUE(Temporaries().empty());
}

// A store whose credentials can read but not write: compose is refused.
class NoWriteStore : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  void ComposeAsync(std::vector<std::string>, std::string dst_key,
                    Callback<ObjectMeta> done) override {
    ++composes;
    std::move(done)(absl::PermissionDeniedError(
        absl::StrCat("compose ", Uri(dst_key), ": HTTP 403 forbidden")));
  }
  std::atomic<int> composes{0};
};

TEST_F(ComposedReadTest, RefusedPermissionTurnsCompositionOffAndReadsStillSucceed) {
  std::vector<FetchItem> items = PutObjects(40);
  auto no_write = std::make_shared<NoWriteStore>(store_);
  FetchScheduler scheduler(no_write, {.compose = ComposeMode::kOn});
  for (int round = 0; round < 2; ++round) {
    auto batch = scheduler.Fetch(items);
    int ok = 0;
    while (auto r = batch->Next()) ok += r->data.ok();
    EXPECT_EQ(ok, 40);
  }
  // The first round's groups were planned before the refusal; the second composes nothing.
  EXPECT_LE(no_write->composes.load(), 2);
  EXPECT_GE(no_write->composes.load(), 1);
}

TEST_F(ComposedReadTest, SweepRemovesWhatDeadProcessesLeftAndKeepsLiveOnes) {
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  // A pid that is surely gone: a child that exited and was reaped.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  const std::string dead = absl::StrCat(ComposedReads::kTempRoot, host, "/", child, "-1/0");
  const std::string other_host = absl::StrCat(ComposedReads::kTempRoot, "elsewhere/1-1/0");
  ASSERT_TRUE(store_->Put(dead, absl::Cord("litter")).ok());
  ASSERT_TRUE(store_->Put(other_host, absl::Cord("maybe live")).ok());
  auto swept = ComposedReads::Sweep(*store_);
  ASSERT_TRUE(swept.ok()) << swept.status();
  EXPECT_EQ(*swept, 1);
  EXPECT_EQ(Temporaries(), std::vector<std::string>{other_host});
  // Anything older than the age bound goes, whoever left it.
  swept = ComposedReads::Sweep(*store_, absl::ZeroDuration());
  ASSERT_TRUE(swept.ok());
  EXPECT_EQ(*swept, 1);
  EXPECT_TRUE(Temporaries().empty());
}

}  // namespace
}  // namespace wharf
