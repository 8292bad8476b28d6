#include "base/status.h"

#include <cerrno>

#include "gtest/gtest.h"

namespace wharf {
namespace {

TEST(StatusTest, AnnotateKeepsCodeAndPrefixesMessage) {
  auto s = Annotate(absl::NotFoundError("no such object"), "get s3://b/k");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "get s3://b/k: no such object");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

TEST(StatusTest, ErrnoMapping) {
  EXPECT_EQ(ErrnoToStatus(ENOENT, "open f").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatus(EACCES, "open f").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "write f").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(ENOENT, "open f").message(), "open f: No such file or directory");
}

absl::StatusOr<int> Half(int x) {
  if (x % 2) return absl::InvalidArgumentError("odd");
  return x / 2;
}
absl::StatusOr<int> Quarter(int x) {
  WHARF_ASSIGN_OR_RETURN(int h, Half(x));
  WHARF_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusTest, Macros) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace wharf
