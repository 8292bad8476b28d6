#include "store/s3/aws_config.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file_io.h"
#include "base/status.h"
#include "store/s3/aws_credentials.h"

namespace wharf::s3 {
namespace {

// ---------------------------------------------------------------------------------------------
// INI parsing

bool IsBlank(char c) { return c == ' ' || c == '\t'; }

// Drops a comment that starts with '#' or ';' preceded by whitespace (an inline comment). A
// '#' inside a value, as in "a#b", is kept: AWS secrets and URLs may contain one.
absl::string_view StripInlineComment(absl::string_view s) {
  for (size_t i = 1; i < s.size(); ++i) {
    if ((s[i] == '#' || s[i] == ';') && IsBlank(s[i - 1])) return s.substr(0, i);
  }
  return s;
}

absl::Status LineError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
}

// Splits "name = value" (comment already stripped) into a lowercased name and a trimmed value.
absl::Status SplitProperty(absl::string_view text, int line, std::string* name,
                           std::string* value) {
  const size_t eq = text.find('=');
  if (eq == absl::string_view::npos) return LineError(line, "expected 'name = value'");
  *name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text.substr(0, eq)));
  if (name->empty()) return LineError(line, "property with an empty name");
  *value = std::string(absl::StripAsciiWhitespace(text.substr(eq + 1)));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Files

// The file's content, nullopt when it does not exist.
absl::StatusOr<std::optional<std::string>> ReadFileIfExists(const std::string& path) {
  auto content = ReadFileToString(path, absl::StrCat("reading ", path));
  if (!content.ok() && absl::IsNotFound(content.status())) return std::optional<std::string>();
  if (!content.ok()) return content.status();
  return std::optional<std::string>(*std::move(content));
}

std::optional<std::string> NonEmpty(std::optional<std::string> value) {
  if (value.has_value() && value->empty()) return std::nullopt;
  return value;
}

using SharedFile = AwsSharedFile;

absl::StatusOr<SharedFile> LoadSharedFile(const EnvLookup& env, absl::string_view path_variable,
                                          absl::string_view default_name) {
  SharedFile file;
  const std::optional<std::string> home = NonEmpty(env("HOME"));
  if (std::optional<std::string> path = NonEmpty(env(path_variable))) {
    file.path = *std::move(path);
    // "~/x" as the SDKs expand it; without HOME it stays literal (and likely missing).
    if (home.has_value() && (file.path == "~" || absl::StartsWith(file.path, "~/"))) {
      file.path = absl::StrCat(*home, file.path.substr(1));
    }
  } else if (home.has_value()) {
    file.path = absl::StrCat(*home, "/.aws/", default_name);
  } else {
    return file;
  }
  WHARF_ASSIGN_OR_RETURN(std::optional<std::string> content, ReadFileIfExists(file.path));
  if (!content.has_value()) return file;
  absl::StatusOr<IniFile> parsed = ParseAwsIni(*content);
  if (!parsed.ok()) return Annotate(parsed.status(), absl::StrCat("parsing ", file.path));
  file.data = *std::move(parsed);
  return file;
}

const IniSection* FindSection(const SharedFile& file, absl::string_view name) {
  if (!file.data.has_value()) return nullptr;
  auto it = file.data->find(std::string(name));
  return it == file.data->end() ? nullptr : &it->second;
}

std::optional<std::string> Value(const IniSection* section, absl::string_view key) {
  if (section == nullptr) return std::nullopt;
  auto it = section->values.find(std::string(key));
  if (it == section->values.end()) return std::nullopt;
  return NonEmpty(it->second);
}

std::optional<std::string> SubValue(const IniSection* section, absl::string_view subsection,
                                    absl::string_view key) {
  if (section == nullptr) return std::nullopt;
  auto sub = section->subsections.find(std::string(subsection));
  if (sub == section->subsections.end()) return std::nullopt;
  auto it = sub->second.find(std::string(key));
  if (it == sub->second.end()) return std::nullopt;
  return NonEmpty(it->second);
}

// ---------------------------------------------------------------------------------------------
// Endpoint, region

// The host of "scheme://host[:port]", without the port.
absl::string_view EndpointHost(absl::string_view endpoint) {
  const size_t scheme_end = endpoint.find("://");
  absl::string_view host =
      scheme_end == absl::string_view::npos ? endpoint : endpoint.substr(scheme_end + 3);
  if (absl::StartsWith(host, "[")) return host.substr(0, host.find(']') + 1);  // IPv6 literal
  return host.substr(0, host.find(':'));
}

bool IsAwsEndpoint(absl::string_view endpoint) {
  const std::string host = absl::AsciiStrToLower(EndpointHost(endpoint));
  return absl::EndsWith(host, ".amazonaws.com") || absl::EndsWith(host, ".amazonaws.com.cn");
}

absl::StatusOr<std::string> NormalizeEndpoint(absl::string_view raw, absl::string_view source) {
  const absl::string_view url = absl::StripAsciiWhitespace(raw);
  const auto error = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("endpoint '", raw, "' (from ", source, ") ", why));
  };
  std::string scheme;
  if (absl::StartsWithIgnoreCase(url, "https://")) {
    scheme = "https";
  } else if (absl::StartsWithIgnoreCase(url, "http://")) {
    scheme = "http";
  } else {
    return error("must start with http:// or https://");
  }
  absl::string_view authority = url.substr(scheme.size() + 3);
  while (absl::EndsWith(authority, "/")) authority.remove_suffix(1);
  if (authority.empty()) return error("has no host");
  if (absl::StrContains(authority, '@')) {
    // Not quoted: the part before '@' may be a password.
    return absl::InvalidArgumentError(
        absl::StrCat("the endpoint from ", source, " must not contain a user name or password"));
  }
  for (unsigned char c : authority) {
    if (c <= ' ' || c == 0x7f || c == '/' || c == '?' || c == '#') {
      return error("must be scheme://host[:port], without a path, query or user name");
    }
  }
  return absl::StrCat(scheme, "://", authority);
}

std::string DefaultEndpoint(absl::string_view region) {
  return absl::StrCat("https://s3.", region, ".amazonaws.com",
                      absl::StartsWith(region, "cn-") ? ".cn" : "");
}

absl::Status ValidateRegion(absl::string_view region, absl::string_view source) {
  const bool ok = std::all_of(region.begin(), region.end(), [](unsigned char c) {
    return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.';
  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("region '", region, "' (from ", source,
                   ") may only contain letters, digits, '-', '_' and '.'"));
}

// A value and where it came from.
struct Sourced {
  std::string value;
  std::string source;
};

// The first of `candidates` that is set.
std::optional<Sourced> FirstOf(
    std::initializer_list<std::pair<std::optional<std::string>, std::string>> candidates) {
  for (const auto& [value, source] : candidates) {
    if (value.has_value()) return Sourced{*value, source};
  }
  return std::nullopt;
}

}  // namespace

// -----------------------------------------------------------------------------------------------

std::string AwsSharedFile::Describe() const {
  if (path.empty()) return "(unknown path: HOME is not set)";
  return data.has_value() ? path : absl::StrCat(path, " (does not exist)");
}

absl::StatusOr<AwsSharedFile> LoadAwsSharedFile(const EnvLookup& env,
                                                absl::string_view path_variable,
                                                absl::string_view default_name) {
  return LoadSharedFile(env, path_variable, default_name);
}

absl::StatusOr<std::string> NormalizeAwsEndpoint(absl::string_view raw, absl::string_view source) {
  return NormalizeEndpoint(raw, source);
}

const IniSection* FindIniSection(const AwsSharedFile& file, absl::string_view name) {
  return FindSection(file, name);
}

const IniSection* FindConfigProfile(const AwsSharedFile& file, absl::string_view profile) {
  if (!file.data.has_value()) return nullptr;
  for (const auto& [name, section] : *file.data) {
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, "profile") || rest.empty() || !IsBlank(rest.front())) {
      continue;
    }
    if (absl::StripAsciiWhitespace(rest) == profile) return &section;
  }
  return profile == "default" ? FindSection(file, "default") : nullptr;
}

absl::StatusOr<IniFile> ParseAwsIni(absl::string_view text) {
  absl::ConsumePrefix(&text, "\xEF\xBB\xBF");  // UTF-8 byte order mark
  IniFile file;
  IniSection* section = nullptr;
  std::string last_key;  // the last top-level property of `section`; "" when none
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    absl::ConsumeSuffix(&line, "\r");
    const absl::string_view trimmed = absl::StripAsciiWhitespace(line);
    if (trimmed.empty() || trimmed.front() == '#' || trimmed.front() == ';') continue;

    // An indented line belongs to the property above it: a nested "name = value" when that
    // property's value is empty, else a continuation of the value.
    if (IsBlank(line.front()) && section != nullptr && !last_key.empty()) {
      const absl::string_view content = absl::StripAsciiWhitespace(StripInlineComment(trimmed));
      auto value_it = section->values.find(last_key);
      if (value_it != section->values.end() && !value_it->second.empty()) {
        absl::StrAppend(&value_it->second, "\n", content);
        continue;
      }
      std::string name, value;
      WHARF_RETURN_IF_ERROR(SplitProperty(content, line_number, &name, &value));
      if (value_it != section->values.end()) section->values.erase(value_it);
      section->subsections[last_key][name] = std::move(value);
      continue;
    }

    if (trimmed.front() == '[') {
      const size_t close = trimmed.find(']');
      if (close == absl::string_view::npos) {
        return LineError(line_number, "section header without a closing ']'");
      }
      const absl::string_view name = absl::StripAsciiWhitespace(trimmed.substr(1, close - 1));
      if (name.empty()) return LineError(line_number, "section with an empty name");
      section = &file[std::string(name)];
      last_key.clear();
      continue;
    }

    if (section == nullptr) {
      return LineError(line_number, "property before the first [section]");
    }
    std::string name, value;
    WHARF_RETURN_IF_ERROR(SplitProperty(StripInlineComment(trimmed), line_number, &name, &value));
    section->subsections.erase(name);
    section->values[name] = std::move(value);
    last_key = std::move(name);
  }
  return file;
}

std::optional<std::string> GetEnv(absl::string_view name) {
  const char* value = std::getenv(std::string(name).c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::string S3ClientConfig::DebugString() const {
  return absl::StrCat("profile=", profile, " region=", region, " endpoint=", endpoint,
                      " addressing=", path_style ? "path" : "virtual",
                      " ca_bundle=", ca_bundle.empty() ? "(system)" : ca_bundle,
                      " credentials=", credentials_source);
}

absl::StatusOr<S3ClientConfig> ResolveS3ClientConfig(const S3ClientOverrides& overrides,
                                                     const EnvLookup& env) {
  const auto getenv = [&](absl::string_view name) { return NonEmpty(env(name)); };
  S3ClientConfig config;
  config.anonymous = overrides.anonymous;

  // Profile and the shared files.
  const std::optional<Sourced> named_profile = FirstOf(
      {{NonEmpty(overrides.profile), "explicit options"}, {getenv("AWS_PROFILE"), "AWS_PROFILE"}});
  config.profile = named_profile.has_value() ? named_profile->value : "default";
  WHARF_ASSIGN_OR_RETURN(const SharedFile credentials_file,
                         LoadSharedFile(env, "AWS_SHARED_CREDENTIALS_FILE", "credentials"));
  WHARF_ASSIGN_OR_RETURN(const SharedFile config_file,
                         LoadSharedFile(env, "AWS_CONFIG_FILE", "config"));
  const IniSection* credentials_section = FindSection(credentials_file, config.profile);
  const IniSection* config_section = FindConfigProfile(config_file, config.profile);
  if (named_profile.has_value() && credentials_section == nullptr && config_section == nullptr) {
    // A common slip: "[dev]" in the config file, where profiles are "[profile dev]".
    const std::string hint =
        FindSection(config_file, config.profile) != nullptr
            ? absl::StrCat(" (the config file has [", config.profile,
                           "]; there it must be written [profile ", config.profile, "])")
            : "";
    // FailedPrecondition, not NotFound: a configuration to fix, never an object that is
    // missing (Python's exists() takes NotFound for "no such object").
    return absl::FailedPreconditionError(absl::StrCat(
        "AWS profile '", config.profile, "' (from ", named_profile->source, ") not found in ",
        credentials_file.Describe(), " or ", config_file.Describe(), hint));
  }

  // Region.
  const std::string profile_source =
      absl::StrCat("profile '", config.profile, "' in ", config_file.path);
  const std::optional<Sourced> region =
      FirstOf({{NonEmpty(overrides.region), "explicit options"},
               {getenv("AWS_REGION"), "AWS_REGION"},
               {getenv("AWS_DEFAULT_REGION"), "AWS_DEFAULT_REGION"},
               {Value(config_section, "region"), profile_source}});
  if (region.has_value()) {
    WHARF_RETURN_IF_ERROR(ValidateRegion(region->value, region->source));
    config.region = region->value;
  } else {
    config.region = "us-east-1";
  }

  // Endpoint.
  std::optional<std::string> services_endpoint;
  std::string services_source;
  if (std::optional<std::string> services = Value(config_section, "services")) {
    const std::string section_name = absl::StrCat("services ", *services);
    services_endpoint = SubValue(FindSection(config_file, section_name), "s3", "endpoint_url");
    services_source = absl::StrCat("[", section_name, "] in ", config_file.path);
  }
  const std::optional<Sourced> endpoint =
      FirstOf({{NonEmpty(overrides.endpoint_url), "explicit options"},
               {getenv("AWS_ENDPOINT_URL_S3"), "AWS_ENDPOINT_URL_S3"},
               {getenv("AWS_ENDPOINT_URL"), "AWS_ENDPOINT_URL"},
               {services_endpoint, services_source},
               {SubValue(config_section, "s3", "endpoint_url"), profile_source},
               {Value(config_section, "endpoint_url"), profile_source}});
  if (endpoint.has_value()) {
    WHARF_ASSIGN_OR_RETURN(config.endpoint, NormalizeEndpoint(endpoint->value, endpoint->source));
  } else {
    config.endpoint = DefaultEndpoint(config.region);
  }

  // Addressing style.
  std::optional<bool> path_style = overrides.path_style;
  if (!path_style.has_value()) {
    if (std::optional<std::string> style = SubValue(config_section, "s3", "addressing_style")) {
      const std::string lower = absl::AsciiStrToLower(*style);
      if (lower == "path") {
        path_style = true;
      } else if (lower == "virtual") {
        path_style = false;
      } else if (lower != "auto") {
        return absl::InvalidArgumentError(absl::StrCat("addressing_style '", *style, "' (from ",
                                                       profile_source,
                                                       ") must be path, virtual or auto"));
      }
    }
  }
  config.path_style = path_style.value_or(!IsAwsEndpoint(config.endpoint));

  // CA bundle.
  const std::optional<Sourced> ca_bundle =
      FirstOf({{NonEmpty(overrides.ca_bundle), "explicit options"},
               {getenv("AWS_CA_BUNDLE"), "AWS_CA_BUNDLE"},
               {Value(config_section, "ca_bundle"), profile_source}});
  if (ca_bundle.has_value()) config.ca_bundle = ca_bundle->value;

  // Credentials: last, because the sources that call STS need the region and CA bundle.
  if (config.anonymous) {
    config.credentials_source = "anonymous (requests are not signed)";
    return config;
  }
  {
    std::optional<std::string> id = NonEmpty(overrides.access_key_id);
    std::optional<std::string> secret = NonEmpty(overrides.secret_access_key);
    std::optional<std::string> token = NonEmpty(overrides.session_token);
    if (id.has_value() != secret.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("explicit options: ", id.has_value() ? "access_key_id" : "secret_access_key",
                       " is set but ", id.has_value() ? "secret_access_key" : "access_key_id",
                       " is missing; set both or neither"));
    }
    if (token.has_value() && !id.has_value()) {
      return absl::InvalidArgumentError(
          "explicit options: session_token is set without access_key_id and "
          "secret_access_key");
    }
    if (id.has_value()) {
      config.credentials.access_key_id = *std::move(id);
      config.credentials.secret_access_key = *std::move(secret);
      config.credentials.session_token = std::move(token).value_or("");
      config.credentials_source = "explicit options";
      config.credentials_provider = std::make_shared<StaticCredentialsProvider>(
          config.credentials, config.credentials_source);
      return config;
    }
  }
  AwsCredentialsOptions credentials_options;
  credentials_options.env = env;
  credentials_options.region = config.region;
  credentials_options.ca_bundle = config.ca_bundle;
  credentials_options.explicit_profile = NonEmpty(overrides.profile).has_value();
  WHARF_ASSIGN_OR_RETURN(config.credentials_provider,
                         ResolveAwsCredentialsChain(config.profile, credentials_file, config_file,
                                                    credentials_options));
  config.credentials_source = config.credentials_provider->Describe();
  // Static keys are known now, without a fetch: the store signs with them directly.
  if (auto* keys = dynamic_cast<StaticCredentialsProvider*>(config.credentials_provider.get())) {
    WHARF_ASSIGN_OR_RETURN(config.credentials, keys->Fetch());
  }
  return config;
}

}  // namespace wharf::s3
