// Resolution of what an S3 client needs (credentials, region, endpoint, addressing style, CA
// bundle) from explicit options, the environment and the shared AWS files (~/.aws/credentials,
// ~/.aws/config), in the order the AWS SDKs and CLI use, so that a setup that works for
// `aws s3 ls` works for wharf. Credentials come from the chain in store/s3/aws_credentials.h
// (static keys, assume-role profiles, web identity, credential_process, container credentials,
// instance metadata); SSO profiles fail with a hint.
//
// Secrets never appear in error messages, in S3ClientConfig::credentials_source, or in
// S3ClientConfig::DebugString(); the INI parser quotes line numbers, not lines.
//
// Thread-safety: pure functions apart from reading the two files and, with the default
// EnvLookup, the process environment; safe to call concurrently as long as nothing modifies
// the environment meanwhile (setenv is not thread-safe).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/credentials.h"
#include "store/s3/sigv4.h"

namespace wharf::s3 {

// Looks up an environment variable; nullopt when unset. Empty values count as unset
// everywhere below, as they do for the AWS CLI.
using EnvLookup = std::function<std::optional<std::string>(absl::string_view)>;

// The real process environment (getenv).
std::optional<std::string> GetEnv(absl::string_view name);

// Explicit settings (from a URI query, the Python API or CLI flags); each beats every other
// source. Empty strings count as unset.
struct S3ClientOverrides {
  std::optional<std::string> access_key_id;
  std::optional<std::string> secret_access_key;
  std::optional<std::string> session_token;
  std::optional<std::string> profile;
  std::optional<std::string> region;
  std::optional<std::string> endpoint_url;
  std::optional<std::string> ca_bundle;
  std::optional<bool> path_style;
  // Send requests unsigned (public buckets); no credentials are looked up.
  bool anonymous = false;
};

struct S3ClientConfig {
  // Static keys, when the source has them (explicit options, the environment, a profile's
  // aws_access_key_id): a store signs with these when they are set. Empty when `anonymous` or
  // when the credentials come from a source that fetches them (see credentials_provider).
  Credentials credentials;
  // The source of the credentials; null only when `anonymous`. For static keys it hands out
  // `credentials`; otherwise a store fetches through it (behind a CredentialsCache that
  // refreshes before expiry). Shared: every store opened with this config uses it.
  std::shared_ptr<CredentialsProvider> credentials_provider;
  // Where the credentials came from (credentials_provider->Describe()), for error hints; never
  // contains a secret. E.g. "explicit options", "environment (AWS_ACCESS_KEY_ID)",
  // "profile 'dev' in /root/.aws/credentials", "IMDS at http://169.254.169.254",
  // "anonymous (requests are not signed)".
  std::string credentials_source;
  std::string region;
  // "scheme://host[:port]" without a trailing '/', e.g. "https://s3.us-east-1.amazonaws.com"
  // or "http://localhost:9000". The scheme is lowercase.
  std::string endpoint;
  // true: https://endpoint/bucket/key; false: https://bucket.endpoint/key (virtual-hosted).
  bool path_style = false;
  // Path of a PEM bundle of trusted CAs; empty for the system default.
  std::string ca_bundle;
  // The profile consulted in the shared files ("default" unless named).
  std::string profile;
  bool anonymous = false;

  // One line for logs and `--verbose`: profile, region, endpoint, addressing style, CA bundle
  // and credentials source. No key id, secret or token.
  std::string DebugString() const;
};

// Resolves each setting from the first source that has it:
//  - credentials: overrides (static keys); else the chain of ResolveAwsCredentialsChain
//    (store/s3/aws_credentials.h) in botocore's order: AWS_ACCESS_KEY_ID +
//    AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN); the profile's role_arn with source_profile
//    or credential_source; web identity (profile or AWS_WEB_IDENTITY_TOKEN_FILE); the profile
//    in the credentials file (AWS_SHARED_CREDENTIALS_FILE, default ~/.aws/credentials, section
//    [NAME]); the profile's credential_process; the profile in the config file (AWS_CONFIG_FILE,
//    default ~/.aws/config, section [profile NAME], or [default]): aws_access_key_id,
//    aws_secret_access_key, aws_session_token; container credentials; instance metadata
//    (unless AWS_EC2_METADATA_DISABLED=true). Nothing is fetched here: a source that needs
//    the network or a subprocess is only chosen. Skipped when `anonymous`.
//  - profile: overrides, AWS_PROFILE, "default".
//  - region: overrides, AWS_REGION, AWS_DEFAULT_REGION, profile `region`, "us-east-1".
//  - endpoint: overrides, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's services
//    section (`services = NAME` -> [services NAME] s3 = endpoint_url = ...), the profile's
//    nested `s3 =` endpoint_url, profile `endpoint_url`, else https://s3.REGION.amazonaws.com
//    (amazonaws.com.cn for cn-* regions).
//  - path_style: overrides; the profile's nested `s3 =` addressing_style (path | virtual |
//    auto); else true for a custom endpoint, false for *.amazonaws.com(.cn).
//  - ca_bundle: overrides, AWS_CA_BUNDLE, profile `ca_bundle`.
// Profile settings other than credentials come from the config file only, as in the AWS CLI.
//
// Errors (each names the setting and its source, never a secret):
//  - NotFound: a profile named by the overrides or AWS_PROFILE is in neither file.
//  - Unauthenticated: no credentials anywhere, instance metadata disabled, and not anonymous.
//  - InvalidArgument: only one of key id / secret set in a source; a session token without
//    keys in the overrides; an endpoint that is not http(s)://host[:port]; a malformed region
//    or addressing_style; a file that does not parse (with its path and line number); an
//    incomplete role or container setup (see ResolveAwsCredentialsChain).
//  - Unimplemented: the profile gets its credentials through SSO (or needs an MFA code).
//  - errno-derived codes when a file exists but cannot be read.
absl::StatusOr<S3ClientConfig> ResolveS3ClientConfig(const S3ClientOverrides& overrides,
                                                     const EnvLookup& env = GetEnv);

// --- The shared-file format, exposed for tests and diagnostics. ---

// One [section] of an AWS INI file. Keys are lowercased; the last definition wins. A property
// with an empty value followed by indented "name = value" lines is a nested section:
//   [profile dev]
//   s3 =
//       addressing_style = path
// gives subsections["s3"]["addressing_style"] == "path" (and no values["s3"]). An indented line
// after a non-empty value continues it (joined with '\n').
struct IniSection {
  std::map<std::string, std::string> values;
  std::map<std::string, std::map<std::string, std::string>> subsections;
};

// Sections by name as written between the brackets, trimmed ("default", "profile dev",
// "services local"); sections repeated in a file are merged.
using IniFile = std::map<std::string, IniSection>;

// Parses the AWS credentials/config format: '#' or ';' starts a comment on a line of its own
// or, after whitespace, at the end of a line; blank lines are ignored; CRLF and a UTF-8 BOM
// are accepted. InvalidArgument "line N: ..." for a property outside any section, a line
// without '=', an empty name, or an unterminated '['. Messages never quote the line.
absl::StatusOr<IniFile> ParseAwsIni(absl::string_view text);

// One of the two shared files, as read for one resolution.
struct AwsSharedFile {
  std::string path;             // empty when it cannot be located (no HOME)
  std::optional<IniFile> data;  // nullopt when the file does not exist

  // The path, "(unknown path: HOME is not set)" or "PATH (does not exist)", for messages.
  std::string Describe() const;
};

// Reads the file named by the variable `path_variable` (AWS_SHARED_CREDENTIALS_FILE,
// AWS_CONFIG_FILE; a leading "~/" expanded with HOME), else ~/.aws/<default_name>. A missing
// file is not an error; one that cannot be read or parsed is (naming its path).
absl::StatusOr<AwsSharedFile> LoadAwsSharedFile(const EnvLookup& env,
                                                absl::string_view path_variable,
                                                absl::string_view default_name);

// "scheme://host[:port]" from an endpoint URL (scheme lowercased, trailing '/' dropped);
// InvalidArgument naming `source` for anything else (a path, a query, a user name).
absl::StatusOr<std::string> NormalizeAwsEndpoint(absl::string_view raw, absl::string_view source);

// Section `name` ("default", "services local"); nullptr when absent.
const IniSection* FindIniSection(const AwsSharedFile& file, absl::string_view name);
// A profile of the config file: "[profile NAME]", or "[default]" for the default profile
// ("[profile default]" wins when both exist, as in the SDKs); nullptr when absent.
const IniSection* FindConfigProfile(const AwsSharedFile& file, absl::string_view profile);

}  // namespace wharf::s3
