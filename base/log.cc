#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/file_io.h"

namespace wharf {
namespace {

constexpr int kUnset = -1;
std::atomic<int> level{kUnset};

LogLevel FromEnvironment() {
  const char* env = std::getenv("WHARF_LOG");
  if (env == nullptr || *env == '\0') return LogLevel::kWarning;
  absl::StatusOr<LogLevel> parsed = ParseLogLevel(env);
  if (!parsed.ok()) {
    std::fprintf(stderr, "wharf: WHARF_LOG: %s; using warning\n",
                 std::string(parsed.status().message()).c_str());
    return LogLevel::kWarning;
  }
  return *parsed;
}

}  // namespace

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (t == "debug") return LogLevel::kDebug;
  if (t == "info") return LogLevel::kInfo;
  if (t == "warning" || t == "warn") return LogLevel::kWarning;
  if (t == "error") return LogLevel::kError;
  if (t == "off" || t == "none") return LogLevel::kOff;
  return absl::InvalidArgumentError(
      absl::StrCat("log level '", text, "': expected debug, info, warning, error or off"));
}

absl::string_view LogLevelName(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
    case LogLevel::kOff:
      return "off";
  }
  return "?";
}

LogLevel GetLogLevel() {
  int v = level.load(std::memory_order_relaxed);
  if (v == kUnset) {
    int expected = kUnset;
    level.compare_exchange_strong(expected, static_cast<int>(FromEnvironment()));
    v = level.load(std::memory_order_relaxed);
  }
  return static_cast<LogLevel>(v);
}

void SetLogLevel(LogLevel l) { level.store(static_cast<int>(l), std::memory_order_relaxed); }

void LogLine(LogLevel l, absl::string_view message) {
  if (!LogEnabled(l)) return;
  const std::string line = absl::StrCat("wharf: ", LogLevelName(l), ": ", message, "\n");
  (void)WriteAll(STDERR_FILENO, line);  // nowhere to report a failure to write to stderr
}

}  // namespace wharf
