#include "store/s3/sigv4.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/hash.h"

namespace wharf::s3 {
namespace {

constexpr absl::string_view kAlgorithm = "AWS4-HMAC-SHA256";
constexpr absl::string_view kSessionTokenHeader = "x-amz-security-token";

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("signing request: ", what));
}

bool IsUnreserved(unsigned char c) {
  return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~';
}

// RFC 9110 token characters: what a header name or method may be made of.
bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  constexpr absl::string_view kTokenPunct = "!#$%&'*+-.^_`|~";
  return std::all_of(s.begin(), s.end(), [&](unsigned char c) {
    return absl::ascii_isalnum(c) || kTokenPunct.find(static_cast<char>(c)) != kTokenPunct.npos;
  });
}

// CR or LF would end the header line (header injection) and break the canonical request's
// line structure; NUL truncates in C APIs.
bool HasLineBreakOrNul(absl::string_view s) {
  return s.find_first_of(absl::string_view("\r\n\0", 3)) != absl::string_view::npos;
}

bool HasSpaceOrControl(absl::string_view s) {
  return std::any_of(s.begin(), s.end(), [](unsigned char c) { return c <= ' ' || c == 0x7f; });
}

bool IsReservedHeader(absl::string_view lower_name) {
  return lower_name == "host" || lower_name == "authorization" || lower_name == "x-amz-date" ||
         lower_name == "x-amz-content-sha256" || lower_name == kSessionTokenHeader;
}

bool IsValidPayloadHash(absl::string_view s) {
  if (s.size() == 64 && std::all_of(s.begin(), s.end(), [](unsigned char c) {
        return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f');
      })) {
    return true;
  }
  // Sentinels: UNSIGNED-PAYLOAD, STREAMING-AWS4-HMAC-SHA256-PAYLOAD, ... The '-' tells them
  // from a hash in uppercase hex, which S3 would reject.
  return s.find('-') != absl::string_view::npos &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) {
           return absl::ascii_isupper(c) || absl::ascii_isdigit(c) || c == '-';
         });
}

// AWS "Trimall": leading and trailing whitespace removed, inner runs collapsed to one space.
std::string TrimAll(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  bool pending_space = false;
  for (unsigned char c : value) {
    if (absl::ascii_isspace(c)) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out += ' ';
    pending_space = false;
    out += static_cast<char>(c);
  }
  return out;
}

absl::Status Validate(const SigningRequest& request, const Credentials& credentials,
                      absl::string_view region, absl::string_view service) {
  if (credentials.access_key_id.empty() || credentials.secret_access_key.empty()) {
    return Invalid(
        "credentials need both an access key id and a secret access key (anonymous requests "
        "are sent unsigned)");
  }
  if (HasSpaceOrControl(credentials.access_key_id) ||
      credentials.access_key_id.find('/') != std::string::npos) {
    return Invalid("the access key id contains whitespace, '/' or control characters");
  }
  if (HasLineBreakOrNul(credentials.session_token)) {
    return Invalid("the session token contains a line break or NUL");
  }
  for (absl::string_view part : {region, service}) {
    if (part.empty() || HasSpaceOrControl(part) || part.find('/') != absl::string_view::npos) {
      return Invalid(absl::StrCat("region and service must be non-empty without '/' or ",
                                  "whitespace (got region '", region, "', service '", service,
                                  "')"));
    }
  }
  if (request.method.empty() ||
      !std::all_of(request.method.begin(), request.method.end(),
                   [](unsigned char c) { return absl::ascii_isupper(c); })) {
    return Invalid(absl::StrCat("method '", request.method, "' is not an uppercase HTTP method"));
  }
  if (request.host.empty() || HasSpaceOrControl(request.host) ||
      request.host.find('/') != std::string::npos) {
    return Invalid(
        absl::StrCat("host '", request.host, "' must be non-empty, without whitespace or '/'"));
  }
  if (request.path.empty() || request.path.front() != '/') {
    return Invalid(absl::StrCat("path '", request.path, "' must start with '/'"));
  }
  for (const auto& [name, value] : request.query) {
    if (name.empty()) return Invalid("a query parameter has an empty name");
  }
  for (const auto& [name, value] : request.headers) {
    if (!IsToken(name)) {
      return Invalid(absl::StrCat("header name '", name, "' is not a valid HTTP token"));
    }
    if (IsReservedHeader(absl::AsciiStrToLower(name))) {
      return Invalid(absl::StrCat("header '", name, "' is set by the signer; do not pass it"));
    }
    // The value itself is not quoted: it may be a secret (e.g. an SSE-C key).
    if (HasLineBreakOrNul(value)) {
      return Invalid(absl::StrCat("the value of header '", name, "' contains a line break or NUL"));
    }
  }
  if (!IsValidPayloadHash(request.payload_sha256)) {
    return Invalid(absl::StrCat("payload_sha256 '", request.payload_sha256,
                                "' is neither 64 lowercase hex digits nor UNSIGNED-PAYLOAD"));
  }
  return absl::OkStatus();
}

struct CanonicalHeader {
  std::string name;   // lowercase
  std::string value;  // TrimAll'ed; repeated names joined with ','
};

// Lowercased, trimmed, sorted by name; repeated names merged in their original order.
std::vector<CanonicalHeader> CanonicalHeaders(
    const std::vector<std::pair<absl::string_view, absl::string_view>>& headers) {
  std::vector<CanonicalHeader> sorted;
  sorted.reserve(headers.size());
  for (const auto& [name, value] : headers) {
    sorted.push_back({absl::AsciiStrToLower(name), TrimAll(value)});
  }
  std::stable_sort(
      sorted.begin(), sorted.end(),
      [](const CanonicalHeader& a, const CanonicalHeader& b) { return a.name < b.name; });
  std::vector<CanonicalHeader> merged;
  for (CanonicalHeader& h : sorted) {
    if (!merged.empty() && merged.back().name == h.name) {
      absl::StrAppend(&merged.back().value, ",", h.value);
    } else {
      merged.push_back(std::move(h));
    }
  }
  return merged;
}

// The signing step proper, given a derived key. Kept apart from key derivation so that a
// caller-side key cache can be added without touching the canonicalization.
SignedRequest SignWithKey(const SigningRequest& request, const Credentials& credentials,
                          absl::string_view signing_key, absl::string_view scope,
                          const std::string& amz_date) {
  SignedRequest out;

  const std::string canonical_uri = UriEncode(request.path, /*encode_slash=*/false);
  const std::string canonical_query = CanonicalQueryString(request.query);
  out.canonical_target =
      canonical_query.empty() ? canonical_uri : absl::StrCat(canonical_uri, "?", canonical_query);

  std::vector<std::pair<absl::string_view, absl::string_view>> to_sign;
  to_sign.reserve(request.headers.size() + 4);
  to_sign.emplace_back("host", request.host);
  for (const auto& [name, value] : request.headers) to_sign.emplace_back(name, value);
  to_sign.emplace_back("x-amz-content-sha256", request.payload_sha256);
  to_sign.emplace_back("x-amz-date", amz_date);
  if (!credentials.session_token.empty()) {
    to_sign.emplace_back(kSessionTokenHeader, credentials.session_token);
  }
  const std::vector<CanonicalHeader> canonical_headers = CanonicalHeaders(to_sign);

  std::string header_block;
  for (const CanonicalHeader& h : canonical_headers) {
    absl::StrAppend(&header_block, h.name, ":", h.value, "\n");
  }
  out.signed_headers =
      absl::StrJoin(canonical_headers, ";",
                    [](std::string* dst, const CanonicalHeader& h) { dst->append(h.name); });

  out.canonical_request =
      absl::StrCat(request.method, "\n", canonical_uri, "\n", canonical_query, "\n", header_block,
                   "\n", out.signed_headers, "\n", request.payload_sha256);
  out.string_to_sign =
      absl::StrCat(kAlgorithm, "\n", amz_date, "\n", scope, "\n", Sha256Hex(out.canonical_request));
  out.signature = HexLower(HmacSha256(signing_key, out.string_to_sign));
  out.authorization =
      absl::StrCat(kAlgorithm, " Credential=", credentials.access_key_id, "/", scope,
                   ",SignedHeaders=", out.signed_headers, ",Signature=", out.signature);

  out.headers = request.headers;
  out.headers.emplace_back("x-amz-date", amz_date);
  out.headers.emplace_back("x-amz-content-sha256", request.payload_sha256);
  if (!credentials.session_token.empty()) {
    out.headers.emplace_back(kSessionTokenHeader, credentials.session_token);
  }
  out.headers.emplace_back("authorization", out.authorization);
  return out;
}

}  // namespace

std::string UriEncode(absl::string_view s, bool encode_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  for (unsigned char c : s) {
    if (IsUnreserved(c) || (c == '/' && !encode_slash)) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  return out;
}

std::string CanonicalQueryString(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (const auto& [name, value] : query) {
    encoded.emplace_back(UriEncode(name, /*encode_slash=*/true),
                         UriEncode(value, /*encode_slash=*/true));
  }
  std::sort(encoded.begin(), encoded.end());
  return absl::StrJoin(encoded, "&", absl::PairFormatter("="));
}

std::string FormatAmzDate(absl::Time t) {
  return absl::FormatTime("%Y%m%dT%H%M%SZ", t, absl::UTCTimeZone());
}

std::string DeriveSigningKey(absl::string_view secret_access_key, absl::string_view date,
                             absl::string_view region, absl::string_view service) {
  std::string key = HmacSha256(absl::StrCat("AWS4", secret_access_key), date);
  key = HmacSha256(key, region);
  key = HmacSha256(key, service);
  return HmacSha256(key, "aws4_request");
}

std::string SignedRequest::RedactedCanonicalRequest() const {
  const std::string prefix = absl::StrCat("\n", kSessionTokenHeader, ":");
  const size_t start = canonical_request.find(prefix);
  if (start == std::string::npos) return canonical_request;
  const size_t value_start = start + prefix.size();
  const size_t value_end = canonical_request.find('\n', value_start);
  std::string out = canonical_request;
  out.replace(value_start, value_end - value_start, "<redacted>");
  return out;
}

absl::StatusOr<SignedRequest> SignV4(const SigningRequest& request, const Credentials& credentials,
                                     absl::string_view region, absl::string_view service,
                                     absl::Time now) {
  if (absl::Status status = Validate(request, credentials, region, service); !status.ok()) {
    return status;
  }
  const std::string amz_date = FormatAmzDate(now);
  const absl::string_view date = absl::string_view(amz_date).substr(0, 8);  // YYYYMMDD
  const std::string scope = absl::StrCat(date, "/", region, "/", service, "/aws4_request");
  const std::string signing_key =
      DeriveSigningKey(credentials.secret_access_key, date, region, service);
  return SignWithKey(request, credentials, signing_key, scope, amz_date);
}

}  // namespace wharf::s3
