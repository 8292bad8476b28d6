#include "store/spec.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace wharf {
namespace {

absl::Status InvalidOption(absl::string_view name, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("store option '", name, "': ", why));
}

absl::StatusOr<bool> ParseBool(absl::string_view name, absl::string_view value) {
  const std::string v = absl::AsciiStrToLower(value);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  return InvalidOption(name, absl::StrCat("'", value,
                                          "' is not one of true, false, 1, 0, yes, "
                                          "no, on, off"));
}

// The host part must be there; user info is refused because it would carry a secret into
// the spec (and into pickles). The backend checks the rest (store/s3/aws_config.h).
absl::Status CheckEndpoint(absl::string_view value) {
  absl::string_view rest = value;
  if (!absl::ConsumePrefix(&rest, "http://") && !absl::ConsumePrefix(&rest, "https://")) {
    return InvalidOption("endpoint", absl::StrCat("'", value, "' is not http(s)://host[:port]"));
  }
  if (rest.empty() || rest.front() == '/' || absl::StrContains(rest, '@')) {
    return InvalidOption("endpoint", "expected http(s)://host[:port] (no user name or password)");
  }
  return absl::OkStatus();
}

// %XX escapes of a query value ('+' stays '+': endpoints and names do not use it for spaces).
absl::StatusOr<std::string> PercentDecode(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size() || !absl::ascii_isxdigit(s[i + 1]) || !absl::ascii_isxdigit(s[i + 2])) {
      return absl::InvalidArgumentError(absl::StrCat("bad %-escape in '", s, "'"));
    }
    auto hex = [](char c) {
      return absl::ascii_isdigit(c) ? c - '0' : absl::ascii_tolower(c) - 'a' + 10;
    };
    out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
    i += 2;
  }
  return out;
}

}  // namespace

const std::vector<std::string>& StoreOptions::Names() {
  static const auto* const names = new std::vector<std::string>{
      "endpoint", "region", "anonymous", "profile", "addressing_style", "api", "cache"};
  return *names;
}

absl::string_view AddressingStyleName(AddressingStyle style) {
  switch (style) {
    case AddressingStyle::kPath:
      return "path";
    case AddressingStyle::kVirtual:
      return "virtual";
    case AddressingStyle::kAuto:
      break;
  }
  return "auto";
}

absl::Status StoreOptions::Set(absl::string_view name, absl::string_view value) {
  if (std::find(Names().begin(), Names().end(), name) == Names().end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown store option '", name, "' (valid: ", absl::StrJoin(Names(), ", "), ")"));
  }
  if (value.empty()) return InvalidOption(name, "empty value");
  if (name == "endpoint") {
    if (auto s = CheckEndpoint(value); !s.ok()) return s;
    endpoint = std::string(value);
  } else if (name == "region") {
    region = std::string(value);
  } else if (name == "anonymous") {
    auto b = ParseBool(name, value);
    if (!b.ok()) return b.status();
    anonymous = *b;
  } else if (name == "profile") {
    profile = std::string(value);
  } else if (name == "addressing_style") {
    if (value == "path") {
      addressing_style = AddressingStyle::kPath;
    } else if (value == "virtual") {
      addressing_style = AddressingStyle::kVirtual;
    } else if (value == "auto") {
      addressing_style = AddressingStyle::kAuto;
    } else {
      return InvalidOption(name, absl::StrCat("'", value, "' is not one of path, virtual, auto"));
    }
  } else if (name == "api") {
    api = std::string(value);
  } else {  // "cache"
    auto dir = AbsoluteLocalPath(value);
    if (!dir.ok()) return InvalidOption(name, dir.status().message());
    cache = *std::move(dir);
  }
  return absl::OkStatus();
}

void StoreOptions::MergeFrom(const StoreOptions& overrides) {
  if (overrides.endpoint) endpoint = overrides.endpoint;
  if (overrides.region) region = overrides.region;
  if (overrides.anonymous) anonymous = overrides.anonymous;
  if (overrides.profile) profile = overrides.profile;
  if (overrides.addressing_style) addressing_style = overrides.addressing_style;
  if (overrides.api) api = overrides.api;
  if (overrides.cache) cache = overrides.cache;
}

std::vector<std::string> StoreOptions::SetNames() const {
  std::vector<std::string> out;
  if (endpoint) out.push_back("endpoint");
  if (region) out.push_back("region");
  if (anonymous) out.push_back("anonymous");
  if (profile) out.push_back("profile");
  if (addressing_style) out.push_back("addressing_style");
  if (api) out.push_back("api");
  if (cache) out.push_back("cache");
  return out;
}

std::string StoreSpec::ToJson() const {
  nlohmann::ordered_json options = nlohmann::ordered_json::object();
  if (this->options.endpoint) options["endpoint"] = *this->options.endpoint;
  if (this->options.region) options["region"] = *this->options.region;
  if (this->options.anonymous) options["anonymous"] = *this->options.anonymous;
  if (this->options.profile) options["profile"] = *this->options.profile;
  if (this->options.addressing_style) {
    options["addressing_style"] = std::string(AddressingStyleName(*this->options.addressing_style));
  }
  if (this->options.api) options["api"] = *this->options.api;
  if (this->options.cache) options["cache"] = *this->options.cache;
  nlohmann::ordered_json j;
  j["v"] = 1;
  j["scheme"] = scheme;
  j["bucket"] = bucket;
  j["options"] = std::move(options);
  return j.dump();
}

absl::StatusOr<StoreSpec> StoreSpec::FromJson(absl::string_view json) {
  auto bad = [](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("store spec JSON: ", why));
  };
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (!j.contains("v") || !j["v"].is_number_integer() || j["v"].get<int>() != 1) {
    return bad("expected version \"v\": 1");
  }
  StoreSpec spec;
  if (!j.contains("scheme") || !j["scheme"].is_string() || j["scheme"].get<std::string>().empty()) {
    return bad("missing \"scheme\"");
  }
  spec.scheme = j["scheme"].get<std::string>();
  if (j.contains("bucket")) {
    if (!j["bucket"].is_string()) return bad("\"bucket\" is not a string");
    spec.bucket = j["bucket"].get<std::string>();
  }
  if (j.contains("options")) {
    if (!j["options"].is_object()) return bad("\"options\" is not an object");
    for (const auto& [name, value] : j["options"].items()) {
      std::string text;
      if (value.is_boolean()) {
        text = value.get<bool>() ? "true" : "false";
      } else if (value.is_string()) {
        text = value.get<std::string>();
      } else {
        return bad(absl::StrCat("option \"", name, "\" is neither a string nor a boolean"));
      }
      if (auto s = spec.options.Set(name, text); !s.ok()) return bad(s.message());
    }
  }
  return spec;
}

std::string StoreSpec::RootUri() const {
  if (scheme == "file") return "file:///";
  return absl::StrCat(scheme, "://", bucket, bucket.empty() ? "" : "/");
}

absl::StatusOr<SpecAndKey> ParseStoreUri(absl::string_view uri_or_path,
                                         const StoreOptions& explicit_options) {
  absl::string_view location = uri_or_path;
  StoreOptions options;
  const size_t question = uri_or_path.find('?');
  if (LooksLikeUri(uri_or_path) && question != absl::string_view::npos && question > 0 &&
      uri_or_path[question - 1] == '/') {
    location = uri_or_path.substr(0, question);
    for (absl::string_view pair :
         absl::StrSplit(uri_or_path.substr(question + 1), '&', absl::SkipEmpty())) {
      const size_t eq = pair.find('=');
      const absl::string_view name = pair.substr(0, eq);
      auto value = PercentDecode(eq == absl::string_view::npos ? "" : pair.substr(eq + 1));
      absl::Status s = value.ok() ? options.Set(name, *value) : value.status();
      if (!s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("invalid URI '", uri_or_path, "': ", s.message()));
      }
    }
  }
  auto uri = ParseUriOrPath(location);
  if (!uri.ok()) return uri.status();
  options.MergeFrom(explicit_options);
  return SpecAndKey{StoreSpec{uri->scheme, uri->bucket, std::move(options)}, uri->key};
}

}  // namespace wharf
