#include "cli/common.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/fork.h"
#include "base/interrupt.h"
#include "base/status.h"

namespace wharf::cli {

// ---- Keys ----

// ---- Parsing and formatting ----

namespace {

// A decimal number of digits only (no sign, no spaces, which SimpleAtoi would accept).
bool ParseDecimal(absl::string_view s, uint64_t* out) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return absl::SimpleAtoi(s, out);
}

}  // namespace

namespace {
constexpr absl::string_view kUsagePayload = "wharf.cli/usage";
constexpr absl::string_view kSkippedPayload = "wharf.cli/skipped";
}  // namespace

absl::Status SkippedError(absl::string_view message) {
  absl::Status s = absl::FailedPreconditionError(message);
  s.SetPayload(kSkippedPayload, absl::Cord("1"));
  return s;
}

bool IsSkippedError(const absl::Status& status) {
  return status.GetPayload(kSkippedPayload).has_value();
}

absl::Status UsageError(absl::string_view message) {
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kUsagePayload, absl::Cord("1"));
  return s;
}

bool IsUsageError(const absl::Status& status) {
  return status.GetPayload(kUsagePayload).has_value();
}

absl::StatusOr<ByteRange> ParseRange(absl::string_view text) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid range '", text, "' (expected START-END, START- or -LENGTH, in bytes)"));
  };
  const size_t dash = text.find('-');
  if (dash == absl::string_view::npos || text.find('-', dash + 1) != absl::string_view::npos) {
    return bad();
  }
  const absl::string_view first = text.substr(0, dash);
  const absl::string_view second = text.substr(dash + 1);
  uint64_t start = 0;
  uint64_t end = 0;
  if (first.empty()) {  // "-N": the last N bytes
    if (!ParseDecimal(second, &end) || end == 0) return bad();
    return ByteRange::Last(end);
  }
  if (!ParseDecimal(first, &start)) return bad();
  if (second.empty()) return ByteRange::From(start);
  if (!ParseDecimal(second, &end) || end < start) return bad();
  if (end == std::numeric_limits<uint64_t>::max()) return ByteRange::From(start);
  return ByteRange::Of(start, end - start + 1);
}

std::string FormatMtime(absl::Time t) {
  if (t == absl::InfinitePast() || t == absl::InfiniteFuture()) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

std::string Megabytes(uint64_t bytes) {
  return absl::StrFormat("%.1f", static_cast<double>(bytes) / 1e6);
}

std::string MegabytesPerSecond(uint64_t bytes, absl::Duration elapsed) {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  if (seconds <= 0) return "-";
  return absl::StrFormat("%.1f", static_cast<double>(bytes) / 1e6 / seconds);
}

std::string OneLine(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", u);
    } else {
      out += c;
    }
  }
  return out;
}

// ---- Listing ----

absl::Status ForEachPage(ObjectStore& store, const ListOptions& options,
                         absl::FunctionRef<absl::Status(ListPage&)> fn) {
  std::string token;
  do {
    WHARF_ASSIGN_OR_RETURN(ListPage page, store.List(options, token));
    WHARF_RETURN_IF_ERROR(fn(page));
    token = std::move(page.continuation);
  } while (!token.empty());
  return absl::OkStatus();
}

void ForEachEntry(const ListPage& page, absl::FunctionRef<void(const ObjectMeta&)> object,
                  absl::FunctionRef<void(const std::string&)> prefix) {
  size_t i = 0;
  size_t j = 0;
  while (i < page.objects.size() || j < page.common_prefixes.size()) {
    if (j == page.common_prefixes.size() ||
        (i < page.objects.size() && page.objects[i].key < page.common_prefixes[j])) {
      object(page.objects[i++]);
    } else {
      prefix(page.common_prefixes[j++]);
    }
  }
}

absl::StatusOr<Target> ResolveTarget(ObjectStore& store, const std::string& key) {
  Target target;
  if (!key.empty() && key.back() != '/') {
    auto head = store.Head(key);
    if (head.ok()) {
      target.is_object = true;
      target.object = *std::move(head);
      return target;
    }
    if (!absl::IsNotFound(head.status())) return head.status();
  }
  target.prefix = AsPrefix(key);
  return target;
}

absl::StatusOr<Target> ResolveRecursiveTarget(ObjectStore& store, const std::string& key,
                                              absl::string_view what) {
  WHARF_ASSIGN_OR_RETURN(Target target, ResolveTarget(store, key));
  if (!target.is_object) return target;
  WHARF_ASSIGN_OR_RETURN(bool also_prefix, PrefixHasObjects(store, AsPrefix(key)));
  if (also_prefix) {
    return UsageError(absl::StrCat(what, " ", store.Uri(key),
                                   ": names both an object and a prefix of other objects; "
                                   "add '/' for the prefix (",
                                   store.Uri(AsPrefix(key)), "), or leave out -r for the object"));
  }
  return target;
}

absl::StatusOr<bool> PrefixHasObjects(ObjectStore& store, const std::string& prefix) {
  ListOptions options;
  options.prefix = prefix;
  options.page_size = 1;
  WHARF_ASSIGN_OR_RETURN(ListPage page, store.List(options));
  return !page.objects.empty();
}

// ---- Output ----

std::string JsonLine(const nlohmann::ordered_json& j) {
  return absl::StrCat(j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace),
                      "\n");
}

namespace {
bool stdout_broken = false;
}  // namespace

void Print(absl::string_view data) {
  if (stdout_broken) return;
  if (std::fwrite(data.data(), 1, data.size(), stdout) != data.size() && errno == EPIPE) {
    stdout_broken = true;
  }
}

bool StdoutBroken() { return stdout_broken; }

absl::Status FlushStdout() {
  if (stdout_broken) return absl::OkStatus();
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return absl::OkStatus();
  if (errno == EPIPE) {
    stdout_broken = true;
    return absl::OkStatus();
  }
  return ErrnoToStatus(errno, "writing to stdout");
}

// ---- Progress ----

bool Progress::ShouldShow(bool quiet) { return !quiet && isatty(STDERR_FILENO) == 1; }

namespace {
absl::Duration StallWarnAfter() {
  double seconds = 60;
  if (const char* v = std::getenv("WHARF_STALL_WARN_SECONDS"); v != nullptr && *v != '\0') {
    double parsed = 0;
    if (absl::SimpleAtod(v, &parsed) && parsed > 0) seconds = parsed;
  }
  return absl::Seconds(seconds);
}
}  // namespace

Progress::Progress(bool enabled)
    : enabled_(enabled),
      start_(absl::Now()),
      stall_warn_(StallWarnAfter()),
      moved_(start_),
      next_warn_(stall_warn_) {
  thread_ = StartThread([this] { Loop(); });
}

Progress::~Progress() { Stop(); }

void Progress::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    EraseLocked();
  }
  if (thread_.joinable()) thread_.join();
}

void Progress::PrintLine(absl::string_view line) {
  // After a signal the run is ending: the requests its cleanups abort fail by the dozen, and
  // the one line saying why is the signal's (base/interrupt.h).
  if (Interrupted()) return;
  absl::MutexLock lock(&mu_);
  EraseLocked();
  std::string out = absl::StrCat(line, "\n");
  std::fwrite(out.data(), 1, out.size(), stderr);
  std::fflush(stderr);
}

void Progress::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (enabled_ && !Interrupted()) DrawLocked();
    CheckStallLocked(absl::Now());
    // Wakes early when Stop() sets stopping_.
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(200));
  }
}

void Progress::CheckStallLocked(absl::Time now) {
  const uint64_t counters = total_.load(std::memory_order_relaxed) + bytes() + objects_done();
  if (counters != seen_) {
    seen_ = counters;
    moved_ = now;
    next_warn_ = stall_warn_;
    return;
  }
  const absl::Duration stalled = now - moved_;
  if (stalled < next_warn_) return;
  next_warn_ = next_warn_ * 2;
  EraseLocked();
  const std::string line = absl::StrFormat(
      "wharf: no progress for %.0f s (%d objects, %s MB done so far): still waiting for the store "
      "or for writes to the destination (a full file system, e.g. a CephFS whose pool is full, "
      "blocks writes)\n",
      absl::ToDoubleSeconds(stalled), objects_done(), Megabytes(bytes()));
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

void Progress::DrawLocked() {
  const uint64_t done = objects_done();
  const uint64_t total = total_.load(std::memory_order_relaxed);
  const uint64_t total_bytes = total_bytes_.load(std::memory_order_relaxed);
  const bool final_total = total_final_.load(std::memory_order_relaxed);
  constexpr int kWidth = 20;
  std::string bar(kWidth, '.');
  if (final_total) {
    // Bytes when there are any (one large object moves the bar too), else objects.
    const double fraction = total_bytes > 0 ? static_cast<double>(bytes()) / total_bytes
                                            : (total > 0 ? static_cast<double>(done) / total : 1.0);
    bar.replace(0, static_cast<size_t>(kWidth * std::min(fraction, 1.0)),
                static_cast<size_t>(kWidth * std::min(fraction, 1.0)), '#');
  } else {
    constexpr int kBlock = 3;
    const int pos = ticks_ % (kWidth - kBlock + 1);
    bar.replace(pos, kBlock, kBlock, '#');
  }
  ++ticks_;
  // ETA from the byte rate so far, once the total is known.
  std::string eta;
  const double secs = absl::ToDoubleSeconds(elapsed());
  if (final_total && bytes() > 0 && total_bytes > bytes() && secs > 0) {
    const double left = (total_bytes - bytes()) / (bytes() / secs);
    eta =
        absl::StrFormat("  ETA %d:%02d", static_cast<int>(left) / 60, static_cast<int>(left) % 60);
  }
  const std::string line = absl::StrCat(
      "\r[", bar, "]  ", done, "/", total, final_total ? "" : "+", " objects  ", Megabytes(bytes()),
      " MB  ", MegabytesPerSecond(bytes(), elapsed()), " MB/s", eta, "\033[K");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::EraseLocked() {
  if (!drawn_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace wharf::cli
