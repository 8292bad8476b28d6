#include "store/uri.h"

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wharf {
namespace {

TEST(UriTest, ParsesS3AndGs) {
  auto s3 = ParseUri("s3://my-bucket/a/b c+d.jpg");
  ASSERT_TRUE(s3.ok());
  EXPECT_EQ(s3->scheme, "s3");
  EXPECT_EQ(s3->bucket, "my-bucket");
  EXPECT_EQ(s3->key, "a/b c+d.jpg");
  EXPECT_EQ(s3->ToString(), "s3://my-bucket/a/b c+d.jpg");
  auto root = ParseUri("gs://bucket_1");
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->key, "");
  EXPECT_EQ(ParseUri("S3://bucket/x")->scheme, "s3");
}

TEST(UriTest, RejectsBadBuckets) {
  for (const char* bad : {"s3://", "s3:///key", "s3://ab/x", "s3://Upper/x", "s3://under_score/x",
                          "s3://-dash/x", "no-scheme/path"}) {
    auto uri = ParseUri(bad);
    EXPECT_EQ(uri.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(UriTest, FileUris) {
  auto f = ParseUri("file:///data/set/x.bin");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->bucket, "/");
  EXPECT_EQ(f->key, "data/set/x.bin");
  EXPECT_EQ(f->ToString(), "file:///data/set/x.bin");
  EXPECT_EQ(ParseUri("file://localhost/tmp/x")->key, "tmp/x");
  EXPECT_EQ(ParseUri("file:///a/./b/../c/")->key, "a/c/");
  EXPECT_EQ(ParseUri("file://relative/x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(UriTest, LocalPathsBecomeFileUris) {
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  auto rel = ParseUriOrPath("sub/dir/");
  ASSERT_TRUE(rel.ok());
  EXPECT_EQ(rel->scheme, "file");
  EXPECT_EQ("/" + rel->key, absl::StrCat(cwd, "/sub/dir/"));
  EXPECT_EQ(ParseUriOrPath("/abs/../x")->key, "x");
  EXPECT_EQ(ParseUriOrPath("s3://bkt/k")->scheme, "s3");
}

TEST(UriTest, MistypedUrisAreRefusedNotTakenForLocalPaths) {
  for (const char* typo : {"s3:/bkt/k", "s3:bkt", "gs:/bkt/k", "file:/tmp/x"}) {
    auto parsed = ParseUriOrPath(typo);
    ASSERT_FALSE(parsed.ok()) << typo;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), testing::HasSubstr("malformed URI"));
    EXPECT_THAT(std::string(parsed.status().message()), testing::HasSubstr(typo));
  }
  // A local name with a colon stays reachable with ./
  auto local = ParseUriOrPath("./s3:bkt");
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local->scheme, "file");
  EXPECT_TRUE(absl::EndsWith(local->key, "/s3:bkt"));
}

}  // namespace
}  // namespace wharf
