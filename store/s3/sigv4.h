// AWS Signature Version 4 for S3 requests: header-based authentication with the payload sent
// in a single chunk (S3 API reference, "Signature Calculations for the Authorization Header:
// Transferring Payload in a Single Chunk"). Pure functions: no clock, no I/O, no caching; the
// caller passes the time and the credentials.
//
// SignV4 returns, with the signature, the encoded path and query the transport must put in the
// URL (SignedRequest::canonical_target), so the URL sent and the URL signed cannot disagree.
// S3 canonical URIs are the raw key encoded once, '/' kept: no double encoding and no
// dot-segment normalization. A transport must therefore send the target byte for byte (curl:
// CURLOPT_PATH_AS_IS, or it folds "/a/../b" in keys that contain such segments).
//
// Thread-safety: all functions are pure and may be called concurrently.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/credentials.h"

namespace wharf::s3 {

// Hex SHA-256 of the empty string: the payload hash of GET, HEAD and DELETE requests.
inline constexpr absl::string_view kEmptyPayloadSha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
// Payload hash that tells S3 the body is not covered by the signature.
inline constexpr absl::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";

// The credentials a signer uses (base/credentials.h): SigV4 reads access_key_id,
// secret_access_key and, for temporary (STS) credentials, session_token; a provider's
// CredentialsCache hands them out (store/s3/aws_credentials.h).
using Credentials = ::wharf::Credentials;

// Percent-encodes `s` the way SigV4 requires: the unreserved bytes A-Z a-z 0-9 '-' '_' '.' '~'
// are kept, every other byte becomes %XX with uppercase hex (UTF-8 multi-byte characters are
// encoded byte by byte; a space is "%20", never '+'). '/' is kept when `encode_slash` is false
// (object key paths) and encoded as "%2F" when true (query names and values).
std::string UriEncode(absl::string_view s, bool encode_slash);

// The canonical query string: names and values encoded with UriEncode(encode_slash=true),
// sorted by encoded name, then encoded value, joined as "n1=v1&n2=v2". A parameter with an
// empty value (e.g. "?lifecycle") is written "lifecycle=". Empty query: "".
std::string CanonicalQueryString(const std::vector<std::pair<std::string, std::string>>& query);

// `t` as an x-amz-date value in UTC, e.g. "20130524T000000Z" (sub-second part dropped).
std::string FormatAmzDate(absl::Time t);

// The SigV4 signing key: HMAC chain over "AWS4" + secret, `date` (YYYYMMDD), region, service,
// "aws4_request". Raw 32 bytes. It depends only on those inputs, so a caller may cache it for
// a day per (credentials, region, service); SignV4 derives it on every call.
std::string DeriveSigningKey(absl::string_view secret_access_key, absl::string_view date,
                             absl::string_view region, absl::string_view service);

// One HTTP request to sign. Everything is raw (unencoded); the signer encodes.
struct SigningRequest {
  // Uppercase HTTP method: "GET", "PUT", "HEAD", "DELETE", "POST".
  std::string method;
  // The Host header exactly as the transport sends it: "examplebucket.s3.amazonaws.com",
  // "s3.us-west-2.amazonaws.com", or "localhost:9000" (a default port is omitted, as curl does).
  std::string host;
  // Raw path starting with '/': "/" (bucket root, virtual-hosted), "/test.txt",
  // "/bucket/my key+x" (path style). Bytes are taken literally, '/' separates nothing special.
  std::string path;
  // Raw query parameters in any order; a flag parameter such as "lifecycle" has value "".
  std::vector<std::pair<std::string, std::string>> query;
  // Extra headers to send and sign (e.g. range, content-md5, content-type, x-amz-*), in any
  // order and case. Repeated names are signed as one comma-joined value, as AWS specifies.
  // REQUIRES: none of host, authorization, x-amz-date, x-amz-content-sha256,
  // x-amz-security-token: the signer sets those.
  std::vector<std::pair<std::string, std::string>> headers;
  // Lowercase hex SHA-256 of the body, kEmptyPayloadSha256, or kUnsignedPayload.
  std::string payload_sha256;
};

// What SignV4 produces: everything the transport needs, plus the intermediate strings for tests
// and debug logs.
struct SignedRequest {
  // Path and query to append to "scheme://host" to form the URL, already encoded exactly as
  // signed, e.g. "/bucket/my%20key%2Bx" or "/?max-keys=2&prefix=J".
  std::string canonical_target;
  // Every header to send except Host: SigningRequest::headers as given, then x-amz-date,
  // x-amz-content-sha256, x-amz-security-token (only with a session token), authorization.
  std::vector<std::pair<std::string, std::string>> headers;
  // The Authorization header value (also the last entry of `headers`).
  std::string authorization;
  // "host;range;x-amz-content-sha256;x-amz-date": the names covered by the signature.
  std::string signed_headers;
  // Lowercase hex signature.
  std::string signature;
  // The canonical request and string to sign, as AWS's examples print them. The canonical
  // request contains the session token, if any: log RedactedCanonicalRequest() instead.
  std::string canonical_request;
  std::string string_to_sign;

  // canonical_request with the x-amz-security-token value replaced by "<redacted>".
  std::string RedactedCanonicalRequest() const;
};

// Signs `request` for `region` and `service` ("s3") at time `now` (which also becomes
// x-amz-date). InvalidArgument (naming the problem, never a header value or a secret) when the
// credentials lack the key id or the secret, the region or service is empty or has '/' or
// whitespace, the method is not uppercase letters, the host is empty or has whitespace or '/',
// the path does not start with '/', a query name is empty, a header name is not an HTTP token
// or is one the signer owns, a header value or the session token contains CR, LF or NUL, or
// payload_sha256 is neither 64 lowercase hex digits nor an AWS sentinel like UNSIGNED-PAYLOAD.
absl::StatusOr<SignedRequest> SignV4(const SigningRequest& request, const Credentials& credentials,
                                     absl::string_view region, absl::string_view service,
                                     absl::Time now);

}  // namespace wharf::s3
