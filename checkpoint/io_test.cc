// Checkpoint I/O: files written from memory regions appear whole with exactly those bytes,
// and a failed file takes the others with it (ranged reads: io/read_ranges_test.cc).
#include "checkpoint/io.h"

#include <atomic>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/forwarding_store.h"
#include "store/testing/memory_store.h"
#include "store/testing/random_bytes.h"
#include "store/testing/temp_store.h"

namespace wharf::checkpoint {
namespace {

using store_testing::RandomBytes;
using store_testing::TempStore;
using ::testing::HasSubstr;

absl::Span<const char> Bytes(const std::string& s, size_t off, size_t n) {
  return absl::Span<const char>(s.data() + off, n);
}

// Writers of keys containing "bad" fail after their first write.
class FailingStore : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key,
                                                          const PutOptions& options) override {
    if (key.find("bad") == std::string::npos) return inner().NewWriter(key, options);
    class Bad : public ObjectWriter {
     public:
      absl::Status Write(absl::Cord) override {
        return absl::UnavailableError("write s3://b/bad: connection reset");
      }
      absl::StatusOr<ObjectMeta> Close() override { return absl::InternalError("closed"); }
      void Abort() override {}
    };
    return std::make_unique<Bad>();
  }
};

class CheckpointIoTest : public ::testing::TestWithParam<bool> {
 protected:
  std::shared_ptr<ObjectStore> Store() {
    if (GetParam()) return temp_.store();
    return memory_;
  }
  TempStore temp_;
  std::shared_ptr<ObjectStore> memory_ = std::make_shared<store_testing::MemoryStore>();
};

TEST_P(CheckpointIoTest, WritesEachFileAsTheConcatenationOfItsRegions) {
  auto store = Store();
  const std::string a = RandomBytes(3 << 20, 1), b = RandomBytes(1000, 2), c = RandomBytes(0, 3);
  std::vector<FileToWrite> files;
  files.push_back({"ckpt/__0_0.distcp", {Bytes(a, 0, a.size()), Bytes(b, 0, b.size())}, {}});
  files.push_back(
      {"ckpt/__1_0.distcp", {Bytes(b, 10, 500), Bytes(c, 0, 0), Bytes(a, 7, 4096)}, {}});
  files.push_back({"ckpt/empty", {}, {}});
  WriteFilesOptions options;
  options.slice_bytes = 1 << 20;  // several Write() calls per region
  auto written = WriteFiles(*store, files, options);
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_EQ(written->size(), 3u);
  EXPECT_EQ((*written)[0].key, "ckpt/__0_0.distcp");
  EXPECT_EQ((*written)[0].size, a.size() + b.size());
  EXPECT_EQ((*written)[1].size, 500u + 4096u);
  EXPECT_EQ((*written)[2].size, 0u);
  EXPECT_EQ(*store->Read("ckpt/__0_0.distcp"), a + b);
  EXPECT_EQ(*store->Read("ckpt/__1_0.distcp"), b.substr(10, 500) + a.substr(7, 4096));
  EXPECT_EQ(*store->Read("ckpt/empty"), "");
  auto head = store->Head("ckpt/__0_0.distcp");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->etag, (*written)[0].etag);
}

TEST_P(CheckpointIoTest, AFailedFileLeavesNoFileOfTheCallBehind) {
  auto inner = Store();
  FailingStore store(inner);
  const std::string a = RandomBytes(1 << 20, 4);
  std::vector<FileToWrite> files;
  for (int i = 0; i < 6; ++i)
    files.push_back({absl::StrCat("ok/", i), {Bytes(a, 0, a.size())}, {}});
  files.push_back({"bad/x", {Bytes(a, 0, a.size())}, {}});
  WriteFilesOptions options;
  options.max_files_in_flight = 2;
  auto written = WriteFiles(store, files, options);
  ASSERT_FALSE(written.ok());
  EXPECT_THAT(written.status().message(), HasSubstr("connection reset"));
  ListOptions lo;
  auto all = inner->ListAll(lo);
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->objects.empty())
      << all->objects.size() << " files left, first " << all->objects.front().key;
}

INSTANTIATE_TEST_SUITE_P(Stores, CheckpointIoTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Local" : "Memory"; });

}  // namespace
}  // namespace wharf::checkpoint
