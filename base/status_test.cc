#include "base/status.h"

#include <cerrno>
#include <vector>

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

// Runs the steps in order through WHARF_RETURN_IF_ERROR; records each one run.
absl::Status RunSteps(const std::vector<absl::Status>& steps, std::vector<int>* ran) {
  for (size_t i = 0; i < steps.size(); ++i) {
    WHARF_RETURN_IF_ERROR((ran->push_back(static_cast<int>(i)), steps[i]));
  }
  return absl::OkStatus();
}

TEST(StatusTest, ReturnIfErrorReturnsTheFirstErrorAndStopsThere) {
  std::vector<int> ran;
  EXPECT_TRUE(RunSteps({absl::OkStatus(), absl::OkStatus()}, &ran).ok());
  EXPECT_EQ(ran, (std::vector<int>{0, 1}));
  ran.clear();
  const absl::Status status = RunSteps(
      {absl::OkStatus(), absl::DataLossError("second"), absl::NotFoundError("third")}, &ran);
  EXPECT_EQ(status, absl::DataLossError("second"));  // as returned: code and message
  EXPECT_EQ(ran, (std::vector<int>{0, 1}));          // the expression is evaluated once
  // In an if without braces, the macro is one statement (its do/while).
  ran.clear();
  auto guarded = [&](bool check) -> absl::Status {
    if (check)
      WHARF_RETURN_IF_ERROR(absl::AbortedError("checked"));
    else
      ran.push_back(-1);
    return absl::OkStatus();
  };
  EXPECT_EQ(guarded(true).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(guarded(false).ok());
  EXPECT_EQ(ran, (std::vector<int>{-1}));
}

}  // namespace
}  // namespace wharf
