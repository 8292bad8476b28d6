#include "store/keys.h"

#include <sys/stat.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace wharf {

std::string UnsafeKeyReason(absl::string_view rel) {
  if (rel.empty()) return "an empty key names no file below the destination";
  if (rel.find('\0') != absl::string_view::npos) return "a NUL byte cannot be in a file name";
  if (rel.front() == '/' || rel.front() == '\\') {
    return "an absolute path would escape the destination";
  }
  for (absl::string_view part : absl::StrSplit(rel, '/')) {
    if (part.empty()) return "an empty path component ('//', or a '/' at the end) names no file";
    if (part == ".") return "a '.' path component names no file of its own";
    if (part == "..") return "a '..' component would escape the destination";
    // A backslash is an ordinary byte in POSIX names, so "a\b" is one harmless file here;
    // but the same tree copied onto Windows, or unpacked by a tool that treats '\' as a
    // separator, would resolve "..\" upwards. Refuse the dot components on that side too.
    for (absl::string_view sub : absl::StrSplit(part, '\\')) {
      if (sub == "." || sub == "..") {
        return "a '.' or '..' component between backslashes would escape the destination on "
               "Windows";
      }
    }
  }
  return "";
}

bool IsSafeRelativeKey(absl::string_view rel) { return UnsafeKeyReason(rel).empty(); }

std::string AsPrefix(absl::string_view key) {
  if (key.empty() || key.back() == '/') return std::string(key);
  return absl::StrCat(key, "/");
}

std::string JoinKey(absl::string_view prefix, absl::string_view rel) {
  if (prefix.empty()) return std::string(rel);
  while (!rel.empty() && rel.front() == '/') rel.remove_prefix(1);
  if (prefix.back() == '/') return absl::StrCat(prefix, rel);
  return absl::StrCat(prefix, "/", rel);
}

absl::string_view Basename(absl::string_view key) {
  const size_t slash = key.rfind('/');
  return slash == absl::string_view::npos ? key : key.substr(slash + 1);
}

bool IsLocalDirectory(absl::string_view uri) {
  if (!absl::ConsumePrefix(&uri, "file://")) return false;
  struct stat st;
  return stat(std::string(uri).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::Status RequireObjectKey(absl::string_view op, absl::string_view uri, absl::string_view key) {
  if (!key.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, " ", uri, ": no object key (a bucket or a prefix ending in '/' is not an object)"));
}

}  // namespace wharf
