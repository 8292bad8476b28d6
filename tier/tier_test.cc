// The tier's on-disk model: where a tier is, its settings, entry attributes, and temporary
// directories owned through locks the OS releases when their process dies.
#include "tier/tier.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/testing/temp_store.h"

namespace wharf {
namespace {

using ::testing::HasSubstr;

// A fresh directory, removed afterwards (the temporary store's root).
class TempDir {
 public:
  const std::string& path() const { return store_.root(); }

 private:
  store_testing::TempStore store_;
};

size_t CountEntries(const std::string& dir) {
  if (!std::filesystem::exists(dir)) return 0;
  size_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  return n;
}

TEST(TierTest, InitWritesSettingsAndFindWalksUp) {
  TempDir dir;
  TierConfig config;
  config.mode = TierConfig::Mode::kTtl;
  config.ttl = absl::Seconds(90);
  config.max_size = 12345;
  config.min_free = 7.5;
  auto tier = Tier::Init(dir.path(), config);
  ASSERT_TRUE(tier.ok()) << tier.status();
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/.wharf/tier.json"));

  auto found = Tier::Find(dir.path() + "/a/b/c.jpg");  // need not exist
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ((*found)->root(), AbsolutePath(dir.path()));
  EXPECT_EQ((*found)->config().mode, TierConfig::Mode::kTtl);
  EXPECT_EQ((*found)->config().ttl, absl::Seconds(90));
  EXPECT_EQ((*found)->config().max_size, 12345u);
  EXPECT_DOUBLE_EQ((*found)->config().min_free, 7.5);
  EXPECT_EQ((*found)->Relative(dir.path() + "/a/b"), "a/b");
  EXPECT_EQ((*found)->Relative(dir.path()), "");
}

TEST(TierTest, FindOutsideAnyTierIsNotFound) {
  TempDir dir;
  auto found = Tier::Find(dir.path() + "/x");
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(found.status().message(), HasSubstr("wharf tier init"));
}

TEST(TierTest, ATierOverAnotherIsRefused) {
  TempDir dir;
  ASSERT_TRUE(Tier::Init(dir.path() + "/data/a/imported", {}).ok());
  std::filesystem::create_directories(dir.path() + "/data/b");
  for (const std::string& outer : {dir.path(), dir.path() + "/data"}) {
    auto made = Tier::Init(outer, {});
    ASSERT_FALSE(made.ok()) << outer;
    EXPECT_EQ(made.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(made.status().message(),
                HasSubstr("the tier at " + dir.path() + "/data/a/imported is inside it"));
    // cache= over such a folder (FindOrCreate) says the same, and makes nothing.
    auto cache = Tier::FindOrCreate(outer);
    ASSERT_FALSE(cache.ok());
    EXPECT_FALSE(std::filesystem::exists(outer + "/.wharf"));
  }
  EXPECT_TRUE(Tier::Init(dir.path() + "/data/b", {}).ok());  // beside it is fine
}

TEST(TierTest, InitInsideAnotherTierIsRefused) {
  TempDir dir;
  ASSERT_TRUE(Tier::Init(dir.path(), {}).ok());
  auto inner = Tier::Init(dir.path() + "/sub", {});
  ASSERT_FALSE(inner.ok());
  EXPECT_EQ(inner.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(inner.status().message(), HasSubstr("inside the tier"));
  // Init again at the root changes the settings.
  TierConfig c;
  c.max_size = 99;
  ASSERT_TRUE(Tier::Init(dir.path(), c).ok());
  EXPECT_EQ((*Tier::Find(dir.path()))->config().max_size, 99u);
}

TEST(TierTest, FindOrCreateMakesATierWithDefaults) {
  TempDir dir;
  auto tier = Tier::FindOrCreate(dir.path() + "/new");
  ASSERT_TRUE(tier.ok()) << tier.status();
  EXPECT_EQ((*tier)->root(), AbsolutePath(dir.path() + "/new"));
  EXPECT_EQ((*tier)->config().mode, TierConfig::Mode::kImmutable);
  auto again = Tier::FindOrCreate(dir.path() + "/new/deeper");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->root(), (*tier)->root());
}

TEST(TierConfigTest, MalformedSettingsNameTheFileAndField) {
  EXPECT_EQ(TierConfig::FromJson("[]", "t.json").status().code(),
            absl::StatusCode::kInvalidArgument);
  auto v2 = TierConfig::FromJson(R"({"version":2})", "t.json");
  EXPECT_THAT(v2.status().message(), HasSubstr("unsupported version 2"));
  auto mode = TierConfig::FromJson(R"({"version":1,"mode":"sometimes"})", "t.json");
  EXPECT_THAT(mode.status().message(), HasSubstr("unknown tier mode 'sometimes'"));
  auto ttl = TierConfig::FromJson(R"({"version":1,"ttl_seconds":-1})", "t.json");
  EXPECT_THAT(ttl.status().message(), HasSubstr("t.json: ttl_seconds"));
  auto type = TierConfig::FromJson(R"({"version":1,"max_size":"big"})", "t.json");
  EXPECT_THAT(type.status().message(), HasSubstr("malformed field"));
  TierConfig c;
  c.max_size = 1 << 20;
  auto back = TierConfig::FromJson(c.ToJson(), "x");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->max_size, c.max_size);
}

TEST(TierEntryTest, AttributeRoundTripsAndSizeDecidesCompleteness) {
  TempDir dir;
  const std::string path = dir.path() + "/f";
  std::ofstream(path) << "hello";
  TierEntry e;
  e.source = "s3://b/k";
  e.etag = "abc-2";
  e.size = 5;
  e.md5 = "5d41402abc4b2a76b9719d911017c592";
  e.filled = absl::FromUnixSeconds(1700000000);
  ASSERT_TRUE(WriteEntryAttr(path, e).ok());
  auto back = ReadEntryAttr(path);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->source, e.source);
  EXPECT_EQ(back->etag, e.etag);
  EXPECT_EQ(back->md5, e.md5);
  EXPECT_EQ(back->filled, e.filled);
  EXPECT_FALSE(back->local);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(IsCompleteEntry(back, st));
  std::ofstream(path, std::ios::app) << "!";  // another program appended
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_FALSE(IsCompleteEntry(ReadEntryAttr(path), st));
  // A file without the attribute is not an entry.
  std::ofstream(dir.path() + "/plain") << "x";
  // A filled copy carries a CRC32C instead of an MD5; an entry with neither is refused.
  e.md5.clear();
  e.crc32c = "9a71bb4c";
  auto crc_only = TierEntry::FromJson(e.ToJson());
  ASSERT_TRUE(crc_only.has_value());
  EXPECT_EQ(crc_only->crc32c, "9a71bb4c");
  EXPECT_TRUE(crc_only->md5.empty());
  e.crc32c.clear();
  EXPECT_FALSE(TierEntry::FromJson(e.ToJson()).has_value());
  EXPECT_FALSE(ReadEntryAttr(dir.path() + "/plain").has_value());

  EXPECT_FALSE(IsPinned(path));
  ASSERT_TRUE(SetPinned(path, true).ok());
  EXPECT_TRUE(IsPinned(path));
  ASSERT_TRUE(SetPinned(path, false).ok());
  EXPECT_FALSE(IsPinned(path));
  EXPECT_TRUE(SetPinned(path, false).ok());  // idempotent
}

TEST(TierTest, TempDirIsPrivateAndGarbageCollectionSparesLiveOwners) {
  TempDir dir;
  auto tier = Tier::Init(dir.path(), {});
  ASSERT_TRUE(tier.ok());
  auto temp = (*tier)->TempDir();
  ASSERT_TRUE(temp.ok()) << temp.status();
  EXPECT_EQ(*(*tier)->TempDir(), *temp);  // one per process
  struct stat st;
  ASSERT_EQ(stat(temp->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  std::ofstream(*temp + "/partial") << "half";

  // Another Tier object (another process, as far as the locks know) collects: we are alive.
  auto other = Tier::Find(dir.path());
  ASSERT_TRUE(other.ok());
  auto garbage = (*other)->CollectGarbage();
  ASSERT_TRUE(garbage.ok()) << garbage.status();
  EXPECT_EQ(garbage->owners, 0u);
  EXPECT_TRUE(std::filesystem::exists(*temp + "/partial"));
}

// A child process that owns a temporary directory in the tier at `root`, does `work` with
// its Tier, and waits to be killed (like kill -9 mid-import). Returns once `work` is done.
pid_t ForkOwner(const std::string& root, const std::function<void(Tier&)>& work) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return -1;
  const pid_t child = fork();
  if (child == 0) {
    auto tier = Tier::Find(root);
    if (!tier.ok() || !(*tier)->TempDir().ok()) _exit(3);
    work(**tier);
    (void)!write(pipefd[1], "r", 1);
    pause();
    _exit(0);
  }
  char c;
  if (child < 0 || read(pipefd[0], &c, 1) != 1) return -1;
  close(pipefd[0]);
  close(pipefd[1]);
  return child;
}

// A ForkOwner whose temporary directory holds three files.
pid_t ForkOwnerWithTempFiles(const std::string& root) {
  return ForkOwner(root, [](Tier& tier) {
    for (int i = 0; i < 3; ++i) std::ofstream(*tier.TempDir() + "/t" + std::to_string(i)) << "x";
  });
}

void KillAndReap(pid_t child) {
  kill(child, SIGKILL);
  int status;
  ASSERT_EQ(waitpid(child, &status, 0), child);
}

TEST(TierTest, GarbageOfAKilledProcessIsRemoved) {
  TempDir dir;
  ASSERT_TRUE(Tier::Init(dir.path(), {}).ok());
  const pid_t child = ForkOwnerWithTempFiles(dir.path());
  ASSERT_GT(child, 0);
  const std::string temp_root = dir.path() + "/.wharf/tmp";
  EXPECT_EQ(CountEntries(temp_root), 5u);  // lock + dir + 3 files
  {
    auto tier = Tier::Find(dir.path());
    auto alive = (*tier)->CollectGarbage();
    ASSERT_TRUE(alive.ok());
    EXPECT_EQ(alive->owners, 0u) << "the child still lives";
  }
  KillAndReap(child);
  auto tier = Tier::Find(dir.path());
  auto garbage = (*tier)->CollectGarbage();
  ASSERT_TRUE(garbage.ok()) << garbage.status();
  EXPECT_EQ(garbage->owners, 1u);
  EXPECT_EQ(garbage->files, 3u);
  EXPECT_EQ(CountEntries(temp_root), 0u);
}

TEST(TierTest, ANewOwnerRemovesWhatKilledOwnersLeft) {
  // Fills and exports call no `tier gc`: the next process that writes to the tier cleans up.
  TempDir dir;
  ASSERT_TRUE(Tier::Init(dir.path(), {}).ok());
  const pid_t alive = ForkOwnerWithTempFiles(dir.path());
  const pid_t killed = ForkOwnerWithTempFiles(dir.path());
  ASSERT_GT(alive, 0);
  ASSERT_GT(killed, 0);
  KillAndReap(killed);
  const std::string temp_root = dir.path() + "/.wharf/tmp";
  EXPECT_EQ(CountEntries(temp_root), 10u);
  auto tier = Tier::Find(dir.path());
  auto temp = (*tier)->TempDir();
  ASSERT_TRUE(temp.ok()) << temp.status();
  // The killed owner's lock, directory and files are gone; the live one's and ours remain.
  EXPECT_EQ(CountEntries(temp_root), 5u + 2u);
  KillAndReap(alive);
}

TEST(TierTest, GcFoldsDeadOwnersStatsKeepingTheTotals) {
  TempDir dir;
  ASSERT_TRUE(Tier::Init(dir.path(), {}).ok());
  // Three processes that counted reads (twice each, into one file each) and were killed, and
  // one that lives on.
  auto count = [](Tier& tier) {
    (void)tier.AddStats({.hits = 1, .misses = 2, .fills = 3, .fill_bytes = 40});
    (void)tier.AddStats({.hits = 10, .misses = 0, .fills = 0, .fill_bytes = 0});
  };
  std::vector<pid_t> dead;
  for (int i = 0; i < 3; ++i) dead.push_back(ForkOwner(dir.path(), count));
  const pid_t alive = ForkOwner(dir.path(), count);
  ASSERT_GT(alive, 0);
  for (pid_t child : dead) KillAndReap(child);
  const std::string stats_dir = dir.path() + "/.wharf/stats";
  EXPECT_EQ(CountEntries(stats_dir), 4u) << "one file per process";
  auto tier = Tier::Find(dir.path());
  ASSERT_TRUE(tier.ok());
  auto expect_totals = [&](const char* when) {
    const Tier::Stats s = (*tier)->ReadStats();
    EXPECT_EQ(s.hits, 4u * 11) << when;
    EXPECT_EQ(s.misses, 4u * 2) << when;
    EXPECT_EQ(s.fills, 4u * 3) << when;
    EXPECT_EQ(s.fill_bytes, 4u * 40) << when;
  };
  expect_totals("before folding");
  const std::string one_dead = [&] {
    for (const auto& e : std::filesystem::directory_iterator(stats_dir)) {
      if (e.path().filename().string().find(absl::StrCat("-", dead[0], "-")) != std::string::npos) {
        return e.path().string();
      }
    }
    return std::string();
  }();
  ASSERT_FALSE(one_dead.empty());
  std::stringstream saved;
  saved << std::ifstream(one_dead).rdbuf();

  auto folded = (*tier)->FoldStats();
  ASSERT_TRUE(folded.ok()) << folded.status();
  EXPECT_EQ(*folded, 3u);
  EXPECT_EQ(CountEntries(stats_dir), 2u) << "folded.json and the live process's";
  expect_totals("after folding");

  // A fold killed after it wrote folded.json left a file it had folded: not counted twice,
  // and the next fold removes it.
  std::ofstream(one_dead) << saved.str();
  expect_totals("with a folded file left behind");
  folded = (*tier)->FoldStats();
  ASSERT_TRUE(folded.ok());
  EXPECT_EQ(*folded, 0u);
  EXPECT_FALSE(std::filesystem::exists(one_dead));
  expect_totals("after the next fold");

  KillAndReap(alive);
  folded = (*tier)->FoldStats();
  ASSERT_TRUE(folded.ok());
  EXPECT_EQ(*folded, 1u);
  EXPECT_EQ(CountEntries(stats_dir), 1u);
  expect_totals("all folded");
  // This process counts on: its own file, next to the folded one.
  ASSERT_TRUE((*tier)->AddStats({.hits = 1}).ok());
  ASSERT_TRUE((*tier)->AddStats({.hits = 1}).ok());
  EXPECT_EQ(CountEntries(stats_dir), 2u);
  EXPECT_EQ((*tier)->ReadStats().hits, 4u * 11 + 2);
}

TEST(TierTest, ImportsAreRecorded) {
  TempDir dir;
  auto tier = Tier::Init(dir.path(), {});
  ASSERT_TRUE(tier.ok());
  ASSERT_TRUE((*tier)->RecordImport({"s3://b/train/", "train"}).ok());
  ASSERT_TRUE((*tier)->RecordImport({"s3://b/train/", "train"}).ok());  // idempotent
  ASSERT_TRUE((*tier)->RecordImport({"gs://c/val/", "val"}).ok());
  auto imports = (*tier)->Imports();
  ASSERT_TRUE(imports.ok());
  ASSERT_EQ(imports->size(), 2u);
}

}  // namespace
}  // namespace wharf

namespace wharf {
namespace {

TEST(TierImportsTest, ShardedRunsMakeOneImportCompleteOnlyWhenEveryRankCompleted) {
  TempDir dir;
  auto tier = Tier::Init(dir.path() + "/t", TierConfig{});
  ASSERT_TRUE(tier.ok()) << tier.status();
  auto run = [](int rank, int world, bool complete, uint64_t objects) {
    TierImport r{.source = "s3://b/ds/", .dir = "ds"};
    r.rank = rank;
    r.world_size = world;
    if (complete) {
      r.completed = absl::Now();
      r.objects = objects;
    }
    return r;
  };
  auto only = [&]() {
    auto imports = (*tier)->Imports();
    EXPECT_TRUE(imports.ok());
    EXPECT_EQ(imports->size(), 1u);
    return imports->empty() ? TierImport{} : imports->front();
  };
  ASSERT_TRUE((*tier)->RecordImport(run(0, 2, true, 7)).ok());
  EXPECT_FALSE(only().complete());  // rank 1 has not run
  ASSERT_TRUE((*tier)->RecordImport(run(1, 2, true, 5)).ok());
  EXPECT_TRUE(only().complete());
  EXPECT_EQ(only().objects, 12u);
  ASSERT_TRUE((*tier)->RecordImport(run(1, 2, false, 0)).ok());  // rank 1 reran and failed
  EXPECT_FALSE(only().complete());
  // An unsharded run replaces the ranks' records.
  ASSERT_TRUE((*tier)->RecordImport(run(-1, 0, true, 12)).ok());
  EXPECT_TRUE(only().complete());
  EXPECT_EQ(only().objects, 12u);
  EXPECT_EQ(only().source, "s3://b/ds/");
  EXPECT_EQ(only().dir, "ds");
}

}  // namespace
}  // namespace wharf
