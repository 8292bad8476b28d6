#include "store/uri.h"

#include <unistd.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace wharf {
namespace {

absl::Status ValidateBucket(absl::string_view scheme, absl::string_view bucket,
                            absl::string_view uri) {
  if (bucket.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid URI '", uri, "': missing bucket name"));
  }
  // S3 and GCS share the core rules: 3-63 characters of lowercase letters, digits, '.', '-',
  // beginning and ending with a letter or digit. GCS also allows '_'. Other schemes are not
  // ours to judge here: the registry refuses an unknown one by name (a misspelt scheme must
  // not read as a bad bucket), and a registered backend checks its own names.
  if (scheme != "s3" && scheme != "gs") return absl::OkStatus();
  const bool allow_underscore = scheme == "gs";
  bool ok = bucket.size() >= 3 && bucket.size() <= 63 && absl::ascii_isalnum(bucket.front()) &&
            absl::ascii_isalnum(bucket.back());
  for (char c : bucket) {
    ok = ok && (absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '.' || c == '-' ||
                (allow_underscore && c == '_'));
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid URI '", uri, "': '", bucket,
                     "' is not a valid bucket name (3-63 lowercase letters, digits, '.', '-')"));
  }
  return absl::OkStatus();
}

// Folds "." and ".." and repeated '/' of an absolute path; keeps a trailing '/'.
std::string NormalizeAbsolutePath(absl::string_view path) {
  std::vector<absl::string_view> parts;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  std::string out = absl::StrCat("/", absl::StrJoin(parts, "/"));
  const bool dir = absl::EndsWith(path, "/") || absl::EndsWith(path, "/.") ||
                   absl::EndsWith(path, "/..") || path == "." || path == "..";
  if (dir && out != "/") out += '/';
  return out;
}

}  // namespace

std::string ObjectUri::ToString() const {
  if (scheme == "file") return absl::StrCat("file:///", key);
  return absl::StrCat(scheme, "://", bucket, "/", key);
}

bool LooksLikeUri(absl::string_view s) {
  const size_t pos = s.find("://");
  if (pos == absl::string_view::npos || pos == 0) return false;
  for (char c : s.substr(0, pos)) {
    if (!absl::ascii_isalnum(c) && c != '+' && c != '-' && c != '.') return false;
  }
  return true;
}

absl::StatusOr<ObjectUri> ParseUri(absl::string_view uri) {
  if (!LooksLikeUri(uri)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid URI '", uri, "': expected scheme://bucket/key"));
  }
  if (uri.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("invalid URI: contains a NUL byte");
  }
  const size_t pos = uri.find("://");
  ObjectUri out;
  out.scheme = absl::AsciiStrToLower(uri.substr(0, pos));
  absl::string_view rest = uri.substr(pos + 3);
  if (out.scheme == "file") {
    // file:///abs/path or file://localhost/abs/path
    if (absl::StartsWith(rest, "localhost/")) rest.remove_prefix(9);
    if (!absl::StartsWith(rest, "/")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid URI '", uri, "': a file URI needs an absolute path (file:///path)"));
    }
    out.bucket = "/";
    std::string path = NormalizeAbsolutePath(rest);
    out.key = path.substr(1);
    return out;
  }
  const size_t slash = rest.find('/');
  out.bucket = std::string(rest.substr(0, slash));
  if (slash != absl::string_view::npos) out.key = std::string(rest.substr(slash + 1));
  if (auto s = ValidateBucket(out.scheme, out.bucket, uri); !s.ok()) return s;
  return out;
}

absl::StatusOr<ObjectUri> ParseUriOrPath(absl::string_view uri_or_path) {
  if (LooksLikeUri(uri_or_path)) return ParseUri(uri_or_path);
  // "s3:/b/k" or "gs:b/k" is a mistyped URI far more often than a local file so named (which
  // stays reachable as ./s3:...).
  for (absl::string_view scheme : {"s3:", "gs:", "file:"}) {
    if (absl::StartsWith(uri_or_path, scheme)) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed URI '", uri_or_path, "': expected ", scheme,
                       scheme == "file:" ? "///ABSOLUTE/PATH" : "//BUCKET/KEY",
                       " (a local path: ./", uri_or_path, ")"));
    }
  }
  auto absolute = AbsoluteLocalPath(uri_or_path);
  if (!absolute.ok()) return absolute.status();
  ObjectUri out;
  out.scheme = "file";
  out.bucket = "/";
  out.key = absolute->substr(1);
  return out;
}

absl::StatusOr<std::string> AbsoluteLocalPath(absl::string_view path) {
  if (path.empty()) return absl::InvalidArgumentError("empty path");
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("invalid path: contains a NUL byte");
  }
  if (absl::StartsWith(path, "/")) return NormalizeAbsolutePath(path);
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) {
    return absl::InternalError("cannot determine the working directory");
  }
  return NormalizeAbsolutePath(absl::StrCat(cwd, "/", path));
}

}  // namespace wharf
