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

namespace wharf::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// Keys are arbitrary strings, as on S3. Callbacks run inline; flat listings only.
class MemoryStore : public ObjectStore {
 public:
  explicit MemoryStore(std::map<std::string, std::string> objects)
      : objects_(std::move(objects)) {}

  std::string Uri(absl::string_view key) const override {
    return absl::StrCat("mem://bkt/", key);
  }
  const Capabilities& capabilities() const override { return caps_; }

  void ListAsync(ListOptions options, std::string continuation,
                 Callback<ListPage> done) override {
    absl::MutexLock lock(&mu_);
    ListPage page;
    std::string after = std::max(options.start_after, continuation);
    for (auto it = objects_.upper_bound(after); it != objects_.end(); ++it) {
      if (!absl::StartsWith(it->first, options.prefix)) {
        if (it->first > options.prefix) break;
        continue;
      }
      if (static_cast<int>(page.objects.size()) == options.page_size) {
        page.continuation = page.objects.back().key;
        break;
      }
      page.objects.push_back(MetaLocked(it->first));
    }
    std::move(done)(std::move(page));
  }
  void HeadAsync(std::string key, Callback<ObjectMeta> done) override {
    absl::MutexLock lock(&mu_);
    if (!objects_.contains(key)) {
      return std::move(done)(absl::NotFoundError(absl::StrCat("head ", Uri(key), ": none")));
    }
    std::move(done)(MetaLocked(key));
  }
  void GetAsync(GetRequest request, Callback<GetResult> done) override {
    std::string data;
    GetResult result;
    {
      absl::MutexLock lock(&mu_);
      auto it = objects_.find(request.key);
      if (it == objects_.end()) {
        return std::move(done)(absl::NotFoundError(absl::StrCat("get ", Uri(request.key))));
      }
      data = it->second;
      result.meta = MetaLocked(request.key);
    }
    auto range = request.range.Resolve(data.size());
    if (!range.ok()) return std::move(done)(range.status());
    const std::string part = data.substr(range->first, range->second - range->first);
    result.offset = range->first;
    result.bytes = part.size();
    if (request.sink != nullptr) {
      if (absl::Status s = request.sink->Append(part); !s.ok()) return std::move(done)(s);
    } else if (request.buffer.size() < part.size()) {
      return std::move(done)(absl::OutOfRangeError("buffer too small"));
    } else {
      std::copy(part.begin(), part.end(), request.buffer.data());
    }
    std::move(done)(result);
  }
  void PutAsync(std::string key, absl::Cord data, Callback<ObjectMeta> done) override {
    absl::MutexLock lock(&mu_);
    objects_[key] = std::string(data);
    std::move(done)(MetaLocked(key));
  }
  void DeleteAsync(std::string key, StatusCallback done) override {
    absl::MutexLock lock(&mu_);
    objects_.erase(key);
    std::move(done)(absl::OkStatus());
  }
  void DeleteManyAsync(std::vector<std::string> keys, StatusCallback done) override {
    absl::MutexLock lock(&mu_);
    for (const auto& key : keys) objects_.erase(key);
    std::move(done)(absl::OkStatus());
  }
  void CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) override {
    absl::MutexLock lock(&mu_);
    objects_[dst_key] = objects_[src_key];
    std::move(done)(MetaLocked(dst_key));
  }
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string) override {
    return absl::UnimplementedError("not needed here");
  }

  std::vector<std::string> keys() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& [key, _] : objects_) out.push_back(key);
    return out;
  }

 private:
  ObjectMeta MetaLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return {.key = key, .size = objects_[key].size(), .etag = "e"};
  }

  const Capabilities caps_;  // trailing_slash_keys: directory markers are objects
  absl::Mutex mu_;
  std::map<std::string, std::string> objects_ ABSL_GUARDED_BY(mu_);
};

class CpHostileKeysTest : public testing::Test {
 protected:
  void SetUp() override {
    store_ = std::make_shared<MemoryStore>(std::map<std::string, std::string>{
        {"p/", ""},                     // the prefix's own directory marker: skipped
        {"p/ok.txt", "fine"},           //
        {"p/sub/deep.txt", "fine too"},  //
        {"p/dir/", ""},                 // a directory marker: no data
        {"p/../escape", "evil"},        //
        {"p/sub/../../up", "evil"},     //
        {"p//abs", "evil"},             //
        {"p/./dot", "evil"},            //
        {"p/a\\..\\..\\win", "evil"},   //
        {std::string("p/nul\0x", 7), "evil"},
        {"other/x", "not listed"},
    });
    StoreRegistry::Global().Register(
        "mem", [store = store_](const StoreSpec&, std::shared_ptr<Runtime>)
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
  CpArgs args{.src = "mem://bkt/p", .dst = root_ + "/dst", .recursive = true, .jobs = 4,
              .quiet = true};
  testing::internal::CaptureStderr();
  absl::Status status = RunCp(args);
  const std::string err = testing::internal::GetCapturedStderr();

  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("6 of 10 objects failed"));
  EXPECT_THAT(LocalFiles(), UnorderedElementsAre("dst/ok.txt", "dst/sub/deep.txt"));
  std::vector<std::string> lines = absl::StrSplit(err, '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.size(), 6u) << err;
  for (const std::string& line : lines) {
    EXPECT_THAT(line, HasSubstr("refusing key that would escape the destination"));
    EXPECT_TRUE(absl::StartsWith(line, "wharf: download mem://bkt/p/")) << line;
  }
  EXPECT_THAT(err, HasSubstr("wharf: download mem://bkt/p/../escape: refusing key"));
  EXPECT_THAT(err, HasSubstr("wharf: download mem://bkt/p/nul\\x00x: refusing key"));
}

TEST_F(CpHostileKeysTest, WithinAStoreUsesServerSideCopyAndKeepsMarkers) {
  CpArgs args{.src = "mem://bkt/p/", .dst = "mem://bkt/q", .recursive = true, .quiet = true};
  testing::internal::CaptureStderr();
  absl::Status status = RunCp(args);
  testing::internal::GetCapturedStderr();

  EXPECT_THAT(status.message(), HasSubstr("6 of 10 objects failed"));
  std::vector<std::string> copied;
  for (const std::string& key : store_->keys()) {
    if (absl::StartsWith(key, "q")) copied.push_back(key);
  }
  // No NewWriter (unimplemented here): copies within one store are server-side.
  EXPECT_THAT(copied, UnorderedElementsAre("q/dir/", "q/ok.txt", "q/sub/deep.txt"));
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
