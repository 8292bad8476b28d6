// Google application-default credentials (ADC) for the GCS JSON API: OAuth2 access tokens, each
// source a wharf::CredentialsProvider (base/credentials.h) whose Credentials carry
// `bearer_token` and `expiration`, to be handed out by a CredentialsCache and put on requests by
// a BearerTokenSigner (http/bearer_signer.h).
//
//   service account     a key file (type "service_account"): a JWT signed RS256 with the key,
//                       exchanged at the key's token_uri for an access token (RFC 7523)
//   gcloud user         gcloud's application_default_credentials.json (type "authorized_user"):
//                       the refresh token exchanged at the OAuth2 token endpoint
//   GCE metadata        the metadata server's token for the instance's default service account
//
// ResolveGoogleCredentials picks one in the order Google documents for ADC
// (https://cloud.google.com/docs/authentication/application-default-credentials):
// GOOGLE_APPLICATION_CREDENTIALS, then gcloud's well-known file, then the metadata server.
//
// Providers block (HTTP over the given transport, waiting for its callback): they are meant to
// be called by a CredentialsCache, whose fetches run on the runtime's blocking pool, never on
// an event loop or a transport thread. Choosing a source reads the chosen key file (so a
// malformed key fails when the store is opened) and does no network I/O.
//
// Secrets (private keys, signed assertions, client secrets, refresh and access tokens) never
// appear in Describe(), in errors or in logs. Fetch errors name the step and the cause, e.g.
//   "POST https://oauth2.googleapis.com/token answered 400: invalid_grant: Invalid JWT
//    Signature. (the key may have been deleted or disabled, or this machine's clock is off)";
// the CredentialsCache prefixes "credentials from <Describe()>", which names the key file and
// the service account. File errors name the file and the field.
//
// Thread-safety: a provider may be used from any thread; Fetch() calls on one provider may
// overlap (they share nothing mutable: the parsed private key is only read).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/credentials.h"
#include "http/transport.h"

namespace wharf::gcs {

// The OAuth2 scopes of Cloud Storage.
inline constexpr char kGcsFullControlScope[] =
    "https://www.googleapis.com/auth/devstorage.full_control";
inline constexpr char kGcsReadOnlyScope[] = "https://www.googleapis.com/auth/devstorage.read_only";
// Google's OAuth2 token endpoint (authorized_user files; service-account keys name their own).
inline constexpr char kGoogleTokenUri[] = "https://oauth2.googleapis.com/token";
// The metadata server's name on GCE (and GKE, Cloud Run, Cloud Functions).
inline constexpr char kGceMetadataHost[] = "metadata.google.internal";

// Looks up an environment variable; nullopt when unset. Empty values count as unset.
using GoogleEnvLookup = std::function<std::optional<std::string>(absl::string_view)>;

// How the providers find and reach their sources. Defaults follow Google's client libraries.
struct GoogleCredentialsOptions {
  // Variables that select sources (GOOGLE_APPLICATION_CREDENTIALS, CLOUDSDK_CONFIG, HOME,
  // GCE_METADATA_HOST). Null: the process environment.
  GoogleEnvLookup env;
  // The transport for every token request. Null: the runtime's shared curl transport (looked
  // up at the first fetch, so choosing a source starts no thread). Shared: the stores and the
  // runtime use the same transport.
  std::shared_ptr<HttpTransport> transport;
  // The time for JWT claims and for expirations (now + expires_in). Null: absl::Now. Tests
  // inject a fixed clock.
  std::function<absl::Time()> clock;
  // The scope a service account asks for: `scope` when set, else devstorage.read_only when
  // `read_only`, else devstorage.full_control. (gcloud user credentials and the metadata
  // server carry the scopes they were granted.)
  bool read_only = false;
  std::string scope;
  // Where authorized_user refresh tokens are exchanged. Tests point it at a stand-in.
  std::string oauth_token_uri = kGoogleTokenUri;
  // The metadata server: "host[:port]" or an http:// URL. Empty: GCE_METADATA_HOST (as
  // Google's libraries read it), else metadata.google.internal.
  std::string metadata_host;
  // Token endpoints: limit per request and attempts (transport failures, 429 and 5xx are
  // retried after a short pause).
  absl::Duration token_timeout = absl::Seconds(30);
  int token_attempts = 3;
  // The metadata server: limit per request and attempts. Short, because off GCE the name does
  // not resolve (or the address does not answer) and the last source must fail fast.
  absl::Duration metadata_timeout = absl::Seconds(1);
  int metadata_attempts = 2;
};

// A service-account key: a JWT {iss: client_email, scope, aud: token_uri, iat: now,
// exp: now + 1 h} with header {alg: RS256, typ: JWT, kid: private_key_id}, signed with the
// key's RSA private key (EVP_DigestSign, SHA-256), POSTed to token_uri as
// grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<JWT>; the answer's
// access_token and expires_in become the Credentials.
class ServiceAccountCredentialsProvider final : public CredentialsProvider {
 public:
  // Reads and parses the key file at `path`. Errors: those of reading the file (naming it);
  // InvalidArgument naming the file and the field for one that is not a JSON object, whose
  // "type" is not "service_account", that lacks client_email or private_key, or whose
  // private_key is not an unencrypted PEM RSA key. token_uri defaults to kGoogleTokenUri;
  // private_key_id is optional (no "kid" then).
  static absl::StatusOr<std::unique_ptr<ServiceAccountCredentialsProvider>> FromFile(
      const std::string& path, GoogleCredentialsOptions options);
  // The same from the file's content; `origin` (the file's path) is named in messages.
  static absl::StatusOr<std::unique_ptr<ServiceAccountCredentialsProvider>> FromJson(
      absl::string_view json, std::string origin, GoogleCredentialsOptions options);

  ~ServiceAccountCredentialsProvider() override;
  ServiceAccountCredentialsProvider(const ServiceAccountCredentialsProvider&) = delete;
  ServiceAccountCredentialsProvider& operator=(const ServiceAccountCredentialsProvider&) = delete;

  absl::StatusOr<Credentials> Fetch() override;
  // "service account <client_email> (key <origin>)".
  std::string Describe() const override;

  // The signed assertion Fetch() sends for `now` (header.claims.signature, base64url without
  // padding). Deterministic for a given `now` (RSASSA-PKCS1-v1_5 uses no randomness).
  absl::StatusOr<std::string> MakeAssertion(absl::Time now) const;

  const std::string& client_email() const { return client_email_; }
  const std::string& token_uri() const { return token_uri_; }
  // The scope asked for (see GoogleCredentialsOptions).
  const std::string& scope() const { return scope_; }

 private:
  struct Key;  // the parsed private key (OpenSSL), kept out of this header
  ServiceAccountCredentialsProvider(std::string origin, std::string client_email,
                                    std::string private_key_id, std::string token_uri,
                                    std::unique_ptr<Key> key, GoogleCredentialsOptions options);

  const std::string origin_;
  const std::string client_email_;
  const std::string private_key_id_;
  const std::string token_uri_;
  const std::unique_ptr<Key> key_;
  const GoogleCredentialsOptions options_;
  const std::string scope_;
};

// gcloud user credentials (`gcloud auth application-default login`): POSTs
// grant_type=refresh_token&client_id=..&client_secret=..&refresh_token=.. to
// options.oauth_token_uri.
class AuthorizedUserCredentialsProvider final : public CredentialsProvider {
 public:
  // Errors as ServiceAccountCredentialsProvider::FromFile: the type must be "authorized_user"
  // and client_id, client_secret and refresh_token present.
  static absl::StatusOr<std::unique_ptr<AuthorizedUserCredentialsProvider>> FromFile(
      const std::string& path, GoogleCredentialsOptions options);
  static absl::StatusOr<std::unique_ptr<AuthorizedUserCredentialsProvider>> FromJson(
      absl::string_view json, std::string origin, GoogleCredentialsOptions options);

  AuthorizedUserCredentialsProvider(const AuthorizedUserCredentialsProvider&) = delete;
  AuthorizedUserCredentialsProvider& operator=(const AuthorizedUserCredentialsProvider&) = delete;

  absl::StatusOr<Credentials> Fetch() override;
  // "gcloud user credentials (<origin>)".
  std::string Describe() const override;

 private:
  AuthorizedUserCredentialsProvider(std::string origin, std::string client_id,
                                    std::string client_secret, std::string refresh_token,
                                    GoogleCredentialsOptions options);

  const std::string origin_;
  const std::string client_id_;
  const std::string client_secret_;
  const std::string refresh_token_;
  const GoogleCredentialsOptions options_;
};

// The metadata server: GET http://<host>/computeMetadata/v1/instance/service-accounts/default/
// token with "Metadata-Flavor: Google", answered with {access_token, expires_in, token_type}.
class GceMetadataCredentialsProvider final : public CredentialsProvider {
 public:
  // `last_resort`: ResolveGoogleCredentials found nothing else, so a failure is reported as
  // Unauthenticated with a hint naming the other sources.
  explicit GceMetadataCredentialsProvider(GoogleCredentialsOptions options,
                                          bool last_resort = false);
  GceMetadataCredentialsProvider(const GceMetadataCredentialsProvider&) = delete;
  GceMetadataCredentialsProvider& operator=(const GceMetadataCredentialsProvider&) = delete;

  absl::StatusOr<Credentials> Fetch() override;
  // "GCE metadata server at <host>".
  std::string Describe() const override;

 private:
  const GoogleCredentialsOptions options_;
  const std::string host_;      // as configured, for Describe()
  const std::string base_url_;  // "http://host[:port]"
  const bool last_resort_;
};

// The provider for a credentials file by its "type": service_account or authorized_user.
// Other types (external_account, impersonated_service_account, ...) are Unimplemented; a
// missing "type" is InvalidArgument. Errors name the file.
absl::StatusOr<std::unique_ptr<CredentialsProvider>> LoadGoogleCredentialsFile(
    const std::string& path, const GoogleCredentialsOptions& options);

// gcloud's well-known file: $CLOUDSDK_CONFIG/application_default_credentials.json, else
// $HOME/.config/gcloud/application_default_credentials.json; nullopt when neither variable is
// set. Whether the file exists is not checked.
std::optional<std::string> GcloudWellKnownFile(const GoogleCredentialsOptions& options);

// Application-default credentials, in Google's documented order:
//   1. GOOGLE_APPLICATION_CREDENTIALS: the file it names (by its type). A missing, unreadable
//      or malformed file is an error naming the variable and the path, never a fall-through.
//   2. gcloud's well-known file (GcloudWellKnownFile), if it exists.
//   3. the GCE metadata server (options.metadata_host, GCE_METADATA_HOST, or
//      metadata.google.internal), as a last resort: nothing is fetched here, so off GCE the
//      first Fetch() fails (fast, Unauthenticated, naming what to set).
absl::StatusOr<std::unique_ptr<CredentialsProvider>> ResolveGoogleCredentials(
    const GoogleCredentialsOptions& options);

}  // namespace wharf::gcs
