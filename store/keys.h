// Keys as paths: joining, base names, and the check that keeps a key from a listing inside
// its destination. Shared by the transfer engine and the CLI.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace wharf {

// True when `rel`, a key relative to a destination prefix, names something strictly below
// that prefix once joined to it, on a POSIX file system as well as on Windows. A listing of
// a hostile bucket can return keys such as "p/../../etc/x" or "p//x"; copying those under a
// destination directory must never write outside it. Refused: the empty string; a leading
// '/' or '\'; an empty, "." or ".." path component (split on '/'); a "." or ".." component
// when also splitting on '\' (so "a\..\b" is refused too); a NUL byte anywhere.
bool IsSafeRelativeKey(absl::string_view rel);
// Why IsSafeRelativeKey refuses `rel` ("a '..' component would escape the destination", "an
// empty path component ('//', ...) names no file", ...), or "" when it does not.
std::string UnsafeKeyReason(absl::string_view rel);

// `key` with a '/' appended, unless it is empty or already ends in '/'.
std::string AsPrefix(absl::string_view key);

// prefix + rel, with exactly one '/' between them (none when `prefix` is empty).
std::string JoinKey(absl::string_view prefix, absl::string_view rel);

// The last path component of `key` (the part after the last '/').
absl::string_view Basename(absl::string_view key);

// Whether `uri` is a file:// URI naming an existing directory (a local folder, empty or not,
// that a listing of it found nothing in is an empty source, not a missing one).
bool IsLocalDirectory(absl::string_view uri);

// InvalidArgument "<op> <uri>: no object key (...)" when `key` is empty: a request for the
// empty key addresses the bucket itself (an S3 GET of it is a listing), never an object.
absl::Status RequireObjectKey(absl::string_view op, absl::string_view uri, absl::string_view key);

}  // namespace wharf
