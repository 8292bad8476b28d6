// The AWS credential sources real deployments use, each a wharf::CredentialsProvider
// (base/credentials.h), and the chain that picks one the way botocore does
// (docs/design/credentials.md):
//
//   static keys          explicit options, AWS_ACCESS_KEY_ID, a profile's aws_access_key_id
//                        (StaticCredentialsProvider)
//   assume role          a profile's role_arn + source_profile / credential_source: STS
//                        AssumeRole, SigV4-signed (service "sts") with the source's credentials
//   web identity         AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN, or a profile's
//                        web_identity_token_file + role_arn (EKS IRSA): STS
//                        AssumeRoleWithWebIdentity, unsigned
//   credential_process   a profile's command printing the JSON "Version": 1 document
//   container            AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (ECS) or _FULL_URI (EKS Pod
//                        Identity, local agents) with AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE)
//   instance metadata    IMDSv2 (a session token from PUT /latest/api/token, then the role's
//                        credentials), the last resort
//
// Providers block (HTTP on the runtime's shared curl transport, a subprocess): they are meant
// to be called by a CredentialsCache, whose fetches run on the runtime's blocking pool, never
// on an event loop. Choosing a source (ResolveAwsCredentialsChain) does no I/O beyond reading
// the shared files the caller already loaded.
//
// Secrets (keys, session tokens, web identity and container tokens) never appear in Describe(),
// in errors or in logs. Errors name the source and the step, e.g.
//   "IMDS at http://169.254.169.254: GET /latest/meta-data/iam/security-credentials/
//    answered 404 (no IAM role is attached to the instance)".
//
// Thread-safety: a provider may be used from any thread; Fetch() calls on one provider may
// overlap (they share nothing mutable).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/credentials.h"
#include "http/transport.h"
#include "store/s3/aws_config.h"

namespace wharf::s3 {

// How the providers reach their endpoints. Defaults follow botocore.
struct AwsCredentialsOptions {
  // Variables that select and configure sources (the process environment by default).
  EnvLookup env = GetEnv;
  // The transport for IMDS, container and STS requests; null: the runtime's shared curl
  // transport for `ca_bundle` (looked up at the first fetch, so choosing a source starts no
  // thread).
  std::shared_ptr<HttpTransport> transport;
  // PEM bundle for STS over https; empty for the system default.
  std::string ca_bundle;
  // The profile was named explicitly (the `profile=` option, not AWS_PROFILE): the
  // environment's AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are skipped, as boto3 does for
  // Session(profile_name=...), so naming a profile selects its credentials.
  bool explicit_profile = false;
  // The STS region: its regional endpoint and the SigV4 scope of AssumeRole.
  std::string region = "us-east-1";
  // Instance metadata: limit per request and attempts per request (AWS_METADATA_SERVICE_TIMEOUT
  // and AWS_METADATA_SERVICE_NUM_ATTEMPTS override them in the chain). Short, because off
  // EC2 the address does not answer and the chain must fail fast.
  absl::Duration imds_timeout = absl::Seconds(1);
  int imds_attempts = 2;
  // Container credentials endpoint: limit per request and attempts.
  absl::Duration container_timeout = absl::Seconds(2);
  int container_attempts = 3;
  // STS: limit per request and attempts (transport failures, 5xx and throttling are retried).
  absl::Duration sts_timeout = absl::Seconds(10);
  int sts_attempts = 3;
  // A credential_process still running after this long is killed.
  absl::Duration process_timeout = absl::Minutes(2);
  // Where AWS_CONTAINER_CREDENTIALS_RELATIVE_URI points (ECS's fixed agent address); tests
  // point it at a stand-in.
  std::string container_relative_host = "http://169.254.170.2";
};

// Runs `command` with /bin/sh -c (as the Go and Rust SDKs do; quoting follows the shell) and
// parses its standard output as the credential_process document:
//   {"Version": 1, "AccessKeyId": ..., "SecretAccessKey": ..., "SessionToken": ...,
//    "Expiration": "2024-05-01T12:00:00Z"}
// (SessionToken and Expiration optional; without Expiration the credentials never expire).
// A non-zero exit is an error quoting the end of the command's standard error.
class ProcessCredentialsProvider final : public CredentialsProvider {
 public:
  // `origin` says where the command was configured, e.g. "profile 'dev' in /root/.aws/config".
  ProcessCredentialsProvider(std::string command, std::string origin,
                             absl::Duration timeout = absl::Minutes(2));
  absl::StatusOr<Credentials> Fetch() override;
  // "credential_process of <origin>" (never the command: it may hold a secret).
  std::string Describe() const override;

 private:
  const std::string command_;
  const std::string origin_;
  const absl::Duration timeout_;
};

// Parses a credential_process document (above). InvalidArgument naming the missing or
// malformed field, never quoting a value.
absl::StatusOr<Credentials> ParseProcessCredentials(absl::string_view json);

// IMDSv2: PUT /latest/api/token (X-aws-ec2-metadata-token-ttl-seconds: 21600), then with
// X-aws-ec2-metadata-token: GET /latest/meta-data/iam/security-credentials/ (the role name)
// and GET .../<role> (the JSON document with AccessKeyId, SecretAccessKey, Token,
// Expiration). There is no IMDSv1 fallback.
class ImdsCredentialsProvider final : public CredentialsProvider {
 public:
  // `endpoint`: "http://169.254.169.254" or a stand-in; a trailing '/' is dropped.
  // `last_resort`: the chain found nothing else, so a failure is reported as Unauthenticated
  // with a hint naming the other sources.
  ImdsCredentialsProvider(std::string endpoint, AwsCredentialsOptions options,
                          bool last_resort = false);
  absl::StatusOr<Credentials> Fetch() override;
  // "IMDS at <endpoint>".
  std::string Describe() const override;

 private:
  const std::string endpoint_;
  const AwsCredentialsOptions options_;
  const bool last_resort_;
};

// Container credentials: GET `url`, with "Authorization: <token>" when a token is configured
// (the file is re-read on every fetch, since agents rotate it); the answer is JSON with
// AccessKeyId, SecretAccessKey, Token, Expiration.
class ContainerCredentialsProvider final : public CredentialsProvider {
 public:
  // `authorization_token_file` wins over `authorization_token`; both may be empty.
  ContainerCredentialsProvider(std::string url, std::string authorization_token,
                               std::string authorization_token_file, AwsCredentialsOptions options);
  absl::StatusOr<Credentials> Fetch() override;
  // "container credentials at <url>".
  std::string Describe() const override;

 private:
  const std::string url_;
  const std::string authorization_token_;
  const std::string authorization_token_file_;
  const AwsCredentialsOptions options_;
};

// The role an STS call asks for.
struct AssumeRoleParams {
  std::string role_arn;
  // Empty: "wharf-<unix seconds>" at each fetch.
  std::string session_name;
  std::string external_id;   // AssumeRole only; empty: none
  int duration_seconds = 0;  // 0: STS's default (one hour)
};

// STS AssumeRoleWithWebIdentity with the token read from `token_file` at every fetch (EKS
// rotates it): an unsigned POST of Action=AssumeRoleWithWebIdentity&Version=2011-06-15&...
// to `sts_endpoint`, answered with XML.
class WebIdentityCredentialsProvider final : public CredentialsProvider {
 public:
  // `sts_endpoint`: "https://sts.us-east-1.amazonaws.com" (see ResolveStsEndpoint).
  WebIdentityCredentialsProvider(std::string token_file, AssumeRoleParams role,
                                 std::string sts_endpoint, AwsCredentialsOptions options);
  absl::StatusOr<Credentials> Fetch() override;
  // "web identity token <file> for role <arn> via STS at <endpoint>".
  std::string Describe() const override;

 private:
  const std::string token_file_;
  const AssumeRoleParams role_;
  const std::string sts_endpoint_;
  const AwsCredentialsOptions options_;
};

// STS AssumeRole, SigV4-signed (service "sts", options.region) with credentials fetched from
// `source` at every fetch (so a source that expires is refreshed along with the role).
class AssumeRoleCredentialsProvider final : public CredentialsProvider {
 public:
  // REQUIRES: source != nullptr.
  AssumeRoleCredentialsProvider(AssumeRoleParams role, std::shared_ptr<CredentialsProvider> source,
                                std::string sts_endpoint, AwsCredentialsOptions options);
  absl::StatusOr<Credentials> Fetch() override;
  // "role <arn> via STS at <endpoint> with <source->Describe()>".
  std::string Describe() const override;

 private:
  const AssumeRoleParams role_;
  const std::shared_ptr<CredentialsProvider> source_;
  const std::string sts_endpoint_;
  const AwsCredentialsOptions options_;
};

// The STS endpoint for `profile`: AWS_ENDPOINT_URL_STS, AWS_ENDPOINT_URL, the profile's
// services section (`services = NAME` -> [services NAME] sts = endpoint_url = ...), the
// profile's endpoint_url, else https://sts.REGION.amazonaws.com (amazonaws.com.cn for cn-*).
// InvalidArgument for one that is not http(s)://host[:port].
absl::StatusOr<std::string> ResolveStsEndpoint(const AwsSharedFile& config_file,
                                               absl::string_view profile,
                                               const AwsCredentialsOptions& options);

// Chooses the credentials for `profile` from the first source that is configured, in
// botocore's order:
//   1. AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN)
//   2. the profile's role_arn with source_profile (static keys, another role, web identity or
//      credential_process of that profile; cycles are an error) or credential_source
//      (Environment, Ec2InstanceMetadata, EcsContainer)
//   3. web identity: web_identity_token_file / AWS_WEB_IDENTITY_TOKEN_FILE with role_arn /
//      AWS_ROLE_ARN and role_session_name / AWS_ROLE_SESSION_NAME (the profile's first)
//   4. the profile's static keys in the credentials file
//   5. the profile's credential_process (the credentials file's first, as profiles merge)
//   6. the profile's static keys in the config file
//   7. container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI, then _FULL_URI, which
//      must be https or a loopback / ECS / EKS agent address)
//   8. instance metadata (IMDSv2) at AWS_EC2_METADATA_SERVICE_ENDPOINT, the profile's
//      ec2_metadata_service_endpoint, or http://169.254.169.254 ([fd00:ec2::254] when the
//      endpoint mode is IPv6), unless AWS_EC2_METADATA_DISABLED=true
// A profile that uses SSO, or role_arn with nothing to assume it with, is an error before
// step 7 (rather than silently falling back to the instance's role). Nothing is fetched: the
// returned provider's Fetch() does the network or subprocess work. Static sources are
// StaticCredentialsProviders.
//
// Errors: InvalidArgument for half a key pair (naming the variable or file and field), an
// incomplete role or container setup, a malformed endpoint; NotFound for a source_profile
// that does not exist; Unimplemented for SSO and mfa_serial; Unauthenticated when nothing is
// configured and instance metadata is disabled.
absl::StatusOr<std::shared_ptr<CredentialsProvider>> ResolveAwsCredentialsChain(
    absl::string_view profile, const AwsSharedFile& credentials_file,
    const AwsSharedFile& config_file, const AwsCredentialsOptions& options);

}  // namespace wharf::s3
