// Checkpoint roots: a checkpoint exists only once its manifest does; deletion and the
// clean-up of abandoned saves; selection; copies between roots (a tier's entries lose
// `local` when exported, the manifest arrives last).
#include "checkpoint/catalog.h"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "checkpoint/io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/testing/random_bytes.h"
#include "store/testing/temp_store.h"
#include "tier/tier.h"

namespace wharf::checkpoint {
namespace {

using store_testing::RandomBytes;
using store_testing::TempStore;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Writes a two-file checkpoint of `step` (the files a DCP save would leave) without a manifest.
void WriteFilesOf(const CheckpointRoot& root, int64_t step, const std::string& data) {
  std::vector<FileToWrite> files;
  files.push_back({root.StepPrefix(step) + "__0_0.distcp", {absl::MakeConstSpan(data)}, {}});
  files.push_back(
      {root.StepPrefix(step) + ".metadata", {absl::MakeConstSpan(data).first(100)}, {}});
  auto written = WriteFiles(*root.store(), files);
  ASSERT_TRUE(written.ok()) << written.status();
}

TEST(StepDirNameTest, RoundTrips) {
  EXPECT_EQ(StepDirName(42), "step-000000000042");
  EXPECT_EQ(ParseStepDirName("step-000000000042"), 42);
  EXPECT_EQ(ParseStepDirName("step-7"), 7);
  EXPECT_EQ(ParseStepDirName("step-"), std::nullopt);
  EXPECT_EQ(ParseStepDirName("step-12a"), std::nullopt);
  EXPECT_EQ(ParseStepDirName("stage-1"), std::nullopt);
}

TEST(ManifestTest, RoundTripsAndRefusesWhatIsNotOne) {
  Manifest m;
  m.step = 100;
  m.time = absl::FromUnixSeconds(1700000000);
  m.metrics = {{"loss", 0.25}, {"acc", 0.9}};
  m.files = {{".metadata", 10, "e1"}, {"__0_0.distcp", 1000, "e2"}};
  m.bytes = 1010;
  m.world_size = 2;
  m.user_json = R"({"epoch":3})";
  auto back = Manifest::FromJson(m.ToJson(), "m");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, 100);
  EXPECT_EQ(back->time, m.time);
  EXPECT_EQ(back->metrics, m.metrics);
  ASSERT_EQ(back->files.size(), 2u);
  EXPECT_EQ(back->files[1].path, "__0_0.distcp");
  EXPECT_EQ(back->files[1].size, 1000u);
  EXPECT_EQ(back->world_size, 2);
  EXPECT_EQ(back->user_json, R"({"epoch":3})");
  EXPECT_FALSE(Manifest::FromJson("{}", "x").ok());
  EXPECT_FALSE(Manifest::FromJson("not json", "x").ok());
  auto newer = Manifest::FromJson(R"({"format":"wharf-checkpoint","version":99,"step":1})", "x");
  EXPECT_EQ(newer.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SelectTest, LatestBestAndStep) {
  std::vector<Manifest> all(3);
  all[0].step = 10;
  all[0].metrics = {{"loss", 0.5}};
  all[1].step = 30;
  all[1].metrics = {{"loss", 0.7}};
  all[2].step = 20;
  all[2].metrics = {{"loss", 0.2}};
  EXPECT_EQ(Select(all, {}, "r")->step, 30);
  EXPECT_EQ(Select(all, {Selector::Kind::kBest, 0, "loss", false}, "r")->step, 20);
  EXPECT_EQ(Select(all, {Selector::Kind::kBest, 0, "loss", true}, "r")->step, 30);
  EXPECT_EQ(Select(all, {Selector::Kind::kStep, 10, "", false}, "r")->step, 10);
  auto none = Select(all, {Selector::Kind::kStep, 11, "", false}, "s3://b/r/");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("step 11"));
  EXPECT_THAT(Select(all, {Selector::Kind::kBest, 0, "acc", false}, "r").status().message(),
              HasSubstr("'acc'"));
  EXPECT_FALSE(Select({}, {}, "r").ok());
}

TEST(CheckpointRootTest, OnlyCommittedCheckpointsExistAndDeletionStartsWithTheManifest) {
  TempStore dir;
  auto root = CheckpointRoot::Open(dir.root() + "/ckpt");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_FALSE(Exists(dir.root() + "/ckpt"));  // opening creates nothing
  auto empty = (*root)->List();
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->complete.empty());

  const std::string data = RandomBytes(200000, 1);
  WriteFilesOf(**root, 1, data);
  WriteFilesOf(**root, 2, data);
  CheckpointRoot::CommitOptions commit;
  commit.metrics = {{"loss", 1.5}};
  commit.expected = {{"__0_0.distcp", data.size()}, {".metadata", 100}};
  auto m = (*root)->Commit(1, commit);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->bytes, data.size() + 100);
  ASSERT_EQ(m->files.size(), 2u);
  EXPECT_EQ(m->files[0].path, ".metadata");

  auto listing = (*root)->List();
  ASSERT_TRUE(listing.ok()) << listing.status();
  ASSERT_EQ(listing->complete.size(), 1u);
  EXPECT_EQ(listing->complete[0].step, 1);
  EXPECT_EQ(listing->complete[0].metrics.at("loss"), 1.5);
  EXPECT_THAT(listing->incomplete, ElementsAre(2));
  EXPECT_EQ((*root)->Read(2).status().code(), absl::StatusCode::kNotFound);

  // A commit missing a file it expects writes no manifest.
  commit.expected = {{"__1_0.distcp", 1}};
  auto missing = (*root)->Commit(2, commit);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("__1_0.distcp is missing"));
  EXPECT_FALSE(Exists(dir.root() + "/ckpt/step-000000000002/manifest.json"));

  // The files as they are now, checked against the manifest.
  auto files = (*root)->Files(*m);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[1].path, "__0_0.distcp");
  EXPECT_EQ((*files)[1].etag, m->files[1].etag);
  std::filesystem::resize_file(dir.root() + "/ckpt/step-000000000001/__0_0.distcp", 10);
  auto damaged = (*root)->Files(*m);
  ASSERT_FALSE(damaged.ok());
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(damaged.status().message(), HasSubstr("__0_0.distcp has 10 bytes"));

  ASSERT_TRUE((*root)->Delete(1).ok());
  EXPECT_FALSE(Exists(dir.root() + "/ckpt/step-000000000001"));
  EXPECT_TRUE((*root)->Delete(1).ok());  // gone already
}

TEST(CheckpointRootTest, RemoveAbandonedTakesOnlyIncompleteEarlierSaves) {
  TempStore dir;
  auto root = *CheckpointRoot::Open(dir.root() + "/ckpt");
  const std::string data = RandomBytes(1000, 2);
  for (int64_t step : {1, 2, 3, 4}) WriteFilesOf(*root, step, data);
  ASSERT_TRUE(root->Commit(2, {}).ok());
  // A killed writer's temporary file in an abandoned step directory.
  std::ofstream(dir.root() + "/ckpt/step-000000000001/.wharf-tmp-killed") << "partial";
  auto removed = root->RemoveAbandoned(/*before_step=*/4);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 2);  // steps 1 and 3
  EXPECT_FALSE(Exists(dir.root() + "/ckpt/step-000000000001"));
  EXPECT_TRUE(Exists(dir.root() + "/ckpt/step-000000000002/manifest.json"));
  EXPECT_FALSE(Exists(dir.root() + "/ckpt/step-000000000003"));
  EXPECT_TRUE(Exists(dir.root() + "/ckpt/step-000000000004/__0_0.distcp"));  // may be running
}

TEST(CheckpointRootTest, AStepDirectoryHoldingOnlyTemporaryFilesIsAnAbandonedSave) {
  // A save killed before any of its files was finished: only hidden temporary files.
  TempStore dir;
  auto root = *CheckpointRoot::Open(dir.root() + "/ckpt");
  const std::string data = RandomBytes(1000, 3);
  std::filesystem::create_directories(dir.root() + "/ckpt/step-000000000002");
  std::ofstream(dir.root() + "/ckpt/step-000000000002/.wharf-tmp-killed") << "partial";
  WriteFilesOf(*root, 3, data);
  ASSERT_TRUE(root->Commit(3, {}).ok());
  auto listing = root->List();
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_THAT(listing->incomplete, ElementsAre(2));
  auto removed = root->RemoveAbandoned(/*before_step=*/3);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 1);
  EXPECT_FALSE(Exists(dir.root() + "/ckpt/step-000000000002"));
  EXPECT_TRUE(Exists(dir.root() + "/ckpt/step-000000000003/manifest.json"));
}

TEST(CheckpointRootTest, AnImportedStepDirectoryInATierRootIsNeverTakenForAnAbandonedSave) {
  // The tier's root is the checkpoint root, and an import put a tree named like a step there.
  TempStore dir;
  ASSERT_TRUE(Tier::Init(dir.root() + "/tier", {}).ok());
  auto root = *CheckpointRoot::Open(dir.root() + "/tier");
  ASSERT_NE(root->tier(), nullptr);
  ASSERT_TRUE(root->tier()->RecordImport({.source = "s3://bucket/data/", .dir = ""}).ok());
  PutOptions imported;
  imported.source_uri = "s3://bucket/data/step-000000000007/sub/part-0";
  const std::string data = RandomBytes(1000, 4);
  ASSERT_TRUE(root->store()->Put("step-000000000007/sub/part-0", absl::Cord(data), imported).ok());
  WriteFilesOf(*root, 3, data);  // a save that was killed before its manifest
  // An exported (or restored) checkpoint whose deletion was killed after its manifest went:
  // its files name the export destination as their source, not an import's.
  PutOptions exported;
  exported.source_uri = "s3://bucket/ckpt/step-000000000005/__0_0.distcp";
  ASSERT_TRUE(
      root->store()->Put("step-000000000005/__0_0.distcp", absl::Cord(data), exported).ok());
  auto listing = root->List();
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_THAT(listing->incomplete, ElementsAre(3, 5));
  auto removed = root->RemoveAbandoned(/*before_step=*/10);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 2);
  EXPECT_FALSE(Exists(dir.root() + "/tier/step-000000000003"));
  EXPECT_FALSE(Exists(dir.root() + "/tier/step-000000000005"));
  EXPECT_TRUE(Exists(dir.root() + "/tier/step-000000000007/sub/part-0"));
}

TEST(CheckpointRootTest, ConfigRoundTrips) {
  TempStore dir;
  auto root = *CheckpointRoot::Open("file://" + dir.root() + "/ckpt/");
  EXPECT_EQ(root->uri(), "file://" + dir.root() + "/ckpt/");
  EXPECT_EQ(root->ReadConfig()->export_to, "");
  ASSERT_TRUE(root->WriteConfig({"s3://b/ckpt/", "loss", "max"}).ok());
  auto config = root->ReadConfig();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->export_to, "s3://b/ckpt/");
  EXPECT_EQ(config->metric, "loss");
  EXPECT_EQ(config->mode, "max");
}

TEST(CheckpointRootTest, ATierRootKeepsLocalEntriesUntilExportedAndTheManifestComesLast) {
  TempStore dir;
  auto tier = Tier::Init(dir.root() + "/tier", {});
  ASSERT_TRUE(tier.ok()) << tier.status();
  auto root = *CheckpointRoot::Open(dir.root() + "/tier/ckpt");
  ASSERT_NE(root->tier(), nullptr);
  EXPECT_EQ(root->prefix(), "ckpt/");
  const std::string data = RandomBytes(300000, 3);
  WriteFilesOf(*root, 5, data);
  ASSERT_TRUE(root->Commit(5, {}).ok());
  const std::string file = dir.root() + "/tier/ckpt/step-000000000005/__0_0.distcp";
  auto entry = ReadEntryAttr(file);
  ASSERT_TRUE(entry.has_value());
  EXPECT_TRUE(entry->local);
  EXPECT_EQ(entry->crc32c.size(), 8u);  // checkpoint files carry a CRC32C, not an MD5
  EXPECT_TRUE(entry->md5.empty());

  TempStore bucket;
  auto remote = *CheckpointRoot::Open(bucket.root() + "/exported");
  // A copy that is not an export (a restore into a folder) leaves the tier's files local.
  TempStore scratch;
  auto out = *CheckpointRoot::Open(scratch.root() + "/out");
  ASSERT_TRUE(CopyCheckpoint(*root, *out, 5).ok());
  EXPECT_TRUE(ReadEntryAttr(file)->local);
  EXPECT_TRUE(ReadEntryAttr(dir.root() + "/tier/ckpt/step-000000000005/manifest.json")->local);

  CopyOptions exporting;
  exporting.mark_exported = true;
  auto copied = CopyCheckpoint(*root, *remote, 5, exporting);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(copied->files, 2u);
  EXPECT_EQ(copied->bytes, data.size() + 100);
  EXPECT_FALSE(ReadEntryAttr(file)->local);
  EXPECT_FALSE(ReadEntryAttr(dir.root() + "/tier/ckpt/step-000000000005/manifest.json")->local);
  auto there = remote->List();
  ASSERT_TRUE(there.ok()) << there.status();
  ASSERT_EQ(there->complete.size(), 1u);
  EXPECT_EQ(there->complete[0].step, 5);

  // Restore into a fresh tier directory (the tier was lost): the copies are not `local`
  // (their source exists), and the restored checkpoint is complete.
  auto restored_root = *CheckpointRoot::Open(dir.root() + "/tier/restored");
  auto restored = CopyCheckpoint(*remote, *restored_root, 5);
  ASSERT_TRUE(restored.ok()) << restored.status();
  auto back = restored_root->List();
  ASSERT_EQ(back->complete.size(), 1u);
  std::ifstream in(dir.root() + "/tier/restored/step-000000000005/__0_0.distcp", std::ios::binary);
  std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, data);
  EXPECT_FALSE(ReadEntryAttr(dir.root() + "/tier/restored/step-000000000005/__0_0.distcp")->local);

  // A copy of an incomplete checkpoint is refused.
  WriteFilesOf(*root, 6, data);
  auto partial = CopyCheckpoint(*root, *remote, 6);
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(Exists(bucket.root() + "/exported/step-000000000006"));

  // A source missing a file is named as damaged, before anything is copied.
  ASSERT_EQ(std::remove((dir.root() + "/tier/restored/step-000000000005/__0_0.distcp").c_str()), 0);
  auto again = *CheckpointRoot::Open(bucket.root() + "/again");
  auto damaged = CopyCheckpoint(*restored_root, *again, 5);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(damaged.status().message()),
              testing::HasSubstr(restored_root->StepUri(5) + " is damaged: __0_0.distcp is "
                                                             "missing"));
  EXPECT_THAT(std::string(damaged.status().message()), testing::HasSubstr("nothing copied"));
  EXPECT_FALSE(Exists(bucket.root() + "/again/step-000000000005"));
}

// Records, when the first file of a copy is at the destination, whether the destination's
// step then existed.
class ExistsAtFirstFile : public TransferObserver {
 public:
  ExistsAtFirstFile(const CheckpointRoot& root, int64_t step) : root_(root), step_(step) {}
  void OnObjectDone(const std::string&, const std::string&) override {
    absl::MutexLock lock(&mu_);
    if (!seen_) seen_ = root_.Read(step_).status();
  }
  std::optional<absl::Status> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  const CheckpointRoot& root_;
  const int64_t step_;
  absl::Mutex mu_;
  std::optional<absl::Status> seen_ ABSL_GUARDED_BY(mu_);
};

TEST(CheckpointRootTest, ACopyOverAnotherCheckpointOfTheStepRemovesItsManifestFirst) {
  // Two saves of step 5 with files of the same sizes: a copy of one over the other that died
  // after some files would leave the old manifest over a mix that passes every size check.
  TempStore a, b;
  auto from = *CheckpointRoot::Open(a.root() + "/run");
  auto to = *CheckpointRoot::Open(b.root() + "/run");
  const std::string new_data = RandomBytes(200000, 7), old_data = RandomBytes(200000, 8);
  WriteFilesOf(*from, 5, new_data);
  ASSERT_TRUE(from->Commit(5, {}).ok());
  WriteFilesOf(*to, 5, old_data);
  ASSERT_TRUE(to->Commit(5, {}).ok());

  ExistsAtFirstFile observer(*to, 5);
  CopyOptions options;
  options.observer = &observer;
  auto copied = CopyCheckpoint(*from, *to, 5, options);
  ASSERT_TRUE(copied.ok()) << copied.status();
  ASSERT_TRUE(observer.seen().has_value());
  EXPECT_TRUE(absl::IsNotFound(*observer.seen())) << *observer.seen();
  auto now = to->Read(5);
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->ToJson(), from->Read(5)->ToJson());

  // The same checkpoint again: its manifest stays (nothing is copied, nothing removed).
  auto again = CopyCheckpoint(*from, *to, 5);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->files, 0u);
  EXPECT_EQ(again->skipped, 2u);
}

}  // namespace
}  // namespace wharf::checkpoint
