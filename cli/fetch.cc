// wharf fetch: reads objects into memory through the I/O engine and discards them: the
// engine's read path without a destination, to measure a store (and to warm caches in front
// of it). Prints objects, bytes, time, throughput and time-to-first-byte percentiles.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/runtime.h"
#include "base/status.h"
#include "cli/common.h"
#include "cli/store_flags.h"
#include "cli/verbs.h"
#include "io/fetch_scheduler.h"
#include "io/prefix_fetch.h"
#include "store/registry.h"

namespace wharf::cli {

void AddFetch(CLI::App& app, FetchArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "fetch", "Read objects into memory through the I/O engine and report throughput");
  cmd->add_flag("-r,--recursive", args.recursive, "Every object below the URI's prefix");
  cmd->add_flag("--json", args.json, "One JSON object instead of a table");
  cmd->add_option("--inflight,-j,--jobs", args.inflight,
                  "Requests in flight (0: derived from latency x throughput)")
      ->check(CLI::Range(0, 65536))
      ->capture_default_str();
  AddEngineFlags(cmd, args.engine, /*budget_mb_alias=*/true);
  cmd->add_option("--part-size-mb", args.part_size_mb,
                  "Objects over twice this size are read as ranged parts of this size, up to "
                  "16 at once per object")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--list-workers", args.list_workers, "Parallel listing workers")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_flag("--profile", args.profile,
                "Print where the time went to stderr (a table of stages and a verdict of "
                "what bounds throughput) and write a Chrome/Perfetto trace to "
                "WHARF_PROFILE_TRACE (default wharf-trace-<pid>.json); for every verb: "
                "WHARF_PROFILE=1");
  cmd->add_option("URI", args.uri, "Object, or prefix with -r")->required();
}

absl::Status RunFetch(const FetchArgs& args) {
  WHARF_RETURN_IF_ERROR(ApplyEngineArgs(args.engine, args.inflight));
  WHARF_ASSIGN_OR_RETURN(OpenedUri opened, OpenCliUri(args.uri));
  std::shared_ptr<ObjectStore> store = opened.store;
  FetchOptions options;
  options.max_in_flight = args.inflight;
  options.part_size = static_cast<uint64_t>(args.part_size_mb) << 20;
  options.split_threshold = 2 * options.part_size;
  FetchScheduler scheduler(store, options);

  const absl::Time start = absl::Now();
  std::vector<absl::Duration> ttfb;
  uint64_t objects = 0, bytes = 0, errors = 0;
  absl::Status first_error;
  auto take = [&](FetchResult& r) {
    if (!r.data.ok()) {
      if (errors++ == 0) first_error = r.data.status();
      // Each failure of a prefix's fetch is one line as it happens; a single object's is the
      // verb's own error.
      if (args.recursive) {
        const std::string line = absl::StrCat("wharf: ", OneLine(r.data.status().message()), "\n");
        std::fwrite(line.data(), 1, line.size(), stderr);
      }
      return;
    }
    ++objects;
    bytes += r.data->size();
    if (r.requests > 0) ttfb.push_back(r.time_to_first_byte);
  };

  FetchStats fetch_stats;
  ParallelListStats list_stats;
  absl::Status listing;
  if (args.recursive) {
    ListOptions range;
    range.prefix = AsPrefix(opened.uri.key);
    if (opened.uri.key.empty()) range.prefix.clear();
    PrefixFetch fetch(store, scheduler, range, {.workers = args.list_workers}, nullptr);
    while (auto r = fetch.Next()) take(*r);
    listing = fetch.listing_status();
    list_stats = fetch.list_stats();
    fetch_stats = fetch.fetch_stats();
  } else {
    auto batch = scheduler.Fetch({{.key = opened.uri.key}});
    while (auto r = batch->Next()) take(*r);
    fetch_stats = batch->stats();
  }
  const absl::Duration elapsed = absl::Now() - start;
  WHARF_RETURN_IF_ERROR(Annotate(listing, absl::StrCat("fetch ", args.uri)));
  if (!args.recursive && errors > 0) {
    // Not an object: say whether -r was meant, as cp does.
    const std::string& key = opened.uri.key;
    if (absl::IsNotFound(first_error) || key.empty() || key.back() == '/') {
      absl::StatusOr<bool> is_prefix = PrefixHasObjects(*store, AsPrefix(key));
      if (is_prefix.ok() && *is_prefix) {
        return UsageError(absl::StrCat("fetch ", args.uri, ": is a prefix; use -r"));
      }
    }
    return first_error;
  }
  // Nothing below the prefix: the error alone, not a table of zeros before it.
  if (args.recursive && objects == 0 && errors == 0) {
    return absl::NotFoundError(absl::StrCat("fetch ", args.uri, ": no objects match"));
  }

  std::sort(ttfb.begin(), ttfb.end());
  auto pct = [&](double p) {
    if (ttfb.empty()) return 0.0;
    return absl::ToDoubleMilliseconds(
        ttfb[std::min(ttfb.size() - 1, static_cast<size_t>(p * ttfb.size()))]);
  };
  const double secs = std::max(1e-9, absl::ToDoubleSeconds(elapsed));
  if (args.json) {
    nlohmann::ordered_json j;
    j["uri"] = args.uri;
    j["objects"] = objects;
    j["bytes"] = bytes;
    j["errors"] = errors;
    j["seconds"] = secs;
    j["objects_per_second"] = objects / secs;
    j["mb_per_second"] = bytes / secs / 1e6;
    j["list_seconds"] = absl::ToDoubleSeconds(list_stats.wall);
    j["list_calls"] = list_stats.list_calls;
    j["requests"] = fetch_stats.requests;
    j["retries"] = fetch_stats.retries;
    j["peak_in_flight"] = fetch_stats.peak_in_flight;
    j["peak_bytes_held"] = fetch_stats.peak_bytes_held;
    // The settings in force (flags over WHARF_MEMORY_BUDGET/WHARF_INFLIGHT over defaults).
    j["memory_budget"] = Runtime::Default()->budget().limit();
    j["ttfb_p50_ms"] = pct(0.5);
    j["ttfb_p99_ms"] = pct(0.99);
    Print(JsonLine(j));
  } else {
    Print(
        absl::StrFormat("| objects | MB | seconds | objects/s | MB/s | TTFB p50 ms | TTFB p99 ms | "
                        "peak in flight |\n"
                        "|---|---|---|---|---|---|---|---|\n"
                        "| %d | %s | %.2f | %.0f | %.1f | %.1f | %.1f | %d |\n",
                        objects, Megabytes(bytes), secs, objects / secs, bytes / secs / 1e6,
                        pct(0.5), pct(0.99), fetch_stats.peak_in_flight));
  }
  if (errors > 0) {
    // The failures were printed as they happened; the code is the first one's.
    return absl::Status(first_error.code(), absl::StrCat("fetch ", args.uri, ": ", errors, " of ",
                                                         objects + errors, " objects failed"));
  }
  return FlushStdout();
}

}  // namespace wharf::cli
