#include "store/s3/s3_store.h"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <map>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/hash.h"
#include "base/interrupt.h"
#include "base/runtime.h"
#include "base/status.h"
#include "base/timer.h"
#include "http/curl_transport.h"
#include "http/retry_after.h"
#include "pugixml.hpp"
#include "store/get_body.h"
#include "store/keys.h"
#include "store/s3/sigv4.h"

namespace wharf::s3 {

// One logical S3 request, re-signed and re-sent on each attempt.
struct S3Store::Call {
  std::string op;   // "get", "put", "list", ... for messages
  std::string key;  // object key; empty for bucket-level calls
  // The key messages name when it is not `key`: a listing's prefix (its request is the
  // bucket's), so an error names what was listed.
  std::string subject;
  const std::string& named() const { return subject.empty() ? key : subject; }
  std::string method = "GET";
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::pair<std::string, std::string>> headers;
  absl::Cord body;
  bool sign_payload = false;  // sign the body's SHA-256 (small XML bodies) or UNSIGNED-PAYLOAD
  // Where a 2xx body goes; rebuilt for every attempt (a resumed GET shifts the buffer).
  absl::AnyInvocable<ResponseBody()> make_response_body;
  // Sees each 2xx attempt's headers before its body (see HttpRequest::on_headers).
  std::function<void(const HttpResponse&)> on_headers;
  // Called on each attempt's failure with the status; return true to retry the call
  // (after the caller adjusted it, e.g. a GET's range for resuming).
  absl::AnyInvocable<bool(const absl::Status&)> on_transport_failure;
  // When it fires the call stops: no further attempt is sent, the transfer in flight is
  // aborted by the transport, and `done` gets "<op> <uri>: cancelled".
  CancelToken cancel;
  // A 304 Not Modified is a success (a GET with If-None-Match), not an error.
  bool accept_not_modified = false;
  // HttpRequest::fresh_connection: a request whose unseen resend by libcurl would act twice.
  bool fresh_connection = false;

  int attempt = 0;
  absl::Time first_attempt = absl::InfinitePast();
  // Set once the call dropped cached credentials the server called expired (retried once).
  bool refreshed_credentials = false;
};

namespace {

constexpr absl::string_view kXmlNs = "http://s3.amazonaws.com/doc/2006-03-01/";

std::string Unquote(absl::string_view etag) {
  etag = absl::StripAsciiWhitespace(etag);
  if (absl::StartsWith(etag, "W/")) etag.remove_prefix(2);
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') {
    etag = etag.substr(1, etag.size() - 2);
  }
  return std::string(etag);
}

std::string Header(const HttpResponse& r, absl::string_view name) {
  auto v = r.header(std::string_view(name.data(), name.size()));
  return v ? std::string(*v) : std::string();
}

// "2009-10-12T17:50:30.000Z"
absl::Time ParseIsoDate(const char* s) {
  absl::Time t;
  std::string err;
  if (absl::ParseTime(absl::RFC3339_full, s, &t, &err)) return t;
  return absl::InfinitePast();
}

// S3's encoding-type=url is form encoding: %XX escapes and '+' for space.
std::string UrlDecode(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() + 0 && i + 2 <= s.size() - 1 &&
               absl::ascii_isxdigit(s[i + 1]) && absl::ascii_isxdigit(s[i + 2])) {
      int v = 0;
      for (int k = 1; k <= 2; ++k) {
        char c = s[i + k];
        v = v * 16 + (absl::ascii_isdigit(c) ? c - '0' : absl::ascii_tolower(c) - 'a' + 10);
      }
      out += static_cast<char>(v);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

absl::Status CancelledCall(absl::string_view op, absl::string_view uri) {
  return absl::CancelledError(absl::StrCat(op, " ", uri, ": cancelled"));
}

// The body the server received does not match the checksum sent with it: damaged on the
// way. The request still holds its body, so sending it again is right.
bool IsDamagedBodyCode(absl::string_view code) {
  return code == "BadDigest" || code == "XAmzContentSHA256Mismatch";
}

bool IsRetryableCode(absl::string_view code) {
  return code == "SlowDown" || code == "RequestTimeout" || code == "InternalError" ||
         code == "ServiceUnavailable" || code == "Throttling" || code == "ThrottlingException" ||
         code == "RequestTimeTooSkewed" || IsDamagedBodyCode(code);
}

struct S3Error {
  std::string code, message, request_id;
};

S3Error ParseError(const HttpResponse& r) {
  S3Error e;
  pugi::xml_document doc;
  if (!r.body.empty() && doc.load_buffer(r.body.data(), r.body.size())) {
    pugi::xml_node err = doc.child("Error");
    e.code = err.child_value("Code");
    e.message = err.child_value("Message");
    e.request_id = err.child_value("RequestId");
  }
  if (e.request_id.empty()) e.request_id = Header(r, "x-amz-request-id");
  return e;
}

// The server refused temporary credentials as expired or unknown: fresh ones may work.
bool IsExpiredCredentialsResponse(const HttpResponse& response) {
  if (response.status != 400 && response.status != 403) return false;
  const std::string code = ParseError(response).code;
  return code == "ExpiredToken" || code == "InvalidToken" || code == "TokenRefreshRequired" ||
         code == "ExpiredTokenException";
}

// ETag of a part or single PUT as S3 computes it: the hex MD5 of the bytes.
// True when the reply's ETag is not the MD5 of the body, as AWS documents for objects
// encrypted with SSE-KMS (also DSSE-KMS) or SSE-C: their ETags are opaque. The Content-MD5
// sent with the body still has the server check it.
bool EtagIsOpaque(const HttpResponse& r) {
  const std::optional<std::string_view> sse = r.header("x-amz-server-side-encryption");
  return (sse && absl::StartsWith(absl::string_view(sse->data(), sse->size()), "aws:kms")) ||
         r.header("x-amz-server-side-encryption-customer-algorithm").has_value();
}

std::pair<std::string, std::string> Md5HexAndBase64(const absl::Cord& data) {
  Md5 md5;
  md5.Update(data);
  auto digest = md5.Finish();
  std::string raw(reinterpret_cast<const char*>(digest.data()), digest.size());
  return {HexLower(raw), Base64(raw)};
}

// A create-only put (PutOptions::if_absent) that found the key taken (412).
absl::Status AlreadyExists(absl::string_view uri) {
  return absl::AlreadyExistsError(
      absl::StrCat("put ", uri, ": the object already exists (exclusive create)"));
}

// The headers of PutOptions on PutObject and CreateMultipartUpload (all signed).
std::vector<std::pair<std::string, std::string>> PutOptionHeaders(const PutOptions& options) {
  std::vector<std::pair<std::string, std::string>> headers;
  if (!options.content_type.empty()) headers.emplace_back("content-type", options.content_type);
  if (!options.storage_class.empty()) {
    headers.emplace_back("x-amz-storage-class", options.storage_class);
  }
  if (!options.sse.empty()) headers.emplace_back("x-amz-server-side-encryption", options.sse);
  if (!options.sse_kms_key_id.empty()) {
    headers.emplace_back("x-amz-server-side-encryption-aws-kms-key-id", options.sse_kms_key_id);
  }
  return headers;
}

// "bytes 0-9/1000" -> 0, 9, 1000.
bool ParseContentRange(absl::string_view cr, uint64_t* first, uint64_t* last, uint64_t* total) {
  if (!absl::ConsumePrefix(&cr, "bytes ")) return false;
  const size_t dash = cr.find('-'), slash = cr.find('/');
  return dash != absl::string_view::npos && slash != absl::string_view::npos && dash < slash &&
         absl::SimpleAtoi(cr.substr(0, dash), first) &&
         absl::SimpleAtoi(cr.substr(dash + 1, slash - dash - 1), last) &&
         absl::SimpleAtoi(cr.substr(slash + 1), total) && *first <= *last;
}

// The retry meter's cause for a retryable S3 error code (in an error reply, or for one key
// of a DeleteObjects reply).
absl::string_view RetryCauseOfCode(absl::string_view code) {
  if (code == "SlowDown" || code == "Throttling" || code == "ThrottlingException") {
    return "throttled";
  }
  if (code == "RequestTimeout") return "timeout";
  if (code == "RequestTimeTooSkewed") return "clock_skew";
  if (IsDamagedBodyCode(code)) return "connection";
  return "server_error";
}

}  // namespace

absl::string_view RetryCause(const absl::StatusOr<HttpResponse>& response) {
  if (!response.ok()) return "connection";  // reset, refused, timed out on the wire
  if (response->status == 429 || response->status == 503) return "throttled";
  if (response->status == 408) return "timeout";
  if (response->status >= 500) return "server_error";
  return RetryCauseOfCode(ParseError(*response).code);
}

bool IsRetryableResponse(const HttpResponse& response) {
  if (IsRetryableHttpStatus(response.status)) return true;
  if (response.status == 400 || response.status == 403) {
    return IsRetryableCode(ParseError(response).code);
  }
  return false;
}

absl::Status ErrorFromResponse(const HttpResponse& response, absl::string_view op,
                               absl::string_view uri, const S3ClientConfig& config) {
  S3Error e = ParseError(response);
  const bool bodyless = e.code.empty();  // HEAD responses have no body
  if (bodyless) {
    switch (response.status) {
      case 404: {
        // A bodyless 404 on an object cannot tell a missing key from a missing bucket; on
        // the bucket itself (no key: "s3://b" or "s3://b/") it is the bucket.
        const size_t slash = uri.find('/', uri.find("://") + 3);
        e.code = slash == absl::string_view::npos || slash + 1 == uri.size()
                     ? "NoSuchBucket"
                     : "NoSuchKey or NoSuchBucket";
        break;
      }
      case 403:
        e.code = "AccessDenied";
        break;
      case 412:
        e.code = "PreconditionFailed";
        break;
      case 416:
        e.code = "InvalidRange";
        break;
      default:
        e.code = absl::StrCat("HTTP ", response.status);
    }
  }
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string hint;
  const std::string creds = absl::StrCat("credentials from ", config.credentials_source);
  if (e.code == "NoSuchKey" || e.code == "NoSuchUpload" || response.status == 404) {
    code = absl::StatusCode::kNotFound;
    if (e.code == "NoSuchBucket") {
      hint = absl::StrCat("check the bucket name and the endpoint ", config.endpoint);
    } else if (bodyless) {
      hint = absl::StrCat(
          "a HEAD reply names no cause; check the key, the bucket name and the "
          "endpoint ",
          config.endpoint);
    }
  } else if (e.code == "SignatureDoesNotMatch") {
    code = absl::StatusCode::kPermissionDenied;
    hint = absl::StrCat("check AWS_SECRET_ACCESS_KEY; ", creds);
  } else if (e.code == "InvalidAccessKeyId") {
    code = absl::StatusCode::kPermissionDenied;
    hint = absl::StrCat("check AWS_ACCESS_KEY_ID; ", creds);
  } else if ((e.code == "AccessDenied" || response.status == 403) && config.anonymous) {
    code = absl::StatusCode::kPermissionDenied;
    hint =
        "the request was sent unsigned (anonymous: --no-sign-request, anonymous=True, "
        "WHARF_NO_SIGN_REQUEST): only public buckets and objects can be read that way";
  } else if (e.code == "AccessDenied" || response.status == 403) {
    code = absl::StatusCode::kPermissionDenied;
    hint = absl::StrCat("check the credentials and their permissions; ", creds);
  } else if (e.code == "PreconditionFailed" || response.status == 412) {
    code = absl::StatusCode::kFailedPrecondition;
    hint = "the object changed (ETag mismatch)";
  } else if (e.code == "InvalidRange" || response.status == 416) {
    code = absl::StatusCode::kOutOfRange;
    hint = "the range starts at or past the end of the object";
  } else if (e.code == "BucketAlreadyOwnedByYou" || e.code == "BucketAlreadyExists") {
    code = absl::StatusCode::kAlreadyExists;
  } else if (e.code == "BucketNotEmpty") {
    code = absl::StatusCode::kFailedPrecondition;
  } else if (IsDamagedBodyCode(e.code)) {
    code = absl::StatusCode::kDataLoss;
    hint = "the bytes the server received differ from those sent: damaged on the way";
  } else if (IsRetryableResponse(response)) {
    code = absl::StatusCode::kUnavailable;
  } else if (response.status == 501 || response.status == 505) {
    code = absl::StatusCode::kUnimplemented;
  } else if (response.status == 400) {
    code = absl::StatusCode::kInvalidArgument;
  }
  std::string msg = absl::StrCat(op, " ", uri, ": ", e.code);
  if (!e.message.empty()) absl::StrAppend(&msg, ": ", e.message);
  if (!hint.empty()) absl::StrAppend(&msg, " (", hint, ")");
  if (!e.request_id.empty()) absl::StrAppend(&msg, " [request id ", e.request_id, "]");
  return absl::Status(code, msg);
}

absl::StatusOr<std::unique_ptr<S3Store>> S3Store::Open(std::string bucket, S3ClientConfig config,
                                                       std::shared_ptr<HttpTransport> transport,
                                                       S3StoreOptions options) {
  if (options.part_size < (uint64_t{5} << 20)) {
    return absl::InvalidArgumentError("S3 multipart part size must be at least 5 MiB");
  }
  return std::unique_ptr<S3Store>(
      new S3Store(std::move(bucket), std::move(config), std::move(transport), std::move(options)));
}

S3Store::S3Store(std::string bucket, S3ClientConfig config,
                 std::shared_ptr<HttpTransport> transport, S3StoreOptions options)
    : bucket_(std::move(bucket)),
      config_(std::move(config)),
      transport_(std::move(transport)),
      options_(std::move(options)) {
  absl::string_view endpoint = config_.endpoint;
  const size_t sep = endpoint.find("://");
  scheme_ = std::string(endpoint.substr(0, sep));
  std::string authority(endpoint.substr(sep + 3));
  // curl omits default ports from Host; the signature must cover the same string.
  if (scheme_ == "http" && absl::EndsWith(authority, ":80")) authority.resize(authority.size() - 3);
  if (scheme_ == "https" && absl::EndsWith(authority, ":443")) {
    authority.resize(authority.size() - 4);
  }
  if (bucket_.empty()) {  // the endpoint itself (ListBuckets): GET / on its host
    host_ = authority;
  } else if (config_.path_style) {
    host_ = authority;
    base_path_ = absl::StrCat("/", bucket_);
  } else {
    host_ = absl::StrCat(bucket_, ".", authority);
  }
  if (!config_.anonymous && config_.credentials.empty() &&
      config_.credentials_provider != nullptr) {
    // One cache per source in the runtime, so stores on the same role share its fetches.
    runtime_ = Runtime::Default();
    std::shared_ptr<CredentialsProvider> provider = config_.credentials_provider;
    ThreadPool* pool = &runtime_->blocking_pool();  // not inside Shared(): it holds the lock
    credentials_cache_ = runtime_->Shared<CredentialsCache>(
        absl::StrCat("aws-credentials:", provider->Describe()), [&] {
          // The cache owns a provider; this one forwards to the shared source.
          class Forwarding : public CredentialsProvider {
           public:
            explicit Forwarding(std::shared_ptr<CredentialsProvider> p) : p_(std::move(p)) {}
            absl::StatusOr<Credentials> Fetch() override { return p_->Fetch(); }
            std::string Describe() const override { return p_->Describe(); }

           private:
            const std::shared_ptr<CredentialsProvider> p_;
          };
          return std::make_shared<CredentialsCache>(std::make_unique<Forwarding>(provider), pool);
        });
  }
}

S3Store::~S3Store() = default;

std::string S3Store::Uri(absl::string_view key) const {
  // A store without a bucket (for ListBuckets) names the endpoint: "s3://".
  if (bucket_.empty()) return absl::StrCat(options_.scheme, "://", key);
  return absl::StrCat(options_.scheme, "://", bucket_, "/", key);
}

const Capabilities& S3Store::capabilities() const {
  if (options_.capabilities != nullptr) return *options_.capabilities;
  static const Capabilities caps = [] {
    Capabilities c;
    c.multipart_upload = true;
    c.max_page_size = 1000;
    c.put_options = true;
    c.max_copy_size = uint64_t{5} << 30;  // CopyObject's limit
    return c;
  }();
  return caps;
}

absl::Duration S3Store::Backoff(int attempt) {
  return options_.retry.Backoff(attempt, retries_.Uniform01());
}

void S3Store::Execute(std::shared_ptr<Call> call, ResponseCallback done) {
  call->first_attempt = absl::Now();
  Attempt(std::move(call), std::move(done));
}

void S3Store::Attempt(std::shared_ptr<Call> call, ResponseCallback done) {
  if (IsCancelled(call->cancel)) {
    return std::move(done)(CancelledCall(call->op, Uri(call->named())));
  }
  ++call->attempt;
  if (config_.anonymous) return SendAttempt(std::move(call), std::move(done), nullptr);
  if (credentials_cache_ == nullptr) {
    return SendAttempt(std::move(call), std::move(done), &config_.credentials);
  }
  // Runs inline while the cached credentials are valid, else on the blocking pool once a
  // fetch completes: never blocks the calling (possibly transport) thread.
  credentials_cache_->GetAsync([this, call = std::move(call), done = std::move(done)](
                                   absl::StatusOr<Credentials> credentials) mutable {
    if (!credentials.ok()) {
      // A missing credential (a profile's file) is not the request's object or bucket
      // missing: callers take NotFound for that.
      absl::Status status = credentials.status();
      if (absl::IsNotFound(status)) status = absl::UnauthenticatedError(status.message());
      std::move(done)(Annotate(status, absl::StrCat(call->op, " ", Uri(call->named()))));
      return;
    }
    SendAttempt(std::move(call), std::move(done), &*credentials);
  });
}

void S3Store::SendAttempt(std::shared_ptr<Call> call, ResponseCallback done,
                          const Credentials* credentials) {
  const std::string uri = Uri(call->named());
  // Fired while the credentials were fetched: nothing is sent.
  if (IsCancelled(call->cancel)) return std::move(done)(CancelledCall(call->op, uri));

  SigningRequest sr;
  sr.method = call->method;
  sr.host = host_;
  sr.path = call->key.empty() ? (base_path_.empty() ? "/" : base_path_)
                              : absl::StrCat(base_path_, "/", call->key);
  sr.query = call->query;
  sr.headers = call->headers;
  sr.payload_sha256 = call->sign_payload   ? Sha256Hex(call->body)
                      : call->body.empty() ? std::string(kEmptyPayloadSha256)
                                           : std::string(kUnsignedPayload);

  HttpRequest request;
  request.method = call->method;
  request.body = call->body;
  request.cancel = call->cancel;
  request.fresh_connection = call->fresh_connection;
  if (call->make_response_body) request.response = call->make_response_body();
  if (call->on_headers) request.on_headers = call->on_headers;
  if (credentials == nullptr) {
    request.url = absl::StrCat(scheme_, "://", host_, UriEncode(sr.path, false));
    std::string query = CanonicalQueryString(sr.query);
    if (!query.empty()) absl::StrAppend(&request.url, "?", query);
    request.headers = sr.headers;
  } else {
    auto signed_request = SignV4(sr, *credentials, config_.region, options_.service, absl::Now());
    if (!signed_request.ok()) {
      std::move(done)(Annotate(signed_request.status(), absl::StrCat(call->op, " ", uri)));
      return;
    }
    request.url = absl::StrCat(scheme_, "://", host_, signed_request->canonical_target);
    request.headers = std::move(signed_request->headers);
  }

  transport_->Send(
      std::move(request), [this, call = std::move(call), done = std::move(done), uri,
                           sent = absl::Now()](absl::StatusOr<HttpResponse> response) mutable {
        absl::Status failure;
        bool retry = false;
        if (!response.ok()) {
          failure = response.status();
          retry = failure.code() == absl::StatusCode::kUnavailable;
          if (call->on_transport_failure) retry = call->on_transport_failure(failure) && retry;
        } else if (response->status / 100 != 2 &&
                   !(call->accept_not_modified && response->status == 304)) {
          if (credentials_cache_ != nullptr && !call->refreshed_credentials &&
              IsExpiredCredentialsResponse(*response)) {
            // Temporary credentials that expired early or were revoked: fetch fresh ones and
            // retry once (the fetch runs on the blocking pool, not on this transport thread).
            call->refreshed_credentials = true;
            retries_.Count("credentials");
            credentials_cache_->Invalidate();
            Attempt(std::move(call), std::move(done));
            return;
          }
          failure = ErrorFromResponse(*response, call->op, uri, config_);
          retry = IsRetryableResponse(*response);
        } else {
          std::move(done)(std::move(response));
          return;
        }
        // A cancelled call fails as cancelled, whatever the transport or server said, and is
        // never retried.
        if (IsCancelled(call->cancel)) return std::move(done)(CancelledCall(call->op, uri));
        const bool in_budget = call->attempt < options_.retry.max_attempts &&
                               absl::Now() - call->first_attempt < options_.retry.max_total;
        if (retry && in_budget) {
          retries_.Count(RetryCause(response));
          if (!response.ok()) {
            retries_.WarnSlowRetry(absl::StrCat(call->op, " ", uri), failure, absl::Now() - sent,
                                   StallTimeout(), call->attempt + 1, options_.retry.max_attempts);
          }
          // Before `call` is moved below; a throttling server's Retry-After is waited out.
          const absl::Duration delay =
              RetryDelay(response, Backoff(call->attempt),
                         options_.retry.max_total - (absl::Now() - call->first_attempt));
          const CancelToken cancel = call->cancel;
          AfterDelayOrCancel(delay, cancel,
                             [this, call = std::move(call), done = std::move(done)]() mutable {
                               Attempt(std::move(call), std::move(done));
                             });
          return;
        }
        if (!response.ok()) failure = Annotate(failure, absl::StrCat(call->op, " ", uri));
        if (retry) {
          failure = Annotate(failure, absl::StrCat("gave up after ", call->attempt, " attempts"));
        }
        std::move(done)(failure);
      });
}

void S3Store::ListAsync(ListOptions options, std::string continuation, Callback<ListPage> done) {
  auto call = std::make_shared<Call>();
  call->op = "list";
  call->subject = options.prefix;
  call->query = {{"list-type", "2"}, {"encoding-type", "url"}};
  call->query.emplace_back(
      "max-keys", absl::StrCat(std::clamp(options.page_size, 1, capabilities().max_page_size)));
  if (!options.prefix.empty()) call->query.emplace_back("prefix", options.prefix);
  if (!options.delimiter.empty()) call->query.emplace_back("delimiter", options.delimiter);
  if (!continuation.empty()) {
    call->query.emplace_back("continuation-token", continuation);
  } else if (!options.start_after.empty()) {
    call->query.emplace_back("start-after", options.start_after);
  }
  const std::string uri = Uri(options.prefix);
  Execute(std::move(call), [options = std::move(options), uri, asked = std::move(continuation),
                            done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
    if (!r.ok()) return std::move(done)(r.status());
    pugi::xml_document doc;
    // parse_ws_pcdata: a key or continuation token may be whitespace only (" ").
    if (!doc.load_buffer(r->body.data(), r->body.size(),
                         pugi::parse_default | pugi::parse_ws_pcdata)) {
      return std::move(done)(
          absl::DataLossError(absl::StrCat("list ", uri, ": unparseable ListObjectsV2 reply")));
    }
    pugi::xml_node root = doc.child("ListBucketResult");
    if (!root) {  // XML, but not a listing (a proxy's page): never an empty last page
      return std::move(done)(absl::DataLossError(absl::StrCat(
          "list ", uri, ": the reply is not a ListObjectsV2 listing (no ListBucketResult in ",
          r->body.size(), " bytes: ", Snippet(r->body, 80), ")")));
    }
    const bool url_encoded = std::string_view(root.child_value("EncodingType")) == "url";
    auto decode = [&](const char* s) { return url_encoded ? UrlDecode(s) : std::string(s); };
    const std::string& end = options.end_before;
    bool past_end = false;
    ListPage page;
    for (pugi::xml_node c : root.children("Contents")) {
      ObjectMeta meta;
      meta.key = decode(c.child_value("Key"));
      if (!end.empty() && meta.key >= end) {
        past_end = true;
        continue;
      }
      if (!absl::SimpleAtoi(c.child_value("Size"), &meta.size)) meta.size = 0;
      meta.etag = Unquote(c.child_value("ETag"));
      meta.mtime = ParseIsoDate(c.child_value("LastModified"));
      page.objects.push_back(std::move(meta));
    }
    for (pugi::xml_node p : root.children("CommonPrefixes")) {
      std::string prefix = decode(p.child_value("Prefix"));
      if (!end.empty() && prefix >= end) {
        past_end = true;
        continue;
      }
      page.common_prefixes.push_back(std::move(prefix));
    }
    if (std::string_view(root.child_value("IsTruncated")) == "true" && !past_end) {
      page.continuation = root.child_value("NextContinuationToken");
      if (page.continuation.empty()) {  // more to come, and no way to ask for it
        return std::move(done)(absl::DataLossError(absl::StrCat(
            "list ", uri, ": a truncated listing page without a NextContinuationToken")));
      }
      if (page.continuation == asked) {  // the same page again, for ever
        return std::move(done)(absl::DataLossError(
            absl::StrCat("list ", uri, ": the server repeated its continuation token")));
      }
    }
    std::move(done)(std::move(page));
  });
}

void S3Store::HeadAsync(std::string key, Callback<ObjectMeta> done) {
  if (absl::Status s = RequireObjectKey("head", Uri(key), key); !s.ok()) {
    return std::move(done)(std::move(s));
  }
  auto call = std::make_shared<Call>();
  call->op = "head";
  call->method = "HEAD";
  call->key = key;
  Execute(std::move(call),
          [key = std::move(key), done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
            if (!r.ok()) return std::move(done)(r.status());
            ObjectMeta meta;
            meta.key = std::move(key);
            // No (or a malformed) Content-Length: the size is unknown (0).
            if (!absl::SimpleAtoi(Header(*r, "content-length"), &meta.size)) meta.size = 0;
            meta.etag = Unquote(Header(*r, "etag"));
            meta.etag_opaque = EtagIsOpaque(*r);
            meta.mtime = ParseHttpDate(Header(*r, "last-modified"));
            std::move(done)(std::move(meta));
          });
}

namespace {

// Progress of one GET across attempts: how many bytes already reached the destination, so
// an interrupted transfer resumes where it stopped.
struct GetState {
  GetRequest request;
  std::string uri;
  uint64_t begin = 0;           // first byte wanted (known once the range is resolved)
  uint64_t delivered = 0;       // bytes delivered to the destination by earlier attempts
  std::optional<uint64_t> end;  // one past the last byte wanted, once known
  std::string etag;             // of the version being read, once known
  // Set by on_headers or the body: the response cannot be delivered (the buffer is too small,
  // or the range cannot be cut from a whole object); the call fails with it, not retried.
  std::optional<absl::Status> refused;
  // This attempt: bytes of the response body delivered.
  uint64_t attempt_bytes = 0;
  // Active when the server answered a ranged request with 200 and the whole object (HTTP
  // lets a server ignore Range; some S3-compatible servers and proxies do): the attempt
  // delivers the range of it, and cannot be resumed.
  RangeCut cut;
};

}  // namespace

void S3Store::GetAsync(GetRequest request, Callback<GetResult> done) {
  const std::string uri = Uri(request.key);
  if ((request.sink == nullptr) == (request.buffer.data() == nullptr)) {
    std::move(done)(absl::InvalidArgumentError(
        absl::StrCat("get ", uri, ": set exactly one of buffer and sink")));
    return;
  }
  if (absl::Status s = RequireObjectKey("get", uri, request.key); !s.ok()) {
    return std::move(done)(std::move(s));
  }
  if (request.range.length.has_value() && *request.range.length == 0) {
    // A zero-length range has no HTTP form ("bytes=5-4" is not one); the local store says the same.
    return std::move(done)(absl::OutOfRangeError(absl::StrCat("get ", uri, ": empty range")));
  }
  auto state = std::make_shared<GetState>();
  state->request = std::move(request);
  state->uri = uri;
  auto call = std::make_shared<Call>();
  call->op = "get";
  call->key = state->request.key;
  call->cancel = state->request.cancel;
  call->accept_not_modified = !state->request.if_none_match.empty();
  auto set_headers = [state](Call& c) {
    c.headers.clear();
    const GetRequest& req = state->request;
    if (state->delivered > 0) {
      // Resume: the rest of the range, of the same version.
      const uint64_t from = state->begin + state->delivered;
      c.headers.emplace_back("range", state->end
                                          ? absl::StrCat("bytes=", from, "-", *state->end - 1)
                                          : absl::StrCat("bytes=", from, "-"));
      c.headers.emplace_back("if-match", absl::StrCat("\"", state->etag, "\""));
    } else {
      if (!req.range.is_all()) c.headers.emplace_back("range", "bytes=" + req.range.ToHttp());
      if (!req.if_match.empty()) {
        c.headers.emplace_back("if-match", absl::StrCat("\"", req.if_match, "\""));
      }
      // Only on the first request: a resumed one continues a 2xx, so the ETag differed.
      if (!req.if_none_match.empty()) {
        c.headers.emplace_back("if-none-match", absl::StrCat("\"", req.if_none_match, "\""));
      }
    }
  };
  set_headers(*call);
  call->make_response_body = [state]() -> ResponseBody {
    return ResponseBody::Stream([state](std::string_view chunk) -> absl::Status {
      if (state->refused) return *state->refused;
      const GetRequest& req = state->request;
      // A sink's own cancel (or another thread's) stops the stream before the next chunk.
      if (IsCancelled(req.cancel)) return absl::CancelledError("cancelled");
      const absl::string_view bytes =
          state->cut.Take(absl::string_view(chunk.data(), chunk.size()));
      if (bytes.empty()) return absl::OkStatus();
      // Bytes of this attempt land after those of earlier attempts.
      absl::Status delivered =
          DeliverGetBytes(req, state->delivered + state->attempt_bytes, bytes, state->uri);
      if (absl::IsOutOfRange(delivered) && req.sink == nullptr) state->refused = delivered;
      if (!delivered.ok()) return delivered;
      state->attempt_bytes += bytes.size();
      return absl::OkStatus();
    });
  };
  call->on_headers = [state](const HttpResponse& r) {
    state->attempt_bytes = 0;
    state->cut = {};
    if (r.status / 100 != 2) return;
    const GetRequest& req = state->request;
    if (r.status == 200 && (state->delivered > 0 || !req.range.is_all())) {
      // The whole object for a ranged request: the server ignored Range (and on a resumed
      // attempt maybe If-Match too, so the version is checked here).
      const std::string etag = Unquote(Header(r, "etag"));
      if (state->delivered > 0 && !etag.empty() && etag != state->etag) {
        state->refused = absl::FailedPreconditionError(
            absl::StrCat("get ", state->uri, ": the object changed from ETag ", state->etag, " to ",
                         etag, " while it was read"));
        return;
      }
      uint64_t size = 0;
      std::optional<uint64_t> sized;
      if (absl::SimpleAtoi(Header(r, "content-length"), &size)) sized = size;
      absl::StatusOr<RangeCut> cut = CutFromWholeObject(req.range, sized, state->begin,
                                                        state->delivered, state->end, state->uri);
      if (!cut.ok()) {
        state->refused = cut.status();
        return;
      }
      state->cut = *cut;
    }
    if (state->delivered > 0) return;
    // The first response fixes the version and the extent that a resumed attempt continues.
    state->etag = Unquote(Header(r, "etag"));
    uint64_t first = 0, last = 0, total = 0, length = 0;
    if (state->cut.active) {
      state->begin = state->cut.skip;
      state->end = state->cut.end();
    } else if (ParseContentRange(Header(r, "content-range"), &first, &last, &total)) {
      state->begin = first;
      state->end = last + 1;
    } else if (absl::SimpleAtoi(Header(r, "content-length"), &length)) {
      state->begin = 0;
      state->end = length;
    }
    // A buffer that cannot hold the body fails before any byte is read.
    if (req.sink == nullptr && state->end && *state->end - state->begin > req.buffer.size()) {
      state->refused = absl::OutOfRangeError(
          absl::StrCat("get ", state->uri, ": the response body of ", *state->end - state->begin,
                       " bytes does not fit the ", req.buffer.size(), "-byte buffer"));
    }
  };
  std::weak_ptr<Call> weak_call = call;
  call->on_transport_failure = [state, weak_call, set_headers](const absl::Status&) {
    if (state->refused) return false;
    // This attempt's bytes, counted once: an attempt that fails before its headers (a refused
    // connection) delivered nothing, and must not count the previous attempt's again.
    const uint64_t got = std::exchange(state->attempt_bytes, 0);
    if (got == 0) return true;  // nothing delivered: the attempt starts over
    if (state->cut.active || state->etag.empty()) {
      // Cannot resume (a server that ignores ranges, or no version to pin): a buffer is
      // filled again from the start; bytes a sink already took cannot be retracted.
      return state->request.sink == nullptr;
    }
    state->delivered += got;
    if (auto c = weak_call.lock()) set_headers(*c);
    return true;
  };
  // The ETag and extent are learned from the first response's headers.
  Execute(call,
          [this, call, state, uri, done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
            const int attempts = call->attempt;
            call.reset();  // breaks the cycle through call->on_* closures holding `state`
            if (state->refused) return std::move(done)(*state->refused);
            if (!r.ok()) {
              if (state->delivered > 0) return std::move(done)(r.status());
              return SuffixOfEmptyObject(*this, state->request, r.status(), std::move(done));
            }
            GetResult result;
            result.meta.key = state->request.key;
            result.meta.etag = Unquote(Header(*r, "etag"));
            result.meta.etag_opaque = EtagIsOpaque(*r);
            result.meta.mtime = ParseHttpDate(Header(*r, "last-modified"));
            result.time_to_first_byte = r->time_to_first_byte;
            result.attempts = attempts;
            result.request_id = Header(*r, "x-amz-request-id");
            if (r->status == 304) {  // If-None-Match matched: nothing delivered
              result.not_modified = true;
              if (result.meta.etag.empty()) result.meta.etag = state->request.if_none_match;
              // A 304 may carry the Content-Length a 200 would have; servers that leave it out
              // leave the size unknown (0).
              if (!absl::SimpleAtoi(Header(*r, "content-length"), &result.meta.size)) {
                result.meta.size = 0;
              }
              return std::move(done)(std::move(result));
            }
            const std::string content_range = Header(*r, "content-range");
            uint64_t length = r->body_bytes;
            if (!content_range.empty()) {
              uint64_t first = 0, last = 0, total = 0;
              if (!ParseContentRange(content_range, &first, &last, &total)) {
                return std::move(done)(absl::DataLossError(
                    absl::StrCat("get ", uri, ": malformed Content-Range '", content_range, "'")));
              }
              result.meta.size = total;
              result.offset = first;
              length = last - first + 1;
            } else if (!absl::SimpleAtoi(Header(*r, "content-length"), &result.meta.size)) {
              result.meta.size = r->body_bytes;  // a whole object sent without a Content-Length
            }
            if (state->delivered > 0 || state->cut.active) result.offset = state->begin;
            result.bytes = state->delivered + state->attempt_bytes;
            if (r->body_bytes != length) {
              return std::move(done)(absl::DataLossError(absl::StrCat(
                  "get ", uri, ": received ", r->body_bytes, " bytes, expected ", length)));
            }
            std::move(done)(std::move(result));
          });
}

void S3Store::PutAsync(std::string key, absl::Cord data, Callback<ObjectMeta> done) {
  PutAsync(std::move(key), std::move(data), PutOptions{}, std::move(done));
}

void S3Store::PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                       Callback<ObjectMeta> done) {
  if (absl::Status valid = ValidatePutOptions(options); !valid.ok()) {
    return std::move(done)(Annotate(valid, absl::StrCat("put ", Uri(key))));
  }
  if (absl::Status s = RequireObjectKey("put", Uri(key), key); !s.ok()) {
    return std::move(done)(std::move(s));
  }
  auto call = std::make_shared<Call>();
  call->op = "put";
  call->method = "PUT";
  call->key = key;
  auto [md5_hex, md5_b64] = Md5HexAndBase64(data);
  call->headers = PutOptionHeaders(options);
  call->headers.emplace_back("content-md5", md5_b64);
  // Create-only goes on PutObject (and CompleteMultipartUpload), not on the headers that
  // CreateMultipartUpload shares.
  const bool if_absent = options.if_absent;
  if (if_absent) call->headers.emplace_back("if-none-match", "*");
  const uint64_t size = data.size();
  call->body = std::move(data);
  const std::string uri = Uri(key);
  Execute(call, [this, call, if_absent, key = std::move(key), md5_hex = std::move(md5_hex), size,
                 uri, done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
    if (!r.ok() && if_absent && r.status().code() == absl::StatusCode::kFailedPrecondition) {
      // A retried create-only put finds the key taken: by its own earlier attempt (whose
      // reply was lost) when the object is what this put sent.
      if (call->attempt > 1) {
        HeadAsync(key, [key, md5_hex, size, uri, status = r.status(),
                        done = std::move(done)](absl::StatusOr<ObjectMeta> head) mutable {
          if (head.ok() && head->etag == md5_hex && head->size == size) {
            return std::move(done)(*std::move(head));
          }
          std::move(done)(AlreadyExists(uri));
        });
        return;
      }
      return std::move(done)(AlreadyExists(uri));
    }
    if (!r.ok()) return std::move(done)(r.status());
    ObjectMeta meta;
    meta.key = std::move(key);
    meta.size = size;
    meta.etag = Unquote(Header(*r, "etag"));
    meta.mtime = absl::Now();
    if (meta.etag != md5_hex && !EtagIsOpaque(*r)) {
      return std::move(done)(
          absl::DataLossError(absl::StrCat("put ", uri, ": server ETag ", meta.etag,
                                           " is not the MD5 ", md5_hex, " of what was sent")));
    }
    std::move(done)(std::move(meta));
  });
}

void S3Store::DeleteAsync(std::string key, StatusCallback done) {
  if (absl::Status s = RequireObjectKey("delete", Uri(key), key); !s.ok()) {
    return std::move(done)(std::move(s));
  }
  auto call = std::make_shared<Call>();
  call->op = "delete";
  call->method = "DELETE";
  call->key = std::move(key);
  Execute(std::move(call), [done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
    // Deleting a missing key succeeds on S3 (204); some servers answer 404: the same here.
    if (!r.ok() && r.status().code() == absl::StatusCode::kNotFound &&
        !absl::StrContains(r.status().message(), "NoSuchBucket")) {
      return std::move(done)(absl::OkStatus());
    }
    std::move(done)(r.status());
  });
}

struct S3Store::DeleteBatch {
  absl::Time first_attempt;
  int attempt = 0;
  int failures = 0;  // keys that failed for good so far
  absl::Status first;
  absl::AnyInvocable<void(absl::Status, int)> done;
};

void S3Store::DeleteManyAsync(std::vector<std::string> keys, StatusCallback done) {
  constexpr size_t kBatch = 1000;  // S3's limit per DeleteObjects call
  if (keys.empty()) return std::move(done)(absl::OkStatus());
  struct Shared {
    absl::Mutex mu;
    int pending;
    int failed = 0;
    size_t total;
    absl::Status first;
    StatusCallback done;
  };
  // XML 1.0 cannot carry most control characters, and a parser turns "\r" into "\n": such
  // keys are deleted one by one (DeleteObject takes the key in the URI), not in a batch that
  // the server would refuse as a whole.
  std::vector<std::string> alone;
  const auto batchable = std::stable_partition(keys.begin(), keys.end(), [](const std::string& k) {
    return std::none_of(k.begin(), k.end(), [](char c) {
      return static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n';
    });
  });
  std::move(batchable, keys.end(), std::back_inserter(alone));
  keys.erase(batchable, keys.end());
  auto shared = std::make_shared<Shared>();
  shared->pending = static_cast<int>((keys.size() + kBatch - 1) / kBatch + alone.size());
  shared->total = keys.size() + alone.size();
  shared->done = std::move(done);
  auto finish_one = [shared](absl::Status s, int failures) {
    bool last;
    {
      absl::MutexLock lock(&shared->mu);
      if (!s.ok()) {
        if (shared->first.ok()) shared->first = s;
        shared->failed += std::max(1, failures);
      }
      last = --shared->pending == 0;
    }
    if (!last) return;
    absl::Status result = shared->first;
    if (shared->failed > 1) {
      result = Annotate(
          result, absl::StrCat(shared->failed, " of ", shared->total, " deletions failed; first"));
    }
    std::move(shared->done)(result);
  };
  for (size_t i = 0; i < keys.size(); i += kBatch) {
    auto batch = std::make_shared<DeleteBatch>();
    batch->first_attempt = absl::Now();
    batch->done = finish_one;
    const size_t end = std::min(keys.size(), i + kBatch);
    DeleteBatchAsync(std::move(batch),
                     std::vector<std::string>(std::make_move_iterator(keys.begin() + i),
                                              std::make_move_iterator(keys.begin() + end)));
  }
  for (std::string& key : alone) {
    DeleteAsync(std::move(key), [finish_one](absl::Status s) mutable { finish_one(s, 0); });
  }
}

void S3Store::DeleteBatchAsync(std::shared_ptr<DeleteBatch> batch, std::vector<std::string> keys) {
  ++batch->attempt;
  pugi::xml_document doc;
  pugi::xml_node del = doc.append_child("Delete");
  del.append_attribute("xmlns") = std::string(kXmlNs).c_str();
  del.append_child("Quiet").text() = "true";
  for (const std::string& key : keys) {
    del.append_child("Object").append_child("Key").text() = key.c_str();
  }
  std::ostringstream xml;
  doc.save(xml, "", pugi::format_raw);
  auto call = std::make_shared<Call>();
  call->op = "delete";
  call->method = "POST";
  call->query = {{"delete", ""}};
  call->body = absl::Cord(xml.str());
  call->sign_payload = true;
  call->headers = {{"content-md5", Md5HexAndBase64(call->body).second},
                   {"content-type", "application/xml"}};
  const size_t n = keys.size();
  Execute(std::move(call), [this, batch = std::move(batch), n,
                            first_key = keys.front()](absl::StatusOr<HttpResponse> r) mutable {
    if (!r.ok()) {
      // The whole request failed: say which one (the error names only the bucket).
      absl::Status s = Annotate(
          r.status(), absl::StrCat("a batch of ", n, " keys from ", Uri(first_key), " on"));
      if (batch->first.ok()) batch->first = std::move(s);
      return std::move(batch->done)(batch->first, batch->failures);
    }
    pugi::xml_document reply;
    reply.load_buffer(r->body.data(), r->body.size());
    std::vector<std::string> again;
    absl::Status last_retryable;
    absl::string_view cause;  // the retry meter's, of the last retryable key
    for (pugi::xml_node e : reply.child("DeleteResult").children("Error")) {
      const absl::string_view code = e.child_value("Code");
      if (code == "NoSuchKey") continue;
      absl::Status s = absl::UnknownError(absl::StrCat("delete ", Uri(e.child_value("Key")), ": ",
                                                       code, ": ", e.child_value("Message")));
      if (IsRetryableCode(code)) {
        again.emplace_back(e.child_value("Key"));
        last_retryable = std::move(s);
        cause = RetryCauseOfCode(code);
        continue;
      }
      if (batch->failures++ == 0) batch->first = std::move(s);
    }
    if (again.empty()) return std::move(batch->done)(batch->first, batch->failures);
    const absl::Duration spent = absl::Now() - batch->first_attempt;
    if (batch->attempt < options_.retry.max_attempts && spent < options_.retry.max_total) {
      retries_.Count(cause);
      const absl::Duration delay =
          std::min(Backoff(batch->attempt), options_.retry.max_total - spent);
      AfterDelayOrCancel(delay, CancelToken(),
                         [this, batch = std::move(batch), again = std::move(again)]() mutable {
                           DeleteBatchAsync(std::move(batch), std::move(again));
                         });
      return;
    }
    if (batch->failures == 0) {
      batch->first =
          Annotate(last_retryable, absl::StrCat("gave up after ", batch->attempt, " attempts"));
    }
    batch->failures += static_cast<int>(again.size());
    std::move(batch->done)(batch->first, batch->failures);
  });
}

void S3Store::CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) {
  std::string src_uri = Uri(src_key);
  CopyObjectAsync(bucket_, std::move(src_uri), std::move(src_key), std::move(dst_key),
                  std::move(done));
}

bool S3Store::CanCopyFrom(const ObjectStore& src) const {
  const auto* other = dynamic_cast<const S3Store*>(&src);
  if (other == nullptr) return false;
  if (other == this) return true;
  const S3ClientConfig &a = config_, &b = other->config_;
  return options_.scheme == other->options_.scheme && !bucket_.empty() && !other->bucket_.empty() &&
         !a.anonymous && !b.anonymous && a.endpoint == b.endpoint && a.region == b.region &&
         a.path_style == b.path_style && a.ca_bundle == b.ca_bundle && a.profile == b.profile &&
         a.credentials_source == b.credentials_source &&
         a.credentials.access_key_id == b.credentials.access_key_id;
}

void S3Store::CopyFromAsync(const ObjectStore& src, std::string src_key, std::string dst_key,
                            Callback<ObjectMeta> done) {
  if (!CanCopyFrom(src)) {
    return ObjectStore::CopyFromAsync(src, std::move(src_key), std::move(dst_key), std::move(done));
  }
  const auto& other = static_cast<const S3Store&>(src);
  CopyObjectAsync(other.bucket_, other.Uri(src_key), std::move(src_key), std::move(dst_key),
                  std::move(done));
}

void S3Store::CopyObjectAsync(const std::string& src_bucket, std::string src_uri,
                              std::string src_key, std::string dst_key, Callback<ObjectMeta> done) {
  if (absl::Status s = RequireObjectKey("copy", src_uri, src_key); !s.ok()) {
    return std::move(done)(std::move(s));
  }
  if (absl::Status s = RequireObjectKey("copy", Uri(dst_key), dst_key); !s.ok()) {
    return std::move(done)(std::move(s));
  }
  auto call = std::make_shared<Call>();
  call->op = absl::StrCat("copy ", src_uri, " to");
  call->method = "PUT";
  call->key = dst_key;
  call->headers = {
      {"x-amz-copy-source", UriEncode(absl::StrCat("/", src_bucket, "/", src_key), false)}};
  Execute(std::move(call), [this, dst_key = std::move(dst_key), src_uri,
                            done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
    if (!r.ok()) return std::move(done)(r.status());
    // CopyObject can fail after answering 200: the error is then in the body.
    pugi::xml_document doc;
    doc.load_buffer(r->body.data(), r->body.size());
    if (doc.child("Error")) {
      HttpResponse as_error = *r;
      as_error.status = 500;
      return std::move(done)(ErrorFromResponse(as_error, "copy", src_uri, config_));
    }
    // The reply has no size: ask for it (asynchronously: never block a transport thread).
    std::string etag = Unquote(doc.child("CopyObjectResult").child_value("ETag"));
    HeadAsync(dst_key, [etag = std::move(etag),
                        done = std::move(done)](absl::StatusOr<ObjectMeta> head) mutable {
      if (head.ok() && !etag.empty()) head->etag = std::move(etag);
      std::move(done)(std::move(head));
    });
  });
}

absl::StatusOr<std::vector<BucketInfo>> S3Store::ListBuckets() {
  if (!bucket_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("list buckets of ", config_.endpoint,
                                                      ": this store is opened on bucket ", bucket_,
                                                      "; open one with an empty bucket name"));
  }
  std::vector<BucketInfo> buckets;
  std::string continuation;  // AWS pages with max-buckets; others answer in one reply
  do {
    auto call = std::make_shared<Call>();
    call->op = "list buckets";
    if (!continuation.empty()) call->query = {{"continuation-token", continuation}};
    auto r = WaitFor<HttpResponse>(
        [&](Callback<HttpResponse> cb) { Execute(std::move(call), std::move(cb)); });
    if (!r.ok()) return r.status();
    pugi::xml_document doc;
    if (!doc.load_buffer(r->body.data(), r->body.size())) {
      return absl::DataLossError(
          absl::StrCat("list buckets ", Uri(""), ": unparseable ListAllMyBuckets reply"));
    }
    pugi::xml_node root = doc.child("ListAllMyBucketsResult");
    for (pugi::xml_node b : root.child("Buckets").children("Bucket")) {
      buckets.push_back({b.child_value("Name"), ParseIsoDate(b.child_value("CreationDate"))});
    }
    const std::string next = root.child_value("ContinuationToken");
    if (next == continuation) break;  // never loop on a server that repeats itself
    continuation = next;
  } while (!continuation.empty());
  return buckets;
}

absl::StatusOr<std::vector<PendingUpload>> S3Store::ListUploads(const std::string& prefix) {
  const std::string what = absl::StrCat("list uploads ", Uri(prefix));
  std::vector<PendingUpload> uploads;
  std::string key_marker, upload_id_marker;
  while (true) {
    auto call = std::make_shared<Call>();
    call->op = "list uploads";
    call->query = {{"uploads", ""}, {"prefix", prefix}, {"encoding-type", "url"}};
    if (!key_marker.empty()) {
      call->query.emplace_back("key-marker", key_marker);
      call->query.emplace_back("upload-id-marker", upload_id_marker);
    }
    auto r = WaitFor<HttpResponse>(
        [&](Callback<HttpResponse> cb) { Execute(std::move(call), std::move(cb)); });
    if (!r.ok()) return r.status();
    pugi::xml_document doc;
    if (!doc.load_buffer(r->body.data(), r->body.size(),
                         pugi::parse_default | pugi::parse_ws_pcdata)) {
      return absl::DataLossError(absl::StrCat(what, ": unparseable ListMultipartUploads reply"));
    }
    pugi::xml_node root = doc.child("ListMultipartUploadsResult");
    const bool url_encoded = std::string_view(root.child_value("EncodingType")) == "url";
    auto decode = [&](const char* s) { return url_encoded ? UrlDecode(s) : std::string(s); };
    for (pugi::xml_node upload : root.children("Upload")) {
      PendingUpload u;
      u.key = decode(upload.child_value("Key"));
      u.upload_id = upload.child_value("UploadId");
      u.initiated = ParseIsoDate(upload.child_value("Initiated"));
      if (!u.upload_id.empty() && absl::StartsWith(u.key, prefix)) uploads.push_back(std::move(u));
    }
    if (std::string_view(root.child_value("IsTruncated")) != "true") break;
    std::string next_key = decode(root.child_value("NextKeyMarker"));
    std::string next_id = root.child_value("NextUploadIdMarker");
    if (next_key.empty() || (next_key == key_marker && next_id == upload_id_marker)) break;
    key_marker = std::move(next_key);
    upload_id_marker = std::move(next_id);
  }
  return uploads;
}

absl::Status S3Store::AbortUpload(const std::string& key, const std::string& upload_id) {
  auto call = std::make_shared<Call>();
  call->op = "abort upload";
  call->method = "DELETE";
  call->key = key;
  call->query = {{"uploadId", upload_id}};
  auto r = WaitFor<HttpResponse>(
      [&](Callback<HttpResponse> cb) { Execute(std::move(call), std::move(cb)); });
  if (!r.ok() && r.status().code() == absl::StatusCode::kNotFound) return absl::OkStatus();
  return r.status();
}

absl::Status S3Store::CreateBucket() {
  auto call = std::make_shared<Call>();
  call->op = "create bucket";
  call->method = "PUT";
  if (config_.region != "us-east-1") {
    call->body = absl::Cord(absl::StrCat("<CreateBucketConfiguration xmlns=\"", kXmlNs,
                                         "\"><LocationConstraint>", config_.region,
                                         "</LocationConstraint></CreateBucketConfiguration>"));
    call->sign_payload = true;
  }
  auto r = WaitFor<HttpResponse>(
      [&](Callback<HttpResponse> cb) { Execute(std::move(call), std::move(cb)); });
  return r.status();
}

absl::Status S3Store::DeleteBucket() {
  auto call = std::make_shared<Call>();
  call->op = "delete bucket";
  call->method = "DELETE";
  auto r = WaitFor<HttpResponse>(
      [&](Callback<HttpResponse> cb) { Execute(std::move(call), std::move(cb)); });
  return r.status();
}

// ---- Multipart writer ----

namespace {

// Margins around the window in which this writer's creates reached the server, when an
// upload's Initiated time (server clock) is matched against it (our clock): beyond the
// offset measured from the listing's Date header, which has whole seconds and is stamped a
// network hop before it is read; and without a Date header to measure from.
constexpr absl::Duration kSkewMargin = absl::Seconds(5);
constexpr absl::Duration kUnmeasuredSkewMargin = absl::Minutes(2);

// The ETag S3 gives a completed multipart upload: the MD5 of the parts' binary MD5s, then
// "-" and the part count.
std::string MultipartEtag(const std::map<int, std::string>& part_md5_hex) {
  Md5 md5;
  for (const auto& [number, hex] : part_md5_hex) md5.Update(absl::HexStringToBytes(hex));
  return absl::StrCat(HexLower(md5.Finish()), "-", part_md5_hex.size());
}

}  // namespace

// Uploads one object as a multipart upload once it outgrows a part (else one PutObject).
//
// Nothing is left behind on failure: every failing path (a part, the create, the complete, a
// Write or Close after an error, Abort, destruction) aborts the upload. A create that needed
// more than one attempt, or failed, may have started uploads whose ids never arrived (the
// server created one, then the connection dropped): those are found by listing the key's
// uploads and aborted, right after such a create (keeping the one in use) and again on
// failure if that listing did not succeed.
class S3Writer : public ObjectWriter {
 public:
  S3Writer(S3Store* store, std::string key, PutOptions options)
      : store_(store), key_(std::move(key)), options_(std::move(options)) {}
  ~S3Writer() override { Abort(); }

  absl::Status Write(absl::Cord data) override {
    if (!failure_.ok()) return failure_;
    if (closed_) return absl::FailedPreconditionError(absl::StrCat("write ", Uri(), ": closed"));
    bytes_ += data.size();
    buffer_.Append(std::move(data));
    while (buffer_.size() >= PartSize(next_part_)) {
      const uint64_t n = PartSize(next_part_);
      if (absl::Status s = UploadPart(buffer_.Subcord(0, n)); !s.ok()) return Fail(s);
      buffer_.RemovePrefix(n);
    }
    if (absl::Status s = FirstError(); !s.ok()) return Fail(s);
    return absl::OkStatus();
  }

  absl::StatusOr<ObjectMeta> Close() override {
    if (!failure_.ok()) return failure_;
    if (closed_) return absl::FailedPreconditionError(absl::StrCat("close ", Uri(), ": closed"));
    closed_ = true;
    if (upload_id_.empty()) {  // smaller than one part: a single PUT
      const uint64_t size = buffer_.size();
      auto meta = store_->Put(key_, std::move(buffer_), options_);
      if (meta.ok()) meta->size = size;
      return meta;
    }
    if (!buffer_.empty()) {
      if (absl::Status s = UploadPart(std::move(buffer_)); !s.ok()) return Fail(s);
    }
    WaitForParts();
    if (absl::Status s = FirstError(); !s.ok()) return Fail(s);
    auto meta = Complete();
    if (!meta.ok()) return Fail(meta.status());
    completed_ = true;
    interrupt_.Reset();
    // Our upload is complete, so no longer listed: whatever the key still has from our
    // creates is an orphan.
    if (sweep_pending_) {
      ScopedAmbientCancel cleanup(nullptr);
      (void)AbortOrphans(/*keep=*/"");
    }
    return meta;
  }

  void Abort() override {
    if (aborted_ || completed_) return;
    aborted_ = closed_ = true;
    // Cleanup: not cancelled with the operation it ends (base/cancel.h).
    ScopedAmbientCancel cleanup(nullptr);
    WaitForParts();
    if (!upload_id_.empty()) {
      auto call = std::make_shared<S3Store::Call>();
      call->op = "abort upload";
      call->method = "DELETE";
      call->key = key_;
      call->query = {{"uploadId", upload_id_}};
      auto r = WaitFor<HttpResponse>(
          [&](Callback<HttpResponse> cb) { store_->Execute(std::move(call), std::move(cb)); });
      // NoSuchUpload: gone already. Otherwise the listing below finds it and tries again.
      if (!r.ok() && r.status().code() != absl::StatusCode::kNotFound) sweep_pending_ = true;
    }
    interrupt_.Reset();
    if (sweep_pending_) (void)AbortOrphans(/*keep=*/"");
  }

 private:
  std::string Uri() const { return store_->Uri(key_); }

  // Part n's size: the base size, doubled every 1,000 parts, so 10,000 parts cover
  // base * (2^10 - 1) * 1,000 bytes (8 TiB at 8 MiB) while small objects use small parts.
  uint64_t PartSize(int part) const {
    const int doublings = std::min(10, std::max(0, part - 1) / 1000);
    return std::min(store_->options_.part_size << doublings, uint64_t{5} << 30);
  }

  absl::Status FirstError() {
    absl::MutexLock lock(&mu_);
    return error_;
  }

  // The writer failed: every later call returns `s`, and the upload is aborted now.
  absl::Status Fail(absl::Status s) {
    failure_ = s;
    Abort();
    return s;
  }

  // A create-only upload: whether the key already holds an object (AlreadyExists), asked
  // before the upload starts (to fail before sending its parts) and again just before the
  // commit. The commit's If-None-Match decides where the server honours it on a multipart
  // completion; Ceph RGW before Squid ignores it there, and these checks are then what
  // refuses a key taken before the commit (one taken between the check and the commit is
  // still overwritten).
  // A HEAD that fails (credentials that may write but not read, which AWS answers 403 also
  // for a missing key) tells nothing: the commit's condition decides alone.
  absl::Status CheckAbsent() {
    if (!options_.if_absent) return absl::OkStatus();
    if (store_->Head(key_).ok()) return AlreadyExists(Uri());
    return absl::OkStatus();
  }

  absl::Status Start() {
    if (absl::Status s = CheckAbsent(); !s.ok()) return s;
    auto call = std::make_shared<S3Store::Call>();
    call->op = "start upload";
    call->method = "POST";
    call->key = key_;
    call->query = {{"uploads", ""}};
    call->headers = PutOptionHeaders(options_);
    // Never resent by libcurl unseen (a second upload nobody completes or aborts): a create
    // sent twice is then one this writer knows of, and sweeps (sweep_pending_).
    call->fresh_connection = true;
    first_create_ = absl::Now();
    // Registered before the create goes out: an interrupted CLI run aborts the upload on its
    // way out (base/interrupt.h), also one whose create the server has started and not yet
    // answered.
    auto created = std::make_shared<CreateReply>();
    interrupt_ = InterruptCleanup([store = store_, key = key_, created, since = first_create_] {
      AbortOnInterrupt(*store, key, *created, since);
    });
    auto r = WaitFor<HttpResponse>(
        [&](Callback<HttpResponse> cb) { store_->Execute(call, std::move(cb)); });
    create_done_ = absl::Now();
    // Only a create that was answered on its first attempt is known to have started exactly
    // the upload its reply names.
    if (!r.ok() || call->attempt > 1) sweep_pending_ = true;
    if (r.ok()) {
      pugi::xml_document doc;
      doc.load_buffer(r->body.data(), r->body.size());
      upload_id_ = doc.child("InitiateMultipartUploadResult").child_value("UploadId");
    }
    {
      absl::MutexLock lock(&created->mu);
      created->answered = true;
      created->upload_id = upload_id_;
    }
    if (!r.ok()) return r.status();
    if (upload_id_.empty()) {
      sweep_pending_ = true;
      return absl::DataLossError(absl::StrCat("start upload ", Uri(), ": no UploadId in reply"));
    }
    if (sweep_pending_) (void)AbortOrphans(/*keep=*/upload_id_);
    return absl::OkStatus();
  }

  // What the interrupt cleanup knows of the create: set once its reply (or failure) is in.
  struct CreateReply {
    absl::Mutex mu;
    bool answered ABSL_GUARDED_BY(mu) = false;
    std::string upload_id ABSL_GUARDED_BY(mu);
  };

  // On the signal thread: waits a little for a create in flight, then aborts the upload it
  // started; without a reply (or an id), aborts the key's uploads initiated since `since`
  // (less a margin for the server's clock), which the create may have started unseen.
  static void AbortOnInterrupt(S3Store& store, const std::string& key, CreateReply& created,
                               absl::Time since) {
    std::string id;
    {
      absl::MutexLock lock(&created.mu);
      created.mu.AwaitWithTimeout(absl::Condition(&created.answered), absl::Seconds(3));
      id = created.upload_id;
    }
    if (!id.empty()) {
      // A commit may be in flight on the writer's thread: the abort can then meet it on the
      // server (seen here as an upload left with all its parts once the process was gone).
      // So the upload is aborted until the key's listing no longer holds it (aborted, or
      // completed by that commit), within the signal handler's time for cleanups.
      const absl::Time deadline = absl::Now() + absl::Seconds(8);
      while (true) {
        const absl::Status aborted = store.AbortUpload(key, id);
        absl::StatusOr<std::vector<PendingUpload>> left = store.ListUploads(key);
        // A listing this client may not make: the abort's own answer decides.
        bool listed = !left.ok() && !aborted.ok() && !absl::IsNotFound(aborted);
        for (const PendingUpload& u : left.ok() ? *left : std::vector<PendingUpload>{}) {
          listed |= u.key == key && u.upload_id == id;
        }
        if (!listed || absl::Now() > deadline) return;
        absl::SleepFor(absl::Milliseconds(250));
      }
    }
    absl::StatusOr<std::vector<PendingUpload>> uploads = store.ListUploads(key);
    if (!uploads.ok()) return;
    for (const PendingUpload& u : *uploads) {
      if (u.key == key && u.initiated >= since - kSkewMargin) {
        (void)store.AbortUpload(key, u.upload_id);
      }
    }
  }

  // Aborts the key's in-progress uploads that this writer's creates started, except `keep`:
  // those initiated (server clock) between the first create attempt and the create's reply,
  // within the measured clock offset and kSkewMargin. S3 has no tag that tells them from
  // another client's uploads of the same key started in that same window; such an upload
  // would be aborted too, failing that client's upload rather than leaving ours behind.
  // Clears sweep_pending_ once a whole listing was processed.
  absl::Status AbortOrphans(absl::string_view keep) {
    const std::string what = absl::StrCat("aborting the leftover uploads of ", Uri());
    std::string key_marker, upload_id_marker;
    absl::Status first_error;
    while (true) {
      auto call = std::make_shared<S3Store::Call>();
      call->op = "list uploads";
      call->query = {{"uploads", ""}, {"prefix", key_}, {"encoding-type", "url"}};
      if (!key_marker.empty()) {
        call->query.emplace_back("key-marker", key_marker);
        call->query.emplace_back("upload-id-marker", upload_id_marker);
      }
      auto r = WaitFor<HttpResponse>(
          [&](Callback<HttpResponse> cb) { store_->Execute(std::move(call), std::move(cb)); });
      const absl::Time received = absl::Now();
      if (!r.ok()) return Annotate(r.status(), what);
      pugi::xml_document doc;
      if (!doc.load_buffer(r->body.data(), r->body.size(),
                           pugi::parse_default | pugi::parse_ws_pcdata)) {
        return absl::DataLossError(absl::StrCat(what, ": unparseable ListMultipartUploads reply"));
      }
      // The server's clock minus ours, measured on this reply.
      absl::Duration offset = absl::ZeroDuration(), margin = kUnmeasuredSkewMargin;
      if (const absl::Time date = ParseHttpDate(Header(*r, "date")); date != absl::InfinitePast()) {
        offset = date - received;
        margin = kSkewMargin;
      }
      const absl::Time earliest = first_create_ + offset - margin;
      const absl::Time latest = create_done_ + offset + margin;
      pugi::xml_node root = doc.child("ListMultipartUploadsResult");
      const bool url_encoded = std::string_view(root.child_value("EncodingType")) == "url";
      auto decode = [&](const char* s) { return url_encoded ? UrlDecode(s) : std::string(s); };
      for (pugi::xml_node upload : root.children("Upload")) {
        if (decode(upload.child_value("Key")) != key_) continue;  // the prefix matches more
        const std::string id = upload.child_value("UploadId");
        const absl::Time initiated = ParseIsoDate(upload.child_value("Initiated"));
        if (id.empty() || id == keep || initiated < earliest || initiated > latest) continue;
        auto abort = std::make_shared<S3Store::Call>();
        abort->op = "abort upload";
        abort->method = "DELETE";
        abort->key = key_;
        abort->query = {{"uploadId", id}};
        auto aborted = WaitFor<HttpResponse>(
            [&](Callback<HttpResponse> cb) { store_->Execute(std::move(abort), std::move(cb)); });
        if (!aborted.ok() && aborted.status().code() != absl::StatusCode::kNotFound &&
            first_error.ok()) {
          first_error = Annotate(aborted.status(), what);
        }
      }
      if (std::string_view(root.child_value("IsTruncated")) != "true") break;
      key_marker = decode(root.child_value("NextKeyMarker"));
      upload_id_marker = root.child_value("NextUploadIdMarker");
      if (key_marker.empty() || key_marker > key_) break;  // past every upload of the key
    }
    if (first_error.ok()) sweep_pending_ = false;
    return first_error;
  }

  absl::Status UploadPart(absl::Cord part) {
    if (upload_id_.empty()) WHARF_RETURN_IF_ERROR(Start());
    const int number = next_part_++;
    {
      // Back-pressure: at most `upload_concurrency` parts in memory.
      absl::MutexLock lock(&mu_);
      auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return in_flight_ < store_->options_.upload_concurrency;
      };
      AwaitInterruptibly(mu_, absl::Condition(&room));
      ++in_flight_;
    }
    auto call = std::make_shared<S3Store::Call>();
    call->op = absl::StrCat("upload part ", number, " of");
    call->method = "PUT";
    call->key = key_;
    call->query = {{"partNumber", absl::StrCat(number)}, {"uploadId", upload_id_}};
    auto [md5_hex, md5_b64] = Md5HexAndBase64(part);
    call->headers = {{"content-md5", md5_b64}};
    call->body = std::move(part);
    store_->Execute(
        std::move(call), [this, number, md5_hex = md5_hex](absl::StatusOr<HttpResponse> r) {
          absl::MutexLock lock(&mu_);
          --in_flight_;
          if (!r.ok()) {
            if (error_.ok()) error_ = r.status();
            return;
          }
          std::string etag = Unquote(Header(*r, "etag"));
          if (etag != md5_hex && !EtagIsOpaque(*r) && error_.ok()) {
            error_ = absl::DataLossError(absl::StrCat("upload part ", number, " of ", Uri(),
                                                      ": ETag ", etag, " is not the part's MD5"));
          }
          parts_[number] = std::move(etag);
        });
    return absl::OkStatus();
  }

  void WaitForParts() {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
    AwaitInterruptibly(mu_, absl::Condition(&idle));
  }

  // REQUIRES: every part uploaded (WaitForParts) without error.
  absl::StatusOr<ObjectMeta> Complete() {
    if (absl::Status s = CheckAbsent(); !s.ok()) return s;
    pugi::xml_document doc;
    pugi::xml_node root = doc.append_child("CompleteMultipartUpload");
    root.append_attribute("xmlns") = std::string(kXmlNs).c_str();
    std::string expected_etag;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [number, etag] : parts_) {
        pugi::xml_node p = root.append_child("Part");
        p.append_child("PartNumber").text() = number;
        p.append_child("ETag").text() = absl::StrCat("\"", etag, "\"").c_str();
      }
      expected_etag = MultipartEtag(parts_);
    }
    std::ostringstream xml;
    doc.save(xml, "", pugi::format_raw);
    auto call = std::make_shared<S3Store::Call>();
    call->op = "complete upload";
    call->method = "POST";
    call->key = key_;
    call->query = {{"uploadId", upload_id_}};
    call->body = absl::Cord(xml.str());
    call->sign_payload = true;
    call->headers = {{"content-type", "application/xml"}};
    if (options_.if_absent) call->headers.emplace_back("if-none-match", "*");
    auto r = WaitFor<HttpResponse>(
        [&](Callback<HttpResponse> cb) { store_->Execute(call, std::move(cb)); });
    ObjectMeta meta;
    meta.key = key_;
    meta.size = bytes_;
    meta.mtime = absl::Now();
    if (!r.ok()) {
      // A complete whose reply was lost is retried and then finds its upload gone
      // (NoSuchUpload), or the key taken (412, create-only): it succeeded if the key now
      // holds what these parts make.
      const absl::StatusCode code = r.status().code();
      if ((code == absl::StatusCode::kNotFound ||
           (options_.if_absent && code == absl::StatusCode::kFailedPrecondition)) &&
          call->attempt > 1) {
        auto head = store_->Head(key_);
        if (head.ok() && head->etag == expected_etag && head->size == bytes_) return head;
      }
      if (options_.if_absent && code == absl::StatusCode::kFailedPrecondition) {
        return AlreadyExists(Uri());
      }
      return r.status();
    }
    pugi::xml_document reply;
    reply.load_buffer(r->body.data(), r->body.size());
    if (reply.child("Error")) {  // a 200 that failed
      HttpResponse as_error = *r;
      as_error.status = 500;
      return ErrorFromResponse(as_error, "complete upload", Uri(), store_->config_);
    }
    meta.etag = Unquote(reply.child("CompleteMultipartUploadResult").child_value("ETag"));
    if (meta.etag.empty()) meta.etag = expected_etag;
    return meta;
  }

  S3Store* const store_;
  const std::string key_;
  const PutOptions options_;
  absl::Cord buffer_;
  uint64_t bytes_ = 0;  // written so far
  std::string upload_id_;
  int next_part_ = 1;
  bool closed_ = false;
  bool aborted_ = false;
  bool completed_ = false;
  absl::Status failure_;  // sticky, once a Write or Close failed
  // The window of the create's attempts on our clock (set by Start), and whether uploads
  // they may have started (or ours, if aborting it failed) still need to be listed and
  // aborted.
  absl::Time first_create_ = absl::InfiniteFuture();
  absl::Time create_done_ = absl::InfinitePast();
  bool sweep_pending_ = false;
  // Registered while our upload is open.
  InterruptCleanup interrupt_;

  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::string> parts_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<ObjectWriter>> S3Store::NewWriter(std::string key) {
  return NewWriter(std::move(key), PutOptions{});
}

absl::StatusOr<std::unique_ptr<ObjectWriter>> S3Store::NewWriter(std::string key,
                                                                 const PutOptions& options) {
  WHARF_RETURN_IF_ERROR(Annotate(ValidatePutOptions(options), absl::StrCat("put ", Uri(key))));
  WHARF_RETURN_IF_ERROR(RequireObjectKey("put", Uri(key), key));
  return std::make_unique<S3Writer>(this, std::move(key), options);
}

// ---- Opening from specs ----

absl::StatusOr<bool> NoSignRequestFromEnv() {
  const std::optional<std::string> value = GetEnv("WHARF_NO_SIGN_REQUEST");
  if (!value.has_value() || value->empty()) return false;
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(*value));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  return absl::InvalidArgumentError(absl::StrCat(
      "WHARF_NO_SIGN_REQUEST='", *value, "' is not one of 1, true, yes, on, 0, false, no, off"));
}

absl::Status ApplySpecOptions(const StoreSpec& spec, S3ClientOverrides& overrides) {
  const StoreOptions& o = spec.options;
  if (o.api) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.RootUri(), ": store option 'api' is for gs:// (", spec.scheme,
                     ":// takes endpoint, region, anonymous, profile, addressing_style)"));
  }
  if (o.endpoint) overrides.endpoint_url = *o.endpoint;
  if (o.region) overrides.region = *o.region;
  if (o.profile) overrides.profile = *o.profile;
  if (o.addressing_style && *o.addressing_style != AddressingStyle::kAuto) {
    overrides.path_style = *o.addressing_style == AddressingStyle::kPath;
  }
  if (o.anonymous) {
    overrides.anonymous = *o.anonymous;
  } else {
    auto anonymous = NoSignRequestFromEnv();
    if (!anonymous.ok()) return Annotate(anonymous.status(), spec.RootUri());
    overrides.anonymous = *anonymous;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<S3Store>> OpenS3Endpoint(const std::string& bucket,
                                                        const S3ClientOverrides& overrides,
                                                        S3StoreOptions options) {
  auto config = ResolveS3ClientConfig(overrides);
  if (!config.ok()) return Annotate(config.status(), absl::StrCat(options.scheme, "://", bucket));
  // One transport per runtime and CA bundle: connections are shared by every store.
  std::shared_ptr<HttpTransport> transport = SharedCurlTransport(config->ca_bundle);
  return S3Store::Open(bucket, *std::move(config), std::move(transport), std::move(options));
}

namespace {

absl::StatusOr<std::unique_ptr<S3Store>> OpenS3FromSpec(const StoreSpec& spec) {
  S3ClientOverrides overrides;
  WHARF_RETURN_IF_ERROR(ApplySpecOptions(spec, overrides));
  S3StoreOptions options;
  options.scheme = spec.scheme;
  return OpenS3Endpoint(spec.bucket, overrides, std::move(options));
}

}  // namespace

absl::StatusOr<std::shared_ptr<ObjectStore>> OpenS3Spec(const StoreSpec& spec) {
  auto store = OpenS3FromSpec(spec);
  if (!store.ok()) return store.status();
  return std::shared_ptr<ObjectStore>(*std::move(store));
}

absl::StatusOr<std::vector<BucketInfo>> ListS3Buckets(const StoreSpec& spec) {
  WHARF_ASSIGN_OR_RETURN(std::unique_ptr<S3Store> endpoint, OpenS3FromSpec(spec));
  return endpoint->ListBuckets();
}

}  // namespace wharf::s3
