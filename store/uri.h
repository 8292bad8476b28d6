// Object URIs: "s3://bucket/key", "gs://bucket/key", "file:///absolute/path".
// Keys are taken literally (no percent-decoding), as the AWS and gcloud CLIs do.
// For file:// the "bucket" is the file system root "/" and the key is the path below it,
// so "file:///data/x.jpg" is key "data/x.jpg" of the local store rooted at "/".
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace wharf {

struct ObjectUri {
  std::string scheme;  // "file", "s3", "gs", ...
  std::string bucket;  // "/" for file://
  std::string key;     // may be empty (the bucket root) or end in '/' (a prefix)

  std::string ToString() const;
};

// True when `s` has the form "<scheme>://...": a URI rather than a local path.
bool LooksLikeUri(absl::string_view s);

// Parses and validates a URI. InvalidArgument with a message naming the URI when the scheme
// is missing, the bucket name is not valid for its scheme, or a file:// URI is relative.
absl::StatusOr<ObjectUri> ParseUri(absl::string_view uri);

// `path` made absolute against the working directory, with ".", ".." and repeated '/'
// folded; a trailing '/' (or a last "." or "..") is kept as a trailing '/'. InvalidArgument for
// an empty path or a NUL byte.
absl::StatusOr<std::string> AbsoluteLocalPath(absl::string_view path);

// Turns a local path (relative paths resolved against the working directory, "." and ".."
// folded lexically) into a file:// URI; a trailing '/' is kept. URIs pass through ParseUri.
absl::StatusOr<ObjectUri> ParseUriOrPath(absl::string_view uri_or_path);

}  // namespace wharf
