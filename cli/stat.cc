// wharf stat: one object's metadata (a HEAD request).
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "cli/common.h"
#include "cli/store_flags.h"
#include "cli/verbs.h"
#include "nlohmann/json.hpp"
#include "store/registry.h"

namespace wharf::cli {

void AddStat(CLI::App& app, StatArgs& args) {
  CLI::App* stat = app.add_subcommand("stat", "Show one object's size, ETag and mtime");
  stat->add_flag("--json", args.json, "One JSON object: {uri,key,size,etag,mtime}");
  stat->add_option("URI", args.uri, "The object: a URI or a local path")->required();
}

absl::Status RunStat(const StatArgs& args) {
  WHARF_ASSIGN_OR_RETURN(OpenedUri opened, OpenCliUri(args.uri));
  ObjectStore& store = *opened.store;
  const std::string& key = opened.uri.key;
  const std::string uri = store.Uri(key);

  absl::StatusOr<ObjectMeta> meta =
      absl::NotFoundError(absl::StrCat("stat ", uri, ": no such object"));
  // A key ending in '/' is an object too where the store keeps such keys (a folder marker,
  // or data under such a name).
  if (!key.empty() && (key.back() != '/' || store.capabilities().trailing_slash_keys)) {
    meta = store.Head(key);
  }
  if (absl::IsNotFound(meta.status())) {
    // Say so when the user named a "directory": the next step is `ls`, not a typo hunt.
    auto is_prefix = PrefixHasObjects(store, AsPrefix(key));
    if (is_prefix.ok() && *is_prefix) {
      return absl::FailedPreconditionError(
          absl::StrCat("stat ", uri, ": a prefix, not an object (try 'wharf ls ", uri, "')"));
    }
  }
  WHARF_RETURN_IF_ERROR(meta.status());

  if (args.json) {
    nlohmann::ordered_json j = {{"uri", store.Uri(meta->key)},
                                {"key", meta->key},
                                {"size", meta->size},
                                {"etag", meta->etag},
                                {"mtime", FormatMtime(meta->mtime)}};
    Print(JsonLine(j));
  } else {
    Print(absl::StrCat("uri:   ", store.Uri(meta->key), "\n",  //
                       "key:   ", meta->key, "\n",             //
                       "size:  ", meta->size, "\n",            //
                       "etag:  ", meta->etag, "\n",            //
                       "mtime: ", FormatMtime(meta->mtime), "\n"));
  }
  return absl::OkStatus();
}

}  // namespace wharf::cli
