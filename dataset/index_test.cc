#include "dataset/index.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/local/local_store.h"
#include "store/testing/temp_store.h"

namespace wharf {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Keys(const SampleIndex& index) {
  std::vector<std::string> keys;
  for (const auto& e : index.entries()) keys.push_back(e.key);
  return keys;
}

absl::StatusOr<SampleIndex> Parse(absl::string_view text,
                                  ManifestFormat format = ManifestFormat::kAuto) {
  return SampleIndex::ParseManifest(text, "ds/", "s3://bucket/", "s3://bucket/ds/m",
                                    {.format = format});
}

TEST(ManifestTest, PlainKeys) {
  auto index = Parse("a/1.jpg\n\n  b/2.jpg \r\n/other/3.jpg\r\ns3://bucket/x/4.jpg\n5.jpg");
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_THAT(Keys(*index),
              ElementsAre("ds/a/1.jpg", "ds/b/2.jpg", "other/3.jpg", "x/4.jpg", "ds/5.jpg"));
  EXPECT_FALSE((*index)[0].size.has_value());
}

TEST(ManifestTest, JsonLines) {
  auto index = Parse(
      "{\"key\": \"a.jpg\", \"size\": 12, \"label\": 3}\n"
      "\n"
      "{\"key\": \"/abs/b.jpg\", \"etag\": \"\\\"0123\\\"\"}\r\n"
      "{\"key\": \"c.jpg\", \"size\": 0, \"etag\": \"ff\"}\n");
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->size(), 3u);
  EXPECT_EQ((*index)[0].key, "ds/a.jpg");
  EXPECT_EQ((*index)[0].size, 12u);
  EXPECT_EQ((*index)[1].key, "abs/b.jpg");
  EXPECT_FALSE((*index)[1].size.has_value());
  EXPECT_EQ((*index)[1].etag, "0123");  // quotes of the HTTP form dropped
  EXPECT_EQ((*index)[2].size, 0u);
  EXPECT_EQ((*index)[2].etag, "ff");
}

TEST(ManifestTest, ErrorsNameTheManifestAndTheLine) {
  struct Case {
    std::string text;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"{\"key\":\"a\"}\n\n{\"key\": \"b\"", "s3://bucket/ds/m line 3: invalid JSON"},
           {"{\"key\":\"a\"}\n[1]", "line 2: expected a JSON object"},
           {"{\"size\": 1}", "line 1: missing \"key\""},
           {"{\"key\": 5}", "line 1: \"key\" must be a string"},
           {"{\"key\": \"\"}", "line 1: empty key"},
           {"{\"key\":\"a\"}\n{\"key\":\"b\",\"size\":-1}",
            "line 2: \"size\" must be a non-negative integer"},
           {"{\"key\":\"b\",\"size\":\"12\"}", "line 1: \"size\" must be a non-negative integer"},
           {"{\"key\":\"b\",\"size\":1.5}", "line 1: \"size\" must be a non-negative integer"},
           {"{\"key\":\"b\",\"etag\":1}", "line 1: \"etag\" must be a string"},
           {"a\nb\ngs://elsewhere/c", "line 3: 'gs://elsewhere/c' is not in this dataset's store"},
           {"a\n/\n", "line 2: key '/' names no object"},
       }) {
    auto index = Parse(c.text);
    EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(index.status().message(), HasSubstr(c.message)) << c.text;
  }
  // The JSON parser's own explanation is kept.
  EXPECT_THAT(Parse("{\"key\": }").status().message(), HasSubstr("syntax error"));
}

TEST(ManifestTest, FormatCanBeForced) {
  // A plain manifest whose first key starts with '{'.
  auto index = Parse("{weird}.jpg\nb.jpg", ManifestFormat::kKeys);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_THAT(Keys(*index), ElementsAre("ds/{weird}.jpg", "ds/b.jpg"));
  EXPECT_THAT(Parse("a.jpg", ManifestFormat::kJsonLines).status().message(),
              HasSubstr("line 1: invalid JSON"));
  EXPECT_TRUE(Parse("").ok());
  EXPECT_TRUE(Parse("\n \n").value().empty());
}

TEST(FingerprintTest, DependsOnKeysAndOrderOnly) {
  SampleIndex a = SampleIndex::FromKeys({"x", "y"});
  SampleIndex b({{.key = "x", .size = 3, .etag = "e"}, {.key = "y"}});
  EXPECT_EQ(a.Fingerprint(), b.Fingerprint());
  EXPECT_NE(a.Fingerprint(), SampleIndex::FromKeys({"y", "x"}).Fingerprint());
  EXPECT_NE(SampleIndex::FromKeys({"ab", "c"}).Fingerprint(),
            SampleIndex::FromKeys({"a", "bc"}).Fingerprint());
  EXPECT_EQ(SampleIndex().Fingerprint().size(), 32u);
}

class LocalIndexTest : public testing::Test {
 protected:
  store_testing::TempStore temp_;
  const std::shared_ptr<LocalStore> store_ = temp_.store();
};

TEST_F(LocalIndexTest, ListingIsSortedAndIndependentOfParallelism) {
  std::vector<std::string> expected;
  // Inserted out of order; "a.txt" < "a/..." byte-wise, which a directory walk gets wrong.
  for (int i = 199; i >= 0; --i) {
    const std::string key = absl::StrCat("train/", i % 7, "/", 1000 + i, ".jpg");
    ASSERT_TRUE(store_->Put(key, absl::Cord(std::string(i, 'x'))).ok());
    expected.push_back(key);
  }
  ASSERT_TRUE(store_->Put("train/a.txt", absl::Cord("t")).ok());
  expected.push_back("train/a.txt");
  ASSERT_TRUE(store_->Put("val/z.jpg", absl::Cord("v")).ok());
  std::sort(expected.begin(), expected.end());

  auto one = SampleIndex::FromListing(*store_, "train/", {.list = {.workers = 1, .page_size = 7}});
  auto many = SampleIndex::FromListing(*store_, "train/", {.list = {.workers = 8, .page_size = 7}});
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ(Keys(*one), expected);
  EXPECT_EQ(Keys(*many), expected);
  EXPECT_EQ(one->Fingerprint(), many->Fingerprint());
  for (const auto& e : one->entries()) {
    ASSERT_TRUE(e.size.has_value());
    EXPECT_FALSE(e.etag.empty());
  }
  EXPECT_EQ((*one)[0].size, 0u);  // train/0/1000.jpg is empty

  auto jpgs = SampleIndex::FromListing(*store_, "train/", {.suffixes = {".jpg"}});
  ASSERT_TRUE(jpgs.ok());
  EXPECT_EQ(jpgs->size(), 200u);
}

TEST_F(LocalIndexTest, ManifestKeysAreRelativeToTheManifest) {
  ASSERT_TRUE(store_->Put("ds/v1/manifest.txt", absl::Cord("a/1.jpg\nb/2.jpg\n/top.jpg\n")).ok());
  auto index = SampleIndex::FromManifest(*store_, "ds/v1/manifest.txt");
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_THAT(Keys(*index), ElementsAre("ds/v1/a/1.jpg", "ds/v1/b/2.jpg", "top.jpg"));

  // A URI inside the store is accepted; the manifest's own error names its URI.
  ASSERT_TRUE(
      store_
          ->Put("m.jsonl", absl::Cord(absl::StrCat("{\"key\":\"", store_->Uri("x/y.bin"), "\"}\n",
                                                   "{\"key\":\"z\",\"size\":true}\n")))
          .ok());
  auto bad = SampleIndex::FromManifest(*store_, "m.jsonl");
  EXPECT_THAT(bad.status().message(),
              HasSubstr(absl::StrCat("manifest ", store_->Uri("m.jsonl"), " line 2")));

  auto missing = SampleIndex::FromManifest(*store_, "nope.txt");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(store_->Uri("nope.txt")));
}

}  // namespace
}  // namespace wharf
