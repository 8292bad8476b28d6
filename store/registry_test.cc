#include "store/registry.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wharf {
namespace {

TEST(RegistryTest, OpensFileUris) {
  auto opened = OpenUri("file:///tmp/some/key");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->uri.key, "tmp/some/key");
  EXPECT_EQ(opened->store->Uri("tmp/some/key"), "file:///tmp/some/key");
}

TEST(RegistryTest, UnknownSchemeNamesTheKnownOnes) {
  auto opened = OpenUri("ftp://host/x");
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(opened.status().message()), testing::HasSubstr("file://"));
}

TEST(RegistryTest, RegisteredFactoryIsUsed) {
  int calls = 0;
  StoreRegistry::Global().Register(
      "test",
      [&](const StoreSpec&,
          std::shared_ptr<Runtime>) -> absl::StatusOr<std::shared_ptr<ObjectStore>> {
        ++calls;
        return absl::UnavailableError("test factory");
      });
  EXPECT_EQ(OpenUri("test://bucket/x").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(calls, 1);
}

TEST(RegistryTest, BucketListersByScheme) {
  StoreRegistry& registry = StoreRegistry::Global();
  registry.RegisterBucketLister(
      "listed",
      [](const StoreSpec&, std::shared_ptr<Runtime>) -> absl::StatusOr<std::vector<BucketInfo>> {
        return std::vector<BucketInfo>{{"one", absl::FromUnixSeconds(1)}, {"two"}};
      });
  auto buckets = registry.ListBuckets("listed");
  ASSERT_TRUE(buckets.ok()) << buckets.status();
  ASSERT_EQ(buckets->size(), 2u);
  EXPECT_EQ((*buckets)[0].name, "one");
  EXPECT_EQ((*buckets)[0].creation_time, absl::FromUnixSeconds(1));
  // file:// opens stores but has no buckets; an unknown scheme is refused as by OpenUri.
  EXPECT_EQ(registry.ListBuckets("file").status().code(), absl::StatusCode::kUnimplemented);
  auto unknown = registry.ListBuckets("ftp");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), testing::HasSubstr("s3://"));
}

TEST(StoreRegistry, AMisspeltSchemeIsNamedNotTakenForABadBucket) {
  // "x" is no valid S3 bucket name, but the scheme is what is wrong.
  auto opened = OpenUri("notascheme://x");
  ASSERT_FALSE(opened.ok());
  EXPECT_THAT(std::string(opened.status().message()),
              testing::HasSubstr("unsupported URI scheme 'notascheme://'"));
  EXPECT_THAT(std::string(OpenUri("s3://X").status().message()),
              testing::HasSubstr("not a valid bucket name"));
}

}  // namespace
}  // namespace wharf
