// wharf cp and wharf sync: flag parsing and output around the transfer engine
// (io/transfer.h), which does the work: listing, resume, streaming of big objects, refusal
// of keys that escape the destination, server-side copies within one store.
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/runtime.h"
#include "base/status.h"
#include "cli/common.h"
#include "cli/store_flags.h"
#include "cli/verbs.h"
#include "io/transfer.h"
#include "store/local/local_store.h"
#include "store/registry.h"

namespace wharf::cli {
namespace {

// True when `uri` is a file:// URI naming an existing directory. A local destination that
// is a directory receives the source under its own name, as with cp(1).
bool IsLocalDirectory(const ObjectUri& uri) {
  if (uri.scheme != "file") return false;
  struct stat st;
  const std::string path = absl::StrCat(uri.bucket == "/" ? "" : uri.bucket, "/", uri.key);
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void PrintSummary(const TransferSummary& s, const CpArgs& args) {
  if (args.quiet || args.dryrun) return;
  const absl::Duration elapsed = s.elapsed;
  Print(absl::StrFormat("copied %d %s (%s MB) in %.2f s (%s MB/s)\n", s.objects,
                        s.objects == 1 ? "object" : "objects", Megabytes(s.bytes),
                        absl::ToDoubleSeconds(elapsed), MegabytesPerSecond(s.bytes, elapsed)));
  if (s.skipped > 0) {
    Print(absl::StrFormat(
        args.sync ? "skipped %d up to date\n" : "skipped %d already present (same size and ETag)\n",
        s.skipped));
  }
  if (s.deleted > 0) Print(absl::StrFormat("deleted %d not in the source\n", s.deleted));
}

void AddTransferFlags(CLI::App* cmd, CpArgs& args, bool stdio) {
  cmd->add_option("-j,--jobs,--inflight", args.jobs,
                  "Requests in flight (objects, or parts of big ones); default: WHARF_INFLIGHT, "
                  "else sized from the store's measured latency")
      ->check(CLI::Range(1, 65536));
  AddEngineFlags(cmd, args.engine, /*budget_mb_alias=*/true);
  cmd->add_option("--list-workers", args.list_workers, "Parallel listing workers")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", args.quiet, "No progress line and no summary");
  cmd->add_flag("--dryrun", args.dryrun,
                "Print what would be done, as '(dryrun) OP SRC -> DST', and do nothing");
  AddFilterFlags(cmd, args.include, args.exclude, "SRC");
  AddUploadFlags(cmd, args.upload);
  cmd->add_option("SRC", args.src,
                  stdio ? "Source: a URI, a local path, or - (standard input)"
                        : "Source: a URI or a local path (a prefix or folder)")
      ->required();
  cmd->add_option("DST", args.dst,
                  stdio ? "Destination: a URI, a local path, or - (standard output)"
                        : "Destination: a URI or a local path (a prefix or folder)")
      ->required();
}

absl::StatusOr<TransferOptions> OptionsFrom(const CpArgs& args) {
  TransferOptions options;
  WHARF_ASSIGN_OR_RETURN(options.put, PutOptionsFrom(args.upload));
  options.guess_content_type = !args.upload.no_guess_content_type;
  options.mode = args.sync ? TransferMode::kSync : TransferMode::kCopy;
  options.recursive = args.recursive || args.sync;
  options.delete_extra = args.delete_extra;
  options.dryrun = args.dryrun;
  WHARF_ASSIGN_OR_RETURN(options.filters, FiltersRelativeTo(args.filters, args.src));
  options.list_workers = args.list_workers;
  return options;
}

}  // namespace

void AddCp(CLI::App& app, CpArgs& args) {
  CLI::App* cp = app.add_subcommand("cp", "Copy an object, or a whole prefix with -r");
  cp->add_flag("-r,--recursive", args.recursive,
               "Copy every object below SRC to the same relative key below DST");
  AddTransferFlags(cp, args, /*stdio=*/true);
  cp->footer(
      "Without -r, SRC is one object; a DST ending in '/' (or an existing local directory)\n"
      "receives it under its own name. SRC - uploads standard input; DST - writes the object\n"
      "to standard output. With -r, SRC/KEY is copied to DST/KEY for every key below SRC;\n"
      "keys that would land outside DST ('..', '//', ...) are refused. Each object appears\n"
      "complete or not at all. Failures are reported one per line; the rest go on (exit 1;\n"
      "exit 2 when the only trouble was local entries that are not files, as aws s3). A rerun\n"
      "of cp -r skips objects the destination already holds with the same size and ETag (for\n"
      "an object uploaded in parts: the local file hashed in the same parts); one object\n"
      "without -r is always copied (use sync to skip it when up to date).");
}

void AddSync(CLI::App& app, CpArgs& args) {
  CLI::App* sync = app.add_subcommand(
      "sync", "Copy what is missing or differs below SRC to DST (optionally delete extras)");
  sync->add_flag("--delete", args.delete_extra,
                 "Delete objects below DST that SRC does not have (among those the filters "
                 "select; none in a run where a copy failed: rerun once the copies succeed)");
  AddTransferFlags(sync, args, /*stdio=*/false);
  sync->footer(
      "Copies every object below SRC that DST lacks or holds differently: by size and ETag\n"
      "(or content MD5) between two remote stores and when one side is local (a local file's\n"
      "MD5 against an object's), by size and modification time where the two sides' tags\n"
      "cannot be compared (an object uploaded in parts: a destination at least as new as its\n"
      "source is current; downloads take the object's time). Nothing is deleted without\n"
      "--delete. Exit 2 when entries of a local SRC that are not files were left out.");
  sync->parse_complete_callback([&args] { args.sync = true; });
}

absl::Status RunCp(const CpArgs& args) {
  WHARF_RETURN_IF_ERROR(ApplyEngineArgs(args.engine, args.jobs));
  WHARF_ASSIGN_OR_RETURN(TransferOptions options, OptionsFrom(args));
  const char* verb = args.sync ? "sync" : "cp";
  Progress progress(Progress::ShouldShow(args.quiet));
  ProgressObserver observer(progress);

  if (args.src == "-" || args.dst == "-") {
    if (args.src == "-" && args.dst == "-") {
      return UsageError(absl::StrCat(verb, ": SRC and DST cannot both be -"));
    }
    if (options.recursive) {
      return UsageError(absl::StrCat(verb, ": - cannot be used with -r or sync"));
    }
    if (args.dryrun) {  // nothing read from standard input, nothing written to the output
      WHARF_ASSIGN_OR_RETURN(OpenedUri other, OpenCliUri(args.src == "-" ? args.dst : args.src));
      const std::string uri = other.store->Uri(other.uri.key);
      if (args.dst == "-") WHARF_RETURN_IF_ERROR(other.store->Head(other.uri.key).status());
      Print(args.src == "-" ? absl::StrCat("(dryrun) upload - -> ", OneLine(uri), "\n")
                            : absl::StrCat("(dryrun) download ", OneLine(uri), " -> -\n"));
      return absl::OkStatus();
    }
    if (args.dst == "-") {
      WHARF_ASSIGN_OR_RETURN(OpenedUri src, OpenCliUri(args.src));
      WHARF_RETURN_IF_ERROR(FlushStdout());
      absl::Status s = TransferToFd({src.store, src.uri.key}, STDOUT_FILENO, options, &observer);
      progress.Stop();
      // The reader went away (`wharf cp s3://b/k - | head`): not an error.
      if (absl::IsUnavailable(s) || s.message().find("Broken pipe") != absl::string_view::npos) {
        return absl::OkStatus();
      }
      if (absl::IsNotFound(s) &&
          PrefixHasObjects(*src.store, AsPrefix(src.uri.key)).value_or(false)) {
        return UsageError(absl::StrCat(verb, " ", src.store->Uri(src.uri.key),
                                       ": is a prefix, not an object (- takes one object)"));
      }
      return s;
    }
    WHARF_ASSIGN_OR_RETURN(OpenedUri dst, OpenCliUri(args.dst));
    if (dst.uri.key.empty() || dst.uri.key.back() == '/') {
      return UsageError(
          absl::StrCat(verb, " - ", dst.store->Uri(dst.uri.key), ": name the object to write"));
    }
    absl::StatusOr<ObjectMeta> meta =
        TransferFromFd(STDIN_FILENO, {dst.store, dst.uri.key}, options, &observer);
    progress.Stop();
    return meta.status();
  }

  WHARF_ASSIGN_OR_RETURN(OpenedUri src, OpenCliUri(args.src));
  WHARF_ASSIGN_OR_RETURN(SpecAndKey dst_parsed, ParseCliUri(args.dst));
  const ObjectUri dst_uri = dst_parsed.uri();
  // sync --delete removing every file of a local destination keeps the folder itself.
  if (dst_parsed.spec.scheme == "file") LocalStore::KeepDirectory(absl::StrCat("/", dst_uri.key));
  std::shared_ptr<ObjectStore> dst_store;
  if (dst_parsed.spec == src.spec) {
    dst_store = src.store;  // one store: server-side copies
  } else {
    WHARF_ASSIGN_OR_RETURN(dst_store, OpenSpec(dst_parsed.spec));
  }
  std::string dst_key = dst_uri.key;

  const std::string& key = src.uri.key;
  if (options.recursive) {
    WHARF_ASSIGN_OR_RETURN(Target target,
                           ResolveRecursiveTarget(*src.store, key, args.sync ? "sync" : "cp -r"));
    if (target.is_object) {
      if (options.delete_extra) {
        return UsageError(absl::StrCat("sync --delete ", src.store->Uri(key),
                                       ": an object, not a prefix; --delete needs a prefix"));
      }
      options.recursive = false;
    } else {
      TransferSummary summary;
      const uint64_t skipped_before = LocalStore::SkippedEntries();
      absl::Status status = TransferWithSummary({src.store, target.prefix}, {dst_store, dst_key},
                                                options, &summary, &observer);
      progress.Stop();
      // After some objects failed (each named as it failed), what the others did still
      // counts: the summary comes before the final error line.
      if (status.ok() || summary.failed > 0) PrintSummary(summary, args);
      const uint64_t skipped = LocalStore::SkippedEntries() - skipped_before;
      if (status.ok() && skipped > 0) {
        return SkippedError(absl::StrFormat(
            "%s %s: %d %s of a local folder left out (named in the warnings above: not files "
            "or folders, links to nothing, names not UTF-8); everything else was %s",
            verb, src.store->Uri(target.prefix), skipped, skipped == 1 ? "entry" : "entries",
            args.dryrun ? "listed" : "copied"));
      }
      return status;
    }
  } else if (key.empty() || key.back() == '/' || absl::IsNotFound(src.store->Head(key).status())) {
    // Not an object: say whether -r was meant.
    WHARF_ASSIGN_OR_RETURN(bool is_prefix, PrefixHasObjects(*src.store, AsPrefix(key)));
    const std::string uri = src.store->Uri(key);
    if (is_prefix) return UsageError(absl::StrCat(verb, " ", uri, ": is a prefix; use -r"));
    return absl::NotFoundError(absl::StrCat(verb, " ", uri, ": no such object"));
  }
  if (IsLocalDirectory(dst_uri)) dst_key = AsPrefix(dst_key);
  absl::StatusOr<TransferSummary> summary =
      Transfer({src.store, key}, {dst_store, dst_key}, options, &observer);
  progress.Stop();
  if (!summary.ok()) return summary.status();
  PrintSummary(*summary, args);
  return absl::OkStatus();
}

}  // namespace wharf::cli
