// Error helpers shared by every wharf library. Errors are values (absl::Status);
// each one names the operation and the object it concerns, e.g.
//   "reading s3://bucket/a/b.jpg: SignatureDoesNotMatch (check AWS_SECRET_ACCESS_KEY)".
// Thread-safety: all functions are pure.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace wharf {

// Returns `status` with "<context>: " prefixed to its message, keeping its code and payloads.
// OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// Maps an errno value to the closest absl status code, with "<context>: <strerror>" as message.
absl::Status ErrnoToStatus(int err, absl::string_view context);

// The start of `text` (a server's reply quoted in a message): at most `limit` bytes, trimmed,
// newlines and tabs as spaces, "..." when cut.
std::string Snippet(absl::string_view text, size_t limit = 200);

}  // namespace wharf

#define WHARF_STATUS_CONCAT_INNER_(a, b) a##b
#define WHARF_STATUS_CONCAT_(a, b) WHARF_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if not OK.
#define WHARF_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status wharf_status_ = (expr);         \
    if (!wharf_status_.ok()) return wharf_status_; \
  } while (0)

// `lhs = *expr` for an absl::StatusOr<T> expression; returns its status if not OK.
#define WHARF_ASSIGN_OR_RETURN(lhs, expr) \
  WHARF_ASSIGN_OR_RETURN_IMPL_(WHARF_STATUS_CONCAT_(wharf_statusor_, __LINE__), lhs, expr)
#define WHARF_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()
