#include "store/spec.h"

#include <stdlib.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/registry.h"

namespace wharf {
namespace {

using ::testing::HasSubstr;

TEST(StoreSpecTest, QueryOptionsOnABucketOrPrefixUri) {
  auto parsed = ParseStoreUri(
      "s3://bucket/train/?endpoint=http://127.0.0.1:9000&region=eu-west-1&anonymous=true");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->spec.scheme, "s3");
  EXPECT_EQ(parsed->spec.bucket, "bucket");
  EXPECT_EQ(parsed->key, "train/");
  EXPECT_EQ(parsed->spec.options.endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(parsed->spec.options.region, "eu-west-1");
  EXPECT_EQ(parsed->spec.options.anonymous, true);
  EXPECT_FALSE(parsed->spec.options.profile.has_value());

  auto root = ParseStoreUri("gs://bucket/?api=xml&addressing_style=virtual");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(root->key, "");
  EXPECT_EQ(root->spec.options.api, "xml");
  EXPECT_EQ(root->spec.options.addressing_style, AddressingStyle::kVirtual);
}

TEST(StoreSpecTest, QuestionMarkInAKeyIsPartOfTheKey) {
  auto parsed = ParseStoreUri("s3://b12/a?b");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->key, "a?b");
  EXPECT_TRUE(parsed->spec.options.empty());
  // Not a folder URI, so even option-like text is key.
  auto option_like = ParseStoreUri("s3://b12/dir/x?region=eu-west-1");
  ASSERT_TRUE(option_like.ok()) << option_like.status();
  EXPECT_EQ(option_like->key, "dir/x?region=eu-west-1");
  EXPECT_FALSE(option_like->spec.options.region.has_value());
  EXPECT_EQ(option_like->uri().ToString(), "s3://b12/dir/x?region=eu-west-1");
}

TEST(StoreSpecTest, FilePathsWithQuestionMarks) {
  auto uri = ParseStoreUri("file:///tmp/what?.txt");
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_EQ(uri->spec.bucket, "/");
  EXPECT_EQ(uri->key, "tmp/what?.txt");
  // A local path is never parsed for options, even ending in "/?...".
  auto path = ParseStoreUri("/tmp/dir/?region=x");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(path->key, "tmp/dir/?region=x");
  EXPECT_TRUE(path->spec.options.empty());
}

TEST(StoreSpecTest, FileStoreOpensAKeyWithAQuestionMark) {
  char tmpl[] = "/tmp/wharf-spec-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string uri = absl::StrCat("file://", tmpl, "/a?b");
  auto opened = OpenUri(uri);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_TRUE(opened->store->Put(opened->uri.key, absl::Cord("q")).ok());
  auto data = opened->store->Read(opened->uri.key);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(*data, "q");
  EXPECT_EQ(opened->store->Uri(opened->uri.key), uri);
  ASSERT_TRUE(opened->store->Delete(opened->uri.key).ok());
  rmdir(tmpl);
}

TEST(StoreSpecTest, UnknownOptionNamesTheValidOnes) {
  auto parsed = ParseStoreUri("s3://bucket/?endpiont=http://x");
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("'endpiont'"));
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr("endpoint, region, anonymous, profile, addressing_style, api"));
  StoreOptions options;
  EXPECT_EQ(options.Set("secret", "x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(StoreSpecTest, MalformedValuesAreRefused) {
  for (const char* uri :
       {"s3://bucket/?anonymous=maybe", "s3://bucket/?addressing_style=dns",
        "s3://bucket/?endpoint=ftp://x", "s3://bucket/?endpoint=http://u:p@h",
        "s3://bucket/?region=", "s3://bucket/?region", "s3://bucket/?region=%zz"}) {
    auto parsed = ParseStoreUri(uri);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << uri;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(uri));
  }
}

TEST(StoreSpecTest, ExplicitOptionsBeatTheQuery) {
  StoreOptions explicit_options;
  explicit_options.region = "us-west-2";
  explicit_options.profile = "dev";
  auto parsed =
      ParseStoreUri("s3://bucket/?region=eu-west-1&endpoint=http%3A%2F%2Fh%3A1", explicit_options);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->spec.options.region, "us-west-2");
  EXPECT_EQ(parsed->spec.options.profile, "dev");
  EXPECT_EQ(parsed->spec.options.endpoint, "http://h:1");  // percent-decoded
}

TEST(StoreSpecTest, JsonRoundTrip) {
  StoreSpec spec{"s3", "bucket", {}};
  spec.options.endpoint = "http://127.0.0.1:9000";
  spec.options.anonymous = false;
  spec.options.addressing_style = AddressingStyle::kPath;
  spec.options.profile = "dev";
  const std::string json = spec.ToJson();
  EXPECT_EQ(json, R"({"v":1,"scheme":"s3","bucket":"bucket","options":{"endpoint":)"
                  R"("http://127.0.0.1:9000","anonymous":false,"profile":"dev",)"
                  R"("addressing_style":"path"}})");
  auto back = StoreSpec::FromJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, spec);

  StoreSpec file{"file", "/", {}};
  auto file_back = StoreSpec::FromJson(file.ToJson());
  ASSERT_TRUE(file_back.ok()) << file_back.status();
  EXPECT_EQ(*file_back, file);
}

TEST(StoreSpecTest, JsonErrors) {
  for (const char* json : {"", "[]", R"({"scheme":"s3"})", R"({"v":2,"scheme":"s3"})", R"({"v":1})",
                           R"({"v":1,"scheme":"s3","options":{"key":"x"}})",
                           R"({"v":1,"scheme":"s3","options":{"region":3}})"}) {
    auto spec = StoreSpec::FromJson(json);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << json;
  }
}

TEST(StoreSpecTest, FileStoresTakeNoOptions) {
  auto opened = OpenUri("file:///tmp/?region=eu-west-1");
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(opened.status().message()), HasSubstr("region"));
}

TEST(StoreSpecTest, GcsRefusesAwsOptionsAndChoosesItsApi) {
  StoreOptions region;
  region.region = "eu-west-1";
  auto with_region = OpenUri("gs://bucket/", region);
  EXPECT_EQ(with_region.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(with_region.status().message()), HasSubstr("'region'"));
  // The JSON API (compose, no parallel multipart writer) and the XML API (S3's protocol).
  auto json = OpenUri("gs://bucket/?api=json&anonymous=true");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_TRUE(json->store->capabilities().compose);
  EXPECT_FALSE(json->store->capabilities().multipart_upload);
  auto xml = OpenUri("gs://bucket/?api=xml&anonymous=true");
  ASSERT_TRUE(xml.ok()) << xml.status();
  EXPECT_FALSE(xml->store->capabilities().compose);
  EXPECT_TRUE(xml->store->capabilities().multipart_upload);
  auto other = OpenUri("gs://bucket/?api=grpc&anonymous=true");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  // addressing_style is the XML API's.
  auto style = OpenUri("gs://bucket/?api=json&anonymous=true&addressing_style=virtual");
  EXPECT_EQ(style.status().code(), absl::StatusCode::kInvalidArgument);
  auto s3_api = OpenUri("s3://bucket/?api=xml&anonymous=true");
  EXPECT_EQ(s3_api.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StoreSpecTest, OpenedUriCarriesTheSpec) {
  auto opened = OpenUri("gs://bucket/p/?anonymous=true&endpoint=http://127.0.0.1:1");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->uri.ToString(), "gs://bucket/p/");
  EXPECT_EQ(opened->spec.options.anonymous, true);
  auto again = OpenSpec(opened->spec);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->Uri("k"), "gs://bucket/k");
}

}  // namespace
}  // namespace wharf
