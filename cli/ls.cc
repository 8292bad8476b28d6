// wharf ls: lists objects and common prefixes, streaming page by page; `wharf ls s3://`
// lists the endpoint's buckets.
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "cli/common.h"
#include "cli/store_flags.h"
#include "cli/verbs.h"
#include "io/parallel_list.h"
#include "nlohmann/json.hpp"
#include "store/keys.h"
#include "store/registry.h"

namespace wharf::cli {
namespace {

// A URI for a human line: as it is, or, when it holds a control character (a key may hold a
// newline), quoted as the shell's $'...' with the characters escaped (as GNU ls does), so a
// key with a newline and one with a backslash and an 'n' print differently.
std::string Quoted(const std::string& uri) {
  const std::string escaped = OneLine(uri);
  if (escaped == uri) return uri;
  std::string out = "$'";
  for (char c : uri) {
    if (c == '\\' || c == '\'') out += '\\';
    out += OneLine(std::string(1, c));
  }
  return out + "'";
}

// One line per entry. Human lines are "<size>  <mtime>  <uri>" (Quoted); JSON lines carry
// keys exactly.
class Printer {
 public:
  Printer(const ObjectStore& store, bool json) : store_(store), json_(json) {}

  void Object(const ObjectMeta& meta) {
    const std::string uri = store_.Uri(meta.key);
    if (json_) {
      Print(JsonLine({{"uri", uri},
                      {"key", meta.key},
                      {"size", meta.size},
                      {"etag", meta.etag},
                      {"mtime", FormatMtime(meta.mtime)}}));
    } else {
      Print(absl::StrFormat("%12d  %-20s  %s\n", meta.size, FormatMtime(meta.mtime), Quoted(uri)));
    }
    ++count_;
  }

  void Prefix(const std::string& prefix) {
    const std::string uri = store_.Uri(prefix);
    if (json_) {
      Print(JsonLine({{"uri", uri}, {"prefix", prefix}}));
    } else {
      Print(absl::StrFormat("%12s  %-20s  %s\n", "PRE", "", Quoted(uri)));
    }
    ++count_;
  }

  uint64_t count() const { return count_; }

 private:
  const ObjectStore& store_;
  const bool json_;
  uint64_t count_ = 0;
};

// The scheme of a URI that names no bucket ("s3://"), whose listing is the endpoint's buckets.
std::optional<std::string> BucketlessScheme(absl::string_view uri) {
  const size_t sep = uri.find("://");
  if (sep == absl::string_view::npos || sep == 0 || sep + 3 != uri.size()) return std::nullopt;
  return std::string(uri.substr(0, sep));
}

// As `aws s3 ls`: "<creation date, local time> <name>", or one JSON object per line.
absl::Status ListBuckets(const std::string& scheme, bool json) {
  WHARF_ASSIGN_OR_RETURN(std::vector<BucketInfo> buckets,
                         StoreRegistry::Global().ListBuckets(scheme, CliStoreOptions(scheme)));
  for (const BucketInfo& bucket : buckets) {
    const std::string uri = absl::StrCat(scheme, "://", bucket.name, "/");
    if (json) {
      Print(JsonLine(
          {{"uri", uri}, {"bucket", bucket.name}, {"created", FormatMtime(bucket.creation_time)}}));
    } else {
      const std::string created =
          bucket.creation_time == absl::InfinitePast()
              ? std::string(19, '-')
              : absl::FormatTime("%Y-%m-%d %H:%M:%S", bucket.creation_time, absl::LocalTimeZone());
      Print(absl::StrCat(created, " ", OneLine(bucket.name), "\n"));
    }
  }
  WHARF_RETURN_IF_ERROR(FlushStdout());
  return absl::OkStatus();
}

}  // namespace

void AddLs(CLI::App& app, LsArgs& args) {
  CLI::App* ls = app.add_subcommand("ls", "List objects and prefixes under a URI or local path");
  ls->add_flag("-r,--recursive", args.recursive,
               "List every object below the prefix (no '/' roll-up)");
  ls->add_flag("--json", args.json,
               "One JSON object per line: {uri,key,size,etag,mtime} or {uri,prefix}; "
               "{uri,bucket,created} for buckets");
  ls->add_option("--parallel", args.parallel,
                 "With -r: list with N work-stealing workers; output sorted at the end")
      ->check(CLI::Range(0, 1024));
  ls->add_option("URI", args.uri, "s3://bucket/prefix, gs://..., file:///path or a local path")
      ->required();
  ls->footer(
      "A key naming an existing object lists that object (and, when other objects lie below\n"
      "KEY/ too, that folder: its PRE line, or with -r its contents); otherwise it is taken\n"
      "as a prefix ('/' appended). Entries come in byte-wise key order. A URI without a bucket\n"
      "(s3://, gs://) lists the endpoint's buckets: \"<created> <name>\", as aws s3 ls.");
}

// An empty listing: an error for a prefix nothing is below (a typo, most likely), not for a
// bucket's root or a local directory that exists and is empty (as aws s3 ls and ls(1)).
absl::Status NothingListed(const ObjectStore& store, const std::string& key) {
  const std::string uri = store.Uri(key);
  if (key.empty() || IsLocalDirectory(uri)) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("ls ", uri, ": no objects match"));
}

absl::Status RunLs(const LsArgs& args) {
  if (std::optional<std::string> scheme = BucketlessScheme(args.uri)) {
    return ListBuckets(*scheme, args.json);
  }
  WHARF_ASSIGN_OR_RETURN(OpenedUri opened, OpenCliUri(args.uri));
  ObjectStore& store = *opened.store;
  Printer printer(store, args.json);

  WHARF_ASSIGN_OR_RETURN(Target target, ResolveTarget(store, opened.uri.key));
  ListOptions options;
  options.prefix = target.prefix;
  if (target.is_object) {
    printer.Object(target.object);
    // A key that names an object and a folder of others (`run` and `run/x`) shows both, as
    // gsutil does: the object, then its folder's roll-up (or, with -r, its contents).
    const std::string folder = absl::StrCat(target.object.key, "/");
    if (absl::EndsWith(target.object.key, "/")) return FlushStdout();
    WHARF_ASSIGN_OR_RETURN(bool has_folder, PrefixHasObjects(store, folder));
    if (!has_folder) return FlushStdout();
    if (!args.recursive) {
      printer.Prefix(folder);
      return FlushStdout();
    }
    options.prefix = folder;
  }
  if (args.recursive && args.parallel > 0) {
    // Pages arrive out of order from the workers: collect, then print in key order.
    WHARF_ASSIGN_OR_RETURN(std::vector<ObjectMeta> all,
                           ParallelListAll(store, options, {.workers = args.parallel}));
    for (const ObjectMeta& meta : all) printer.Object(meta);
    if (printer.count() == 0) return NothingListed(store, opened.uri.key);
    return FlushStdout();
  }
  if (!args.recursive) options.delimiter = "/";
  absl::Status listed = ForEachPage(store, options, [&](ListPage& page) {
    ForEachEntry(
        page, [&](const ObjectMeta& meta) { printer.Object(meta); },
        [&](const std::string& prefix) { printer.Prefix(prefix); });
    // Flushing per page streams long listings; a reader that went away ends the listing.
    WHARF_RETURN_IF_ERROR(FlushStdout());
    return StdoutBroken() ? absl::CancelledError("stdout closed") : absl::OkStatus();
  });
  if (StdoutBroken()) return absl::OkStatus();  // `wharf ls | head`: stop quietly
  WHARF_RETURN_IF_ERROR(listed);
  if (printer.count() == 0) return NothingListed(store, opened.uri.key);
  return absl::OkStatus();
}

}  // namespace wharf::cli
