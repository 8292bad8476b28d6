// StoreSpec: what opens a store, as a value: the scheme, the bucket (the root path for
// file://) and typed per-backend options. A spec is what the scheme registry opens
// (store/registry.h), what Python pickles (a DataLoader worker reopens its store from the
// spec instead of re-resolving a URI in a different environment), and what the CLI's store
// flags and Python's keyword arguments fill.
//
// Options come from, in order of precedence: explicit settings (Python keyword arguments,
// CLI flags), then query options of a URI whose part before '?' ends in '/' (a bucket or
// prefix URI, e.g. "s3://bucket/train/?endpoint=http://127.0.0.1:9000&region=eu-west-1").
// A '?' anywhere else belongs to the key: "s3://b/a?b" names key "a?b". An option that is not
// set is resolved by the backend from the environment and the shared files, as before.
//
// Secrets: a spec never holds credentials (keys, tokens); where it is deserialized, the
// backend resolves them from that process's environment and profile. Its JSON form therefore
// carries nothing secret.
//
// Thread-safety: values; the functions are pure.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "store/uri.h"

namespace wharf {

// How bucket names go into request URLs (S3-compatible backends).
enum class AddressingStyle { kAuto, kPath, kVirtual };

// The typed options a backend may take; each is unset unless given. Which options a backend
// accepts is its own documented choice (a backend fails with InvalidArgument naming an option
// it does not take).
struct StoreOptions {
  // "scheme://host[:port]" of the service (S3: instead of AWS_ENDPOINT_URL and the profile's;
  // gs://: instead of WHARF_GS_ENDPOINT).
  std::optional<std::string> endpoint;
  std::optional<std::string> region;
  // Send requests unsigned (public buckets); no credentials are looked up.
  std::optional<bool> anonymous;
  // The AWS profile of the shared files (instead of AWS_PROFILE).
  std::optional<std::string> profile;
  std::optional<AddressingStyle> addressing_style;
  // gs:// only: "xml" (GCS's XML API, today's only mode); "json" comes later.
  std::optional<std::string> api;
  // Every scheme: read through the tier at this directory (docs/design/tier.md), made
  // absolute when set. The registry applies it over whatever the scheme opens; backends
  // never see it. WHARF_CACHE sets it for every remote store a process opens.
  std::optional<std::string> cache;

  // The option names, as query options, Python keyword arguments and JSON use them.
  static const std::vector<std::string>& Names();

  // Sets option `name` from its text form: anonymous takes true/false/1/0/yes/no/on/off,
  // addressing_style path/virtual/auto. InvalidArgument naming the option for an unknown
  // name (listing the valid ones), an empty or malformed value, or an endpoint that is not
  // http(s)://host[:port].
  absl::Status Set(absl::string_view name, absl::string_view value);

  // Each option set in `overrides` replaces this one's.
  void MergeFrom(const StoreOptions& overrides);

  // The names of the options that are set, in Names() order.
  std::vector<std::string> SetNames() const;
  bool empty() const { return SetNames().empty(); }

  bool operator==(const StoreOptions&) const = default;
};

absl::string_view AddressingStyleName(AddressingStyle style);

struct StoreSpec {
  std::string scheme;  // "s3", "gs", "file", ...
  std::string bucket;  // "/" for file://; "" for an endpoint without a bucket (ls s3://)
  StoreOptions options;

  // A small versioned JSON object, e.g.
  //   {"v":1,"scheme":"s3","bucket":"b","options":{"endpoint":"http://127.0.0.1:9000"}}
  // Never contains credentials (the spec holds none).
  std::string ToJson() const;
  // InvalidArgument for malformed JSON, a version other than 1, a missing scheme, or an
  // unknown or malformed option.
  static absl::StatusOr<StoreSpec> FromJson(absl::string_view json);

  // "s3://bucket/", "file:///": the store's root, without options (for messages).
  std::string RootUri() const;

  bool operator==(const StoreSpec&) const = default;
};

// A spec together with the key (or prefix) a URI names in its store.
struct SpecAndKey {
  StoreSpec spec;
  std::string key;

  // The URI without options: scheme, bucket and key.
  ObjectUri uri() const { return ObjectUri{spec.scheme, spec.bucket, key}; }
};

// Parses `uri_or_path` (a URI, or a local path taken as file://, see ParseUriOrPath) into a
// spec and key. Query options are read only from a URI whose part before the first '?' ends
// in '/'; values are percent-decoded. `explicit_options` override the query's. Errors as
// ParseUriOrPath and StoreOptions::Set, annotated with the URI.
absl::StatusOr<SpecAndKey> ParseStoreUri(absl::string_view uri_or_path,
                                         const StoreOptions& explicit_options = {});

}  // namespace wharf
