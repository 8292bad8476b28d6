// The store flags of the `wharf` command line: --endpoint-url, --region, --profile and
// --no-sign-request, accepted before or after any verb. They become StoreOptions
// (store/spec.h) for every store a verb opens, where the scheme takes them: file:// takes
// none, gs:// takes --endpoint-url (unless the command also names an s3:// URI, whose it is
// then) and --no-sign-request, s3:// all four. Options a URI
// carries in its query ("s3://b/?region=x") lose to the flags.
//
// Thread-safety: main() calls AddStoreFlags and then SetStoreFlags once, before a verb runs;
// the verbs then only read (OpenCliUri, CliStoreOptions, ParseCliUri).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "store/registry.h"
#include "store/spec.h"

namespace CLI {
class App;
}  // namespace CLI

namespace wharf::cli {

struct StoreFlags {
  std::string endpoint_url;
  std::string region;
  std::string profile;
  bool no_sign_request = false;
  std::string cache;  // --cache TIER_DIR: remote stores read through the tier
  // Set by main: the command line names an s3:// URI. --endpoint-url is then the S3 side's
  // (`cp s3://... gs://...` against MinIO), and a gs:// URI keeps its own endpoint.
  bool names_s3 = false;
};

// Registers the flags on `app` (global: they fall through to the verbs).
void AddStoreFlags(CLI::App& app, StoreFlags& flags);

// Validates the flags (InvalidArgument naming the flag) and makes them the run's options.
absl::Status SetStoreFlags(const StoreFlags& flags);

// The run's options that `scheme` ("s3", "gs", "file") takes.
StoreOptions CliStoreOptions(absl::string_view scheme);

// ParseStoreUri / OpenUri with the run's options for the URI's scheme.
absl::StatusOr<SpecAndKey> ParseCliUri(absl::string_view uri_or_path);
absl::StatusOr<OpenedUri> OpenCliUri(absl::string_view uri_or_path);

}  // namespace wharf::cli
