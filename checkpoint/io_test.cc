// Checkpoint I/O: files written from memory regions appear whole with exactly those bytes,
// a failed file takes the others with it, and ranged reads land in their destinations
// whatever their order, overlaps, gaps and sizes.
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

TEST_P(CheckpointIoTest, ReadsRangesIntoTheirDestinationsCoalescedAndSplit) {
  auto store = Store();
  const std::string one = RandomBytes(5 << 20, 5), two = RandomBytes(300000, 6);
  ASSERT_TRUE(store->Put("f/one", absl::Cord(one)).ok());
  ASSERT_TRUE(store->Put("f/two", absl::Cord(two)).ok());
  struct Want {
    std::string key;
    uint64_t offset, length;
  };
  // Neighbours, a gap, an overlap, a duplicate, a long range to split, an empty one, and
  // ranges of two objects, given in no particular order.
  std::vector<Want> wants = {{"f/two", 1000, 500},        {"f/one", 0, 100},
                             {"f/one", 100, 50},          {"f/one", 4000, 9000},
                             {"f/one", 4100, 20},         {"f/one", 4100, 20},
                             {"f/one", 1 << 20, 3 << 20}, {"f/two", 0, 0},
                             {"f/two", 299000, 1000},     {"f/one", (5 << 20) - 1, 1}};
  std::vector<std::string> dst(wants.size());
  std::vector<RangeToRead> ranges;
  for (size_t i = 0; i < wants.size(); ++i) {
    dst[i].assign(wants[i].length, '\0');
    ranges.push_back({wants[i].key, wants[i].offset, wants[i].length, dst[i].data(), ""});
  }
  ReadRangesOptions options;
  options.max_request_bytes = 1 << 20;
  options.coalesce_gap = 64 << 10;
  options.max_in_flight = 3;
  auto stats = ReadRanges(*store, ranges, options);
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (size_t i = 0; i < wants.size(); ++i) {
    const std::string& src = wants[i].key == "f/one" ? one : two;
    EXPECT_EQ(dst[i], src.substr(wants[i].offset, wants[i].length)) << "range " << i;
  }
  // one: [0,150) + [4000,13000) coalesced into one GET; the 3 MiB range split into 3 GETs;
  // the last byte alone. two: two GETs (the gap is larger than 64 KiB).
  EXPECT_EQ(stats->requests, 1u + 3u + 1u + 2u);
  EXPECT_EQ(stats->ranges, wants.size());
}

TEST_P(CheckpointIoTest, ReadsNamingTheObjectWhenARangeIsMissingOrTheVersionChanged) {
  auto store = Store();
  ASSERT_TRUE(store->Put("f/x", absl::Cord(RandomBytes(1000, 7))).ok());
  std::string buf(100, '\0');
  auto past = ReadRanges(*store, {{"f/x", 950, 100, buf.data(), ""}});
  ASSERT_FALSE(past.ok());
  EXPECT_THAT(past.status().ToString(), HasSubstr("f/x"));
  auto stale = ReadRanges(*store, {{"f/x", 0, 100, buf.data(), "not-the-etag"}});
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition) << stale.status();
  auto missing = ReadRanges(*store, {{"f/nope", 0, 10, buf.data(), ""}});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().ToString(), HasSubstr("f/nope"));
}

INSTANTIATE_TEST_SUITE_P(Stores, CheckpointIoTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Local" : "Memory"; });

}  // namespace
}  // namespace wharf::checkpoint
