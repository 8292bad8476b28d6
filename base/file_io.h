// Small POSIX file helpers shared by the layers that write files themselves (the local store,
// logs, the metrics and profiler spools).
// Thread-safety: functions of their arguments only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace wharf {

// Writes all of `data` to `fd`, retrying short writes and EINTR. Errors name the errno.
absl::Status WriteAll(int fd, absl::string_view data);
// The same for every chunk of `data`, with writev (up to 64 chunks a call): a file written
// in one call per Cord, not per chunk (each write that starts inside a new page-cache folio
// makes ext4 zero the rest of it first).
absl::Status WriteAll(int fd, const absl::Cord& data);

// Writes `data` to `path` whole or not at all: a temp file beside it (mode 0600, named with
// the pid), renamed over `path`. Errors name the path and the errno.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view data);

// The whole file at `path` into `out`; false when it cannot be opened.
bool ReadFile(const std::string& path, std::string* out);

// The whole file at `path`. Errors name `what` (e.g. "reading credentials file /k.json") and
// the errno (NotFound for a missing file); a file of more than `max_bytes` is InvalidArgument
// ("<what>: larger than <max_bytes> bytes"), so a wrong path cannot fill the memory.
absl::StatusOr<std::string> ReadFileToString(const std::string& path, absl::string_view what,
                                             uint64_t max_bytes = UINT64_MAX);

// "<dir>/<name>" of the entries of `dir` whose names end in `suffix`, sorted; empty when
// `dir` cannot be read.
std::vector<std::string> ListFiles(const std::string& dir, absl::string_view suffix);

}  // namespace wharf
