#include "base/status.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace wharf {

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok() || context.empty()) return status;
  absl::Status out(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

std::string Snippet(absl::string_view text, size_t limit) {
  std::string out(absl::StripAsciiWhitespace(text.substr(0, limit)));
  for (char& c : out) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  if (text.size() > limit) out += "...";
  return out;
}

absl::Status ErrnoToStatus(int err, absl::string_view context) {
  absl::StatusCode code;
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      code = absl::StatusCode::kNotFound;
      break;
    case EACCES:
    case EPERM:
    case EROFS:
      code = absl::StatusCode::kPermissionDenied;
      break;
    case EEXIST:
    case ENOTEMPTY:
      code = absl::StatusCode::kAlreadyExists;
      break;
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      code = absl::StatusCode::kResourceExhausted;
      break;
    case EINVAL:
    case ENAMETOOLONG:
    case EISDIR:
      code = absl::StatusCode::kInvalidArgument;
      break;
    case EAGAIN:
    case EINTR:
    case EIO:
      code = absl::StatusCode::kUnavailable;
      break;
    default:
      code = absl::StatusCode::kUnknown;
  }
  char buf[256];
  // GNU strerror_r returns a pointer that may or may not be `buf`.
  const char* msg = strerror_r(err, buf, sizeof(buf));
  return absl::Status(code, absl::StrCat(context, ": ", msg));
}

}  // namespace wharf
