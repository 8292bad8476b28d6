// Logging: one line per event on stderr, by level (docs/design/metrics.md, "Logs").
//
// The level comes from WHARF_LOG (debug, info, warning, error, off; default warning) or
// SetLogLevel (the CLI's -v/--verbose: debug; wharf.configure(log_level=...)). At debug every
// store request is one line (store/metered_store.h): operation, URI, status, bytes, attempts,
// request id, time. Lines never carry secrets: no headers, no query strings, no credentials,
// only what a URI and a status already say (errors name their object and cause, by the
// library's convention, and never a secret).
//
// Thread-safety: thread-safe; a line is written with one write(2), so lines of concurrent
// threads and processes do not interleave.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace wharf {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

// "debug" | "info" | "warning" (or "warn") | "error" | "off", any case.
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text);
absl::string_view LogLevelName(LogLevel level);

// The process's level: SetLogLevel's, else WHARF_LOG's (read once; a malformed value is
// reported once and the default kept), else kWarning.
LogLevel GetLogLevel();
void SetLogLevel(LogLevel level);
inline bool LogEnabled(LogLevel level) { return level >= GetLogLevel(); }

// Writes "wharf: <level>: <message>\n" to stderr when `level` is enabled.
void LogLine(LogLevel level, absl::string_view message);

}  // namespace wharf
