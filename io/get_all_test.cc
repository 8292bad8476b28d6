// GetAll: at most N GETs in flight, one result per request, short reads and the first
// failure reported by name, no request started after a failure (unless asked).
#include "io/get_all.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/testing/delayed_get_store.h"
#include "store/testing/memory_store.h"

namespace wharf {
namespace {

using ::testing::HasSubstr;

GetRequest Ranged(const std::string& key, uint64_t offset, std::string& buf) {
  GetRequest r;
  r.key = key;
  r.range = ByteRange::Of(offset, buf.size());
  r.buffer = absl::MakeSpan(buf);
  return r;
}

TEST(GetAllTest, KeepsAtMostMaxInFlightAndDeliversEveryRange) {
  auto memory = std::make_shared<store_testing::MemoryStore>();
  std::string data(10000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i % 251);
  ASSERT_TRUE(memory->Put("k", absl::Cord(data)).ok());
  store_testing::DelayedGetStore store(memory, absl::Milliseconds(5));
  std::vector<std::string> bufs(20, std::string(500, '\0'));
  std::vector<GetRequest> requests;
  for (size_t i = 0; i < bufs.size(); ++i) requests.push_back(Ranged("k", i * 500, bufs[i]));
  GetAllOptions options;
  options.max_in_flight = 3;
  const GetAllResult got = GetAll(store, std::move(requests), options);
  ASSERT_TRUE(got.error.ok()) << got.error;
  EXPECT_EQ(got.started, 20u);
  EXPECT_EQ(got.bytes, 10000u);
  EXPECT_LE(store.peak_in_flight(), 3);
  EXPECT_GE(store.peak_in_flight(), 2);
  for (size_t i = 0; i < bufs.size(); ++i) EXPECT_EQ(bufs[i], data.substr(i * 500, 500)) << i;
}

TEST(GetAllTest, AShortReadAndAMissingObjectFailByNameAndStopWhatIsNotStarted) {
  auto store = std::make_shared<store_testing::MemoryStore>();
  ASSERT_TRUE(store->Put("short", absl::Cord(std::string(100, 'x'))).ok());
  std::string a(200, '\0');
  auto got = GetAll(*store, {Ranged("short", 0, a)});
  EXPECT_EQ(got.error.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.error.message(), HasSubstr("bytes [0, 200): short read of 100 bytes"));

  std::vector<std::string> bufs(5, std::string(10, '\0'));
  std::vector<GetRequest> requests = {Ranged("missing", 0, bufs[0])};
  for (int i = 1; i < 5; ++i) requests.push_back(Ranged("short", 0, bufs[i]));
  GetAllOptions one_at_a_time;
  one_at_a_time.max_in_flight = 1;
  got = GetAll(*store, requests, one_at_a_time);
  EXPECT_EQ(got.error.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(got.started, 1u);
  ASSERT_EQ(got.results.size(), 5u);
  EXPECT_EQ(got.results[4].status().code(), absl::StatusCode::kCancelled);

  // Every request runs when asked, each with its own outcome.
  one_at_a_time.stop_at_first_error = false;
  got = GetAll(*store, requests, one_at_a_time);
  EXPECT_EQ(got.started, 5u);
  EXPECT_EQ(got.results[0].status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(got.results[4].ok());
  EXPECT_EQ(got.bytes, 40u);
}

}  // namespace
}  // namespace wharf
