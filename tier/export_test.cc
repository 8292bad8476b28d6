// Exporting a tier path: the selected files arrive, their entries lose `local` and take the
// exported objects as provenance, a rerun skips them.
#include "tier/export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/cord.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/testing/temp_store.h"
#include "tier/tree_store.h"

namespace wharf {
namespace {

using store_testing::TempStore;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Counts what the export forwards.
class CountingObserver : public TransferObserver {
 public:
  void OnObjectDone(const std::string&, const std::string&) override { ++done; }
  void OnObjectAt(const ObjectMeta&, const ObjectMeta&, bool) override { ++at; }
  std::atomic<int> done{0};
  std::atomic<int> at{0};
};

class ExportTierPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tier = Tier::Init(tier_dir_.root() + "/tier", {});
    ASSERT_TRUE(tier.ok()) << tier.status();
    tier_ = *tier;
    // Written to the tier with no provenance: `local` entries.
    auto tree = TierTreeStore::Open(tier_, Dir(), Runtime::Default());
    ASSERT_TRUE(tree.ok()) << tree.status();
    for (const char* name : {"a.bin", "sub/b.bin"}) {
      auto put = (*tree)->Put(name, absl::Cord(std::string("data of ") + name), {});
      ASSERT_TRUE(put.ok()) << put.status();
    }
  }
  std::string Dir() const { return tier_->root() + "/ckpt"; }
  bool Local(const std::string& rel) const {
    auto entry = ReadEntryAttr(Dir() + "/" + rel);
    EXPECT_TRUE(entry.has_value()) << rel;
    return entry.has_value() && entry->local;
  }

  TempStore tier_dir_;
  TempStore dst_;
  std::shared_ptr<Tier> tier_;
};

TEST_F(ExportTierPathTest, ExportsMarksAndResumes) {
  ASSERT_TRUE(Local("a.bin"));
  ASSERT_TRUE(Local("sub/b.bin"));

  // A filter leaves sub/b.bin out: it stays local and does not arrive.
  TierExportOptions filtered;
  filtered.filters = {{.include = false, .pattern = "sub/*"}};
  CountingObserver observer;
  auto first = ExportTierPath(tier_, Dir(), {dst_.store(), "out/"}, filtered, &observer);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->transfer.objects, 1u);
  EXPECT_EQ(first->aborted_uploads, 0u);
  EXPECT_EQ(first->dst_uri, dst_.store()->Uri("out/"));
  EXPECT_EQ(observer.done, 1);  // the caller's observer sees the transfer
  EXPECT_EQ(observer.at, 1);
  EXPECT_EQ(ReadFile(dst_.PathOf("out/a.bin")), "data of a.bin");
  EXPECT_FALSE(std::ifstream(dst_.PathOf("out/sub/b.bin")).good());
  EXPECT_FALSE(Local("a.bin"));
  EXPECT_TRUE(Local("sub/b.bin"));
  auto a = ReadEntryAttr(Dir() + "/a.bin");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->source, dst_.store()->Uri("out/a.bin"));  // provenance: the exported object

  // Unfiltered: both arrive (a.bin already there) and neither says local.
  auto second = ExportTierPath(tier_, Dir(), {dst_.store(), "out/"}, {});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->transfer.objects, 1u);
  EXPECT_EQ(second->transfer.skipped, 1u);
  EXPECT_EQ(ReadFile(dst_.PathOf("out/sub/b.bin")), "data of sub/b.bin");
  EXPECT_FALSE(Local("a.bin"));
  EXPECT_FALSE(Local("sub/b.bin"));

  // A rerun skips both.
  auto third = ExportTierPath(tier_, Dir(), {dst_.store(), "out/"}, {});
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->transfer.objects, 0u);
  EXPECT_EQ(third->transfer.skipped, 2u);
  EXPECT_EQ(third->transfer.failed, 0u);
}

TEST_F(ExportTierPathTest, AFileWrittenSinceItsExportIsTheUsersAndDamageFails) {
  // A CRC32C entry too (a checkpoint's file), besides the fixture's MD5 ones.
  TierTreeOptions crc;
  crc.written_checksum = Checksum::kCrc32c;
  auto tree = TierTreeStore::Open(tier_, Dir(), Runtime::Default(), crc);
  ASSERT_TRUE(tree.ok()) << tree.status();
  ASSERT_TRUE((*tree)->Put("c.bin", absl::Cord(std::string("data of c.bin")), {}).ok());
  auto first = ExportTierPath(tier_, Dir(), {dst_.store(), "out/"}, {});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->transfer.objects, 3u);
  // Only touched: the same bytes. Each listing finds its entry's checksum again: skipped.
  for (const char* name : {"sub/b.bin", "c.bin"}) {
    ASSERT_EQ(utimensat(AT_FDCWD, (Dir() + "/" + name).c_str(), nullptr, 0), 0);
  }
  auto touched = ExportTierPath(tier_, Dir(), {dst_.store(), "out/"}, {});
  ASSERT_TRUE(touched.ok()) << touched.status();
  EXPECT_EQ(touched->transfer.skipped, 3u);
  // Edited in place to the same size: the entries' attributes still describe the old bytes,
  // and neither is skipped as "already there" by them. Written since they were sealed, the
  // files are the user's own now, exported as plain files with the user's bytes.
  for (const char* name : {"a.bin", "c.bin"}) {
    std::fstream f(Dir() + "/" + name, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f << "DATA";
  }
  auto edited = ExportTierPath(tier_, Dir(), {dst_.store(), "out/"}, {});
  ASSERT_TRUE(edited.ok()) << edited.status();
  EXPECT_EQ(edited->transfer.skipped, 1u);  // sub/b.bin
  EXPECT_EQ(ReadFile(dst_.PathOf("out/a.bin")), "DATA of a.bin");
  EXPECT_EQ(ReadFile(dst_.PathOf("out/c.bin")), "DATA of c.bin");
  auto again = ExportTierPath(tier_, Dir(), {dst_.store(), "out/"}, {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->transfer.skipped, 3u);  // by content: the user's files are there now

  // Other bytes with the mtime as sealed (the touch above was taken as the entry's own by
  // the listing that found the same bytes), and no ETag cached for them: damage, never
  // uploaded as the entry.
  const std::string b = Dir() + "/sub/b.bin";
  struct stat sealed;
  ASSERT_EQ(stat(b.c_str(), &sealed), 0);
  {
    std::fstream f(b, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f << "DATA";
  }
  const struct timespec times[2] = {sealed.st_atim, sealed.st_mtim};
  ASSERT_EQ(utimensat(AT_FDCWD, b.c_str(), times, 0), 0);
  ASSERT_EQ(removexattr(b.c_str(), "user.wharf.etag"), 0);
  auto damaged = ExportTierPath(tier_, b, {dst_.store(), "fresh/"}, {});
  ASSERT_FALSE(damaged.ok());
  EXPECT_THAT(std::string(damaged.status().message()),
              ::testing::HasSubstr("no longer holds its tier entry's data"));
  EXPECT_FALSE(std::filesystem::exists(dst_.PathOf("fresh/b.bin")));
}

TEST_F(ExportTierPathTest, OneFileGoesBelowAPrefixUnderItsName) {
  auto one = ExportTierPath(tier_, Dir() + "/sub/b.bin", {dst_.store(), "one/"}, {});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->transfer.objects, 1u);
  EXPECT_EQ(ReadFile(dst_.PathOf("one/b.bin")), "data of sub/b.bin");
  EXPECT_FALSE(Local("sub/b.bin"));
  EXPECT_TRUE(Local("a.bin"));

  auto again = ExportTierPath(tier_, Dir() + "/sub/b.bin", {dst_.store(), "one/"}, {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->transfer.objects, 0u);
  EXPECT_EQ(again->transfer.skipped, 1u);
}

TEST_F(ExportTierPathTest, RefusesAPathOutsideTheTier) {
  auto outside = ExportTierPath(tier_, dst_.root(), {dst_.store(), "x/"}, {});
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument) << outside.status();
}

}  // namespace
}  // namespace wharf
