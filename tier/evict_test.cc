// Eviction: least recently used first, never an entry being read, pinned, or local; the
// read-through store keeps the tier within its size bound by itself.
#include "tier/evict.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/testing/temp_store.h"
#include "tier/tier_store.h"
#include "tier/tree_store.h"

namespace wharf {
namespace {

using store_testing::TempStore;

class EvictTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tier = Tier::Init(dir_.root() + "/tier", config_);
    ASSERT_TRUE(tier.ok()) << tier.status();
    tier_ = *tier;
    auto tree = TierTreeStore::Open(tier_, tier_->root() + "/data", Runtime::Default());
    ASSERT_TRUE(tree.ok());
    tree_ = *tree;
  }
  // An entry of `size` bytes last used `age_seconds` ago.
  std::string Entry(const std::string& key, size_t size, int age_seconds, bool local = false) {
    PutOptions o;
    if (!local) {
      o.source_uri = "s3://b/" + key;
      o.source_etag = "etag-" + key;
    }
    EXPECT_TRUE(tree_->Put(key, absl::Cord(std::string(size, 'x')), o).ok());
    const std::string path = tier_->root() + "/data/" + key;
    const std::string when = absl::StrCat(absl::ToUnixSeconds(absl::Now()) + 3600 - age_seconds);
    // A future access time, so it outranks the fill time: the order is the test's.
    EXPECT_EQ(setxattr(path.c_str(), kTierAtimeXattr, when.data(), when.size(), 0), 0);
    return path;
  }

  TierConfig config_;
  TempStore dir_;
  std::shared_ptr<Tier> tier_;
  std::shared_ptr<TierTreeStore> tree_;
};

// The disk space the file at `path` takes (what eviction targets count).
uint64_t DiskBytesOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return DiskBytes(st);
}

TEST_F(EvictTest, LeastRecentlyUsedGoesFirstDownToTheTarget) {
  const std::string oldest = Entry("a", 1000, 300);
  const std::string middle = Entry("b", 1000, 200);
  const std::string newest = Entry("c", 1000, 100);
  const uint64_t oldest_disk = DiskBytesOf(oldest);
  auto r = EvictTo(*tier_, tier_->root(), DiskBytesOf(middle) + DiskBytesOf(newest));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->entries, 3u);
  EXPECT_EQ(r->bytes, 3000u);
  EXPECT_EQ(r->evicted, 1u);
  EXPECT_EQ(r->evicted_bytes, 1000u);
  EXPECT_EQ(r->evicted_disk_bytes, oldest_disk);
  EXPECT_FALSE(std::filesystem::exists(oldest));
  EXPECT_TRUE(std::filesystem::exists(middle));
  EXPECT_TRUE(std::filesystem::exists(newest));
  ASSERT_TRUE(EvictTo(*tier_, tier_->root(), 0).ok());
  EXPECT_FALSE(std::filesystem::exists(middle));
  EXPECT_FALSE(std::filesystem::exists(newest));
}

// A bound is disk space, not the entries' bytes: small objects take whole blocks (and, where
// their attributes do not fit in the inode, an attribute block too), so 10 entries of 10
// bytes are far over a bound of 5 blocks.
TEST_F(EvictTest, TargetsCountTheDiskSpaceEntriesTake) {
  std::vector<std::string> paths;
  uint64_t disk = 0;
  for (int i = 0; i < 10; ++i) {
    paths.push_back(Entry(absl::StrCat("small", i), 10, 1000 - i));
    disk += DiskBytesOf(paths.back());
  }
  ASSERT_GE(disk, 10u * 4096);  // at least a block each on any file system the tests use
  auto r = EvictTo(*tier_, tier_->root(), 5 * 4096);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes, 100u);
  EXPECT_EQ(r->disk_bytes, disk);
  EXPECT_GE(r->evicted, 5u);
  uint64_t left = 0;
  for (const std::string& p : paths) {
    if (std::filesystem::exists(p)) left += DiskBytesOf(p);
  }
  EXPECT_LE(left, 5u * 4096);
  EXPECT_EQ(left, r->disk_bytes - r->evicted_disk_bytes);
  // The least recently used went first: the survivors are the newest.
  EXPECT_FALSE(std::filesystem::exists(paths.front()));
  EXPECT_TRUE(std::filesystem::exists(paths.back()));
}

TEST_F(EvictTest, AnotherTierBelowIsNotThisOnesToEvict) {
  const std::string own = Entry("a", 1000, 300);
  // A tier made below this one by an older wharf (init refuses that now): its files are its
  // own, not this tier's entries.
  const std::string inner = tier_->root() + "/data/inner";
  ASSERT_TRUE(std::filesystem::create_directories(inner + "/.wharf"));
  std::filesystem::copy_file(tier_->root() + "/.wharf/tier.json", inner + "/.wharf/tier.json");
  const std::string theirs = Entry("inner/x", 1000, 400);  // the oldest
  auto r = EvictTo(*tier_, tier_->root(), 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->entries, 1u);
  EXPECT_FALSE(std::filesystem::exists(own));
  EXPECT_TRUE(std::filesystem::exists(theirs));
}

TEST_F(EvictTest, PinnedLocalAndBusyEntriesStay) {
  const std::string pinned = Entry("pinned", 100, 500);
  ASSERT_TRUE(SetPinned(pinned, true).ok());
  const std::string local = Entry("ckpt", 100, 400, /*local=*/true);
  const std::string busy = Entry("busy", 100, 300);
  const std::string idle = Entry("idle", 100, 200);
  const int reader = open(busy.c_str(), O_RDONLY);
  ASSERT_GE(reader, 0);
  ASSERT_EQ(flock(reader, LOCK_SH), 0);  // what a TierStore read holds
  auto r = EvictTo(*tier_, tier_->root(), 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->evicted, 1u);
  EXPECT_EQ((r->kept_pinned), 1u);
  EXPECT_EQ((r->kept_local), 1u);
  EXPECT_EQ((r->kept_busy), 1u);
  EXPECT_TRUE(std::filesystem::exists(pinned));
  EXPECT_TRUE(std::filesystem::exists(local));
  EXPECT_TRUE(std::filesystem::exists(busy));
  EXPECT_FALSE(std::filesystem::exists(idle));
  close(reader);
  ASSERT_TRUE(EvictTo(*tier_, tier_->root(), 0).ok());
  EXPECT_FALSE(std::filesystem::exists(busy));
}

TEST_F(EvictTest, AFileTheUserWroteSinceItWasFilledStays) {
  const std::string same_size = Entry("edited", 100, 500);
  const std::string other_size = Entry("grown", 100, 400);
  const std::string touched = Entry("touched", 100, 300);
  const std::string damaged = Entry("damaged", 100, 200);
  auto write_at = [](const std::string& path, const std::string& data, bool keep_mtime) {
    struct stat before;
    ASSERT_EQ(stat(path.c_str(), &before), 0);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f << data;
    f.close();
    if (keep_mtime) {  // damage below the file system: the mtime as sealed
      const struct timespec times[2] = {before.st_atim, before.st_mtim};
      ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
    }
  };
  write_at(same_size, "EDIT", false);
  write_at(other_size, std::string(150, 'y'), false);
  ASSERT_EQ(utimensat(AT_FDCWD, touched.c_str(), nullptr, 0), 0);  // the same bytes
  write_at(damaged, "DAMAGE", true);
  auto r = EvictTo(*tier_, tier_->root(), 0);
  ASSERT_TRUE(r.ok()) << r.status();
  // The user's two files are theirs (not counted among the entries); the touched file and the
  // damaged one are entries and go.
  EXPECT_EQ(r->kept_modified, 2u);
  EXPECT_EQ(r->entries, 2u);
  EXPECT_EQ(r->evicted, 2u);
  EXPECT_TRUE(std::filesystem::exists(same_size));
  EXPECT_TRUE(std::filesystem::exists(other_size));
  EXPECT_FALSE(std::filesystem::exists(touched));
  EXPECT_FALSE(std::filesystem::exists(damaged));
}

TEST_F(EvictTest, ReadsThroughTheTierKeepItUnderItsSizeBound) {
  TempStore source;
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(
        source.store()->Put(absl::StrCat("k", i), absl::Cord(std::string(10000, 'v'))).ok());
  }
  TierConfig bounded;
  bounded.max_size = 100000;  // room for 10 of the 40
  bounded.min_free = 0;
  auto tier = Tier::Init(dir_.root() + "/bounded", bounded);
  ASSERT_TRUE(tier.ok());
  auto store = TierStore::Open(source.store(), *tier, Runtime::Default());
  ASSERT_TRUE(store.ok());
  for (int i = 0; i < 40; ++i) {
    auto data = (*store)->Read(absl::StrCat("k", i));
    ASSERT_TRUE(data.ok()) << data.status();
    ASSERT_EQ(data->size(), 10000u);
  }
  // Passes run inside the reads that found the tier over its bound: with reads one at a
  // time, the bound holds as soon as the last read is delivered.
  uint64_t left = 0;
  ASSERT_TRUE(
      WalkTierFiles(**tier, (*tier)->root(), [&](const std::string&, const struct stat& st) {
        left += st.st_size;
      }).ok());
  EXPECT_LE(left, bounded.max_size);
  EXPECT_GT((*store)->stats().evicted, 0u);
  // Evicted objects are fetched again on the next read.
  auto again = (*store)->Read("k0");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->size(), 10000u);
}

TEST_F(EvictTest, AProcessStartsFromTheUsageTheLastPassRecorded) {
  TempStore source;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(source.store()->Put(absl::StrCat("k", i), absl::Cord(std::string(100, 'v'))).ok());
  }
  TierConfig bounded;
  bounded.max_size = 10000;
  bounded.min_free = 0;
  auto tier = Tier::Init(dir_.root() + "/hinted", bounded);
  ASSERT_TRUE(tier.ok());
  EXPECT_FALSE((*tier)->LastUsage().has_value());
  // A pass over the empty tier records what it holds.
  auto pass = EvictToBounds(**tier, /*wait=*/true, nullptr);
  ASSERT_TRUE(pass.ok());
  EXPECT_EQ((*tier)->LastUsage(), std::optional<uint64_t>(0));
  // Entries the record does not know of (another process's fills since), over the bound.
  auto tree = TierTreeStore::Open(*tier, (*tier)->root() + "/data", Runtime::Default());
  ASSERT_TRUE(tree.ok());
  PutOptions o;
  o.source_uri = "s3://b/old";
  o.source_etag = "e";
  ASSERT_TRUE((*tree)->Put("old", absl::Cord(std::string(20000, 'x')), o).ok());
  // A new process's first fill trusts the record (0 + 100 bytes: within the bound), so it
  // does not walk the tier; the fill that crosses the bound by its own count runs a pass.
  auto store = TierStore::Open(source.store(), *tier, Runtime::Default());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Read("k0").ok());
  EXPECT_EQ((*store)->stats().evicted, 0u);
  EXPECT_TRUE(std::filesystem::exists((*tier)->root() + "/data/old"));
  ASSERT_TRUE((*tier)->RecordUsage(9950).ok());  // as if another pass had just run
  auto second = TierStore::Open(source.store(), *tier, Runtime::Default());
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE((*second)->Read("k1").ok());
  EXPECT_GT((*second)->stats().evicted, 0u);
  EXPECT_FALSE(std::filesystem::exists((*tier)->root() + "/data/old"));
  EXPECT_LE(*(*tier)->LastUsage(), bounded.max_size);
}

}  // namespace
}  // namespace wharf
