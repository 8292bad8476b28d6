// Small POSIX file helpers shared by the layers that write files themselves (the local store,
// logs, the metrics spool).
// Thread-safety: functions of their arguments only.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace wharf {

// Writes all of `data` to `fd`, retrying short writes and EINTR. Errors name the errno.
absl::Status WriteAll(int fd, absl::string_view data);

// Writes `data` to `path` whole or not at all: a temp file beside it (mode 0600, named with
// the pid), renamed over `path`. Errors name the path and the errno.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view data);

}  // namespace wharf
