// wharf cleanup: aborts the multipart uploads left below a prefix by writers that never
// finished (a process killed with -9 cannot abort its own; the store keeps, and bills, their
// parts until then).
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "cli/common.h"
#include "cli/store_flags.h"
#include "cli/verbs.h"
#include "nlohmann/json.hpp"

namespace wharf::cli {
namespace {

// "24h", "30m", "90s", "2d", "1h30m", or a number of seconds.
absl::StatusOr<absl::Duration> ParseAge(const std::string& text) {
  absl::Duration d;
  double seconds = 0;
  const std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (absl::SimpleAtod(t, &seconds) && seconds >= 0) return absl::Seconds(seconds);
  if (!t.empty() && t.back() == 'd' && absl::SimpleAtod(t.substr(0, t.size() - 1), &seconds) &&
      seconds >= 0) {
    return absl::Hours(24 * seconds);
  }
  if (absl::ParseDuration(t, &d) && d >= absl::ZeroDuration()) return d;
  return UsageError(absl::StrCat("--older-than: '", text,
                                 "' is not an age (such as 24h, 30m, 90s, 2d or seconds)"));
}

std::string TimeText(absl::Time t) {
  if (t == absl::InfinitePast()) return "unknown";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

}  // namespace

void AddCleanup(CLI::App& app, CleanupArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "cleanup",
      "Abort the unfinished multipart uploads below a prefix (left by writers that were "
      "killed: the store keeps their parts, and bills them, until they are aborted)");
  cmd->add_option("--older-than", args.older_than,
                  "Only uploads started at least this long ago (24h, 30m, 90s, 2d or seconds; "
                  "default 24h, so that uploads in progress elsewhere are left alone; 0: all)")
      ->default_val("24h");
  cmd->add_flag("--dryrun", args.dryrun,
                "Print '(dryrun) abort upload of URI (started TIME)' for each; abort none");
  cmd->add_flag("--json", args.json,
                "One JSON line per upload (uri, upload_id, initiated, action) and a summary");
  cmd->add_flag("-q,--quiet", args.quiet, "Print only errors");
  cmd->add_option("URI", args.uri,
                  "The bucket, a prefix (s3://BUCKET/PREFIX: that folder's uploads and PREFIX's "
                  "own), or one key")
      ->required();
}

absl::Status RunCleanup(const CleanupArgs& args) {
  WHARF_ASSIGN_OR_RETURN(absl::Duration age, ParseAge(args.older_than));
  WHARF_ASSIGN_OR_RETURN(OpenedUri opened, OpenCliUri(args.uri));
  ObjectStore& store = *opened.store;
  const std::string& prefix = opened.uri.key;
  const std::string what = absl::StrCat("cleanup ", store.Uri(prefix));
  absl::StatusOr<std::vector<PendingUpload>> uploads = store.ListUploads(prefix);
  if (absl::IsUnimplemented(uploads.status())) {
    // Nothing to do: a local tree's temporary files are removed as listings find them, and
    // GCS expires unfinished resumable uploads on its own.
    if (!args.quiet && !args.json) {
      Print(absl::StrCat(OneLine(store.Uri(prefix)),
                         ": this store keeps no unfinished multipart uploads to abort\n"));
    }
    if (args.json) {
      Print(JsonLine({{"uploads", 0}, {"aborted", 0}, {"kept", 0}, {"failed", 0}}));
    }
    return absl::OkStatus();
  }
  if (!uploads.ok()) return Annotate(uploads.status(), what);
  // A prefix names a folder and the object of that key, as for `rm -r`: s3://b/run1 is
  // run1 and run1/..., never run10/ (whose uploads may be someone's in progress).
  if (!prefix.empty() && prefix.back() != '/') {
    const std::string folder = absl::StrCat(prefix, "/");
    std::erase_if(*uploads, [&](const PendingUpload& u) {
      return u.key != prefix && !absl::StartsWith(u.key, folder);
    });
  }
  const absl::Time cutoff = absl::Now() - age;
  uint64_t aborted = 0, kept = 0, failed = 0;
  absl::Status first_error;
  for (const PendingUpload& u : *uploads) {
    const std::string uri = store.Uri(u.key);
    // --older-than 0 is every upload, whatever the server's clock says; an upload whose
    // start the server did not say is kept otherwise (it may be in progress).
    if (age > absl::ZeroDuration() &&
        (u.initiated == absl::InfinitePast() || u.initiated > cutoff)) {
      ++kept;
      continue;
    }
    const absl::Status s = args.dryrun ? absl::OkStatus() : store.AbortUpload(u.key, u.upload_id);
    const char* action = !s.ok() ? "failed" : args.dryrun ? "would abort" : "aborted";
    if (s.ok()) {
      ++aborted;
    } else {
      ++failed;
      const std::string line =
          absl::StrCat("wharf: abort upload of ", uri, ": ", OneLine(s.message()), "\n");
      std::fwrite(line.data(), 1, line.size(), stderr);
      if (first_error.ok()) first_error = s;
    }
    if (args.json) {
      Print(JsonLine({{"uri", uri},
                      {"upload_id", u.upload_id},
                      {"initiated", TimeText(u.initiated)},
                      {"action", action}}));
    } else if (!args.quiet && s.ok()) {
      Print(absl::StrCat(args.dryrun ? "(dryrun) abort" : "aborted", " upload of ", OneLine(uri),
                         " (started ", TimeText(u.initiated), ")\n"));
    }
  }
  if (args.json) {
    Print(JsonLine(
        {{"uploads", uploads->size()}, {"aborted", aborted}, {"kept", kept}, {"failed", failed}}));
  } else if (!args.quiet) {
    Print(absl::StrCat(
        args.dryrun ? "would abort " : "aborted ", aborted, aborted == 1 ? " upload" : " uploads",
        kept > 0
            ? absl::StrCat(" (", kept, " started within --older-than ", args.older_than, " kept)")
            : "",
        "\n"));
  }
  if (failed > 0) {
    return absl::Status(first_error.code(),
                        absl::StrCat(what, ": ", failed, " of ", aborted + failed,
                                     " uploads could not be aborted"));
  }
  return absl::OkStatus();
}

}  // namespace wharf::cli
