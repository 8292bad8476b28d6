#include "store/gcs/gcs_store.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
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
  if (o.api && *o.api != "xml") {
    if (*o.api == "json") {
      return absl::UnimplementedError(
          absl::StrCat(what, ": api=json (GCS's JSON API) is not implemented yet; use api=xml"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": store option 'api': '", *o.api, "' is not one of xml, json"));
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
  auto store = OpenXml(spec);
  if (!store.ok()) return store.status();
  return std::shared_ptr<ObjectStore>(*std::move(store));
}

absl::StatusOr<std::vector<BucketInfo>> ListGcsBuckets(const StoreSpec& spec) {
  WHARF_ASSIGN_OR_RETURN(std::unique_ptr<s3::S3Store> endpoint, OpenXml(spec));
  return endpoint->ListBuckets();
}

}  // namespace wharf::gcs
