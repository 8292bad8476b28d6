#include "store/gcs/gcs_store.h"

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file_io.h"
#include "base/runtime.h"
#include "base/status.h"
#include "http/curl_transport.h"
#include "nlohmann/json.hpp"
#include "store/gcs/gcs_credentials.h"
#include "store/gcs/gcs_json_store.h"
#include "store/s3/aws_config.h"
#include "store/s3/s3_store.h"

namespace wharf::gcs {
namespace {

constexpr char kDefaultEndpoint[] = "https://storage.googleapis.com";

absl::StatusOr<std::unique_ptr<s3::S3Store>> OpenXml(const StoreSpec& spec) {
  const std::string what = spec.RootUri();
  const StoreOptions& o = spec.options;
  for (const auto& [set, name] :
       {std::pair{o.region.has_value(), "region"}, std::pair{o.profile.has_value(), "profile"}}) {
    if (set) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": store option '", name,
          "' is not for gs:// (gs:// takes endpoint, anonymous, addressing_style, api)"));
    }
  }
  // The S3 request code speaks GCS's XML API: SigV4 with HMAC keys, region "auto".
  StoreSpec s3_spec = spec;
  s3_spec.options.api.reset();
  s3_spec.options.endpoint =
      o.endpoint ? *o.endpoint : s3::GetEnv("WHARF_GS_ENDPOINT").value_or(kDefaultEndpoint);
  s3::S3ClientOverrides overrides;
  WHARF_RETURN_IF_ERROR(s3::ApplySpecOptions(s3_spec, overrides));
  overrides.region = "auto";
  if (!overrides.path_style) overrides.path_style = true;
  if (auto id = s3::GetEnv("WHARF_GS_ACCESS_KEY_ID")) overrides.access_key_id = *id;
  if (auto secret = s3::GetEnv("WHARF_GS_SECRET_ACCESS_KEY")) overrides.secret_access_key = *secret;
  if (!overrides.access_key_id && !overrides.anonymous) {
    return absl::UnauthenticatedError(
        absl::StrCat(what,
                     ": no GCS HMAC key found (set WHARF_GS_ACCESS_KEY_ID "
                     "and WHARF_GS_SECRET_ACCESS_KEY, or use anonymous access)"));
  }
  s3::S3StoreOptions options;
  options.scheme = spec.scheme;
  options.capabilities = &XmlCapabilities();
  return s3::OpenS3Endpoint(spec.bucket, overrides, std::move(options));
}

// "host:port" (as STORAGE_EMULATOR_HOST is often set) -> "http://host:port".
std::string WithScheme(std::string endpoint) {
  if (!absl::StartsWith(endpoint, "http://") && !absl::StartsWith(endpoint, "https://")) {
    endpoint = absl::StrCat("http://", endpoint);
  }
  return endpoint;
}

// The project a bucket listing or creation names: GOOGLE_CLOUD_PROJECT (or the older
// GCLOUD_PROJECT), else the project_id of the service-account key.
std::string ResolveProject() {
  for (const char* var : {"GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT"}) {
    if (auto p = s3::GetEnv(var); p && !p->empty()) return *p;
  }
  if (auto path = s3::GetEnv("GOOGLE_APPLICATION_CREDENTIALS"); path && !path->empty()) {
    if (std::string text; ReadFile(*path, &text)) {
      auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (j.is_object()) {
        for (const char* field : {"project_id", "quota_project_id"}) {
          if (j.contains(field) && j[field].is_string()) return j[field].get<std::string>();
        }
      }
    }
  }
  return "";
}

absl::StatusOr<std::unique_ptr<GcsJsonStore>> OpenJson(const StoreSpec& spec) {
  const std::string what = spec.RootUri();
  const StoreOptions& o = spec.options;
  for (const auto& [set, name] :
       {std::pair{o.region.has_value(), "region"}, std::pair{o.profile.has_value(), "profile"},
        std::pair{o.addressing_style.has_value(), "addressing_style"}}) {
    if (set) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": store option '", name,
                       "' is not for gs:// over the JSON API (it takes endpoint, anonymous, api; "
                       "addressing_style is for api=xml)"));
    }
  }
  GcsJsonConfig config;
  const std::optional<std::string> emulator = s3::GetEnv("STORAGE_EMULATOR_HOST");
  if (o.endpoint) {
    config.endpoint = WithScheme(*o.endpoint);
  } else if (emulator && !emulator->empty()) {
    config.endpoint = WithScheme(*emulator);
  } else if (auto e = s3::GetEnv("WHARF_GS_ENDPOINT"); e && !e->empty()) {
    config.endpoint = WithScheme(*e);
  } else {
    config.endpoint = kDefaultEndpoint;
  }
  config.project = ResolveProject();
  bool anonymous = false;
  if (o.anonymous) {
    anonymous = *o.anonymous;
  } else {
    WHARF_ASSIGN_OR_RETURN(anonymous, s3::NoSignRequestFromEnv());
  }
  // Google's clients send no token to an emulator.
  if (emulator && !emulator->empty()) anonymous = true;
  std::shared_ptr<HttpTransport> transport = SharedCurlTransport();
  if (!anonymous) {
    GoogleCredentialsOptions options;
    options.transport = transport;
    auto provider = ResolveGoogleCredentials(options);
    if (!provider.ok()) return Annotate(provider.status(), what);
    config.credentials_source = (*provider)->Describe();
    config.credentials = std::shared_ptr<CredentialsProvider>(*std::move(provider));
  }
  return GcsJsonStore::Open(spec.bucket, std::move(config), std::move(transport));
}

// Which API a spec's store speaks: the spec's `api`, WHARF_GS_API, then XML when an HMAC key
// is set, else JSON.
absl::StatusOr<bool> UseXml(const StoreSpec& spec) {
  std::string api;
  const char* from = "store option 'api'";
  if (spec.options.api) {
    api = *spec.options.api;
  } else if (auto env = s3::GetEnv("WHARF_GS_API"); env && !env->empty()) {
    api = *env;
    from = "WHARF_GS_API";
  } else {
    auto id = s3::GetEnv("WHARF_GS_ACCESS_KEY_ID");
    return id.has_value() && !id->empty();
  }
  if (api == "xml") return true;
  if (api == "json") return false;
  return absl::InvalidArgumentError(
      absl::StrCat(spec.RootUri(), ": ", from, ": '", api, "' is not one of xml, json"));
}

}  // namespace

const Capabilities& XmlCapabilities() {
  static const Capabilities caps = [] {
    Capabilities c;
    c.compose = false;
    c.multipart_upload = true;
    c.max_page_size = 1000;
    c.put_options = true;
    return c;
  }();
  return caps;
}

absl::StatusOr<std::shared_ptr<ObjectStore>> OpenGcsSpec(const StoreSpec& spec) {
  WHARF_ASSIGN_OR_RETURN(bool xml, UseXml(spec));
  if (xml) {
    auto store = OpenXml(spec);
    if (!store.ok()) return store.status();
    return std::shared_ptr<ObjectStore>(*std::move(store));
  }
  auto store = OpenJson(spec);
  if (!store.ok()) return store.status();
  return std::shared_ptr<ObjectStore>(*std::move(store));
}

absl::StatusOr<std::vector<BucketInfo>> ListGcsBuckets(const StoreSpec& spec) {
  WHARF_ASSIGN_OR_RETURN(bool xml, UseXml(spec));
  if (xml) {
    WHARF_ASSIGN_OR_RETURN(std::unique_ptr<s3::S3Store> endpoint, OpenXml(spec));
    return endpoint->ListBuckets();
  }
  WHARF_ASSIGN_OR_RETURN(std::unique_ptr<GcsJsonStore> endpoint, OpenJson(spec));
  return endpoint->ListBuckets();
}

}  // namespace wharf::gcs
