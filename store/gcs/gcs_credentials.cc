#include "store/gcs/gcs_credentials.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "base/file_io.h"
#include "base/hash.h"
#include "base/runtime.h"
#include "base/status.h"
#include "http/curl_transport.h"
#include "nlohmann/json.hpp"

namespace wharf::gcs {
namespace {

using json = nlohmann::json;

constexpr absl::string_view kMetadataTokenPath =
    "/computeMetadata/v1/instance/service-accounts/default/token";
constexpr absl::string_view kJwtBearerGrant = "urn:ietf:params:oauth:grant-type:jwt-bearer";
constexpr absl::string_view kFormContentType = "application/x-www-form-urlencoded";
// Google issues access tokens for an hour; a JWT may ask for at most that.
constexpr int64_t kTokenLifetimeSeconds = 3600;
// Credentials files are a few KiB; anything much larger is not one.
constexpr size_t kMaxCredentialsFileBytes = size_t{1} << 20;

std::optional<std::string> Env(const GoogleCredentialsOptions& options, absl::string_view name) {
  std::optional<std::string> value;
  if (options.env) {
    value = options.env(name);
  } else if (const char* v = std::getenv(std::string(name).c_str())) {
    value = std::string(v);
  }
  if (value.has_value() && value->empty()) return std::nullopt;
  return value;
}

absl::Time Now(const GoogleCredentialsOptions& options) {
  return options.clock ? options.clock() : absl::Now();
}

std::string ScopeFor(const GoogleCredentialsOptions& options) {
  if (!options.scope.empty()) return options.scope;
  return options.read_only ? kGcsReadOnlyScope : kGcsFullControlScope;
}

// ---------------------------------------------------------------------------------------------
// HTTP: blocking exchanges (providers run on the blocking pool, never on an event loop).

std::shared_ptr<HttpTransport> TransportFor(const GoogleCredentialsOptions& options) {
  if (options.transport != nullptr) return options.transport;
  return SharedCurlTransport();  // the gs:// stores' transport
}

// Sends the request `make` builds, up to `attempts` times: transport failures (Unavailable),
// 429 and 5xx are retried after a short pause. Returns the last response or failure.
absl::StatusOr<HttpResponse> SendWithRetries(const GoogleCredentialsOptions& options, int attempts,
                                             const std::function<HttpRequest()>& make) {
  return SendBlockingWithRetries(*TransportFor(options), attempts, make);
}

// Every byte outside RFC 3986's unreserved set percent-encoded (so the '+', '/' and '=' of
// tokens and secrets survive form decoding).
std::string PercentEncode(absl::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (absl::ascii_isalnum(u) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += c;
    } else {
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  return out;
}

// An application/x-www-form-urlencoded body.
std::string FormEncode(std::initializer_list<std::pair<absl::string_view, absl::string_view>> kv) {
  std::string out;
  for (const auto& [name, value] : kv) {
    if (!out.empty()) out += '&';
    absl::StrAppend(&out, PercentEncode(name), "=", PercentEncode(value));
  }
  return out;
}

std::string Base64Url(absl::string_view bytes) {
  std::string out = Base64(bytes);
  while (!out.empty() && out.back() == '=') out.pop_back();
  for (char& c : out) {
    if (c == '+') c = '-';
    if (c == '/') c = '_';
  }
  return out;
}

// `text` with every occurrence of a secret, as is or percent-encoded as the request sent it,
// replaced: a token endpoint or a proxy in front of it might echo the request into its error.
// Applied before any truncation, so no prefix of a secret survives a cut.
std::string Redact(std::string text, std::initializer_list<absl::string_view> secrets) {
  for (absl::string_view secret : secrets) {
    // Short strings would redact innocent words; the secrets are long.
    if (secret.size() < 8) continue;
    text = absl::StrReplaceAll(text, {{secret, "<redacted>"}});
    text = absl::StrReplaceAll(text, {{PercentEncode(secret), "<redacted>"}});
  }
  return text;
}

// A non-2xx answer of a token endpoint (or the metadata server): "<step> answered <status>:
// <error>: <error_description> (<hint>)", the OAuth2 error fields (RFC 6749 5.2) when the body
// has them, else the start of the body; `secrets` are redacted from what is quoted.
absl::Status TokenEndpointError(const HttpResponse& response, absl::string_view step,
                                std::initializer_list<absl::string_view> secrets,
                                absl::string_view invalid_grant_hint,
                                absl::string_view not_found_hint = "") {
  std::string error, description;
  const json doc = json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_object()) {
    auto e = doc.find("error");
    if (e != doc.end() && e->is_string()) {
      error = e->get<std::string>();
    } else if (e != doc.end() && e->is_object()) {
      // Google APIs' error shape: {"error": {"code": 400, "status": "...", "message": "..."}}.
      if (auto s = e->find("status"); s != e->end() && s->is_string()) error = *s;
      if (auto m = e->find("message"); m != e->end() && m->is_string()) description = *m;
    }
    auto d = doc.find("error_description");
    if (d != doc.end() && d->is_string()) description = d->get<std::string>();
  }
  std::string message = absl::StrCat(step, " answered ", response.status);
  if (!error.empty() || !description.empty()) {
    if (!error.empty()) absl::StrAppend(&message, ": ", Snippet(Redact(error, secrets), 100));
    if (!description.empty()) {
      absl::StrAppend(&message, ": ", Snippet(Redact(description, secrets), 300));
    }
  } else if (const std::string snippet = Snippet(Redact(response.body, secrets), 200);
             !snippet.empty()) {
    absl::StrAppend(&message, ": ", snippet);
  }
  absl::StatusCode code = absl::StatusCode::kFailedPrecondition;
  absl::string_view hint;
  if (IsRetryableHttpStatus(response.status)) {
    code = absl::StatusCode::kUnavailable;
  } else if (error == "invalid_grant" || error == "invalid_client" ||
             error == "unauthorized_client" || response.status == 401) {
    code = absl::StatusCode::kUnauthenticated;
    if (error == "invalid_grant") hint = invalid_grant_hint;
  } else if (response.status == 403) {
    code = absl::StatusCode::kPermissionDenied;
  } else if (response.status == 404) {
    code = absl::StatusCode::kNotFound;
    hint = not_found_hint;
  }
  if (!hint.empty()) absl::StrAppend(&message, " (", hint, ")");
  return absl::Status(code, message);
}

// {"access_token": ..., "expires_in": 3599, "token_type": "Bearer"} -> Credentials, expiring
// `expires_in` after `issued` (the time the request was made: the token was issued after it,
// so the expiration is never later than the server's).
absl::StatusOr<Credentials> ParseTokenResponse(absl::string_view body, absl::string_view step,
                                               absl::Time issued) {
  const json doc = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) {
    return absl::DataLossError(absl::StrCat(step, ": the answer is not a JSON object"));
  }
  auto token = doc.find("access_token");
  if (token == doc.end() || !token->is_string() || token->get<std::string>().empty()) {
    return absl::DataLossError(absl::StrCat(step, ": the answer has no access_token"));
  }
  if (auto type = doc.find("token_type"); type != doc.end()) {
    if (!type->is_string() || !absl::EqualsIgnoreCase(type->get<std::string>(), "Bearer")) {
      return absl::DataLossError(absl::StrCat(step, ": the answer's token_type is ",
                                              Snippet(type->dump(), 40), ", not Bearer"));
    }
  }
  // Absent, the token is taken to last as long as Google's do (an hour).
  double expires_in = kTokenLifetimeSeconds;
  if (auto e = doc.find("expires_in"); e != doc.end()) {
    bool valid = false;
    if (e->is_number()) {
      expires_in = e->get<double>();
      valid = true;
    } else if (e->is_string()) {
      valid = absl::SimpleAtod(e->get<std::string>(), &expires_in);
    }
    if (!valid || !std::isfinite(expires_in) || expires_in <= 0) {
      return absl::DataLossError(absl::StrCat(step, ": the answer's expires_in ",
                                              Snippet(e->dump(), 40),
                                              " is not a positive number of seconds"));
    }
  }
  Credentials credentials;
  credentials.bearer_token = token->get<std::string>();
  credentials.expiration = issued + absl::Seconds(expires_in);
  return credentials;
}

// ---------------------------------------------------------------------------------------------
// Credentials files

absl::StatusOr<std::string> ReadCredentialsFile(const std::string& path) {
  return ReadFileToString(path, absl::StrCat("reading credentials file ", path),
                          kMaxCredentialsFileBytes);
}

absl::StatusOr<json> ParseCredentialsJson(absl::string_view text, absl::string_view origin) {
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  // Never quote the text: it holds a private key or a refresh token.
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("credentials file ", origin, ": not a JSON object"));
  }
  return doc;
}

// A required non-empty string field; InvalidArgument naming the file and the field.
absl::StatusOr<std::string> RequiredField(const json& doc, absl::string_view field,
                                          absl::string_view origin) {
  auto it = doc.find(std::string(field));
  if (it == doc.end() || !it->is_string() || it->get<std::string>().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("credentials file ", origin, ": no \"", field, "\" (a non-empty string)"));
  }
  return it->get<std::string>();
}

std::string OptionalField(const json& doc, absl::string_view field) {
  auto it = doc.find(std::string(field));
  if (it == doc.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

// When the file says what it is, it must be `expected`.
absl::Status CheckType(const json& doc, absl::string_view expected, absl::string_view origin) {
  auto it = doc.find("type");
  if (it == doc.end()) return absl::OkStatus();
  if (!it->is_string() || it->get<std::string>() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("credentials file ", origin, ": \"type\" is ",
                                                   Snippet(it->dump(), 60), ", not \"", expected,
                                                   "\""));
  }
  return absl::OkStatus();
}

// The first queued OpenSSL error as text (clearing the queue, which is per thread and would
// otherwise confuse the next OpenSSL caller on this thread).
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "unknown error";
  char buffer[256];
  ERR_error_string_n(code, buffer, sizeof(buffer));
  return buffer;
}

// Encrypted PEM keys are refused rather than letting OpenSSL prompt on the terminal.
int NoPassphrase(char*, int, int, void*) { return -1; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// ServiceAccountCredentialsProvider

struct ServiceAccountCredentialsProvider::Key {
  explicit Key(EVP_PKEY* pkey) : pkey(pkey) {}
  ~Key() { EVP_PKEY_free(pkey); }
  Key(const Key&) = delete;
  Key& operator=(const Key&) = delete;
  EVP_PKEY* const pkey;
};

ServiceAccountCredentialsProvider::ServiceAccountCredentialsProvider(
    std::string origin, std::string client_email, std::string private_key_id, std::string token_uri,
    std::unique_ptr<Key> key, GoogleCredentialsOptions options)
    : origin_(std::move(origin)),
      client_email_(std::move(client_email)),
      private_key_id_(std::move(private_key_id)),
      token_uri_(std::move(token_uri)),
      key_(std::move(key)),
      options_(std::move(options)),
      scope_(ScopeFor(options_)) {}

ServiceAccountCredentialsProvider::~ServiceAccountCredentialsProvider() = default;

absl::StatusOr<std::unique_ptr<ServiceAccountCredentialsProvider>>
ServiceAccountCredentialsProvider::FromFile(const std::string& path,
                                            GoogleCredentialsOptions options) {
  WHARF_ASSIGN_OR_RETURN(std::string text, ReadCredentialsFile(path));
  return FromJson(text, path, std::move(options));
}

absl::StatusOr<std::unique_ptr<ServiceAccountCredentialsProvider>>
ServiceAccountCredentialsProvider::FromJson(absl::string_view text, std::string origin,
                                            GoogleCredentialsOptions options) {
  WHARF_ASSIGN_OR_RETURN(json doc, ParseCredentialsJson(text, origin));
  WHARF_RETURN_IF_ERROR(CheckType(doc, "service_account", origin));
  WHARF_ASSIGN_OR_RETURN(std::string client_email, RequiredField(doc, "client_email", origin));
  WHARF_ASSIGN_OR_RETURN(std::string pem, RequiredField(doc, "private_key", origin));
  std::string token_uri = OptionalField(doc, "token_uri");
  if (token_uri.empty()) token_uri = kGoogleTokenUri;
  if (!absl::StartsWith(token_uri, "https://") && !absl::StartsWith(token_uri, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("credentials file ", origin, ": \"token_uri\" is not an http(s) URL"));
  }

  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return absl::ResourceExhaustedError("OpenSSL: BIO_new_mem_buf failed");
  EVP_PKEY* pkey = PEM_read_bio_PrivateKey(bio, nullptr, NoPassphrase, nullptr);
  BIO_free(bio);
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "credentials file ", origin,
        ": \"private_key\" is not an unencrypted PEM private key (OpenSSL: ", OpenSslError(), ")"));
  }
  auto key = std::make_unique<Key>(pkey);
  if (EVP_PKEY_get_base_id(pkey) != EVP_PKEY_RSA) {
    return absl::InvalidArgumentError(absl::StrCat(
        "credentials file ", origin, ": \"private_key\" is not an RSA key (RS256 needs one)"));
  }
  return std::unique_ptr<ServiceAccountCredentialsProvider>(new ServiceAccountCredentialsProvider(
      std::move(origin), std::move(client_email), OptionalField(doc, "private_key_id"),
      std::move(token_uri), std::move(key), std::move(options)));
}

std::string ServiceAccountCredentialsProvider::Describe() const {
  return absl::StrCat("service account ", client_email_, " (key ", origin_, ")");
}

absl::StatusOr<std::string> ServiceAccountCredentialsProvider::MakeAssertion(absl::Time now) const {
  json header = {{"alg", "RS256"}, {"typ", "JWT"}};
  if (!private_key_id_.empty()) header["kid"] = private_key_id_;
  const int64_t iat = absl::ToUnixSeconds(now);
  const json claims = {{"iss", client_email_},
                       {"scope", scope_},
                       {"aud", token_uri_},
                       {"iat", iat},
                       {"exp", iat + kTokenLifetimeSeconds}};
  std::string signing_input = absl::StrCat(Base64Url(header.dump()), ".", Base64Url(claims.dump()));

  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == nullptr) return absl::ResourceExhaustedError("OpenSSL: EVP_MD_CTX_new failed");
  std::string signature;
  size_t length = 0;
  const auto* data = reinterpret_cast<const unsigned char*>(signing_input.data());
  bool ok = EVP_DigestSignInit(ctx, nullptr, EVP_sha256(), nullptr, key_->pkey) == 1 &&
            EVP_DigestSign(ctx, nullptr, &length, data, signing_input.size()) == 1;
  if (ok) {
    signature.resize(length);
    ok = EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(signature.data()), &length, data,
                        signing_input.size()) == 1;
    signature.resize(length);
  }
  EVP_MD_CTX_free(ctx);
  if (!ok) {
    return absl::InternalError(absl::StrCat("signing the JWT for ", client_email_,
                                            " with RS256 (OpenSSL: ", OpenSslError(), ")"));
  }
  absl::StrAppend(&signing_input, ".", Base64Url(signature));
  return signing_input;
}

absl::StatusOr<Credentials> ServiceAccountCredentialsProvider::Fetch() {
  const absl::Time now = Now(options_);
  WHARF_ASSIGN_OR_RETURN(const std::string assertion, MakeAssertion(now));
  const std::string body = FormEncode({{"grant_type", kJwtBearerGrant}, {"assertion", assertion}});
  const std::string step = absl::StrCat("POST ", token_uri_);
  absl::StatusOr<HttpResponse> response = SendWithRetries(options_, options_.token_attempts, [&] {
    HttpRequest request;
    request.method = "POST";
    request.url = token_uri_;
    request.headers = {{"content-type", std::string(kFormContentType)},
                       {"accept", "application/json"}};
    request.body = absl::Cord(body);
    request.timeout = options_.token_timeout;
    return request;
  });
  if (!response.ok()) return response.status();
  if (response->status / 100 != 2) {
    return TokenEndpointError(*response, step, {assertion},
                              "the key may have been deleted or disabled, or this machine's "
                              "clock is off");
  }
  return ParseTokenResponse(response->body, step, now);
}

// ---------------------------------------------------------------------------------------------
// AuthorizedUserCredentialsProvider

AuthorizedUserCredentialsProvider::AuthorizedUserCredentialsProvider(
    std::string origin, std::string client_id, std::string client_secret, std::string refresh_token,
    GoogleCredentialsOptions options)
    : origin_(std::move(origin)),
      client_id_(std::move(client_id)),
      client_secret_(std::move(client_secret)),
      refresh_token_(std::move(refresh_token)),
      options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<AuthorizedUserCredentialsProvider>>
AuthorizedUserCredentialsProvider::FromFile(const std::string& path,
                                            GoogleCredentialsOptions options) {
  WHARF_ASSIGN_OR_RETURN(std::string text, ReadCredentialsFile(path));
  return FromJson(text, path, std::move(options));
}

absl::StatusOr<std::unique_ptr<AuthorizedUserCredentialsProvider>>
AuthorizedUserCredentialsProvider::FromJson(absl::string_view text, std::string origin,
                                            GoogleCredentialsOptions options) {
  WHARF_ASSIGN_OR_RETURN(json doc, ParseCredentialsJson(text, origin));
  WHARF_RETURN_IF_ERROR(CheckType(doc, "authorized_user", origin));
  WHARF_ASSIGN_OR_RETURN(std::string client_id, RequiredField(doc, "client_id", origin));
  WHARF_ASSIGN_OR_RETURN(std::string client_secret, RequiredField(doc, "client_secret", origin));
  WHARF_ASSIGN_OR_RETURN(std::string refresh_token, RequiredField(doc, "refresh_token", origin));
  return std::unique_ptr<AuthorizedUserCredentialsProvider>(new AuthorizedUserCredentialsProvider(
      std::move(origin), std::move(client_id), std::move(client_secret), std::move(refresh_token),
      std::move(options)));
}

std::string AuthorizedUserCredentialsProvider::Describe() const {
  return absl::StrCat("gcloud user credentials (", origin_, ")");
}

absl::StatusOr<Credentials> AuthorizedUserCredentialsProvider::Fetch() {
  const absl::Time now = Now(options_);
  const std::string body = FormEncode({{"grant_type", "refresh_token"},
                                       {"client_id", client_id_},
                                       {"client_secret", client_secret_},
                                       {"refresh_token", refresh_token_}});
  const std::string step = absl::StrCat("POST ", options_.oauth_token_uri);
  absl::StatusOr<HttpResponse> response = SendWithRetries(options_, options_.token_attempts, [&] {
    HttpRequest request;
    request.method = "POST";
    request.url = options_.oauth_token_uri;
    request.headers = {{"content-type", std::string(kFormContentType)},
                       {"accept", "application/json"}};
    request.body = absl::Cord(body);
    request.timeout = options_.token_timeout;
    return request;
  });
  if (!response.ok()) return response.status();
  if (response->status / 100 != 2) {
    return TokenEndpointError(*response, step, {client_secret_, refresh_token_},
                              "the refresh token has expired or been revoked: run `gcloud auth "
                              "application-default login` again");
  }
  return ParseTokenResponse(response->body, step, now);
}

// ---------------------------------------------------------------------------------------------
// GceMetadataCredentialsProvider

namespace {

std::string MetadataHost(const GoogleCredentialsOptions& options) {
  if (!options.metadata_host.empty()) return options.metadata_host;
  return Env(options, "GCE_METADATA_HOST").value_or(kGceMetadataHost);
}

std::string MetadataBaseUrl(absl::string_view host) {
  host = absl::StripSuffix(host, "/");
  if (absl::StartsWithIgnoreCase(host, "http://") || absl::StartsWithIgnoreCase(host, "https://")) {
    return std::string(host);
  }
  return absl::StrCat("http://", host);
}

}  // namespace

GceMetadataCredentialsProvider::GceMetadataCredentialsProvider(GoogleCredentialsOptions options,
                                                               bool last_resort)
    : options_(std::move(options)),
      host_(MetadataHost(options_)),
      base_url_(MetadataBaseUrl(host_)),
      last_resort_(last_resort) {}

std::string GceMetadataCredentialsProvider::Describe() const {
  return absl::StrCat("GCE metadata server at ", host_);
}

absl::StatusOr<Credentials> GceMetadataCredentialsProvider::Fetch() {
  const absl::Time now = Now(options_);
  const std::string url = absl::StrCat(base_url_, kMetadataTokenPath);
  const auto fetch = [&]() -> absl::StatusOr<Credentials> {
    absl::StatusOr<HttpResponse> response =
        SendWithRetries(options_, options_.metadata_attempts, [&] {
          HttpRequest request;
          request.method = "GET";
          request.url = url;
          // Without it the server refuses (403): it proves the request is not a browser's
          // redirected SSRF.
          request.headers = {{"metadata-flavor", "Google"}, {"accept", "application/json"}};
          request.timeout = options_.metadata_timeout;
          return request;
        });
    if (!response.ok()) return response.status();
    const std::string step = absl::StrCat("GET ", url);
    if (response->status / 100 != 2) {
      return TokenEndpointError(*response, step, {}, "",
                                "no service account is attached to the instance");
    }
    return ParseTokenResponse(response->body, step, now);
  };
  absl::StatusOr<Credentials> credentials = fetch();
  if (!credentials.ok() && last_resort_) {
    return absl::UnauthenticatedError(absl::StrCat(
        credentials.status().message(),
        " (no other Google credentials are configured: set GOOGLE_APPLICATION_CREDENTIALS to a "
        "service-account key file, run `gcloud auth application-default login`, or access "
        "public buckets anonymously)"));
  }
  return credentials;
}

// ---------------------------------------------------------------------------------------------
// Resolution

absl::StatusOr<std::unique_ptr<CredentialsProvider>> LoadGoogleCredentialsFile(
    const std::string& path, const GoogleCredentialsOptions& options) {
  WHARF_ASSIGN_OR_RETURN(std::string text, ReadCredentialsFile(path));
  WHARF_ASSIGN_OR_RETURN(json doc, ParseCredentialsJson(text, path));
  auto type = doc.find("type");
  if (type == doc.end() || !type->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "credentials file ", path, ": no \"type\" (service_account or authorized_user)"));
  }
  const std::string kind = type->get<std::string>();
  if (kind == "service_account") {
    WHARF_ASSIGN_OR_RETURN(auto provider,
                           ServiceAccountCredentialsProvider::FromJson(text, path, options));
    return std::unique_ptr<CredentialsProvider>(std::move(provider));
  }
  if (kind == "authorized_user") {
    WHARF_ASSIGN_OR_RETURN(auto provider,
                           AuthorizedUserCredentialsProvider::FromJson(text, path, options));
    return std::unique_ptr<CredentialsProvider>(std::move(provider));
  }
  if (kind == "external_account" || kind == "external_account_authorized_user" ||
      kind == "impersonated_service_account" || kind == "gdch_service_account") {
    return absl::UnimplementedError(absl::StrCat(
        "credentials file ", path, ": credentials of type \"", kind,
        "\" are not supported (use a service-account key or gcloud user credentials)"));
  }
  return absl::InvalidArgumentError(absl::StrCat("credentials file ", path, ": \"type\" is \"",
                                                 Snippet(kind, 60),
                                                 "\", not service_account or authorized_user"));
}

std::optional<std::string> GcloudWellKnownFile(const GoogleCredentialsOptions& options) {
  constexpr absl::string_view kName = "application_default_credentials.json";
  if (std::optional<std::string> config = Env(options, "CLOUDSDK_CONFIG")) {
    return absl::StrCat(absl::StripSuffix(*config, "/"), "/", kName);
  }
  if (std::optional<std::string> home = Env(options, "HOME")) {
    return absl::StrCat(absl::StripSuffix(*home, "/"), "/.config/gcloud/", kName);
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<CredentialsProvider>> ResolveGoogleCredentials(
    const GoogleCredentialsOptions& options) {
  if (std::optional<std::string> path = Env(options, "GOOGLE_APPLICATION_CREDENTIALS")) {
    // Named explicitly: a problem with it is the user's to fix, not a reason to try the
    // machine's credentials (which could silently act as another identity).
    absl::StatusOr<std::unique_ptr<CredentialsProvider>> provider =
        LoadGoogleCredentialsFile(*path, options);
    if (!provider.ok()) return Annotate(provider.status(), "GOOGLE_APPLICATION_CREDENTIALS");
    return provider;
  }
  if (std::optional<std::string> well_known = GcloudWellKnownFile(options)) {
    struct stat st;
    if (stat(well_known->c_str(), &st) == 0) {
      absl::StatusOr<std::unique_ptr<CredentialsProvider>> provider =
          LoadGoogleCredentialsFile(*well_known, options);
      if (!provider.ok()) {
        return Annotate(provider.status(), "gcloud's application-default credentials");
      }
      return provider;
    }
    if (errno != ENOENT && errno != ENOTDIR) {
      return ErrnoToStatus(
          errno,
          absl::StrCat("gcloud's application-default credentials: ", "checking ", *well_known));
    }
  }
  return std::unique_ptr<CredentialsProvider>(
      std::make_unique<GceMetadataCredentialsProvider>(options, /*last_resort=*/true));
}

}  // namespace wharf::gcs
