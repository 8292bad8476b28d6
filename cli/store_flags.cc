#include "cli/store_flags.h"

#include <algorithm>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/common.h"
#include "store/local/local_store.h"
#include "store/registry.h"
#include "tier/tier.h"

namespace wharf::cli {
namespace {

// Set once by SetStoreFlags before a verb runs (see the header).
StoreOptions& RunOptions() {
  static StoreOptions* const options = new StoreOptions;
  return *options;
}

// Whether --endpoint-url belongs to the s3:// side only (SetStoreFlags).
bool& EndpointIsS3s() {
  static bool s3s = false;
  return s3s;
}

// Whether `path` (absolute) lies in the tier at or around the cache directory `cache`.
bool InsideCache(const std::string& path, const std::string& cache) {
  std::string root = cache;
  if (auto tier = Tier::Find(cache); tier.ok()) root = (*tier)->root();
  return path == root || absl::StartsWith(path, absl::StrCat(root, "/"));
}

}  // namespace

void AddStoreFlags(CLI::App& app, StoreFlags& flags) {
  app.add_flag("--no-sign-request", flags.no_sign_request,
               "Send requests unsigned (public buckets); no credentials are looked up");
  app.add_option("--endpoint-url", flags.endpoint_url,
                 "S3 (or gs://) endpoint http(s)://host[:port] (default: AWS_ENDPOINT_URL, the "
                 "profile's; WHARF_GS_ENDPOINT for gs://). In a command that names an s3:// "
                 "URI it is the S3 side's only");
  app.add_option("--region", flags.region, "S3 region (default: AWS_REGION, the profile's)");
  app.add_option("--aws-profile,--profile", flags.profile,
                 "AWS profile (default: AWS_PROFILE). After `fetch`, --profile is the "
                 "profiler's flag: name the AWS profile with --aws-profile or before the verb");
  app.add_option("--cache", flags.cache,
                 "Read s3://, gs:// (and file:// URIs written so) through the tier at TIER_DIR "
                 "(filled on a miss, served from it after; default for s3:// and gs://: "
                 "WHARF_CACHE)");
}

absl::Status SetStoreFlags(const StoreFlags& flags) {
  StoreOptions options;
  for (const auto& [flag, name, value] :
       {std::tuple{"--endpoint-url", "endpoint", flags.endpoint_url},
        std::tuple{"--region", "region", flags.region},
        std::tuple{"--profile", "profile", flags.profile},
        std::tuple{"--cache", "cache", flags.cache}}) {
    if (value.empty()) continue;
    if (absl::Status s = options.Set(name, value); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", s.message()));
    }
  }
  if (flags.no_sign_request) options.anonymous = true;
  RunOptions() = std::move(options);
  EndpointIsS3s() = flags.names_s3;
  return absl::OkStatus();
}

StoreOptions CliStoreOptions(absl::string_view scheme) {
  StoreOptions options = RunOptions();
  if (scheme == "file") return StoreOptions{};
  if (scheme == "gs") {  // AWS notions; gs:// refuses them (store/gcs/gcs_store.h)
    options.region.reset();
    options.profile.reset();
    if (EndpointIsS3s()) options.endpoint.reset();
  }
  return options;
}

absl::StatusOr<SpecAndKey> ParseCliUri(absl::string_view uri_or_path) {
  auto parsed = ParseStoreUri(uri_or_path);
  // A malformed URI or an unknown scheme is the command line's mistake.
  if (absl::IsInvalidArgument(parsed.status())) return UsageError(parsed.status().message());
  if (!parsed.ok()) return parsed.status();
  if (const std::vector<std::string> known = StoreRegistry::Global().schemes();
      std::find(known.begin(), known.end(), absl::StrCat(parsed->spec.scheme, "://")) ==
      known.end()) {
    return UsageError(absl::StrCat("unsupported URI scheme '", parsed->spec.scheme,
                                   "://' (known: ", absl::StrJoin(known, ", "), ")"));
  }
  parsed->spec.options.MergeFrom(CliStoreOptions(parsed->spec.scheme));
  // A delete below a local path given here may remove what the path names (rm -r DIR), never
  // a directory above it. (A sync's destination keeps itself too: cp.cc.)
  if (parsed->spec.scheme == "file") {
    std::string path = absl::StrCat("/", parsed->key);
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    LocalStore::KeepDirectory(path.substr(0, std::max<size_t>(1, path.rfind('/'))));
    // --cache covers a file:// URI spelled so (a slow mount read through a tier on local disk,
    // as Python's cache= does), never a plain path (a copy's local side) nor the cache's own
    // tier (it would copy the tier into itself).
    if (const std::optional<std::string>& cache = RunOptions().cache;
        cache && absl::StartsWith(uri_or_path, "file://") && !InsideCache(path, *cache)) {
      parsed->spec.options.cache = cache;
    }
  }
  return parsed;
}

absl::StatusOr<OpenedUri> OpenCliUri(absl::string_view uri_or_path) {
  auto parsed = ParseCliUri(uri_or_path);
  if (!parsed.ok()) return parsed.status();
  auto store = OpenSpec(parsed->spec);
  if (!store.ok()) return store.status();
  return OpenedUri{*std::move(store), parsed->uri(), std::move(parsed->spec)};
}

}  // namespace wharf::cli
