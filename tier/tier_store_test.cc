// The tier as a read-through cache: misses fill whole objects once (across threads and
// processes, a killed filler blocking no one), hits are served from the tier with every read
// option, writes through it forget the tier's copy, imported trees answer for their source.
#include "tier/tier_store.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/transfer.h"
#include "store/local/temp_object.h"
#include "store/testing/delayed_get_store.h"
#include "store/testing/temp_store.h"
#include "tier/tree_store.h"

namespace wharf {
namespace {

using store_testing::DelayedGetStore;
using store_testing::TempStore;
using ::testing::HasSubstr;

class TierStoreTest : public ::testing::Test {
 protected:
  std::shared_ptr<Tier> MakeTier(TierConfig config = {}) {
    auto tier = Tier::Init(tier_dir_.root() + "/tier", config);
    EXPECT_TRUE(tier.ok()) << tier.status();
    return *tier;
  }
  std::shared_ptr<TierStore> Cached(std::shared_ptr<ObjectStore> inner,
                                    std::shared_ptr<Tier> tier) {
    auto store = TierStore::Open(std::move(inner), std::move(tier), Runtime::Default());
    EXPECT_TRUE(store.ok()) << store.status();
    return *store;
  }

  TempStore tier_dir_;
  TempStore source_;
};

TEST_F(TierStoreTest, AMissFillsAndTheNextReadHits) {
  ASSERT_TRUE(source_.store()->Put("train/a.bin", absl::Cord("hello tier")).ok());
  auto tier = MakeTier();
  auto store = Cached(source_.store(), tier);
  auto first = store->Read("train/a.bin");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, "hello tier");
  EXPECT_EQ(store->stats().misses, 1u);
  EXPECT_EQ(store->stats().fills, 1u);
  const auto path = store->FillPath("train/a.bin");
  ASSERT_TRUE(path.has_value());
  EXPECT_THAT(*path, HasSubstr("/.wharf/objects/file/"));
  auto entry = ReadEntryAttr(*path);
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->source, source_.store()->Uri("train/a.bin"));
  // A fill records a CRC32C of its bytes (what `verify` recomputes), not an MD5.
  EXPECT_EQ(entry->crc32c, Crc32cHex(Crc32c("hello tier")));
  EXPECT_TRUE(entry->md5.empty());

  // The source changes; an immutable tier keeps answering with its copy, without asking.
  ASSERT_TRUE(source_.store()->Put("train/a.bin", absl::Cord("changed")).ok());
  auto second = store->Read("train/a.bin");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, "hello tier");
  EXPECT_EQ(store->stats().hits, 1u);
  EXPECT_EQ(store->stats().fills, 1u);
  // HEAD is answered by the entry too: the old size, not the source's new one.
  auto head = store->Head("train/a.bin");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->size, 10u);
  EXPECT_EQ(head->etag, entry->etag);
  EXPECT_EQ(store->Head("train/missing").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TierStoreTest, TtlModeFetchesAgainOnceTheEntryIsOlderThanTheTtl) {
  TierConfig config;
  config.mode = TierConfig::Mode::kTtl;
  config.ttl = absl::Milliseconds(200);
  auto store = Cached(source_.store(), MakeTier(config));
  ASSERT_TRUE(source_.store()->Put("k", absl::Cord("v1")).ok());
  EXPECT_EQ(*store->Read("k"), "v1");
  // Past the ttl but unchanged at the source: revalidated (304), not fetched again.
  absl::SleepFor(absl::Milliseconds(250));
  EXPECT_EQ(*store->Read("k"), "v1");
  EXPECT_EQ(store->stats().fills, 1u);
  EXPECT_EQ(store->stats().revalidated, 1u);
  ASSERT_TRUE(source_.store()->Put("k", absl::Cord("v2")).ok());
  EXPECT_EQ(*store->Read("k"), "v1");  // within the ttl
  absl::SleepFor(absl::Milliseconds(250));
  EXPECT_EQ(*store->Read("k"), "v2");
  EXPECT_EQ(store->stats().fills, 2u);
  // A caller that accepts older copies widens the window.
  ASSERT_TRUE(source_.store()->Put("k", absl::Cord("v3")).ok());
  absl::SleepFor(absl::Milliseconds(250));
  std::string buf(2, '\0');
  GetRequest lenient;
  lenient.key = "k";
  lenient.buffer = absl::MakeSpan(buf);
  lenient.max_staleness = absl::Hours(1);
  ASSERT_TRUE(store->Get(lenient).ok());
  EXPECT_EQ(buf, "v2");
}

TEST_F(TierStoreTest, HitsHonourRangesSinksAndConditions) {
  ASSERT_TRUE(source_.store()->Put("obj", absl::Cord("0123456789")).ok());
  auto store = Cached(source_.store(), MakeTier());
  ASSERT_TRUE(store->Read("obj").ok());  // fill
  EXPECT_EQ(*store->Read("obj", ByteRange::Of(2, 3)), "234");
  EXPECT_EQ(*store->Read("obj", ByteRange::Last(4)), "6789");
  EXPECT_EQ(store->Read("obj", ByteRange::From(10)).status().code(), absl::StatusCode::kOutOfRange);
  std::string small(3, '\0');
  GetRequest too_small;
  too_small.key = "obj";
  too_small.buffer = absl::MakeSpan(small);
  EXPECT_EQ(store->Get(too_small).status().code(), absl::StatusCode::kOutOfRange);

  auto etag = source_.store()->Head("obj")->etag;
  GetRequest same;
  same.key = "obj";
  same.buffer = absl::MakeSpan(small);
  same.if_none_match = etag;
  auto not_modified = store->Get(same);
  ASSERT_TRUE(not_modified.ok());
  EXPECT_TRUE(not_modified->not_modified);
  EXPECT_EQ(not_modified->meta.etag, etag);

  GetRequest wrong;
  wrong.key = "obj";
  std::string buf(10, '\0');
  wrong.buffer = absl::MakeSpan(buf);
  wrong.if_match = "not-the-etag";
  auto failed = store->Get(wrong);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_GE(store->stats().hits, 4u);
}

TEST_F(TierStoreTest, WritesThroughTheTierForgetItsCopy) {
  ASSERT_TRUE(source_.store()->Put("w", absl::Cord("old")).ok());
  auto store = Cached(source_.store(), MakeTier());
  EXPECT_EQ(*store->Read("w"), "old");
  ASSERT_TRUE(store->Put("w", absl::Cord("new")).ok());
  EXPECT_EQ(*store->Read("w"), "new");
  ASSERT_TRUE(store->Delete("w").ok());
  EXPECT_EQ(store->Read("w").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(*store->FillPath("w")));
}

TEST_F(TierStoreTest, KeysThatCannotBePathsBypassTheTier) {
  auto store = Cached(source_.store(), MakeTier());
  EXPECT_FALSE(store->FillPath("a/../../etc/passwd").has_value());
  EXPECT_FALSE(store->FillPath("a//b").has_value());
  EXPECT_FALSE(store->FillPath("dir/").has_value());
  EXPECT_TRUE(store->FillPath("a/b.c").has_value());
}

TEST_F(TierStoreTest, AnImportedTreeAnswersForItsSource) {
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(
        source_.store()->Put(absl::StrCat("ds/", i), absl::Cord(absl::StrCat("v", i))).ok());
  }
  auto tier = MakeTier();
  {
    auto tree = TierTreeStore::Open(tier, tier->root() + "/imported", Runtime::Default());
    ASSERT_TRUE(tree.ok());
    TransferOptions o;
    o.recursive = true;
    ASSERT_TRUE(Transfer({source_.store(), "ds/"}, {*tree, ""}, o).ok());
  }
  ASSERT_TRUE(tier->RecordImport({source_.store()->Uri("ds/"), "imported"}).ok());
  auto store = Cached(source_.store(), tier);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(*store->Read(absl::StrCat("ds/", i)), absl::StrCat("v", i));
  EXPECT_EQ(store->stats().hits, 5u);
  EXPECT_EQ(store->stats().fills, 0u);
}

// Every page of a listing through `store`, following continuation tokens.
std::vector<std::string> ListAllPages(ObjectStore& store, ListOptions options) {
  std::vector<std::string> out;
  std::string token;
  do {
    auto page = store.List(options, token);
    EXPECT_TRUE(page.ok()) << page.status();
    if (!page.ok()) break;
    for (const ObjectMeta& m : page->objects)
      out.push_back(absl::StrCat(m.key, " ", m.size, " ", m.etag));
    for (const std::string& p : page->common_prefixes) out.push_back(absl::StrCat(p, " (prefix)"));
    token = page->continuation;
  } while (!token.empty());
  return out;
}

TEST_F(TierStoreTest, ACompleteImportAnswersListingsOfItsSource) {
  std::vector<std::string> keys;
  for (int i = 0; i < 10; ++i) keys.push_back(absl::StrCat("ds/a/", i));
  for (int i = 0; i < 5; ++i) keys.push_back(absl::StrCat("ds/b/", i));
  keys.push_back("ds/c");
  for (const std::string& k : keys) {
    ASSERT_TRUE(source_.store()->Put(k, absl::Cord(absl::StrCat("bytes of ", k))).ok());
  }
  auto tier = MakeTier();
  {
    auto tree = TierTreeStore::Open(tier, tier->root() + "/imported", Runtime::Default());
    ASSERT_TRUE(tree.ok());
    TransferOptions o;
    o.recursive = true;
    ASSERT_TRUE(Transfer({source_.store(), "ds/"}, {*tree, ""}, o).ok());
  }
  TierImport import{.source = source_.store()->Uri("ds/"), .dir = "imported"};
  import.completed = absl::Now();
  import.objects = keys.size();
  ASSERT_TRUE(tier->RecordImport(import).ok());
  const std::vector<ListOptions> cases = {
      {.prefix = "ds/", .page_size = 4},
      {.prefix = "ds/", .delimiter = "/", .page_size = 1},
      {.prefix = "ds/a/", .page_size = 3},
      {.prefix = "ds/", .start_after = "ds/a/3", .end_before = "ds/b/2", .page_size = 2},
      {.prefix = "ds/b", .delimiter = "/", .page_size = 1000},
  };
  std::vector<std::vector<std::string>> expected;
  for (const ListOptions& c : cases) expected.push_back(ListAllPages(*source_.store(), c));
  ASSERT_EQ(expected[0].size(), keys.size());

  // The source gains an object: the tier, a snapshot of it, answers without it.
  ASSERT_TRUE(source_.store()->Put("ds/d", absl::Cord("new")).ok());
  {
    auto store = Cached(source_.store(), tier);
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(ListAllPages(*store, cases[i]), expected[i]) << "case " << i;
    }
    EXPECT_GT(store->stats().listed, 0u);
    // Prefixes outside the import go to the bucket.
    EXPECT_EQ(ListAllPages(*store, {.prefix = "ds"}).size(), keys.size() + 1);
  }
  // A file missing from the tree: the bucket answers (with the new object).
  ASSERT_EQ(unlink((tier->root() + "/imported/b/3").c_str()), 0);
  {
    auto store = Cached(source_.store(), tier);
    EXPECT_EQ(ListAllPages(*store, cases[0]).size(), keys.size() + 1);
    EXPECT_EQ(store->stats().listed, 0u);
  }
  // So does an import whose last run did not complete.
  import.completed = absl::InfinitePast();
  ASSERT_TRUE(tier->RecordImport(import).ok());
  {
    auto store = Cached(source_.store(), tier);
    EXPECT_EQ(ListAllPages(*store, cases[0]).size(), keys.size() + 1);
    EXPECT_EQ(store->stats().listed, 0u);
  }
}

TEST_F(TierStoreTest, ConcurrentMissesInOneProcessFetchOnce) {
  ASSERT_TRUE(source_.store()->Put("hot", absl::Cord(std::string(100000, 'h'))).ok());
  auto slow = std::make_shared<DelayedGetStore>(source_.store(), absl::Milliseconds(200));
  auto store = Cached(slow, MakeTier());
  std::vector<std::thread> readers;
  absl::Mutex mu;
  int ok = 0;
  for (int i = 0; i < 8; ++i) {
    readers.emplace_back([&] {
      auto data = store->Read("hot");
      absl::MutexLock lock(&mu);
      if (data.ok() && data->size() == 100000) ++ok;
    });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(ok, 8);
  EXPECT_EQ(store->stats().fills, 1u);
  EXPECT_EQ(slow->gets(), 1);
}

// N processes miss the same object at once: one fetches it; and a filler killed with -9
// mid-fetch blocks no one.
TEST_F(TierStoreTest, ProcessesShareOneFillAndAKilledFillerBlocksNoOne) {
  ASSERT_TRUE(source_.store()->Put("shared", absl::Cord(std::string(50000, 's'))).ok());
  auto tier = MakeTier();
  const std::string tier_root = tier->root();
  // A child opens its own stores: the parent's threads do not survive fork().
  auto child_source = [&](absl::Duration delay) {
    auto runtime = std::make_shared<Runtime>();
    auto local = LocalStore::Open(source_.root(), runtime);
    return std::make_pair(
        std::make_shared<DelayedGetStore>(std::shared_ptr<ObjectStore>(*std::move(local)), delay),
        runtime);
  };
  auto child_read = [&](absl::Duration delay) -> pid_t {
    const pid_t pid = fork();
    if (pid != 0) return pid;
    auto t = Tier::Find(tier_root);
    auto [slow, runtime] = child_source(delay);
    auto s = TierStore::Open(slow, *t, runtime);
    auto data = (*s)->Read("shared");
    if (!data.ok() || data->size() != 50000) _exit(100);
    _exit(static_cast<int>((*s)->stats().fills));  // 1 when this child fetched
  };
  std::vector<pid_t> children;
  for (int i = 0; i < 4; ++i) children.push_back(child_read(absl::Milliseconds(300)));
  int fills = 0;
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_NE(WEXITSTATUS(status), 100) << "a reader failed";
    fills += WEXITSTATUS(status);
  }
  EXPECT_EQ(fills, 1);

  ASSERT_TRUE(source_.store()->Put("victim", absl::Cord("v")).ok());
  const pid_t filler = fork();
  if (filler == 0) {
    auto t = Tier::Find(tier_root);
    auto [slow, runtime] = child_source(absl::Seconds(30));
    auto s = TierStore::Open(slow, *t, runtime);
    (void)(*s)->Read("victim");
    _exit(0);
  }
  absl::SleepFor(absl::Milliseconds(300));  // it holds the stripe, waiting for its GET
  kill(filler, SIGKILL);
  int status;
  ASSERT_EQ(waitpid(filler, &status, 0), filler);
  auto store = Cached(source_.store(), tier);
  EXPECT_EQ(*store->Read("victim"), "v");
  EXPECT_EQ(store->stats().fills, 1u);
  auto garbage = tier->CollectGarbage();
  ASSERT_TRUE(garbage.ok());
  EXPECT_GE(garbage->owners, 1u) << "the killed filler's temporary directory";
}

}  // namespace
}  // namespace wharf
