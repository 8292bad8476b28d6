#include "store/s3/s3_store.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "base/fork.h"
#include "base/hash.h"
#include "base/status.h"
#include "base/timer.h"
#include "http/curl_transport.h"
#include "pugixml.hpp"
#include "store/s3/sigv4.h"

namespace wharf::s3 {

// One logical S3 request, re-signed and re-sent on each attempt.
struct S3Store::Call {
  std::string op;   // "get", "put", "list", ... for messages
  std::string key;  // object key; empty for bucket-level calls
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

  int attempt = 0;
  absl::Time first_attempt = absl::InfinitePast();
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

// "Wed, 12 Oct 2009 17:50:00 GMT"
absl::Time ParseHttpDate(const std::string& s) {
  absl::Time t;
  std::string err;
  if (absl::ParseTime("%a, %d %b %Y %H:%M:%S GMT", s, &t, &err)) return t;
  return absl::InfinitePast();
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

bool IsRetryableCode(absl::string_view code) {
  return code == "SlowDown" || code == "RequestTimeout" || code == "InternalError" ||
         code == "ServiceUnavailable" || code == "Throttling" || code == "ThrottlingException" ||
         code == "RequestTimeTooSkewed";
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

// ETag of a part or single PUT as S3 computes it: the hex MD5 of the bytes.
std::pair<std::string, std::string> Md5HexAndBase64(const absl::Cord& data) {
  Md5 md5;
  md5.Update(data);
  auto digest = md5.Finish();
  std::string raw(reinterpret_cast<const char*>(digest.data()), digest.size());
  return {HexLower(raw), Base64(raw)};
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

}  // namespace

bool IsRetryableResponse(const HttpResponse& response) {
  if (response.status == 429 || response.status >= 500) return true;
  if (response.status == 400 || response.status == 403) {
    return IsRetryableCode(ParseError(response).code);
  }
  return false;
}

absl::Status ErrorFromResponse(const HttpResponse& response, absl::string_view op,
                               absl::string_view uri, const S3ClientConfig& config) {
  S3Error e = ParseError(response);
  if (e.code.empty()) {  // HEAD responses have no body
    switch (response.status) {
      case 404: e.code = uri.find('/', uri.find("://") + 3) == absl::string_view::npos ||
                         absl::EndsWith(uri, "/") ? "NoSuchBucket" : "NoSuchKey";
        break;
      case 403: e.code = "AccessDenied"; break;
      case 412: e.code = "PreconditionFailed"; break;
      case 416: e.code = "InvalidRange"; break;
      default: e.code = absl::StrCat("HTTP ", response.status);
    }
  }
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string hint;
  const std::string creds = absl::StrCat("credentials from ", config.credentials_source);
  if (e.code == "NoSuchKey" || e.code == "NoSuchUpload" || response.status == 404) {
    code = absl::StatusCode::kNotFound;
    if (e.code == "NoSuchBucket") {
      hint = absl::StrCat("check the bucket name and the endpoint ", config.endpoint);
    }
  } else if (e.code == "SignatureDoesNotMatch") {
    code = absl::StatusCode::kPermissionDenied;
    hint = absl::StrCat("check AWS_SECRET_ACCESS_KEY; ", creds);
  } else if (e.code == "InvalidAccessKeyId") {
    code = absl::StatusCode::kPermissionDenied;
    hint = absl::StrCat("check AWS_ACCESS_KEY_ID; ", creds);
  } else if (e.code == "AccessDenied" || response.status == 403) {
    code = absl::StatusCode::kPermissionDenied;
    hint = absl::StrCat("check the credentials and their permissions; ", creds);
  } else if (e.code == "PreconditionFailed" || response.status == 412) {
    code = absl::StatusCode::kFailedPrecondition;
    hint = "the object changed (ETag mismatch)";
  } else if (e.code == "InvalidRange" || response.status == 416) {
    code = absl::StatusCode::kOutOfRange;
  } else if (e.code == "BucketAlreadyOwnedByYou" || e.code == "BucketAlreadyExists") {
    code = absl::StatusCode::kAlreadyExists;
  } else if (e.code == "BucketNotEmpty") {
    code = absl::StatusCode::kFailedPrecondition;
  } else if (IsRetryableResponse(response)) {
    code = absl::StatusCode::kUnavailable;
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
  if (config_.path_style) {
    host_ = authority;
    base_path_ = absl::StrCat("/", bucket_);
  } else {
    host_ = absl::StrCat(bucket_, ".", authority);
  }
}

S3Store::~S3Store() = default;

std::string S3Store::Uri(absl::string_view key) const {
  return absl::StrCat(options_.scheme, "://", bucket_, "/", key);
}

const Capabilities& S3Store::capabilities() const {
  static const Capabilities caps = [] {
    Capabilities c;
    c.multipart_upload = true;
    c.max_page_size = 1000;
    return c;
  }();
  return caps;
}

absl::Duration S3Store::Backoff(int attempt) {
  // Full jitter: uniform in [0, min(max, initial * 2^attempt)).
  absl::Duration cap = options_.retry.initial_backoff * (1 << std::min(attempt, 20));
  cap = std::min(cap, options_.retry.max_backoff);
  absl::MutexLock lock(&rng_mu_);
  return absl::Nanoseconds(absl::Uniform<int64_t>(rng_, 0, absl::ToInt64Nanoseconds(cap) + 1));
}

void S3Store::Execute(std::shared_ptr<Call> call, ResponseCallback done) {
  call->first_attempt = absl::Now();
  Attempt(std::move(call), std::move(done));
}

void S3Store::Attempt(std::shared_ptr<Call> call, ResponseCallback done) {
  ++call->attempt;
  const std::string uri = call->key.empty() ? Uri("") : Uri(call->key);

  SigningRequest sr;
  sr.method = call->method;
  sr.host = host_;
  sr.path = call->key.empty() ? (base_path_.empty() ? "/" : base_path_)
                              : absl::StrCat(base_path_, "/", call->key);
  sr.query = call->query;
  sr.headers = call->headers;
  sr.payload_sha256 = call->sign_payload ? Sha256Hex(call->body)
                      : call->body.empty() ? std::string(kEmptyPayloadSha256)
                                           : std::string(kUnsignedPayload);

  HttpRequest request;
  request.method = call->method;
  request.body = call->body;
  if (call->make_response_body) request.response = call->make_response_body();
  if (call->on_headers) request.on_headers = call->on_headers;
  if (config_.anonymous) {
    request.url = absl::StrCat(scheme_, "://", host_, UriEncode(sr.path, false));
    std::string query = CanonicalQueryString(sr.query);
    if (!query.empty()) absl::StrAppend(&request.url, "?", query);
    request.headers = sr.headers;
  } else {
    auto signed_request = SignV4(sr, config_.credentials, config_.region, options_.service,
                                 absl::Now());
    if (!signed_request.ok()) {
      std::move(done)(Annotate(signed_request.status(), absl::StrCat(call->op, " ", uri)));
      return;
    }
    request.url = absl::StrCat(scheme_, "://", host_, signed_request->canonical_target);
    request.headers = std::move(signed_request->headers);
  }

  transport_->Send(std::move(request), [this, call = std::move(call), done = std::move(done),
                                        uri](absl::StatusOr<HttpResponse> response) mutable {
    absl::Status failure;
    bool retry = false;
    if (!response.ok()) {
      failure = response.status();
      retry = failure.code() == absl::StatusCode::kUnavailable;
      if (call->on_transport_failure) retry = call->on_transport_failure(failure) && retry;
    } else if (response->status / 100 != 2) {
      failure = ErrorFromResponse(*response, call->op, uri, config_);
      retry = IsRetryableResponse(*response);
    } else {
      std::move(done)(std::move(response));
      return;
    }
    const bool in_budget = call->attempt < options_.retry.max_attempts &&
                           absl::Now() - call->first_attempt < options_.retry.max_total;
    if (retry && in_budget) {
      const absl::Duration delay = Backoff(call->attempt);  // before `call` is moved below
      Timer::Global().After(delay, [this, call = std::move(call),
                                                     done = std::move(done)]() mutable {
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
  Execute(std::move(call), [options = std::move(options), uri,
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
    }
    std::move(done)(std::move(page));
  });
}

void S3Store::HeadAsync(std::string key, Callback<ObjectMeta> done) {
  auto call = std::make_shared<Call>();
  call->op = "head";
  call->method = "HEAD";
  call->key = key;
  Execute(std::move(call), [key = std::move(key),
                            done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
    if (!r.ok()) return std::move(done)(r.status());
    ObjectMeta meta;
    meta.key = std::move(key);
    absl::SimpleAtoi(Header(*r, "content-length"), &meta.size);
    meta.etag = Unquote(Header(*r, "etag"));
    meta.mtime = ParseHttpDate(Header(*r, "last-modified"));
    std::move(done)(std::move(meta));
  });
}

namespace {

// Progress of one GET across attempts: how many bytes already reached the destination, so
// an interrupted transfer resumes where it stopped.
struct GetState {
  GetRequest request;
  uint64_t begin = 0;            // first byte wanted (known once the range is resolved)
  uint64_t delivered = 0;        // bytes delivered so far
  std::optional<uint64_t> end;   // one past the last byte wanted, once known
  std::string etag;              // of the version being read, once known
};

}  // namespace

void S3Store::GetAsync(GetRequest request, Callback<GetResult> done) {
  const std::string uri = Uri(request.key);
  if ((request.sink == nullptr) == (request.buffer.data() == nullptr)) {
    std::move(done)(absl::InvalidArgumentError(
        absl::StrCat("get ", uri, ": set exactly one of buffer and sink")));
    return;
  }
  auto state = std::make_shared<GetState>();
  state->request = std::move(request);
  auto call = std::make_shared<Call>();
  call->op = "get";
  call->key = state->request.key;
  auto set_headers = [state](Call& c) {
    c.headers.clear();
    const GetRequest& req = state->request;
    if (state->delivered > 0) {
      // Resume: the rest of the range, of the same version.
      const uint64_t from = state->begin + state->delivered;
      c.headers.emplace_back("range", state->end ? absl::StrCat("bytes=", from, "-", *state->end - 1)
                                                 : absl::StrCat("bytes=", from, "-"));
      c.headers.emplace_back("if-match", absl::StrCat("\"", state->etag, "\""));
    } else {
      if (!req.range.is_all()) c.headers.emplace_back("range", "bytes=" + req.range.ToHttp());
      if (!req.if_match.empty()) {
        c.headers.emplace_back("if-match", absl::StrCat("\"", req.if_match, "\""));
      }
    }
  };
  set_headers(*call);
  call->make_response_body = [state]() -> ResponseBody {
    const GetRequest& req = state->request;
    if (req.sink != nullptr) {
      return ResponseBody::Stream([state](std::string_view chunk) -> absl::Status {
        return state->request.sink->Append(absl::string_view(chunk.data(), chunk.size()));
      });
    }
    return ResponseBody::Buffer(req.buffer.subspan(state->delivered));
  };
  call->on_headers = [state](const HttpResponse& r) {
    if (r.status / 100 != 2 || state->delivered > 0) return;
    // The first response fixes the version and the extent that a resumed attempt continues.
    state->etag = Unquote(Header(r, "etag"));
    uint64_t first = 0, last = 0, total = 0, length = 0;
    if (ParseContentRange(Header(r, "content-range"), &first, &last, &total)) {
      state->begin = first;
      state->end = last + 1;
    } else if (absl::SimpleAtoi(Header(r, "content-length"), &length)) {
      state->begin = 0;
      state->end = length;
    }
  };
  std::weak_ptr<Call> weak_call = call;
  call->on_transport_failure = [state, weak_call, set_headers](const absl::Status& s) {
    const uint64_t got = DeliveredBytes(s);
    // Resuming needs the version's ETag; a first attempt that delivered nothing restarts.
    if (got > 0 && !state->etag.empty()) {
      state->delivered += got;
      if (auto c = weak_call.lock()) set_headers(*c);
    } else if (got > 0) {
      return false;  // bytes reached a sink but the version is unknown: cannot resume safely
    }
    return true;
  };
  // The ETag and extent are learned from the first response's headers.
  Execute(call, [call, state, uri, done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
    const int attempts = call->attempt;
    call.reset();  // breaks the cycle through call->on_* closures holding `state`
    if (!r.ok()) return std::move(done)(r.status());
    GetResult result;
    result.meta.key = state->request.key;
    result.meta.etag = Unquote(Header(*r, "etag"));
    result.meta.mtime = ParseHttpDate(Header(*r, "last-modified"));
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
    } else {
      absl::SimpleAtoi(Header(*r, "content-length"), &result.meta.size);
    }
    result.time_to_first_byte = r->time_to_first_byte;
    result.attempts = attempts;
    if (state->delivered > 0) result.offset = state->begin;
    result.bytes = state->delivered + r->body_bytes;
    if (r->body_bytes != length) {
      return std::move(done)(absl::DataLossError(absl::StrCat(
          "get ", uri, ": received ", r->body_bytes, " bytes, expected ", length)));
    }
    std::move(done)(std::move(result));
  });
}

void S3Store::PutAsync(std::string key, absl::Cord data, Callback<ObjectMeta> done) {
  auto call = std::make_shared<Call>();
  call->op = "put";
  call->method = "PUT";
  call->key = key;
  auto [md5_hex, md5_b64] = Md5HexAndBase64(data);
  call->headers = {{"content-md5", md5_b64}};
  const uint64_t size = data.size();
  call->body = std::move(data);
  const std::string uri = Uri(key);
  Execute(std::move(call), [key = std::move(key), md5_hex = std::move(md5_hex), size, uri,
                            done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
    if (!r.ok()) return std::move(done)(r.status());
    ObjectMeta meta;
    meta.key = std::move(key);
    meta.size = size;
    meta.etag = Unquote(Header(*r, "etag"));
    meta.mtime = absl::Now();
    if (meta.etag != md5_hex) {
      return std::move(done)(absl::DataLossError(absl::StrCat(
          "put ", uri, ": server ETag ", meta.etag, " is not the MD5 ", md5_hex, " of what was sent")));
    }
    std::move(done)(std::move(meta));
  });
}

void S3Store::DeleteAsync(std::string key, StatusCallback done) {
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
  auto shared = std::make_shared<Shared>();
  shared->pending = static_cast<int>((keys.size() + kBatch - 1) / kBatch);
  shared->total = keys.size();
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
      result = Annotate(result, absl::StrCat(shared->failed, " of ", shared->total,
                                             " deletions failed; first"));
    }
    std::move(shared->done)(result);
  };
  for (size_t i = 0; i < keys.size(); i += kBatch) {
    pugi::xml_document doc;
    pugi::xml_node del = doc.append_child("Delete");
    del.append_attribute("xmlns") = std::string(kXmlNs).c_str();
    del.append_child("Quiet").text() = "true";
    for (size_t j = i; j < std::min(keys.size(), i + kBatch); ++j) {
      del.append_child("Object").append_child("Key").text() = keys[j].c_str();
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
    Execute(std::move(call), [this, finish_one](absl::StatusOr<HttpResponse> r) mutable {
      if (!r.ok()) return finish_one(r.status(), 0);
      pugi::xml_document reply;
      reply.load_buffer(r->body.data(), r->body.size());
      int failures = 0;
      absl::Status first;
      for (pugi::xml_node e : reply.child("DeleteResult").children("Error")) {
        if (std::string_view(e.child_value("Code")) == "NoSuchKey") continue;
        if (failures++ == 0) {
          first = absl::UnknownError(absl::StrCat("delete ", Uri(e.child_value("Key")), ": ",
                                                  e.child_value("Code"), ": ",
                                                  e.child_value("Message")));
        }
      }
      finish_one(first, failures);
    });
  }
}

void S3Store::CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) {
  auto call = std::make_shared<Call>();
  call->op = absl::StrCat("copy ", Uri(src_key), " to");
  call->method = "PUT";
  call->key = dst_key;
  call->headers = {{"x-amz-copy-source", UriEncode(absl::StrCat("/", bucket_, "/", src_key), false)}};
  const std::string src_uri = Uri(src_key);
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

absl::Status S3Store::CreateBucket() {
  auto call = std::make_shared<Call>();
  call->op = "create bucket";
  call->method = "PUT";
  if (config_.region != "us-east-1") {
    call->body = absl::Cord(absl::StrCat(
        "<CreateBucketConfiguration xmlns=\"", kXmlNs, "\"><LocationConstraint>", config_.region,
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

class S3Writer : public ObjectWriter {
 public:
  S3Writer(S3Store* store, std::string key) : store_(store), key_(std::move(key)) {}
  ~S3Writer() override { Abort(); }

  absl::Status Write(absl::Cord data) override {
    if (closed_) return absl::FailedPreconditionError(absl::StrCat("write ", Uri(), ": closed"));
    buffer_.Append(std::move(data));
    while (buffer_.size() >= PartSize(next_part_)) {
      WHARF_RETURN_IF_ERROR(UploadPart(buffer_.Subcord(0, PartSize(next_part_))));
      buffer_.RemovePrefix(PartSize(next_part_ - 1));
    }
    return FirstError();
  }

  absl::StatusOr<ObjectMeta> Close() override {
    if (closed_) return absl::FailedPreconditionError(absl::StrCat("close ", Uri(), ": closed"));
    closed_ = true;
    if (upload_id_.empty()) {  // smaller than one part: a single PUT
      const uint64_t size = buffer_.size();
      auto meta = store_->Put(key_, std::move(buffer_));
      if (meta.ok()) meta->size = size;
      return meta;
    }
    if (!buffer_.empty() || next_part_ == 1) {
      absl::Status s = UploadPart(std::move(buffer_));
      if (!s.ok()) return AbortWith(s);
    }
    WaitForParts();
    if (absl::Status s = FirstError(); !s.ok()) return AbortWith(s);
    return Complete();
  }

  void Abort() override {
    if (aborted_ || (closed_ && completed_)) return;
    aborted_ = closed_ = true;
    WaitForParts();
    if (upload_id_.empty()) return;
    auto call = std::make_shared<S3Store::Call>();
    call->op = "abort upload";
    call->method = "DELETE";
    call->key = key_;
    call->query = {{"uploadId", upload_id_}};
    (void)WaitFor<HttpResponse>(
        [&](Callback<HttpResponse> cb) { store_->Execute(std::move(call), std::move(cb)); });
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

  absl::StatusOr<ObjectMeta> AbortWith(absl::Status s) {
    completed_ = false;
    aborted_ = false;
    Abort();
    return s;
  }

  absl::Status Start() {
    auto call = std::make_shared<S3Store::Call>();
    call->op = "start upload";
    call->method = "POST";
    call->key = key_;
    call->query = {{"uploads", ""}};
    auto r = WaitFor<HttpResponse>(
        [&](Callback<HttpResponse> cb) { store_->Execute(std::move(call), std::move(cb)); });
    if (!r.ok()) return r.status();
    pugi::xml_document doc;
    doc.load_buffer(r->body.data(), r->body.size());
    upload_id_ = doc.child("InitiateMultipartUploadResult").child_value("UploadId");
    if (upload_id_.empty()) {
      return absl::DataLossError(absl::StrCat("start upload ", Uri(), ": no UploadId in reply"));
    }
    return absl::OkStatus();
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
      mu_.Await(absl::Condition(&room));
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
    store_->Execute(std::move(call), [this, number, md5_hex = md5_hex](
                                         absl::StatusOr<HttpResponse> r) {
      absl::MutexLock lock(&mu_);
      --in_flight_;
      if (!r.ok()) {
        if (error_.ok()) error_ = r.status();
        return;
      }
      std::string etag = Unquote(Header(*r, "etag"));
      if (etag != md5_hex && error_.ok()) {
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
    mu_.Await(absl::Condition(&idle));
  }

  absl::StatusOr<ObjectMeta> Complete() {
    pugi::xml_document doc;
    pugi::xml_node root = doc.append_child("CompleteMultipartUpload");
    root.append_attribute("xmlns") = std::string(kXmlNs).c_str();
    uint64_t size = 0;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [number, etag] : parts_) {
        pugi::xml_node p = root.append_child("Part");
        p.append_child("PartNumber").text() = number;
        p.append_child("ETag").text() = absl::StrCat("\"", etag, "\"").c_str();
      }
    }
    (void)size;
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
    auto r = WaitFor<HttpResponse>(
        [&](Callback<HttpResponse> cb) { store_->Execute(std::move(call), std::move(cb)); });
    if (!r.ok()) return AbortWith(r.status());
    pugi::xml_document reply;
    reply.load_buffer(r->body.data(), r->body.size());
    if (reply.child("Error")) {  // a 200 that failed
      HttpResponse as_error = *r;
      as_error.status = 500;
      return AbortWith(ErrorFromResponse(as_error, "complete upload", Uri(), store_->config_));
    }
    completed_ = true;
    auto head = store_->Head(key_);
    if (!head.ok()) return head.status();
    return head;
  }

  S3Store* const store_;
  const std::string key_;
  absl::Cord buffer_;
  std::string upload_id_;
  int next_part_ = 1;
  bool closed_ = false;
  bool aborted_ = false;
  bool completed_ = false;

  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::string> parts_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<ObjectWriter>> S3Store::NewWriter(std::string key) {
  return std::make_unique<S3Writer>(this, std::move(key));
}

// ---- Opening from URIs ----

absl::StatusOr<std::shared_ptr<ObjectStore>> OpenS3Uri(absl::string_view scheme,
                                                       const std::string& bucket) {
  S3ClientOverrides overrides;
  S3StoreOptions options;
  options.scheme = std::string(scheme);
  if (scheme == "gs") {
    // GCS's XML API speaks SigV4 with HMAC keys.
    overrides.endpoint_url = GetEnv("WHARF_GS_ENDPOINT").value_or("https://storage.googleapis.com");
    overrides.region = "auto";
    overrides.path_style = true;
    if (auto id = GetEnv("WHARF_GS_ACCESS_KEY_ID")) overrides.access_key_id = *id;
    if (auto secret = GetEnv("WHARF_GS_SECRET_ACCESS_KEY")) overrides.secret_access_key = *secret;
    if (!overrides.access_key_id) {
      return absl::UnauthenticatedError(
          absl::StrCat("gs://", bucket, ": no GCS HMAC key found (set WHARF_GS_ACCESS_KEY_ID "
                       "and WHARF_GS_SECRET_ACCESS_KEY)"));
    }
  }
  auto config = ResolveS3ClientConfig(overrides);
  if (!config.ok()) return Annotate(config.status(), absl::StrCat(scheme, "://", bucket));
  // One transport per process and CA bundle: connections are shared by every store. A forked
  // child gets its own (the parent's event-loop thread does not exist there; base/fork.h).
  static absl::Mutex mu(absl::kConstInit);
  static auto* transports =
      new std::map<std::pair<uint64_t, std::string>, std::shared_ptr<HttpTransport>>;
  std::shared_ptr<HttpTransport> transport;
  {
    absl::MutexLock lock(&mu);
    auto& t = (*transports)[{ForkGeneration(), config->ca_bundle}];
    if (!t) {
      CurlTransportOptions topts;
      topts.ca_bundle = config->ca_bundle;
      t = std::shared_ptr<HttpTransport>(NewCurlTransport(topts));
    }
    transport = t;
  }
  auto store = S3Store::Open(bucket, *std::move(config), std::move(transport), options);
  if (!store.ok()) return store.status();
  return std::shared_ptr<ObjectStore>(*std::move(store));
}

}  // namespace wharf::s3
