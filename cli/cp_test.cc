// `wharf cp -r` against a store whose listing returns hostile keys ("p/../x", "p//y"): the
// local store cannot even hold such keys, so the source here is a small in-memory store
// registered under its own scheme, as an S3 bucket written by someone else would be.
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "cli/verbs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/registry.h"
#include "store/testing/memory_store.h"

namespace wharf::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

using store_testing::MemoryStore;

class CpHostileKeysTest : public testing::Test {
 protected:
  void SetUp() override {
    store_ = std::make_shared<MemoryStore>();
    for (const auto& [key, data] : std::map<std::string, std::string>{
             {"p/", ""},                      // the prefix's own directory marker: skipped
             {"p/ok.txt", "fine"},            //
             {"p/sub/deep.txt", "fine too"},  //
             {"p/dir/", ""},                  // a directory marker: no data
             {"p/../escape", "evil"},         //
             {"p/sub/../../up", "evil"},      //
             {"p//abs", "evil"},              //
             {"p/./dot", "evil"},             //
             {"p/a\\..\\..\\win", "evil"},    //
             {std::string("p/nul\0x", 7), "evil"},
             {"other/x", "not listed"},
         }) {
      ASSERT_TRUE(store_->Put(key, absl::Cord(data)).ok());
    }
    StoreRegistry::Global().Register(
        "mem",
        [store = store_](const StoreSpec&, std::shared_ptr<Runtime>)
            -> absl::StatusOr<std::shared_ptr<ObjectStore>> { return store; });
    char tmpl[] = "/tmp/wharf-cp-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Every regular file below root_, relative to it.
  std::vector<std::string> LocalFiles() {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::recursive_directory_iterator(root_)) {
      if (e.is_regular_file()) out.push_back(e.path().lexically_relative(root_).string());
    }
    return out;
  }

  std::shared_ptr<MemoryStore> store_;
  std::string root_;
};

TEST_F(CpHostileKeysTest, ToLocalRefusesEscapingKeysAndCopiesTheRest) {
  CpArgs args{
      .src = "mem://bkt/p", .dst = root_ + "/dst", .recursive = true, .jobs = 4, .quiet = true};
  testing::internal::CaptureStderr();
  absl::Status status = RunCp(args);
  const std::string err = testing::internal::GetCapturedStderr();

  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("6 of 10 objects failed"));
  EXPECT_THAT(LocalFiles(), UnorderedElementsAre("dst/ok.txt", "dst/sub/deep.txt"));
  std::vector<std::string> lines = absl::StrSplit(err, '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.size(), 6u) << err;
  for (const std::string& line : lines) {
    EXPECT_THAT(line, HasSubstr(": refusing the key: "));
    EXPECT_TRUE(absl::StartsWith(line, "wharf: download mem://bkt/p/")) << line;
  }
  // Each line says why: an escape, or a component that names no file.
  EXPECT_THAT(err, HasSubstr("p/../escape: refusing the key: a '..' component would escape"));
  EXPECT_THAT(err, HasSubstr("p//abs: refusing the key: an absolute path would escape"));
  EXPECT_THAT(err, HasSubstr("p/./dot: refusing the key: a '.' path component names no file"));
  EXPECT_THAT(err, HasSubstr("wharf: download mem://bkt/p/../escape: refusing the key"));
  EXPECT_THAT(err, HasSubstr("wharf: download mem://bkt/p/nul\\x00x: refusing the key"));
}

TEST_F(CpHostileKeysTest, ToLocalAKeyEndingInSlashThatHoldsDataFailsByName) {
  ASSERT_TRUE(store_->Put("q/ok.txt", absl::Cord("fine")).ok());
  ASSERT_TRUE(store_->Put("q/empty/", absl::Cord("")).ok());
  ASSERT_TRUE(store_->Put("q/data/", absl::Cord("12345")).ok());
  CpArgs args{
      .src = "mem://bkt/q", .dst = root_ + "/dst", .recursive = true, .jobs = 2, .quiet = true};
  testing::internal::CaptureStderr();
  absl::Status status = RunCp(args);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("1 of 3 objects failed"));
  EXPECT_THAT(LocalFiles(), UnorderedElementsAre("dst/ok.txt"));  // the empty marker: skipped
  EXPECT_THAT(err, HasSubstr("wharf: download mem://bkt/q/data/: a key ending in '/' that "
                             "holds 5 bytes cannot be a file"));
}

TEST_F(CpHostileKeysTest, WithinAStoreUsesServerSideCopyAndKeepsMarkers) {
  CpArgs args{.src = "mem://bkt/p/", .dst = "mem://bkt/q", .recursive = true, .quiet = true};
  testing::internal::CaptureStderr();
  absl::Status status = RunCp(args);
  testing::internal::GetCapturedStderr();

  // An object store's keys are opaque: those that are no paths are copied as they are; only
  // the NUL byte is refused.
  EXPECT_THAT(status.message(), HasSubstr("1 of 10 objects failed"));
  std::vector<std::string> copied;
  for (const std::string& key : store_->keys()) {
    if (absl::StartsWith(key, "q")) copied.push_back(key);
  }
  // No NewWriter (unimplemented here): copies within one store are server-side.
  EXPECT_THAT(copied,
              UnorderedElementsAre("q/dir/", "q/ok.txt", "q/sub/deep.txt", "q/../escape",
                                   "q/sub/../../up", "q//abs", "q/./dot", "q/a\\..\\..\\win"));
}

TEST_F(CpHostileKeysTest, SingleObjectStreamsAcrossStores) {
  CpArgs args{.src = "mem://bkt/p/ok.txt", .dst = root_ + "/", .quiet = true};
  ASSERT_TRUE(RunCp(args).ok());
  std::ifstream in(root_ + "/ok.txt");
  std::stringstream content;
  content << in.rdbuf();
  EXPECT_EQ(content.str(), "fine");
}

}  // namespace
}  // namespace wharf::cli
