// Small POSIX file helpers shared by the layers that write files themselves (the local store,
// logs, the metrics spool).
// Thread-safety: functions of their arguments only.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace wharf {

// Writes all of `data` to `fd`, retrying short writes and EINTR. Errors name the errno.
absl::Status WriteAll(int fd, absl::string_view data);

}  // namespace wharf
