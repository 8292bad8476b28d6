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
  StoreRegistry::Global().Register("test", [&](const ObjectUri&, std::shared_ptr<Context>)
                                               -> absl::StatusOr<std::shared_ptr<ObjectStore>> {
    ++calls;
    return absl::UnavailableError("test factory");
  });
  EXPECT_EQ(OpenUri("test://bucket/x").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace wharf
