// ReadRanges: ranged reads land in their destinations whatever their order, overlaps, gaps
// and sizes; each range is reported as soon as it is complete; errors name the object.
#include "io/read_ranges.h"

#include <atomic>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/testing/memory_store.h"
#include "store/testing/random_bytes.h"
#include "store/testing/temp_store.h"

namespace wharf {
namespace {

using store_testing::RandomBytes;
using store_testing::TempStore;
using ::testing::HasSubstr;

class ReadRangesTest : public ::testing::TestWithParam<bool> {
 protected:
  std::shared_ptr<ObjectStore> Store() {
    if (GetParam()) return temp_.store();
    return memory_;
  }
  TempStore temp_;
  std::shared_ptr<ObjectStore> memory_ = std::make_shared<store_testing::MemoryStore>();
};

TEST_P(ReadRangesTest, ReadsRangesIntoTheirDestinationsCoalescedAndSplit) {
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
  // Each range is reported done once, and only once its bytes are in place.
  std::vector<std::atomic<int>> done(wants.size());
  std::atomic<int> early{0};
  options.on_range_done = [&](size_t i) {
    done[i].fetch_add(1);
    const std::string& src = wants[i].key == "f/one" ? one : two;
    if (dst[i] != src.substr(wants[i].offset, wants[i].length)) early.fetch_add(1);
  };
  auto stats = ReadRanges(*store, ranges, options);
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (size_t i = 0; i < wants.size(); ++i) EXPECT_EQ(done[i].load(), 1) << "range " << i;
  EXPECT_EQ(early.load(), 0);
  for (size_t i = 0; i < wants.size(); ++i) {
    const std::string& src = wants[i].key == "f/one" ? one : two;
    EXPECT_EQ(dst[i], src.substr(wants[i].offset, wants[i].length)) << "range " << i;
  }
  // one: [0,150) + [4000,13000) coalesced into one GET; the 3 MiB range split into 3 GETs;
  // the last byte alone. two: two GETs (the gap is larger than 64 KiB).
  EXPECT_EQ(stats->requests, 1u + 3u + 1u + 2u);
  EXPECT_EQ(stats->ranges, wants.size());
}

TEST_P(ReadRangesTest, ReadsNamingTheObjectWhenARangeIsMissingOrTheVersionChanged) {
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

TEST_P(ReadRangesTest, ACancelledReadFailsAsCancelled) {
  auto store = Store();
  ASSERT_TRUE(store->Put("f/x", absl::Cord(RandomBytes(1 << 20, 8))).ok());
  std::string buf(1 << 20, '\0');
  ReadRangesOptions options;
  options.cancel = NewCancelToken();
  options.cancel->Cancel();
  int done = 0;
  options.on_range_done = [&](size_t) { ++done; };
  auto got = ReadRanges(*store, {{"f/x", 0, buf.size(), buf.data(), ""}}, options);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled) << got.status();
  EXPECT_EQ(done, 0);
}

INSTANTIATE_TEST_SUITE_P(Stores, ReadRangesTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Local" : "Memory"; });

}  // namespace
}  // namespace wharf
