// wharf rm: deletes one object, or every object below a prefix with -r.
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "cli/common.h"
#include "cli/store_flags.h"
#include "cli/verbs.h"
#include "store/registry.h"

namespace wharf::cli {
namespace {

// S3's DeleteObjects takes at most 1000 keys per request.
constexpr int kDeleteBatch = 1000;

void PrintDeleted(uint64_t n, bool quiet) {
  if (!quiet) Print(absl::StrCat("deleted ", n, n == 1 ? " object\n" : " objects\n"));
}

absl::Status RemovePrefix(ObjectStore& store, const ObjectUri& uri, const std::string& prefix,
                          const RmArgs& args) {
  const bool quiet = args.quiet;
  const std::string what = absl::StrCat("rm ", store.Uri(prefix));
  // On file:// the bucket is the file system root: "rm -r /" must never mean everything.
  if (prefix.empty() && uri.scheme == "file") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": refusing to delete everything below the file system root"));
  }
  // Each batch is listed afresh after the last key deleted, rather than by continuation
  // token: a token is not promised to survive deletes of the keys it was computed from.
  ListOptions options;
  options.prefix = prefix;
  options.page_size = kDeleteBatch;
  uint64_t deleted = 0;
  uint64_t failed_batches = 0;
  uint64_t in_failed_batches = 0;
  absl::Status first_error;
  while (true) {
    WHARF_ASSIGN_OR_RETURN(ListPage page, store.List(options));
    if (page.objects.empty()) break;
    std::vector<std::string> keys;
    keys.reserve(page.objects.size());
    options.start_after = page.objects.back().key;
    for (ObjectMeta& meta : page.objects) {
      // --include/--exclude: patterns on the key relative to the prefix.
      if (!PassesFilters(args.filters, absl::string_view(meta.key).substr(prefix.size()))) {
        continue;
      }
      if (args.dryrun) {
        Print(absl::StrCat("(dryrun) delete ", OneLine(store.Uri(meta.key)), "\n"));
        ++deleted;
        continue;
      }
      keys.push_back(std::move(meta.key));
    }
    if (keys.empty()) {
      if (page.continuation.empty()) break;
      continue;
    }
    const size_t n = keys.size();
    absl::Status status = store.DeleteMany(std::move(keys));
    if (status.ok()) {
      deleted += n;
    } else {
      // A failed batch may have deleted some of its keys (one DELETE each on gs://; per-key
      // errors on S3): they are counted as unknown, not as kept.
      in_failed_batches += n;
      if (failed_batches++ == 0) first_error = std::move(status);
    }
    if (page.continuation.empty()) break;
  }
  if (deleted == 0 && failed_batches == 0) {
    return absl::NotFoundError(absl::StrCat(what, ": no objects match"));
  }
  if (!args.dryrun) PrintDeleted(deleted, quiet);
  if (in_failed_batches > 0 && !quiet) {
    Print(absl::StrCat(in_failed_batches, " more in ", failed_batches,
                       failed_batches == 1 ? " batch" : " batches",
                       " that failed, some of them perhaps deleted: list the prefix for what is "
                       "left\n"));
  }
  return Annotate(first_error, what);
}

}  // namespace

void AddRm(CLI::App& app, RmArgs& args) {
  CLI::App* rm = app.add_subcommand("rm", "Delete an object, or every object below a prefix");
  rm->add_flag("-r,--recursive", args.recursive,
               "Delete every object below the prefix (in batches of 1000)");
  rm->add_flag("-q,--quiet", args.quiet, "Do not print how many objects were deleted");
  rm->add_flag("--dryrun", args.dryrun,
               "Print '(dryrun) delete URI' for each object that would be deleted; delete none");
  rm->add_option("--include", args.include,
                 "With -r: include keys matching PATTERN (relative to the prefix; '*' matches "
                 "across '/'); rules apply in order, the last match wins")
      ->expected(1)
      ->allow_extra_args(false)  // one word per flag: the URI after it is the URI
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  rm->add_option("--exclude", args.exclude, "With -r: exclude keys matching PATTERN")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  rm->add_option("URI", args.uri, "The object or prefix: a URI or a local path")->required();
}

absl::Status RunRm(const RmArgs& given) {
  RmArgs args = given;
  WHARF_ASSIGN_OR_RETURN(args.filters, FiltersRelativeTo(given.filters, given.uri));
  WHARF_ASSIGN_OR_RETURN(OpenedUri opened, OpenCliUri(args.uri));
  ObjectStore& store = *opened.store;
  const std::string& key = opened.uri.key;
  const std::string uri = store.Uri(key);

  if (args.recursive) {
    WHARF_ASSIGN_OR_RETURN(Target target, ResolveRecursiveTarget(store, key, "rm -r"));
    if (!target.is_object) return RemovePrefix(store, opened.uri, target.prefix, args);
  } else {
    // Deleting a missing key succeeds on object stores; a CLI user who typed a name wants to
    // hear that it did not exist.
    absl::StatusOr<ObjectMeta> meta = absl::NotFoundError("");
    // A key ending in '/' is an object too where the store keeps such keys (a folder marker,
    // or data under such a name).
    if (!key.empty() && (key.back() != '/' || store.capabilities().trailing_slash_keys)) {
      meta = store.Head(key);
    }
    if (absl::IsNotFound(meta.status())) {
      WHARF_ASSIGN_OR_RETURN(bool is_prefix, PrefixHasObjects(store, AsPrefix(key)));
      // A prefix without -r is a usage error (exit 2), as for cp and fetch.
      if (is_prefix) return UsageError(absl::StrCat("rm ", uri, ": is a prefix; use -r"));
      return absl::NotFoundError(absl::StrCat("rm ", uri, ": no such object"));
    }
    WHARF_RETURN_IF_ERROR(meta.status());
  }
  if (args.dryrun) {
    Print(absl::StrCat("(dryrun) delete ", OneLine(uri), "\n"));
    return absl::OkStatus();
  }
  WHARF_RETURN_IF_ERROR(store.Delete(key));
  if (args.recursive) PrintDeleted(1, args.quiet);  // a plain rm is silent, as rm(1)
  if (!args.recursive && !key.empty() && key.back() == '/') {
    // The object named "dir/" (a folder marker) is gone; what is below it is not.
    absl::StatusOr<bool> more = PrefixHasObjects(store, key);
    if (more.ok() && *more) {
      std::fprintf(stderr,
                   "wharf: deleted the object %s; the objects below it are kept (rm -r "
                   "removes them)\n",
                   OneLine(uri).c_str());
    }
  }
  return absl::OkStatus();
}

}  // namespace wharf::cli
