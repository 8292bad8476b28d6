// The tier as a read-through cache: misses fill whole objects once (across threads and
// processes, a killed filler blocking no one), hits are served from the tier with every read
// option, writes through it forget the tier's copy, imported trees answer for their source.
#include "tier/tier_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/crc32c.h"
#include "base/file_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/transfer.h"
#include "store/local/temp_object.h"
#include "store/testing/delayed_get_store.h"
#include "store/testing/memory_store.h"
#include "store/testing/random_bytes.h"
#include "store/testing/temp_store.h"
#include "tier/evict.h"
#include "tier/tree_store.h"

namespace wharf {
namespace {

using store_testing::DelayedGetStore;
using store_testing::MemoryStore;
using store_testing::RandomBytes;
using store_testing::TempStore;
using ::testing::HasSubstr;

// Runs `child` in `n` forked processes at once (each opens its own stores: the parent's
// threads do not survive fork()); the sum of their exit codes, or -1 when one failed (exit
// code 100) or did not exit.
int SumOfForkedChildren(int n, const std::function<int()>& child) {
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = fork();
    if (pid == 0) _exit(child());
    pids.push_back(pid);
  }
  int sum = 0;
  bool failed = false;
  for (pid_t pid : pids) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) == 100) {
      failed = true;
    } else {
      sum += WEXITSTATUS(status);
    }
  }
  return failed ? -1 : sum;
}

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

  // Copies the source's "ds/" objects into the tier's tree "imported" (what an import does).
  void ImportDs(const std::shared_ptr<Tier>& tier) {
    auto tree = TierTreeStore::Open(tier, tier->root() + "/imported", Runtime::Default());
    ASSERT_TRUE(tree.ok());
    TransferOptions o;
    o.recursive = true;
    ASSERT_TRUE(Transfer({source_.store(), "ds/"}, {*tree, ""}, o).ok());
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

// A cold read of a whole object into a buffer gets the bytes there as they arrive, and the
// tier's copy is written from that buffer: the answer and the entry hold the same bytes, for
// an object kept whole in memory and one above that size, and a buffer too small for the
// object fails the read (OutOfRange) without damaging the entry it filled.
TEST_F(TierStoreTest, AFillIntoTheReadersBufferAnswersAndFillsTheSameBytes) {
  auto store = Cached(source_.store(), MakeTier());
  for (const uint64_t size : {uint64_t{0}, uint64_t{300} << 10, uint64_t{3} << 20}) {
    const std::string key = absl::StrCat("buf/", size);
    const std::string data = RandomBytes(size, size + 1);
    ASSERT_TRUE(source_.store()->Put(key, absl::Cord(data)).ok());
    std::string buf(size, 'x');
    GetRequest get;
    get.key = key;
    get.buffer = absl::MakeSpan(buf);
    auto got = store->Get(get);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->bytes, size);
    EXPECT_TRUE(buf == data) << size;
    const std::string path = *store->FillPath(key);
    auto file = ReadFileToString(path, "the entry");
    ASSERT_TRUE(file.ok());
    EXPECT_TRUE(*file == data) << size;
    auto entry = ReadEntryAttr(path);
    ASSERT_TRUE(entry.has_value());
    EXPECT_EQ(entry->crc32c, Crc32cHex(Crc32c(data)));
  }
  const std::string data = RandomBytes(200 << 10, 7);
  ASSERT_TRUE(source_.store()->Put("buf/big", absl::Cord(data)).ok());
  std::string small(100 << 10, '\0');
  GetRequest get;
  get.key = "buf/big";
  get.buffer = absl::MakeSpan(small);
  EXPECT_EQ(store->Get(get).status().code(), absl::StatusCode::kOutOfRange);
  const uint64_t fills = store->stats().fills;
  auto again = store->Read("buf/big");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*again == data);
  EXPECT_EQ(store->stats().fills, fills);  // served by the entry the failed read filled

  // A cold read with an If-None-Match that matches: not modified, the buffer untouched.
  ASSERT_TRUE(source_.store()->Put("buf/same", absl::Cord(data)).ok());
  std::string untouched(200 << 10, 'u');
  GetRequest same;
  same.key = "buf/same";
  same.buffer = absl::MakeSpan(untouched);
  same.if_none_match = source_.store()->Head("buf/same")->etag;
  auto not_modified = store->Get(same);
  ASSERT_TRUE(not_modified.ok()) << not_modified.status();
  EXPECT_TRUE(not_modified->not_modified);
  EXPECT_EQ(untouched, std::string(200 << 10, 'u'));
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
  ImportDs(tier);
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
  ImportDs(tier);
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
  // The first walk kept the listing beside the import's record: later processes read it
  // instead of walking the tree. So a file gone from the tree since (evicted, removed) is
  // still listed, as the source listed it, and read through from the bucket.
  EXPECT_TRUE(std::filesystem::exists(tier->ImportListingPath(import)));
  ASSERT_EQ(unlink((tier->root() + "/imported/b/3").c_str()), 0);
  {
    auto store = Cached(source_.store(), tier);
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(ListAllPages(*store, cases[i]), expected[i]) << "case " << i;
    }
    EXPECT_GT(store->stats().listed, 0u);
    auto data = store->Read("ds/b/3");
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(*data, "bytes of ds/b/3");
  }
  // A kept listing that does not parse is walked again (and the walk finds the tree short).
  ASSERT_TRUE(WriteFileAtomically(tier->ImportListingPath(import), "{\"format\": 1\n\x01").ok());
  {
    auto store = Cached(source_.store(), tier);
    // The read above filled the read-through area, which the walk does not count.
    ASSERT_EQ(unlink(store->FillPath("ds/b/3").value_or("").c_str()), 0);
    EXPECT_EQ(ListAllPages(*store, cases[0]).size(), keys.size() + 1);
    EXPECT_EQ(store->stats().listed, 0u);
  }
  // A new run of the import (a new completion time) does not use the old run's listing: its
  // tree is walked, is short of a file, and the bucket answers (with the new object).
  import.completed = absl::Now() + absl::Seconds(1);
  ASSERT_TRUE(tier->RecordImport(import).ok());
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

// A read waiting for another read's fill of the same object (in this process) ends as soon as
// it is cancelled, by its request's token or by its caller's ambient token (Ctrl-C in Python),
// not when the fill ends; the fill goes on and keeps the object.
TEST_F(TierStoreTest, AReadWaitingForAnotherReadsFillEndsWhenCancelled) {
  ASSERT_TRUE(source_.store()->Put("hot", absl::Cord(std::string(100000, 'h'))).ok());
  auto slow = std::make_shared<DelayedGetStore>(source_.store(), absl::Seconds(3));
  auto store = Cached(slow, MakeTier());
  absl::Notification filled;
  absl::StatusOr<absl::Cord> filler_result;
  std::thread filler([&] {
    filler_result = store->Read("hot");
    filled.Notify();
  });
  while (slow->gets() == 0) absl::SleepFor(absl::Milliseconds(5));  // the fill has started

  for (const bool ambient : {false, true}) {
    SCOPED_TRACE(ambient ? "the ambient token" : "the request's token");
    CancelToken token = NewCancelToken();
    GetRequest waiting;
    waiting.key = "hot";
    if (!ambient) waiting.cancel = token;
    absl::Notification done;
    absl::StatusOr<GetResult> result;
    {
      ScopedAmbientCancel scope(ambient ? token : nullptr);
      store->GetAsync(waiting, [&](absl::StatusOr<GetResult> r) {
        result = std::move(r);
        done.Notify();
      });
    }
    absl::SleepFor(absl::Milliseconds(100));  // parked behind the fill
    EXPECT_FALSE(done.HasBeenNotified());
    token->Cancel();
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(2)));
    EXPECT_FALSE(filled.HasBeenNotified());  // it did not wait for the fill
    EXPECT_TRUE(absl::IsCancelled(result.status())) << result.status();
    EXPECT_THAT(result.status().message(), HasSubstr("hot"));
  }
  filler.join();
  ASSERT_TRUE(filler_result.ok()) << filler_result.status();
  EXPECT_EQ(filler_result->size(), 100000u);
  EXPECT_EQ(store->stats().fills, 1u);
  auto again = store->Read("hot");  // from the tier
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->size(), 100000u);
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
  const int fills = SumOfForkedChildren(4, [&] {
    auto t = Tier::Find(tier_root);
    auto [slow, runtime] = child_source(absl::Milliseconds(300));
    auto s = TierStore::Open(slow, *t, runtime);
    auto data = (*s)->Read("shared");
    if (!data.ok() || data->size() != 50000) return 100;
    return static_cast<int>((*s)->stats().fills);  // 1 when this child fetched
  });
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

// Counts what reaches the bucket: GETs (and the bytes they delivered, and their ranges) and
// HEADs.
class CountingStore : public ForwardingStore {
 public:
  explicit CountingStore(std::shared_ptr<ObjectStore> inner) : ForwardingStore(std::move(inner)) {}
  void GetAsync(GetRequest request, Callback<GetResult> done) override {
    {
      absl::MutexLock lock(&mu_);
      ++gets_;
      ranges_.push_back(request.range.is_all() ? "all" : request.range.ToHttp());
    }
    ForwardingStore::GetAsync(std::move(request),
                              [this, done = std::move(done)](absl::StatusOr<GetResult> r) mutable {
                                if (r.ok()) {
                                  absl::MutexLock lock(&mu_);
                                  bytes_ += r->bytes;
                                }
                                std::move(done)(std::move(r));
                              });
  }
  void HeadAsync(std::string key, Callback<ObjectMeta> done) override {
    {
      absl::MutexLock lock(&mu_);
      ++heads_;
    }
    ForwardingStore::HeadAsync(std::move(key), std::move(done));
  }
  int gets() {
    absl::MutexLock lock(&mu_);
    return gets_;
  }
  int heads() {
    absl::MutexLock lock(&mu_);
    return heads_;
  }
  uint64_t bytes() {
    absl::MutexLock lock(&mu_);
    return bytes_;
  }
  std::vector<std::string> ranges() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out = ranges_;
    std::sort(out.begin(), out.end());
    return out;
  }
  void Reset() {
    absl::MutexLock lock(&mu_);
    gets_ = heads_ = 0;
    bytes_ = 0;
    ranges_.clear();
  }

 private:
  absl::Mutex mu_;
  int gets_ ABSL_GUARDED_BY(mu_) = 0;
  int heads_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> ranges_ ABSL_GUARDED_BY(mu_);
};

constexpr uint64_t kBlock = 256 << 10;
constexpr uint64_t kBig = 12 * kBlock;  // 3 MiB: 12 blocks

TierConfig SmallBlocks() {
  TierConfig config;
  config.block_size = kBlock;
  config.block_threshold = 1 << 20;
  return config;
}

std::vector<std::string> FilesBelow(const std::string& dir) {
  std::vector<std::string> out;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out.push_back(e.path().string().substr(dir.size() + 1));
  }
  std::sort(out.begin(), out.end());
  return out;
}

class TierBlocksTest : public TierStoreTest {
 protected:
  void SetUp() override {
    memory_ = std::make_shared<MemoryStore>();
    bucket_ = std::make_shared<CountingStore>(memory_);
  }
  std::string BlocksDir(TierStore& store, const std::string& key) {
    return *store.FillPath(key) + kTierBlocksSuffix;
  }
  std::shared_ptr<MemoryStore> memory_;
  std::shared_ptr<CountingStore> bucket_;
};

TEST_F(TierBlocksTest, ARangedReadOfABigObjectFetchesAndKeepsOnlyItsBlocks) {
  const std::string data = RandomBytes(kBig, 1);
  ASSERT_TRUE(memory_->Put("big.bin", absl::Cord(data)).ok());
  auto store = Cached(bucket_, MakeTier(SmallBlocks()));
  // Bytes [300000, 900000): blocks 1, 2 and 3.
  auto part = store->Read("big.bin", ByteRange::Of(300000, 600000));
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(*part, data.substr(300000, 600000));
  EXPECT_EQ(bucket_->heads(), 1);  // the size, to tell blocks from a whole copy
  EXPECT_EQ(bucket_->gets(), 3);
  EXPECT_EQ(bucket_->bytes(), 3 * kBlock);
  EXPECT_THAT(bucket_->ranges(),
              ::testing::ElementsAre("262144-524287", "524288-786431", "786432-1048575"));
  EXPECT_EQ(store->stats().block_fills, 3u);
  EXPECT_EQ(store->stats().fill_bytes, 3 * kBlock);
  EXPECT_FALSE(std::filesystem::exists(*store->FillPath("big.bin")));  // no whole copy
  const std::string version = TierBlockVersionDir(memory_->Head("big.bin")->etag);
  EXPECT_THAT(FilesBelow(BlocksDir(*store, "big.bin")),
              ::testing::ElementsAre(version + "/1", version + "/2", version + "/3"));
  auto entry = ReadEntryAttr(BlocksDir(*store, "big.bin") + "/" + version + "/2");
  ASSERT_TRUE(entry.has_value());
  EXPECT_TRUE(entry->block);
  EXPECT_EQ(entry->block_offset, 2 * kBlock);
  EXPECT_EQ(entry->object_size, kBig);
  EXPECT_EQ(entry->size, kBlock);
  EXPECT_EQ(entry->source, memory_->Uri("big.bin"));

  // Again, and any range inside those blocks: nothing reaches the bucket, HEAD included.
  bucket_->Reset();
  EXPECT_EQ(*store->Read("big.bin", ByteRange::Of(300000, 600000)), data.substr(300000, 600000));
  EXPECT_EQ(*store->Read("big.bin", ByteRange::Of(kBlock, 10)), data.substr(kBlock, 10));
  auto head = store->Head("big.bin");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->size, kBig);
  EXPECT_EQ(bucket_->gets() + bucket_->heads(), 0);
  EXPECT_EQ(store->stats().hits, 2u);

  // A whole read fetches the 9 other blocks and assembles the object, into a buffer and into
  // a sink; a suffix read is served from the blocks.
  auto whole = store->Read("big.bin");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(*whole == data);
  EXPECT_EQ(bucket_->gets(), 9);
  EXPECT_EQ(bucket_->bytes(), 9 * kBlock);
  EXPECT_EQ(FilesBelow(BlocksDir(*store, "big.bin")).size(), 12u);
  bucket_->Reset();
  std::string buf(kBig, '\0');
  GetRequest into;
  into.key = "big.bin";
  into.buffer = absl::MakeSpan(buf);
  auto got = store->Get(into);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->bytes, kBig);
  EXPECT_TRUE(buf == data);
  EXPECT_EQ(*store->Read("big.bin", ByteRange::Last(5)), data.substr(kBig - 5));
  EXPECT_EQ(store->Read("big.bin", ByteRange::From(kBig)).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(bucket_->gets(), 0);
  // if_match on another version refills (and fails as the bucket does).
  GetRequest wrong;
  wrong.key = "big.bin";
  wrong.buffer = absl::MakeSpan(buf);
  wrong.if_match = "not-the-etag";
  EXPECT_EQ(store->Get(wrong).status().code(), absl::StatusCode::kFailedPrecondition);

  // After a HEAD through the tier (as ObjectReader opens an object), a ranged read with that
  // ETag does not ask for the size again.
  ASSERT_TRUE(memory_->Put("other.bin", absl::Cord(data)).ok());
  bucket_->Reset();
  auto meta = store->Head("other.bin");
  ASSERT_TRUE(meta.ok());
  std::string two(2 * kBlock, '\0');
  GetRequest ranged;
  ranged.key = "other.bin";
  ranged.range = ByteRange::Of(kBlock, 2 * kBlock);
  ranged.buffer = absl::MakeSpan(two);
  ranged.if_match = meta->etag;
  ASSERT_TRUE(store->Get(ranged).ok());
  EXPECT_TRUE(two == data.substr(kBlock, 2 * kBlock));
  EXPECT_EQ(bucket_->heads(), 1);
  EXPECT_EQ(bucket_->gets(), 2);
}

// `tier gc` removes what in the read-through area is not a complete entry (a stray file, a
// copy cut short) and nothing else: whole copies and blocks stay, and read from the tier.
TEST_F(TierBlocksTest, GcRemovesOrphansOfTheReadThroughAreaAndNoEntry) {
  const std::string big = RandomBytes(kBig, 7);
  ASSERT_TRUE(memory_->Put("big.bin", absl::Cord(big)).ok());
  ASSERT_TRUE(memory_->Put("small", absl::Cord(std::string(5000, 's'))).ok());
  ASSERT_TRUE(memory_->Put("cut", absl::Cord(std::string(5000, 'c'))).ok());
  auto tier = MakeTier(SmallBlocks());
  auto store = Cached(bucket_, tier);
  ASSERT_TRUE(store->Read("big.bin", ByteRange::Of(300000, 600000)).ok());
  ASSERT_TRUE(store->Read("small").ok());
  ASSERT_TRUE(store->Read("cut").ok());
  const std::string stray = tier->MetaPath("objects/stray");
  ASSERT_TRUE(WriteFileAtomically(stray, "junk").ok());
  ASSERT_EQ(truncate(store->FillPath("cut")->c_str(), 100), 0);  // its entry says 5000 bytes
  const std::vector<std::string> before = FilesBelow(tier->MetaPath("objects"));

  auto removed = CollectOrphans(*tier);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 2u);
  std::vector<std::string> left = FilesBelow(tier->MetaPath("objects"));
  EXPECT_EQ(left.size(), before.size() - 2);
  EXPECT_FALSE(std::filesystem::exists(stray));
  EXPECT_FALSE(std::filesystem::exists(*store->FillPath("cut")));
  EXPECT_TRUE(std::filesystem::exists(*store->FillPath("small")));
  EXPECT_EQ(FilesBelow(BlocksDir(*store, "big.bin")).size(), 3u);
  bucket_->Reset();
  ASSERT_TRUE(store->Read("small").ok());
  ASSERT_TRUE(store->Read("big.bin", ByteRange::Of(300000, 600000)).ok());
  EXPECT_EQ(bucket_->gets(), 0);  // both from the tier
  auto again = CollectOrphans(*tier);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0u);
}

TEST_F(TierBlocksTest, ABlockTheTierCannotKeepSendsTheRestOfTheReadAroundIt) {
  const std::string data = RandomBytes(kBig, 5);
  ASSERT_TRUE(memory_->Put("big.bin", absl::Cord(data)).ok());
  auto store = Cached(bucket_, MakeTier(SmallBlocks()));
  // A folder where block 2's file goes: its publish fails (as on a full disk, a lock or a
  // temporary file the file system refuses).
  const std::string version = TierBlockVersionDir(memory_->Head("big.bin")->etag);
  const std::string blocks = BlocksDir(*store, "big.bin") + "/" + version;
  std::filesystem::create_directories(blocks + "/2");

  // Blocks 0 and 1 are served from the tier, the rest of the read from one GET around it.
  auto part = store->Read("big.bin", ByteRange::Of(kBlock / 2, 5 * kBlock));
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_TRUE(*part == data.substr(kBlock / 2, 5 * kBlock));
  EXPECT_EQ(store->stats().bypassed, 1u);
  EXPECT_THAT(bucket_->ranges(), ::testing::Contains("524288-1441791"));  // [2 blocks, 5.5 blocks)
  EXPECT_TRUE(std::filesystem::is_regular_file(blocks + "/1"));
  EXPECT_TRUE(std::filesystem::is_directory(blocks + "/2"));

  // Into a buffer: the rest lands at its place.
  std::string buf(3 * kBlock, '\0');
  GetRequest into;
  into.key = "big.bin";
  into.range = ByteRange::Of(kBlock + 10, 3 * kBlock);
  into.buffer = absl::MakeSpan(buf);
  auto got = store->Get(into);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->bytes, 3 * kBlock);
  EXPECT_EQ(got->offset, kBlock + 10);
  EXPECT_EQ(got->meta.size, kBig);
  EXPECT_TRUE(buf == data.substr(kBlock + 10, 3 * kBlock));
  EXPECT_EQ(store->stats().bypassed, 2u);

  // A whole read; and one that starts past the block is served from the tier's blocks.
  auto whole = store->Read("big.bin");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(*whole == data);
  EXPECT_EQ(store->stats().bypassed, 3u);
  bucket_->Reset();
  EXPECT_TRUE(*store->Read("big.bin", ByteRange::Of(3 * kBlock, kBlock)) ==
              data.substr(3 * kBlock, kBlock));
  EXPECT_EQ(bucket_->gets(), 0);
  // A failure of the source itself is not read around: it fails the read.
  ASSERT_TRUE(memory_->Delete("big.bin").ok());
  std::filesystem::remove_all(BlocksDir(*store, "big.bin"));
  EXPECT_EQ(store->Read("big.bin", ByteRange::Of(0, 10)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(TierBlocksTest, AnObjectTheTierCannotKeepIsReadAroundItWithoutFillingAgain) {
  // "e/a" is a file in the tier, so "e/a/b" cannot be (one path cannot be both); 2 MiB, over
  // what a fill keeps in memory, so its failed fill costs a second GET around the tier.
  const std::string big = RandomBytes(2 << 20, 7);
  ASSERT_TRUE(memory_->Put("e/a", absl::Cord("file e/a")).ok());
  ASSERT_TRUE(memory_->Put("e/a/b", absl::Cord(big)).ok());
  auto store = Cached(bucket_, MakeTier());
  ASSERT_EQ(*store->Read("e/a"), "file e/a");
  bucket_->Reset();
  auto first = store->Read("e/a/b");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(*first == big);
  EXPECT_EQ(bucket_->gets(), 2);  // the fill, then the read around the tier
  EXPECT_EQ(store->stats().bypassed, 1u);
  // Later reads (whole and ranged) go around at once: one GET each, no fill.
  bucket_->Reset();
  for (int i = 0; i < 3; ++i) {
    auto again = store->Read("e/a/b");
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(*again == big);
  }
  EXPECT_EQ(*store->Read("e/a/b", ByteRange::Of(10, 5)), big.substr(10, 5));
  EXPECT_EQ(bucket_->gets(), 4);
  EXPECT_EQ(store->stats().bypassed, 5u);
  // Other objects still fill.
  ASSERT_TRUE(memory_->Put("f", absl::Cord("file f")).ok());
  ASSERT_EQ(*store->Read("f"), "file f");
  EXPECT_TRUE(std::filesystem::exists(*store->FillPath("f")));
}

class AppendingSink : public ReadSink {
 public:
  explicit AppendingSink(std::string* out) : out_(out) {}
  absl::Status Append(absl::string_view chunk) override {
    out_->append(chunk.data(), chunk.size());
    return absl::OkStatus();
  }

 private:
  std::string* const out_;
};

// A read through a store, failed after `seconds` instead of hanging the test.
absl::StatusOr<std::string> ReadWithin(ObjectStore& store, const std::string& key, ByteRange range,
                                       int seconds) {
  struct Outcome {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::StatusOr<GetResult> got ABSL_GUARDED_BY(mu);
    std::string buf;
  };
  auto o = std::make_shared<Outcome>();
  auto sink = std::make_shared<AppendingSink>(&o->buf);
  GetRequest req;
  req.key = key;
  req.range = range;
  req.sink = sink.get();
  store.GetAsync(std::move(req), [o, sink](absl::StatusOr<GetResult> got) {
    absl::MutexLock lock(&o->mu);
    o->got = std::move(got);
    o->done = true;
  });
  absl::MutexLock lock(&o->mu);
  if (!o->mu.AwaitWithTimeout(absl::Condition(&o->done), absl::Seconds(seconds))) {
    return absl::DeadlineExceededError(absl::StrCat("read of ", key, " did not end"));
  }
  if (!o->got.ok()) return o->got.status();
  return o->buf;
}

TEST_F(TierBlocksTest, AReadBiggerThanTheTiersBoundEndsAndIsEvictedAfter) {
  const std::string data = RandomBytes(kBig, 8);
  const std::string whole = RandomBytes(1 << 20, 9);  // one whole entry, at the threshold
  ASSERT_TRUE(memory_->Put("big.bin", absl::Cord(data)).ok());
  ASSERT_TRUE(memory_->Put("whole.bin", absl::Cord(whole)).ok());
  TierConfig config = SmallBlocks();
  config.max_size = 2 * kBlock;  // less than one read's window of blocks, or one entry
  auto tier = MakeTier(config);
  auto store = Cached(bucket_, tier);
  // Eviction cannot take what the read itself holds: the read still ends, over the bound.
  auto got = ReadWithin(*store, "big.bin", ByteRange::All(), 60);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == data);
  got = ReadWithin(*store, "whole.bin", ByteRange::All(), 60);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == whole);
  got = ReadWithin(*store, "big.bin", ByteRange::Of(5 * kBlock, 3 * kBlock), 60);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == data.substr(5 * kBlock, 3 * kBlock));
  // Once nothing is being read, a pass brings the tier within its bound.
  std::string warning;
  auto pass = EvictToBounds(*tier, /*wait=*/true, &warning);
  ASSERT_TRUE(pass.ok()) << pass.status();
  EXPECT_LE(pass->disk_bytes - pass->evicted_disk_bytes, config.max_size);
}

TEST_F(TierBlocksTest, AWholeReadOfAnUnknownBigObjectIsCutIntoBlocks) {
  const std::string data = RandomBytes(kBig + 1000, 2);  // a short last block
  ASSERT_TRUE(memory_->Put("big.bin", absl::Cord(data)).ok());
  ASSERT_TRUE(memory_->Put("small.bin", absl::Cord(std::string(1 << 20, 's'))).ok());
  auto store = Cached(bucket_, MakeTier(SmallBlocks()));
  auto whole = store->Read("big.bin");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(*whole == data);
  EXPECT_EQ(bucket_->gets(), 1);  // one GET, no HEAD
  EXPECT_EQ(bucket_->heads(), 0);
  EXPECT_EQ(FilesBelow(BlocksDir(*store, "big.bin")).size(), 13u);
  EXPECT_FALSE(std::filesystem::exists(*store->FillPath("big.bin")));
  // An object at the threshold is one whole entry.
  ASSERT_TRUE(store->Read("small.bin").ok());
  EXPECT_TRUE(std::filesystem::exists(*store->FillPath("small.bin")));
  EXPECT_FALSE(std::filesystem::exists(BlocksDir(*store, "small.bin")));
  bucket_->Reset();
  EXPECT_EQ(*store->Read("big.bin", ByteRange::Of(kBig, 1000)), data.substr(kBig));
  EXPECT_EQ(*store->Read("small.bin", ByteRange::Of(5, 5)), "sssss");
  EXPECT_EQ(bucket_->gets() + bucket_->heads(), 0);
  // Writes through the tier forget the blocks too.
  ASSERT_TRUE(store->Put("big.bin", absl::Cord("now small")).ok());
  EXPECT_FALSE(std::filesystem::exists(BlocksDir(*store, "big.bin")));
  EXPECT_EQ(*store->Read("big.bin"), "now small");
}

TEST_F(TierBlocksTest, AChangedSourceNeverMixesBlocksOfTwoVersions) {
  TierConfig config = SmallBlocks();
  config.mode = TierConfig::Mode::kTtl;
  config.ttl = absl::Milliseconds(300);
  auto store = Cached(bucket_, MakeTier(config));
  const std::string v1 = RandomBytes(kBig, 3), v2 = RandomBytes(kBig, 4);
  ASSERT_TRUE(memory_->Put("big.bin", absl::Cord(v1)).ok());
  const std::string e1 = memory_->Head("big.bin")->etag;
  EXPECT_EQ(*store->Read("big.bin", ByteRange::Of(0, 2 * kBlock)), v1.substr(0, 2 * kBlock));
  // The source changes (same size). Within the ttl, a read that needs a block not yet here
  // finds that block's version gone (If-Match fails), looks the object up again and reads
  // every block of the new version: never block 1 of v1 with block 2 of v2.
  ASSERT_TRUE(memory_->Put("big.bin", absl::Cord(v2)).ok());
  const std::string e2 = memory_->Head("big.bin")->etag;
  auto mixed = store->Read("big.bin", ByteRange::Of(kBlock, 2 * kBlock));
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_TRUE(*mixed == v2.substr(kBlock, 2 * kBlock));
  // The old version's blocks were removed when the new one was filled.
  const std::string blocks = BlocksDir(*store, "big.bin");
  EXPECT_FALSE(std::filesystem::exists(blocks + "/" + TierBlockVersionDir(e1)));
  EXPECT_THAT(FilesBelow(blocks), ::testing::ElementsAre(TierBlockVersionDir(e2) + "/1",
                                                         TierBlockVersionDir(e2) + "/2"));

  // Past the ttl and unchanged: a HEAD confirms the version, no block is fetched again.
  absl::SleepFor(absl::Milliseconds(350));
  bucket_->Reset();
  EXPECT_TRUE(*store->Read("big.bin", ByteRange::Of(kBlock, 2 * kBlock)) ==
              v2.substr(kBlock, 2 * kBlock));
  EXPECT_EQ(bucket_->heads(), 1);
  EXPECT_EQ(bucket_->gets(), 0);
  // Past the ttl and changed: the new version is read.
  const std::string v3 = RandomBytes(kBig, 5);
  ASSERT_TRUE(memory_->Put("big.bin", absl::Cord(v3)).ok());
  absl::SleepFor(absl::Milliseconds(350));
  EXPECT_TRUE(*store->Read("big.bin", ByteRange::Of(kBlock, 2 * kBlock)) ==
              v3.substr(kBlock, 2 * kBlock));
  auto whole = store->Read("big.bin");
  ASSERT_TRUE(whole.ok());
  EXPECT_TRUE(*whole == v3);
}

TEST_F(TierBlocksTest, ImmutableBlocksOfAVersionGoneAreReadAgainAndGcRemovesOldVersions) {
  auto tier = MakeTier(SmallBlocks());
  auto store = Cached(bucket_, tier);
  const std::string v1 = RandomBytes(kBig, 6), v2 = RandomBytes(kBig, 7);
  ASSERT_TRUE(memory_->Put("big.bin", absl::Cord(v1)).ok());
  const std::string e1 = memory_->Head("big.bin")->etag;
  EXPECT_EQ(*store->Read("big.bin", ByteRange::Of(0, kBlock)), v1.substr(0, kBlock));
  ASSERT_TRUE(memory_->Put("big.bin", absl::Cord(v2)).ok());
  // The cached block answers (immutable); a read needing another block gets one version.
  EXPECT_EQ(*store->Read("big.bin", ByteRange::Of(0, kBlock)), v1.substr(0, kBlock));
  const std::string blocks = BlocksDir(*store, "big.bin");
  // Held by a reader: the fill of the new version cannot remove it; gc later can.
  const std::string old_block = blocks + "/" + TierBlockVersionDir(e1) + "/0";
  const int reader = open(old_block.c_str(), O_RDONLY);
  ASSERT_GE(reader, 0);
  ASSERT_EQ(flock(reader, LOCK_SH), 0);
  auto both = store->Read("big.bin", ByteRange::Of(0, 2 * kBlock));
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_TRUE(*both == v2.substr(0, 2 * kBlock));
  EXPECT_TRUE(std::filesystem::exists(old_block));
  auto busy = CollectOldBlockVersions(*tier);
  ASSERT_TRUE(busy.ok());
  EXPECT_EQ(*busy, 0u);
  close(reader);
  auto collected = CollectOldBlockVersions(*tier);
  ASSERT_TRUE(collected.ok());
  EXPECT_EQ(*collected, 1u);
  EXPECT_FALSE(std::filesystem::exists(blocks + "/" + TierBlockVersionDir(e1)));
  EXPECT_EQ(FilesBelow(blocks).size(), 2u);
}

TEST_F(TierBlocksTest, APinFollowsABigObjectToItsNewVersionAndTheOldBlocksGo) {
  auto tier = MakeTier(SmallBlocks());
  auto store = Cached(bucket_, tier);
  const std::string v1 = RandomBytes(kBig, 20), v2 = RandomBytes(kBig, 21);
  ASSERT_TRUE(memory_->Put("big.bin", absl::Cord(v1)).ok());
  const std::string e1 = memory_->Head("big.bin")->etag;
  EXPECT_EQ(*store->Read("big.bin", ByteRange::Of(0, kBlock)), v1.substr(0, kBlock));
  const std::string blocks = BlocksDir(*store, "big.bin");
  // What `wharf tier pin` does to a block: the block and its object's .blocks directory.
  ASSERT_TRUE(SetPinned(blocks + "/" + TierBlockVersionDir(e1) + "/0", true).ok());
  ASSERT_TRUE(SetPinned(blocks, true).ok());
  ASSERT_TRUE(memory_->Put("big.bin", absl::Cord(v2)).ok());
  const std::string e2 = memory_->Head("big.bin")->etag;
  auto both = store->Read("big.bin", ByteRange::Of(0, 2 * kBlock));
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_TRUE(*both == v2.substr(0, 2 * kBlock));
  EXPECT_FALSE(std::filesystem::exists(blocks + "/" + TierBlockVersionDir(e1)));
  EXPECT_THAT(FilesBelow(blocks), ::testing::ElementsAre(TierBlockVersionDir(e2) + "/0",
                                                         TierBlockVersionDir(e2) + "/1"));
  EXPECT_TRUE(IsPinned(blocks + "/" + TierBlockVersionDir(e2) + "/0"));
}

TEST_F(TierBlocksTest, EvictionTakesBlocksLeastRecentlyUsedFirstAndNeverOneBeingRead) {
  auto tier = MakeTier(SmallBlocks());
  auto store = Cached(bucket_, tier);
  const std::string data = RandomBytes(kBig, 8);
  ASSERT_TRUE(memory_->Put("big.bin", absl::Cord(data)).ok());
  const std::string version = TierBlockVersionDir(memory_->Head("big.bin")->etag);
  // Block 1 first, then 0 and 2 (blocks of one read are filled in parallel, in any order).
  ASSERT_TRUE(store->Read("big.bin", ByteRange::Of(kBlock, 10)).ok());
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(store->Read("big.bin", ByteRange::Of(0, 3 * kBlock)).ok());
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(store->Read("big.bin", ByteRange::Of(9 * kBlock, 3 * kBlock)).ok());  // 9-11
  const std::string blocks = BlocksDir(*store, "big.bin");
  // Down to four blocks: the older ones go, except block 1, which a reader holds (and which
  // counts as kept).
  const int reader = open((blocks + "/" + version + "/1").c_str(), O_RDONLY);
  ASSERT_GE(reader, 0);
  ASSERT_EQ(flock(reader, LOCK_SH), 0);
  // Targets count disk space (evict.h): four blocks' worth of it.
  struct stat block_st;
  ASSERT_EQ(fstat(reader, &block_st), 0);
  auto pass = EvictTo(*tier, tier->root(), 4 * DiskBytes(block_st));
  ASSERT_TRUE(pass.ok()) << pass.status();
  EXPECT_EQ(pass->entries, 6u);
  EXPECT_EQ(pass->kept_busy, 1u);
  EXPECT_EQ(pass->evicted, 2u);
  close(reader);
  EXPECT_THAT(FilesBelow(blocks), ::testing::ElementsAre(version + "/1", version + "/10",
                                                         version + "/11", version + "/9"));
  // Evicting the object's path (no whole copy) covers its blocks; a pinned object keeps
  // them, and the blocks filled later are pinned too.
  ASSERT_TRUE(SetPinned(blocks, true).ok());
  bucket_->Reset();
  EXPECT_EQ(*store->Read("big.bin", ByteRange::Of(4 * kBlock, 10)), data.substr(4 * kBlock, 10));
  EXPECT_EQ(bucket_->gets(), 1);  // block 4
  EXPECT_TRUE(IsPinned(blocks + "/" + version + "/4"));
  auto by_path = EvictTo(*tier, *store->FillPath("big.bin"), 0);
  ASSERT_TRUE(by_path.ok()) << by_path.status();
  EXPECT_EQ(by_path->entries, 5u);
  EXPECT_EQ(by_path->evicted, 4u);
  EXPECT_EQ(by_path->kept_pinned, 1u);
  EXPECT_THAT(FilesBelow(blocks), ::testing::ElementsAre(version + "/4"));
  // What was evicted is fetched again.
  bucket_->Reset();
  EXPECT_TRUE(*store->Read("big.bin") == data);
  EXPECT_EQ(bucket_->gets(), 11);
}

// N processes reading the same blocks of a big object at once fetch each block once.
TEST_F(TierStoreTest, ProcessesReadingTheSameBlocksFetchEachOnce) {
  const std::string data = RandomBytes(kBig, 9);
  ASSERT_TRUE(source_.store()->Put("big.bin", absl::Cord(data)).ok());
  auto tier = MakeTier(SmallBlocks());
  const std::string tier_root = tier->root();
  const int fills = SumOfForkedChildren(4, [&] {
    auto runtime = std::make_shared<Runtime>();
    auto local = LocalStore::Open(source_.root(), runtime);
    auto slow = std::make_shared<DelayedGetStore>(std::shared_ptr<ObjectStore>(*std::move(local)),
                                                  absl::Milliseconds(200));
    auto s = TierStore::Open(slow, *Tier::Find(tier_root), runtime);
    auto got = (*s)->Read("big.bin", ByteRange::Of(kBlock / 2, 4 * kBlock));
    if (!got.ok() || *got != data.substr(kBlock / 2, 4 * kBlock)) return 100;
    return static_cast<int>((*s)->stats().block_fills);
  });
  EXPECT_EQ(fills, 5);  // blocks 0-4, each by one process
}

}  // namespace
}  // namespace wharf
