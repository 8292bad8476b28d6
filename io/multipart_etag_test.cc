// MultipartEtags against ETags computed here part by part, the way S3 computes them.
#include "io/multipart_etag.h"

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/testing/random_bytes.h"
#include "store/testing/temp_store.h"

namespace wharf {
namespace {

using store_testing::RandomBytes;
using store_testing::TempStore;
using ::testing::Contains;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// S3's multipart ETag of `data` cut into parts of the given sizes (the last takes the rest).
std::string EtagOf(const std::string& data, const std::vector<uint64_t>& part_sizes) {
  std::string digests;
  uint64_t at = 0;
  for (size_t i = 0; i < part_sizes.size(); ++i) {
    const uint64_t n = i + 1 == part_sizes.size() ? data.size() - at : part_sizes[i];
    Md5 md5;
    md5.Update(absl::string_view(data).substr(at, n));
    const auto d = md5.Finish();
    digests.append(reinterpret_cast<const char*>(d.data()), d.size());
    at += n;
  }
  return absl::StrCat(Md5Hex(digests), "-", part_sizes.size());
}

TEST(MultipartEtagPartsTest, ReadsTheCountOfMultipartEtagsOnly) {
  const std::string hex(32, 'a');
  EXPECT_EQ(MultipartEtagParts(hex + "-3"), 3u);
  EXPECT_EQ(MultipartEtagParts("\"" + hex + "-10000\""), 10000u);
  EXPECT_EQ(MultipartEtagParts(hex), 0u);  // an MD5
  EXPECT_EQ(MultipartEtagParts(hex + "-0"), 0u);
  EXPECT_EQ(MultipartEtagParts(hex + "-10001"), 0u);  // more parts than S3 allows
  EXPECT_EQ(MultipartEtagParts(hex + "-"), 0u);
  EXPECT_EQ(MultipartEtagParts(hex + "-3x"), 0u);
  EXPECT_EQ(MultipartEtagParts(std::string(31, 'a') + "g-3"), 0u);
  EXPECT_EQ(MultipartEtagParts("crc32c-1234-5"), 0u);
  EXPECT_EQ(MultipartEtagParts(""), 0u);
}

TEST(MultipartEtagsTest, FindsTheCommonPartSizes) {
  TempStore t;
  const std::string data = RandomBytes(21 * kMiB + 5, 1);
  ASSERT_TRUE(t.store()->Put("f", absl::Cord(data)).ok());
  // 5 MiB parts (5 of them), 8 MiB (3), 16 MiB (2) and an even split into 4.
  for (const std::vector<uint64_t>& plan :
       std::vector<std::vector<uint64_t>>{{5 * kMiB, 5 * kMiB, 5 * kMiB, 5 * kMiB, 5 * kMiB},
                                          {8 * kMiB, 8 * kMiB, 8 * kMiB},
                                          {16 * kMiB, 16 * kMiB},
                                          {6 * kMiB, 6 * kMiB, 6 * kMiB, 6 * kMiB}}) {
    const std::string etag = EtagOf(data, plan);
    auto same = MultipartEtagMatches(*t.store(), "f", data.size(), etag, 8 * kMiB);
    ASSERT_TRUE(same.ok()) << same.status();
    EXPECT_TRUE(*same) << etag;
    // Quoted and upper case, as some servers send it.
    same = MultipartEtagMatches(*t.store(), "f", data.size(),
                                absl::StrCat("\"", absl::AsciiStrToUpper(etag), "\""), 0);
    ASSERT_TRUE(same.ok());
    EXPECT_TRUE(*same);
  }
  // Other bytes of the same size, an MD5 ETag, a part count no plan gives: no match.
  std::string other = data;
  other[13 * kMiB] ^= 1;
  const std::string etag = EtagOf(other, {8 * kMiB, 8 * kMiB, 8 * kMiB});
  EXPECT_FALSE(*MultipartEtagMatches(*t.store(), "f", data.size(), etag, 8 * kMiB));
  EXPECT_FALSE(*MultipartEtagMatches(*t.store(), "f", data.size(), Md5Hex(data), 8 * kMiB));
  auto none = MultipartEtags(*t.store(), "f", data.size(), 9000, 8 * kMiB);
  ASSERT_TRUE(none.ok());
  EXPECT_THAT(*none, IsEmpty());
  // A size that is no longer the file's (changed since it was listed): nothing to compare.
  auto changed = MultipartEtags(*t.store(), "f", data.size() - 1, 3, 8 * kMiB);
  ASSERT_TRUE(changed.ok());
  EXPECT_THAT(*changed, IsEmpty());
  // A file that is gone: the read's status.
  EXPECT_FALSE(MultipartEtags(*t.store(), "gone", data.size(), 3, 8 * kMiB).ok());
}

TEST(MultipartEtagsTest, TheWritersPlanDoublesEvery1000Parts) {
  // With a 4 KiB base, wharf's writer cuts 1,000 parts of 4 KiB, then 8 KiB ones.
  TempStore t;
  constexpr uint64_t kBase = 4096;
  const std::string data = RandomBytes(1000 * kBase + 9 * 2 * kBase + 100, 2);
  ASSERT_TRUE(t.store()->Put("f", absl::Cord(data)).ok());
  std::vector<uint64_t> plan(1000, kBase);
  plan.insert(plan.end(), 10, 2 * kBase);
  const std::string doubling = EtagOf(data, plan);
  auto etags = MultipartEtags(*t.store(), "f", data.size(), 1010, kBase);
  ASSERT_TRUE(etags.ok()) << etags.status();
  EXPECT_THAT(*etags, Contains(doubling));
  // Without this base among the candidates the plan is not found.
  auto without = MultipartEtags(*t.store(), "f", data.size(), 1010, 0);
  ASSERT_TRUE(without.ok());
  EXPECT_THAT(*without, Not(Contains(doubling)));
}

TEST(MultipartEtagsTest, OnePart) {
  TempStore t;
  const std::string data = RandomBytes(3 * kMiB, 3);
  ASSERT_TRUE(t.store()->Put("f", absl::Cord(data)).ok());
  auto etags = MultipartEtags(*t.store(), "f", data.size(), 1, 8 * kMiB);
  ASSERT_TRUE(etags.ok());
  EXPECT_EQ(*etags, std::vector<std::string>{EtagOf(data, {data.size()})});
}

}  // namespace
}  // namespace wharf
