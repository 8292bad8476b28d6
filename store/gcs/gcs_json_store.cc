#include "store/gcs/gcs_json_store.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/crc32c.h"
#include "base/hash.h"
#include "base/runtime.h"
#include "base/status.h"
#include "base/timer.h"
#include "http/bearer_signer.h"
#include "http/curl_transport.h"
#include "http/retry_after.h"
#include "nlohmann/json.hpp"
#include "store/get_body.h"
#include "store/keys.h"

namespace wharf::gcs {

using json = nlohmann::json;

// One logical JSON API request, re-authorized and re-sent on each attempt.
struct GcsJsonStore::Call {
  std::string op;   // "get", "put", "list", ... for messages
  std::string key;  // object key (messages); empty for bucket-level calls
  std::string method = "GET";
  std::string url;  // absolute, encoded; may be changed between attempts (a resumed GET)
  std::vector<std::pair<std::string, std::string>> headers;
  absl::Cord body;
  // Where a 2xx body goes; rebuilt for every attempt (a resumed GET shifts the buffer).
  absl::AnyInvocable<ResponseBody()> make_response_body;
  std::function<void(const HttpResponse&)> on_headers;
  // Called on each attempt's transport failure; return true to retry (after adjusting the
  // call, e.g. a GET's range for resuming).
  absl::AnyInvocable<bool(const absl::Status&)> on_transport_failure;
  CancelToken cancel;
  // Non-2xx statuses that are answers, not errors: 304 (ifGenerationNotMatch), 308 (a
  // resumable upload's "resume incomplete").
  std::vector<int> accept;
  // The caller retries by itself (a resumable upload's chunk must ask the session first).
  bool no_retry = false;

  int attempt = 0;
  absl::Time first_attempt = absl::InfinitePast();
  bool refreshed_credentials = false;
};

namespace {

constexpr int kMaxComposeSources = 32;
constexpr uint64_t kChunkGranule = uint64_t{256} << 10;

std::string Header(const HttpResponse& r, absl::string_view name) {
  auto v = r.header(std::string_view(name.data(), name.size()));
  return v ? std::string(*v) : std::string();
}

absl::Time ParseRfc3339(const std::string& s) {
  absl::Time t;
  std::string err;
  if (absl::ParseTime(absl::RFC3339_full, s, &t, &err)) return t;
  return absl::InfinitePast();
}

// The JSON API sends int64 fields (size, generation) as strings; some servers as numbers.
bool JsonUint(const json& j, const char* field, uint64_t* out) {
  auto it = j.find(field);
  if (it == j.end()) return false;
  if (it->is_string()) return absl::SimpleAtoi(it->get<std::string>(), out);
  if (it->is_number_unsigned() || it->is_number_integer()) {
    *out = it->get<uint64_t>();
    return true;
  }
  return false;
}

std::string JsonString(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number()) return it->dump();
  return "";
}

// An object resource -> ObjectMeta (generation as the etag).
absl::StatusOr<ObjectMeta> MetaFromResource(const json& j, absl::string_view what) {
  if (!j.is_object() || !j.contains("name")) {
    return absl::DataLossError(absl::StrCat(what, ": reply is not an object resource"));
  }
  ObjectMeta meta;
  meta.key = JsonString(j, "name");
  JsonUint(j, "size", &meta.size);
  meta.etag = JsonString(j, "generation");
  meta.mtime = ParseRfc3339(JsonString(j, "updated"));
  // md5Hash (base64; absent for composite objects): what a copy compares with a file's MD5.
  std::string raw;
  if (absl::Base64Unescape(JsonString(j, "md5Hash"), &raw) && raw.size() == 16) {
    meta.md5 = HexLower(raw);
  }
  return meta;
}

absl::StatusOr<json> ParseJsonBody(const HttpResponse& r, absl::string_view what) {
  json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::DataLossError(absl::StrCat(what, ": unparseable JSON reply (HTTP ", r.status, ", ",
                                            r.body.size(), " bytes)"));
  }
  return j;
}

absl::Status CancelledCall(absl::string_view op, absl::string_view uri) {
  return absl::CancelledError(absl::StrCat(op, " ", uri, ": cancelled"));
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

// A base64 CRC32C as GCS writes it ("AAAAAA=="), as the big-endian value it encodes.
std::optional<uint32_t> DecodeCrc32c(absl::string_view base64) {
  std::string raw;
  if (!absl::Base64Unescape(base64, &raw) || raw.size() != 4) return std::nullopt;
  return (uint32_t{static_cast<uint8_t>(raw[0])} << 24) |
         (uint32_t{static_cast<uint8_t>(raw[1])} << 16) |
         (uint32_t{static_cast<uint8_t>(raw[2])} << 8) | uint32_t{static_cast<uint8_t>(raw[3])};
}

// An object resource's "crc32c".
std::optional<uint32_t> ResourceCrc32c(const json& j) {
  const std::string crc = JsonString(j, "crc32c");
  if (crc.empty()) return std::nullopt;
  return DecodeCrc32c(crc);
}

// The crc32c of x-goog-hash ("crc32c=AAAAAA==,md5=..."; possibly one header per hash), as the
// big-endian value it encodes.
std::optional<uint32_t> GoogCrc32c(const HttpResponse& r) {
  for (const auto& [name, value] : r.headers) {
    if (name != "x-goog-hash") continue;
    for (absl::string_view part : absl::StrSplit(value, ',')) {
      part = absl::StripAsciiWhitespace(part);
      if (!absl::ConsumePrefix(&part, "crc32c=")) continue;
      return DecodeCrc32c(part);
    }
  }
  return std::nullopt;
}

bool IsGeneration(absl::string_view s) {
  uint64_t g;
  return !s.empty() && absl::SimpleAtoi(s, &g);
}

absl::string_view RetryCause(const absl::StatusOr<HttpResponse>& response) {
  if (!response.ok()) return "connection";
  if (response->status == 429 || response->status == 503) return "throttled";
  if (response->status == 408) return "timeout";
  return "server_error";
}

std::string NewBoundary() {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat("wharf_boundary_", absl::Hex(absl::ToUnixNanos(absl::Now())), "_",
                      counter.fetch_add(1));
}

// The object resource a put or writer sends: the name and the upload options GCS has a use
// for (content type, storage class; SSE fields are AWS notions and ignored).
// A create-only put (PutOptions::if_absent) that found the name taken (412).
absl::Status ObjectExists(absl::string_view uri) {
  return absl::AlreadyExistsError(
      absl::StrCat("put ", uri, ": the object already exists (exclusive create)"));
}

json UploadMetadata(absl::string_view key, const PutOptions& options) {
  json meta = {{"name", std::string(key)}};
  if (!options.content_type.empty()) meta["contentType"] = options.content_type;
  if (!options.storage_class.empty()) meta["storageClass"] = options.storage_class;
  return meta;
}

}  // namespace

std::string EncodeComponent(absl::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3 / 2);
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

bool IsRetryableJsonResponse(const HttpResponse& response) {
  return response.status == 408 || IsRetryableHttpStatus(response.status);
}

absl::Status ErrorFromJsonResponse(const HttpResponse& response, absl::string_view op,
                                   absl::string_view uri, absl::string_view credentials_source,
                                   absl::string_view endpoint) {
  std::string message, reason;
  json j = json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded() && j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object()) {
      message = JsonString(e, "message");
      if (e.contains("errors") && e["errors"].is_array() && !e["errors"].empty() &&
          e["errors"][0].is_object()) {
        reason = JsonString(e["errors"][0], "reason");
      }
    } else if (e.is_string()) {  // OAuth-style {"error": "invalid_token"}
      reason = e.get<std::string>();
    }
  } else if (!response.body.empty() && response.body.size() < 300 &&
             response.body.find('<') == std::string::npos) {
    message = std::string(absl::StripAsciiWhitespace(response.body));
  }
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string hint;
  const int s = response.status;
  if (s == 404) {
    code = absl::StatusCode::kNotFound;
    // GCS names the cause in its JSON error; a reply without one could mean either, except
    // to requests that name no object that must exist (a listing, a new object's upload).
    if (message.empty()) {
      hint = op == "list" || op == "put" || op == "start upload"
                 ? "no such bucket"
                 : "no such object, or no such bucket";
      if (!endpoint.empty()) absl::StrAppend(&hint, " at ", endpoint);
    }
  } else if (s == 401 || s == 403) {
    code = absl::StatusCode::kPermissionDenied;
    hint = absl::StrCat("check the credentials and their permissions; credentials from ",
                        credentials_source);
  } else if (s == 412) {
    code = absl::StatusCode::kFailedPrecondition;
    hint = "the object changed (generation mismatch)";
  } else if (s == 416) {
    code = absl::StatusCode::kOutOfRange;
  } else if (s == 409) {
    code = absl::StatusCode::kAlreadyExists;
  } else if (IsRetryableJsonResponse(response)) {
    code = absl::StatusCode::kUnavailable;
  } else if (s == 501 || s == 505) {
    code = absl::StatusCode::kUnimplemented;
  } else if (s == 400) {
    code = absl::StatusCode::kInvalidArgument;
  }
  std::string msg = absl::StrCat(op, " ", uri, ": HTTP ", s);
  if (!reason.empty()) absl::StrAppend(&msg, " ", reason);
  if (!message.empty()) absl::StrAppend(&msg, ": ", message);
  if (!hint.empty()) absl::StrAppend(&msg, " (", hint, ")");
  if (auto id = response.header("x-guploader-uploadid")) {
    absl::StrAppend(&msg, " [upload id ", std::string(*id), "]");
  }
  return absl::Status(code, msg);
}

const Capabilities& JsonCapabilities() {
  static const Capabilities caps = [] {
    Capabilities c;
    c.compose = true;
    c.multipart_upload = false;
    c.native_end_before = true;
    c.max_page_size = 1000;
    c.put_options = true;
    return c;
  }();
  return caps;
}

absl::StatusOr<std::unique_ptr<GcsJsonStore>> GcsJsonStore::Open(
    std::string bucket, GcsJsonConfig config, std::shared_ptr<HttpTransport> transport) {
  if (!absl::StartsWith(config.endpoint, "http://") &&
      !absl::StartsWith(config.endpoint, "https://")) {
    return absl::InvalidArgumentError(absl::StrCat("gs://", bucket, ": endpoint '", config.endpoint,
                                                   "' is not an http(s):// URL"));
  }
  while (absl::EndsWith(config.endpoint, "/")) config.endpoint.pop_back();
  if (config.chunk_size == 0 || config.chunk_size % kChunkGranule != 0) {
    return absl::InvalidArgumentError(absl::StrCat("gs://", bucket, ": resumable chunk size ",
                                                   config.chunk_size,
                                                   " is not a positive multiple of 256 KiB"));
  }
  return std::unique_ptr<GcsJsonStore>(
      new GcsJsonStore(std::move(bucket), std::move(config), std::move(transport)));
}

GcsJsonStore::GcsJsonStore(std::string bucket, GcsJsonConfig config,
                           std::shared_ptr<HttpTransport> transport)
    : bucket_(std::move(bucket)), config_(std::move(config)), transport_(std::move(transport)) {
  if (config_.credentials != nullptr) {
    runtime_ = Runtime::Default();
    std::shared_ptr<CredentialsProvider> provider = config_.credentials;
    ThreadPool* pool = &runtime_->blocking_pool();  // not inside Shared(): it holds the lock
    credentials_cache_ = runtime_->Shared<CredentialsCache>(
        absl::StrCat("gcs-credentials:", provider->Describe()), [&] {
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

GcsJsonStore::~GcsJsonStore() = default;

std::string GcsJsonStore::Uri(absl::string_view key) const {
  if (bucket_.empty()) return absl::StrCat("gs://", key);
  return absl::StrCat("gs://", bucket_, "/", key);
}

const Capabilities& GcsJsonStore::capabilities() const { return JsonCapabilities(); }

std::string GcsJsonStore::ObjectUrl(absl::string_view key) const {
  return absl::StrCat(config_.endpoint, "/storage/v1/b/", EncodeComponent(bucket_), "/o/",
                      EncodeComponent(key));
}

std::string GcsJsonStore::UploadUrl() const {
  return absl::StrCat(config_.endpoint, "/upload/storage/v1/b/", EncodeComponent(bucket_), "/o");
}

absl::Duration GcsJsonStore::Backoff(int attempt) {
  return config_.retry.Backoff(attempt, retries_.Uniform01());
}

void GcsJsonStore::Execute(std::shared_ptr<Call> call, ResponseCallback done) {
  call->first_attempt = absl::Now();
  Attempt(std::move(call), std::move(done));
}

void GcsJsonStore::Attempt(std::shared_ptr<Call> call, ResponseCallback done) {
  if (IsCancelled(call->cancel)) return std::move(done)(CancelledCall(call->op, Uri(call->key)));
  ++call->attempt;
  if (credentials_cache_ == nullptr) return SendAttempt(std::move(call), std::move(done), "");
  // Inline while the cached token is valid, else on the blocking pool once a fetch completes.
  credentials_cache_->GetAsync([this, call = std::move(call), done = std::move(done)](
                                   absl::StatusOr<Credentials> credentials) mutable {
    if (!credentials.ok()) {
      // A credential that is missing (a file, a service account, a token endpoint answering
      // 404) is not the request's object or bucket missing: callers take NotFound for that
      // (a listing says "no such bucket", a copy skips a vanished object).
      absl::Status status = credentials.status();
      if (absl::IsNotFound(status)) status = absl::UnauthenticatedError(status.message());
      std::move(done)(Annotate(status, absl::StrCat(call->op, " ", Uri(call->key))));
      return;
    }
    if (credentials->bearer_token.empty()) {
      std::move(done)(absl::UnauthenticatedError(absl::StrCat(call->op, " ", Uri(call->key), ": ",
                                                              credentials_cache_->Describe(),
                                                              " gave no access token")));
      return;
    }
    SendAttempt(std::move(call), std::move(done), credentials->bearer_token);
  });
}

void GcsJsonStore::SendAttempt(std::shared_ptr<Call> call, ResponseCallback done,
                               const std::string& token) {
  const std::string uri = Uri(call->key);
  if (IsCancelled(call->cancel)) return std::move(done)(CancelledCall(call->op, uri));
  HttpRequest request;
  request.method = call->method;
  request.url = call->url;
  request.headers = call->headers;
  request.body = call->body;
  request.cancel = call->cancel;
  if (call->make_response_body) request.response = call->make_response_body();
  if (call->on_headers) request.on_headers = call->on_headers;
  if (!token.empty()) {
    Credentials bearer;
    bearer.bearer_token = token;
    if (absl::Status s = SignBearer(bearer, config_.credentials_source, request); !s.ok()) {
      return std::move(done)(Annotate(s, absl::StrCat(call->op, " ", uri)));
    }
  }
  transport_->Send(std::move(request), [this, call = std::move(call), done = std::move(done), uri,
                                        sent = absl::Now()](
                                           absl::StatusOr<HttpResponse> response) mutable {
    absl::Status failure;
    bool retry = false;
    if (!response.ok()) {
      failure = response.status();
      retry = failure.code() == absl::StatusCode::kUnavailable;
      if (call->on_transport_failure) retry = call->on_transport_failure(failure) && retry;
    } else if (response->status / 100 != 2 && std::find(call->accept.begin(), call->accept.end(),
                                                        response->status) == call->accept.end()) {
      if (response->status == 401 && credentials_cache_ != nullptr &&
          !call->refreshed_credentials) {
        // An expired or revoked token: fetch a fresh one and retry once.
        call->refreshed_credentials = true;
        retries_.Count("credentials");
        credentials_cache_->Invalidate();
        Attempt(std::move(call), std::move(done));
        return;
      }
      failure = ErrorFromJsonResponse(*response, call->op, uri, config_.credentials_source,
                                      config_.endpoint);
      retry = IsRetryableJsonResponse(*response);
    } else {
      std::move(done)(std::move(response));
      return;
    }
    if (IsCancelled(call->cancel)) return std::move(done)(CancelledCall(call->op, uri));
    const bool in_budget = !call->no_retry && call->attempt < config_.retry.max_attempts &&
                           absl::Now() - call->first_attempt < config_.retry.max_total;
    if (retry && in_budget) {
      retries_.Count(RetryCause(response));
      if (!response.ok()) {
        retries_.WarnSlowRetry(absl::StrCat(call->op, " ", uri), failure, absl::Now() - sent,
                               StallTimeout(), call->attempt + 1, config_.retry.max_attempts);
      }
      const absl::Duration delay =  // a throttling server's Retry-After is waited out
          RetryDelay(response, Backoff(call->attempt),
                     config_.retry.max_total - (absl::Now() - call->first_attempt));
      const CancelToken cancel = call->cancel;
      AfterDelayOrCancel(delay, cancel,
                         [this, call = std::move(call), done = std::move(done)]() mutable {
                           Attempt(std::move(call), std::move(done));
                         });
      return;
    }
    if (!response.ok()) failure = Annotate(failure, absl::StrCat(call->op, " ", uri));
    if (retry && !call->no_retry) {
      failure = Annotate(failure, absl::StrCat("gave up after ", call->attempt, " attempts"));
    }
    std::move(done)(failure);
  });
}

// ---- Listing ----

void GcsJsonStore::ListAsync(ListOptions options, std::string continuation,
                             Callback<ListPage> done) {
  auto call = std::make_shared<Call>();
  call->op = "list";
  call->key = options.prefix;
  const int page_size = std::clamp(options.page_size, 1, capabilities().max_page_size);
  std::string url = absl::StrCat(config_.endpoint, "/storage/v1/b/", EncodeComponent(bucket_),
                                 "/o?maxResults=", page_size);
  if (!options.prefix.empty()) absl::StrAppend(&url, "&prefix=", EncodeComponent(options.prefix));
  if (!options.delimiter.empty()) {
    absl::StrAppend(&url, "&delimiter=", EncodeComponent(options.delimiter));
  }
  // startOffset is inclusive (the bound key itself is dropped below); endOffset exclusive.
  if (!options.start_after.empty()) {
    absl::StrAppend(&url, "&startOffset=", EncodeComponent(options.start_after));
  }
  if (!options.end_before.empty()) {
    absl::StrAppend(&url, "&endOffset=", EncodeComponent(options.end_before));
  }
  if (!continuation.empty()) absl::StrAppend(&url, "&pageToken=", EncodeComponent(continuation));
  call->url = std::move(url);
  const std::string uri = Uri(options.prefix);
  // A listing answered 404 means the bucket is missing: say so, and where it was looked for.
  const std::string missing = absl::StrCat("no such bucket ", bucket_, " at ", config_.endpoint);
  Execute(std::move(call), [options = std::move(options), uri, missing,
                            asked = std::move(continuation),
                            done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
    if (!r.ok() && r.status().code() == absl::StatusCode::kNotFound) {
      return std::move(done)(absl::NotFoundError(absl::StrCat("list ", uri, ": ", missing)));
    }
    if (!r.ok()) return std::move(done)(r.status());
    auto j = ParseJsonBody(*r, absl::StrCat("list ", uri));
    if (!j.ok()) return std::move(done)(j.status());
    const std::string& lo = options.start_after;
    const std::string& hi = options.end_before;
    // Composed reads' temporaries: shown only to a listing inside their folder.
    const bool hide_temps = !absl::StartsWith(options.prefix, kComposeTempRoot);
    bool past_end = false;
    ListPage page;
    if (auto items = j->find("items"); items != j->end() && items->is_array()) {
      for (const json& item : *items) {
        auto meta = MetaFromResource(item, absl::StrCat("list ", uri));
        if (!meta.ok()) return std::move(done)(meta.status());
        // Bounds applied here too: a server that ignores startOffset/endOffset stays correct.
        if (!lo.empty() && meta->key <= lo) continue;
        if (!hi.empty() && meta->key >= hi) {
          past_end = true;
          continue;
        }
        if (!absl::StartsWith(meta->key, options.prefix)) continue;
        if (hide_temps && absl::StartsWith(meta->key, kComposeTempRoot)) continue;
        page.objects.push_back(*std::move(meta));
      }
    }
    if (auto prefixes = j->find("prefixes"); prefixes != j->end() && prefixes->is_array()) {
      for (const json& p : *prefixes) {
        if (!p.is_string()) continue;
        std::string prefix = p.get<std::string>();
        if (hide_temps && absl::StartsWith(prefix, kComposeTempRoot)) continue;
        // A common prefix holds keys above `lo` unless it sorts below it and does not contain it.
        if (!lo.empty() && prefix <= lo && !absl::StartsWith(lo, prefix)) continue;
        if (!hi.empty() && prefix >= hi) {
          past_end = true;
          continue;
        }
        page.common_prefixes.push_back(std::move(prefix));
      }
    }
    std::sort(page.objects.begin(), page.objects.end(),
              [](const ObjectMeta& a, const ObjectMeta& b) { return a.key < b.key; });
    std::sort(page.common_prefixes.begin(), page.common_prefixes.end());
    if (!past_end) page.continuation = JsonString(*j, "nextPageToken");
    if (!page.continuation.empty() && page.continuation == asked) {  // the same page for ever
      return std::move(done)(
          absl::DataLossError(absl::StrCat("list ", uri, ": the server repeated its page token")));
    }
    std::move(done)(std::move(page));
  });
}

void GcsJsonStore::HeadAsync(std::string key, Callback<ObjectMeta> done) {
  if (absl::Status s = RequireObjectKey("head", Uri(key), key); !s.ok()) {
    return std::move(done)(std::move(s));
  }
  auto call = std::make_shared<Call>();
  call->op = "head";
  call->key = key;
  call->url = ObjectUrl(key);
  const std::string uri = Uri(key);
  Execute(std::move(call), [uri, done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
    if (!r.ok()) return std::move(done)(r.status());
    auto j = ParseJsonBody(*r, absl::StrCat("head ", uri));
    if (!j.ok()) return std::move(done)(j.status());
    std::move(done)(MetaFromResource(*j, absl::StrCat("head ", uri)));
  });
}

// ---- Reads ----

namespace {

// Progress of one GET across attempts.
struct GetState {
  GetRequest request;
  std::string uri;
  uint64_t begin = 0;           // first byte wanted (known once the range is resolved)
  uint64_t delivered = 0;       // bytes delivered to the destination by earlier attempts
  std::optional<uint64_t> end;  // one past the last byte wanted, once known
  std::string generation;       // of the version being read, once known
  // Set by on_headers: the response is for a generation the request excludes, or its range
  // cannot be served.
  std::optional<absl::Status> refused;
  bool not_modified = false;
  bool whole_object = false;  // the response is the whole object (its crc32c applies)
  std::optional<uint32_t> expected_crc;
  uint32_t crc = 0;
  // This attempt: bytes of the response body delivered.
  uint64_t attempt_bytes = 0;
  // Active when the server answered a ranged request with 200 and the whole object (HTTP lets
  // a server ignore Range; the emulator does for suffix ranges): the range of it is delivered.
  RangeCut cut;
};

}  // namespace

void GcsJsonStore::GetAsync(GetRequest request, Callback<GetResult> done) {
  const std::string uri = Uri(request.key);
  if ((request.sink == nullptr) == (request.buffer.data() == nullptr)) {
    return std::move(done)(absl::InvalidArgumentError(
        absl::StrCat("get ", uri, ": set exactly one of buffer and sink")));
  }
  // A generation is a number: an etag that is not one (another store's) matches nothing.
  if (!request.if_match.empty() && !IsGeneration(request.if_match)) {
    return std::move(done)(absl::FailedPreconditionError(
        absl::StrCat("get ", uri, ": the object is not at generation '", request.if_match, "'")));
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
  call->accept = {304};
  const std::string base_url = absl::StrCat(ObjectUrl(state->request.key), "?alt=media");
  auto set_request = [state, base_url](Call& c) {
    c.headers.clear();
    c.url = base_url;
    const GetRequest& req = state->request;
    if (state->delivered > 0) {
      // Resume: the rest of the range, of the same generation.
      const uint64_t from = state->begin + state->delivered;
      c.headers.emplace_back("range", state->end
                                          ? absl::StrCat("bytes=", from, "-", *state->end - 1)
                                          : absl::StrCat("bytes=", from, "-"));
      if (!state->generation.empty()) {
        absl::StrAppend(&c.url, "&ifGenerationMatch=", state->generation);
      }
      return;
    }
    if (!req.range.is_all()) c.headers.emplace_back("range", "bytes=" + req.range.ToHttp());
    if (!req.if_match.empty()) absl::StrAppend(&c.url, "&ifGenerationMatch=", req.if_match);
    if (!req.if_none_match.empty() && IsGeneration(req.if_none_match)) {
      absl::StrAppend(&c.url, "&ifGenerationNotMatch=", req.if_none_match);
    }
  };
  set_request(*call);
  call->make_response_body = [state]() -> ResponseBody {
    return ResponseBody::Stream([state](std::string_view chunk) -> absl::Status {
      if (state->refused) return *state->refused;
      if (state->not_modified) return absl::AbortedError("not modified");
      const GetRequest& req = state->request;
      if (IsCancelled(req.cancel)) return absl::CancelledError("cancelled");
      if (state->whole_object) state->crc = Crc32cExtend(state->crc, chunk.data(), chunk.size());
      const absl::string_view bytes =
          state->cut.Take(absl::string_view(chunk.data(), chunk.size()));
      if (bytes.empty()) return absl::OkStatus();
      // Bytes of this attempt land after those of earlier attempts.
      WHARF_RETURN_IF_ERROR(
          DeliverGetBytes(req, state->delivered + state->attempt_bytes, bytes, state->uri));
      state->attempt_bytes += bytes.size();
      return absl::OkStatus();
    });
  };
  call->on_headers = [state](const HttpResponse& r) {
    state->attempt_bytes = 0;
    state->cut = {};
    if (r.status / 100 != 2) return;
    const std::string generation = Header(r, "x-goog-generation");
    const GetRequest& req = state->request;
    uint64_t length = 0;
    std::optional<uint64_t> sized;
    if (absl::SimpleAtoi(Header(r, "content-length"), &length)) sized = length;
    if (state->delivered > 0) {
      if (!generation.empty() && generation != state->generation) {
        state->refused = absl::FailedPreconditionError(
            absl::StrCat("get ", state->uri, ": the object changed from generation ",
                         state->generation, " to ", generation, " while it was read"));
      } else if (r.status == 200) {
        // The resume's Range ignored: the whole object again, of which the rest is cut, and
        // whose CRC32C is then checked over this whole body.
        absl::StatusOr<RangeCut> cut = CutFromWholeObject(req.range, sized, state->begin,
                                                          state->delivered, state->end, state->uri);
        if (!cut.ok()) {
          state->refused = cut.status();
          return;
        }
        state->cut = *cut;
        state->crc = 0;
        state->whole_object = true;
        state->expected_crc = GoogCrc32c(r);
      }
      return;
    }
    // The server may ignore the preconditions: the generation it sends decides.
    if (!generation.empty() && !req.if_match.empty() && generation != req.if_match) {
      state->refused = absl::FailedPreconditionError(
          absl::StrCat("get ", state->uri, ": the object is at generation ", generation, ", not ",
                       req.if_match, " (the object changed)"));
      return;
    }
    if (!generation.empty() && generation == req.if_none_match) {
      state->not_modified = true;
      return;
    }
    state->generation = generation;
    uint64_t first = 0, last = 0, total = 0;
    const std::string content_range = Header(r, "content-range");
    if (!content_range.empty()) {
      if (!ParseContentRange(content_range, &first, &last, &total)) {
        // "bytes 20-10/11" or "bytes 0--1/0" (the emulator's answers to a range past the end
        // of an object, or of an empty one), or garbage.
        const size_t slash = content_range.rfind('/');
        const bool past_end =
            slash != std::string::npos &&
            absl::SimpleAtoi(absl::string_view(content_range).substr(slash + 1), &total) &&
            (total == 0 || first >= total);
        state->refused =
            past_end ? absl::OutOfRangeError(absl::StrCat("get ", state->uri, ": range ",
                                                          req.range.ToHttp(),
                                                          " starts past the end "
                                                          "of the ",
                                                          total, "-byte object"))
                     : absl::DataLossError(absl::StrCat(
                           "get ", state->uri, ": malformed Content-Range '", content_range, "'"));
        return;
      }
      state->begin = first;
      state->end = last + 1;
      state->whole_object = first == 0 && last + 1 == total;
    } else {
      state->whole_object = true;
      state->begin = 0;
      state->end = sized;
      if (!req.range.is_all()) {
        // A 200 to a ranged request: the whole object came; deliver the range of it.
        absl::StatusOr<RangeCut> cut =
            CutFromWholeObject(req.range, sized, 0, 0, std::nullopt, state->uri);
        if (!cut.ok()) {
          state->refused = cut.status();
          return;
        }
        state->cut = *cut;
        if (cut->active) {
          state->begin = cut->skip;
          state->end = cut->end();
        }
      }
    }
    if (state->whole_object) state->expected_crc = GoogCrc32c(r);
  };
  std::weak_ptr<Call> weak_call = call;
  call->on_transport_failure = [state, weak_call, set_request](const absl::Status&) {
    if (state->refused || state->not_modified) return false;
    // This attempt's bytes, counted once: an attempt that fails before its headers (a refused
    // connection) delivered nothing, and must not count the previous attempt's again.
    const uint64_t got = std::exchange(state->attempt_bytes, 0);
    if (state->cut.active || state->generation.empty()) {
      // Cannot resume safely (no generation to pin, or a server that ignores ranges): a
      // buffer is filled again from the start; bytes a sink already took cannot be retracted.
      if (got > 0 && state->request.sink != nullptr) return false;
      state->crc = 0;
      return true;
    }
    if (got > 0) {
      state->delivered += got;
      if (auto c = weak_call.lock()) set_request(*c);
    }
    return true;
  };
  Execute(call, [this, call, state, uri,
                 done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
    const int attempts = call->attempt;
    call.reset();  // breaks the cycle through call->on_* closures holding `state`
    GetResult result;
    result.meta.key = state->request.key;
    result.attempts = attempts;
    if (state->not_modified || (r.ok() && r->status == 304)) {
      result.not_modified = true;
      result.meta.etag = state->request.if_none_match;
      if (r.ok()) result.time_to_first_byte = r->time_to_first_byte;
      return std::move(done)(std::move(result));
    }
    if (state->refused) return std::move(done)(*state->refused);
    if (!r.ok()) {
      if (state->delivered > 0) return std::move(done)(r.status());
      return SuffixOfEmptyObject(*this, state->request, r.status(), std::move(done));
    }
    result.meta.etag = state->generation;
    result.time_to_first_byte = r->time_to_first_byte;
    result.request_id = Header(*r, "x-guploader-uploadid");
    uint64_t first = 0, last = 0, total = 0;
    uint64_t length = r->body_bytes;
    if (ParseContentRange(Header(*r, "content-range"), &first, &last, &total)) {
      result.meta.size = total;
      length = last - first + 1;
    } else {
      result.meta.size = r->body_bytes;  // the whole object came
    }
    result.offset = state->begin;
    result.bytes = state->delivered + state->attempt_bytes;
    if (r->body_bytes != length) {
      return std::move(done)(absl::DataLossError(
          absl::StrCat("get ", uri, ": received ", r->body_bytes, " bytes, expected ", length)));
    }
    if (state->whole_object && state->expected_crc && *state->expected_crc != state->crc) {
      return std::move(done)(absl::DataLossError(
          absl::StrCat("get ", uri, ": CRC32C of the bytes received (", absl::Hex(state->crc),
                       ") is not the object's (", absl::Hex(*state->expected_crc), ")")));
    }
    result.meta.mtime = ParseHttpDate(Header(*r, "last-modified"));
    if (!state->generation.empty()) return std::move(done)(std::move(result));
    if (!state->request.if_match.empty()) {
      // The generation the caller asked for: GCS answers any other with 412; a server that
      // ignores the precondition and names no generation cannot be checked without a call.
      result.meta.etag = state->request.if_match;
      return std::move(done)(std::move(result));
    }
    // A server that names no generation on reads (the emulator sends neither
    // x-goog-generation nor Last-Modified): a whole-object read by a caller that holds no
    // generation (a tier's fill) would give an object without a version, which the tier
    // records and then matches against nothing. The object's resource names its generation
    // and modification time; they describe the bytes read when its CRC32C is theirs.
    // Otherwise (a resource without one, the object replaced since, a range) the version
    // stays unknown, as before. Real GCS never gets here.
    if (!state->whole_object) return std::move(done)(std::move(result));
    auto head = std::make_shared<Call>();
    head->op = "head";
    head->key = state->request.key;
    head->url = ObjectUrl(state->request.key);
    head->cancel = state->request.cancel;
    Execute(std::move(head), [state, result = std::move(result),
                              done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
      if (!r.ok()) return std::move(done)(std::move(result));
      auto j = ParseJsonBody(*r, absl::StrCat("head ", state->uri));
      if (!j.ok()) return std::move(done)(std::move(result));
      auto meta = MetaFromResource(*j, absl::StrCat("head ", state->uri));
      const std::optional<uint32_t> crc = ResourceCrc32c(*j);
      if (meta.ok() && crc && *crc == state->crc && meta->size == result.meta.size) {
        result.meta.etag = meta->etag;
        if (result.meta.mtime == absl::InfinitePast()) result.meta.mtime = meta->mtime;
      }
      std::move(done)(std::move(result));
    });
  });
}

// ---- Writes ----

namespace {

// A multipart/related upload body: the resource as JSON, then the bytes.
absl::Cord MultipartBody(const json& metadata, absl::Cord data, const std::string& boundary) {
  absl::Cord body(absl::StrCat(
      "--", boundary, "\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n", metadata.dump(),
      "\r\n--", boundary, "\r\nContent-Type: application/octet-stream\r\n\r\n"));
  body.Append(std::move(data));
  body.Append(absl::StrCat("\r\n--", boundary, "--\r\n"));
  return body;
}

}  // namespace

void GcsJsonStore::PutAsync(std::string key, absl::Cord data, Callback<ObjectMeta> done) {
  PutAsync(std::move(key), std::move(data), PutOptions{}, std::move(done));
}

void GcsJsonStore::PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                            Callback<ObjectMeta> done) {
  const std::string uri = Uri(key);
  if (absl::Status valid = ValidatePutOptions(options); !valid.ok()) {
    return std::move(done)(Annotate(valid, absl::StrCat("put ", uri)));
  }
  if (absl::Status s = RequireObjectKey("put", uri, key); !s.ok()) {
    return std::move(done)(std::move(s));
  }
  Md5 md5;
  md5.Update(data);
  const auto digest = md5.Finish();
  const std::string md5_b64 =
      Base64(absl::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
  json metadata = UploadMetadata(key, options);
  // The server refuses bytes whose MD5 is not this one.
  metadata["md5Hash"] = md5_b64;
  const uint64_t size = data.size();
  const std::string boundary = NewBoundary();
  auto call = std::make_shared<Call>();
  call->op = "put";
  call->key = key;
  call->method = "POST";
  call->url = absl::StrCat(UploadUrl(), "?uploadType=multipart");
  // Create-only: generation 0 matches only an absent object.
  if (options.if_absent) absl::StrAppend(&call->url, "&ifGenerationMatch=0");
  call->headers = {{"content-type", absl::StrCat("multipart/related; boundary=", boundary)}};
  call->body = MultipartBody(metadata, std::move(data), boundary);
  Execute(std::move(call), [uri, size, md5_b64, if_absent = options.if_absent,
                            done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
    if (!r.ok() && if_absent && r.status().code() == absl::StatusCode::kFailedPrecondition) {
      return std::move(done)(ObjectExists(uri));
    }
    if (!r.ok()) return std::move(done)(r.status());
    auto j = ParseJsonBody(*r, absl::StrCat("put ", uri));
    if (!j.ok()) return std::move(done)(j.status());
    auto meta = MetaFromResource(*j, absl::StrCat("put ", uri));
    if (!meta.ok()) return std::move(done)(meta.status());
    const std::string stored_md5 = JsonString(*j, "md5Hash");
    if (!stored_md5.empty() && stored_md5 != md5_b64) {
      return std::move(done)(
          absl::DataLossError(absl::StrCat("put ", uri, ": the server stored MD5 ", stored_md5,
                                           ", not the MD5 ", md5_b64, " of what was sent")));
    }
    if (meta->size != size) {
      return std::move(done)(absl::DataLossError(
          absl::StrCat("put ", uri, ": the server stored ", meta->size, " bytes of ", size)));
    }
    std::move(done)(*std::move(meta));
  });
}

void GcsJsonStore::DeleteAsync(std::string key, StatusCallback done) {
  if (absl::Status s = RequireObjectKey("delete", Uri(key), key); !s.ok()) {
    return std::move(done)(std::move(s));
  }
  auto call = std::make_shared<Call>();
  call->op = "delete";
  call->key = key;
  call->method = "DELETE";
  call->url = ObjectUrl(key);
  Execute(std::move(call), [done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
    // Deleting a missing object succeeds (as on S3); a missing bucket does not (GCS says
    // "The specified bucket does not exist."; a missing object is "No such object: b/k").
    if (!r.ok() && r.status().code() == absl::StatusCode::kNotFound &&
        !absl::StrContains(r.status().message(), "bucket does not exist")) {
      return std::move(done)(absl::OkStatus());
    }
    std::move(done)(r.status());
  });
}

void GcsJsonStore::DeleteManyAsync(std::vector<std::string> keys, StatusCallback done) {
  if (keys.empty()) return std::move(done)(absl::OkStatus());
  struct Shared {
    absl::Mutex mu;
    size_t pending;
    size_t failed = 0;
    size_t total;
    absl::Status first;
    StatusCallback done;
  };
  auto shared = std::make_shared<Shared>();
  shared->pending = keys.size();
  shared->total = keys.size();
  shared->done = std::move(done);
  for (std::string& key : keys) {
    DeleteAsync(std::move(key), [shared](absl::Status s) {
      bool last;
      {
        absl::MutexLock lock(&shared->mu);
        if (!s.ok()) {
          if (shared->first.ok()) shared->first = s;
          ++shared->failed;
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
    });
  }
}

void GcsJsonStore::CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) {
  for (const std::string* key : {&src_key, &dst_key}) {
    if (absl::Status s = RequireObjectKey("copy", Uri(*key), *key); !s.ok()) {
      return std::move(done)(std::move(s));
    }
  }
  RewriteRound(ObjectUrl(src_key), Uri(src_key), std::move(dst_key), "", 0, std::move(done));
}

bool GcsJsonStore::CanCopyFrom(const ObjectStore& src) const {
  const auto* other = dynamic_cast<const GcsJsonStore*>(&src);
  if (other == nullptr) return false;
  if (other == this) return true;
  // Anonymous on both sides only works against an emulator, which then copies as GCS does.
  return !bucket_.empty() && !other->bucket_.empty() &&
         config_.endpoint == other->config_.endpoint &&
         config_.credentials_source == other->config_.credentials_source &&
         (config_.credentials == nullptr) == (other->config_.credentials == nullptr);
}

void GcsJsonStore::CopyFromAsync(const ObjectStore& src, std::string src_key, std::string dst_key,
                                 Callback<ObjectMeta> done) {
  if (!CanCopyFrom(src)) {
    return ObjectStore::CopyFromAsync(src, std::move(src_key), std::move(dst_key), std::move(done));
  }
  const auto& other = static_cast<const GcsJsonStore&>(src);
  if (absl::Status s = RequireObjectKey("copy", other.Uri(src_key), src_key); !s.ok()) {
    return std::move(done)(std::move(s));
  }
  if (absl::Status s = RequireObjectKey("copy", Uri(dst_key), dst_key); !s.ok()) {
    return std::move(done)(std::move(s));
  }
  RewriteRound(other.ObjectUrl(src_key), other.Uri(src_key), std::move(dst_key), "", 0,
               std::move(done));
}

void GcsJsonStore::RewriteRound(std::string src_url, std::string src_uri, std::string dst_key,
                                std::string token, int rounds, Callback<ObjectMeta> done) {
  auto call = std::make_shared<Call>();
  call->op = absl::StrCat("copy ", src_uri, " to");
  call->key = dst_key;
  call->method = "POST";
  call->url = absl::StrCat(src_url, "/rewriteTo/b/", EncodeComponent(bucket_), "/o/",
                           EncodeComponent(dst_key));
  if (!token.empty()) absl::StrAppend(&call->url, "?rewriteToken=", EncodeComponent(token));
  call->headers = {{"content-type", "application/json"}};
  call->body = absl::Cord("{}");
  const std::string what = absl::StrCat("copy ", src_uri, " to ", Uri(dst_key));
  Execute(std::move(call), [this, src_url = std::move(src_url), src_uri = std::move(src_uri),
                            dst_key = std::move(dst_key), rounds, what,
                            done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
    if (!r.ok()) return std::move(done)(r.status());
    auto j = ParseJsonBody(*r, what);
    if (!j.ok()) return std::move(done)(j.status());
    const auto done_field = j->find("done");
    const bool finished =
        done_field == j->end() || !done_field->is_boolean() || done_field->get<bool>();
    if (finished) {
      const json& resource = j->contains("resource") ? (*j)["resource"] : *j;
      return std::move(done)(MetaFromResource(resource, what));
    }
    const std::string next = JsonString(*j, "rewriteToken");
    if (next.empty() || rounds >= 10000) {
      return std::move(done)(absl::DataLossError(
          absl::StrCat(what, ": rewrite not done and no rewriteToken to continue with")));
    }
    RewriteRound(std::move(src_url), std::move(src_uri), std::move(dst_key), next, rounds + 1,
                 std::move(done));
  });
}

void GcsJsonStore::ComposeAsync(std::vector<std::string> sources, std::string dst_key,
                                Callback<ObjectMeta> done) {
  const std::string what = absl::StrCat("compose ", Uri(dst_key));
  if (sources.empty() || sources.size() > kMaxComposeSources) {
    return std::move(done)(absl::InvalidArgumentError(absl::StrCat(
        what, ": ", sources.size(), " sources (GCS composes 1 to ", kMaxComposeSources, ")")));
  }
  json body = {{"destination", {{"contentType", "application/octet-stream"}}},
               {"sourceObjects", json::array()}};
  for (const std::string& s : sources) body["sourceObjects"].push_back({{"name", s}});
  auto call = std::make_shared<Call>();
  call->op = "compose";
  call->key = dst_key;
  call->method = "POST";
  call->url = absl::StrCat(ObjectUrl(dst_key), "/compose");
  call->headers = {{"content-type", "application/json"}};
  call->body = absl::Cord(body.dump());
  Execute(std::move(call), [what, done = std::move(done)](absl::StatusOr<HttpResponse> r) mutable {
    if (!r.ok()) return std::move(done)(r.status());
    auto j = ParseJsonBody(*r, what);
    if (!j.ok()) return std::move(done)(j.status());
    std::move(done)(MetaFromResource(*j, what));
  });
}

// ---- Resumable writer ----

// Streams one object as a resumable upload: chunks of config.chunk_size bytes, each sent once
// the writer holds it (Write blocks while a chunk uploads); the final chunk carries the total
// size and makes the object visible. A chunk that fails asks the session how much it persisted
// and resumes from there. Nothing is left behind on failure: the session is cancelled (and an
// unfinished session holds no object; GCS drops it after a week).
class GcsResumableWriter : public ObjectWriter {
 public:
  GcsResumableWriter(GcsJsonStore* store, std::string key, PutOptions options)
      : store_(store), key_(std::move(key)), options_(std::move(options)) {}
  ~GcsResumableWriter() override { Abort(); }

  absl::Status Write(absl::Cord data) override {
    if (!failure_.ok()) return failure_;
    if (closed_) return absl::FailedPreconditionError(absl::StrCat("write ", Uri(), ": closed"));
    pending_.Append(std::move(data));
    const uint64_t chunk = store_->config().chunk_size;
    // A whole chunk goes as soon as it is held: the writer holds its bytes zero-copy, still
    // charged to the memory budget, and the source may need that room for its next part (a
    // chunk held back for one more byte waited forever under a budget of one part). Close
    // sends the rest with the total, or just the total ("bytes */TOTAL") when nothing is left.
    while (pending_.size() >= chunk) {
      if (absl::Status s = SendChunk(chunk, /*last=*/false); !s.ok()) return Fail(s);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<ObjectMeta> Close() override {
    if (!failure_.ok()) return failure_;
    if (closed_) return absl::FailedPreconditionError(absl::StrCat("close ", Uri(), ": closed"));
    closed_ = true;
    if (session_.empty()) {  // no more than one chunk: a single upload
      return store_->Put(key_, std::move(pending_), options_);
    }
    if (absl::Status s = SendChunk(pending_.size(), /*last=*/true); !s.ok()) {
      if (options_.if_absent && s.code() == absl::StatusCode::kFailedPrecondition) {
        s = ObjectExists(Uri());
      }
      return Fail(s);
    }
    session_.clear();
    return meta_;
  }

  void Abort() override {
    closed_ = true;
    if (session_.empty()) return;
    // DELETE cancels the session (GCS answers 499); whatever it answers, nothing was created.
    auto call = std::make_shared<GcsJsonStore::Call>();
    call->op = "abort upload";
    call->key = key_;
    call->method = "DELETE";
    call->url = session_;
    call->accept = {499};
    call->no_retry = true;  // best effort: an unfinished session creates no object anyway
    session_.clear();
    // Cleanup: not cancelled with the operation it ends (base/cancel.h).
    ScopedAmbientCancel cleanup(nullptr);
    (void)WaitFor<HttpResponse>(
        [&](Callback<HttpResponse> cb) { store_->Execute(std::move(call), std::move(cb)); });
  }

 private:
  std::string Uri() const { return store_->Uri(key_); }

  absl::Status Fail(absl::Status s) {
    failure_ = s;
    Abort();
    return s;
  }

  absl::Status StartSession() {
    json metadata = UploadMetadata(key_, options_);
    auto call = std::make_shared<GcsJsonStore::Call>();
    call->op = "start upload";
    call->key = key_;
    call->method = "POST";
    call->url =
        absl::StrCat(store_->UploadUrl(), "?uploadType=resumable&name=", EncodeComponent(key_));
    if (options_.if_absent) absl::StrAppend(&call->url, "&ifGenerationMatch=0");
    call->headers = {{"content-type", "application/json; charset=UTF-8"}};
    call->body = absl::Cord(metadata.dump());
    auto r = WaitFor<HttpResponse>(
        [&](Callback<HttpResponse> cb) { store_->Execute(std::move(call), std::move(cb)); });
    if (!r.ok()) return r.status();
    std::string location = Header(*r, "location");
    if (location.empty()) {
      return absl::DataLossError(
          absl::StrCat("start upload ", Uri(), ": the reply names no session (no Location)"));
    }
    session_ = std::move(location);
    return absl::OkStatus();
  }

  // Sends the first `n` pending bytes (all of them when `last`), resuming from the session's
  // persisted offset after a failure, until the server holds them.
  absl::Status SendChunk(uint64_t n, bool last) {
    if (session_.empty()) WHARF_RETURN_IF_ERROR(StartSession());
    const uint64_t target = offset_ + n;  // the server must hold [0, target)
    const RetryPolicy& retry = store_->config().retry;
    const absl::Time start = absl::Now();
    int attempt = 0;
    absl::Status last_failure;
    while (true) {
      ++attempt;
      const uint64_t before = offset_;
      const uint64_t len = target - offset_;
      auto call = std::make_shared<GcsJsonStore::Call>();
      call->op = "upload";
      call->key = key_;
      call->method = "PUT";
      call->url = session_;
      call->no_retry = true;
      call->accept = {308};
      const std::string total = last ? absl::StrCat(target) : "*";
      call->headers = {{"content-range",
                        len == 0 ? absl::StrCat("bytes */", total)
                                 : absl::StrCat("bytes ", offset_, "-", target - 1, "/", total)}};
      call->body = pending_.Subcord(0, len);
      auto r = WaitFor<HttpResponse>(
          [&](Callback<HttpResponse> cb) { store_->Execute(std::move(call), std::move(cb)); });
      absl::Status s = r.ok() ? Accept(*r, last) : r.status();
      if (s.ok() && (last ? completed_ : offset_ >= target)) return absl::OkStatus();
      if (s.ok() && offset_ > before) {  // the server kept part of the chunk: send the rest
        attempt = 0;
        continue;
      }
      if (s.ok()) {
        s = absl::UnavailableError(
            absl::StrCat("upload ", Uri(), ": the session made no progress at byte ", offset_));
      }
      const bool retryable = s.code() == absl::StatusCode::kUnavailable;
      if (!retryable || attempt >= retry.max_attempts || absl::Now() - start > retry.max_total) {
        return attempt > 1 ? Annotate(s, absl::StrCat("gave up after ", attempt, " attempts")) : s;
      }
      store_->retries_.Count(r.ok() ? "server_error" : "connection");
      absl::SleepFor(store_->Backoff(attempt));
      // Ask the session what it holds, then resume from there.
      if (absl::Status q = QueryOffset(last ? target : 0); !q.ok()) {
        if (q.code() != absl::StatusCode::kUnavailable) return q;
      } else if (last ? completed_ : offset_ >= target) {
        return absl::OkStatus();
      }
    }
  }

  // Applies a chunk's answer: 308 moves offset_ to the persisted end; 200/201 completes.
  absl::Status Accept(const HttpResponse& r, bool last) {
    if (r.status == 308) {
      uint64_t persisted = 0;
      const std::string range = Header(r, "range");  // "bytes=0-N"; absent: nothing persisted
      if (!range.empty()) {
        absl::string_view v = range;
        uint64_t first = 0, end = 0;
        const size_t dash = v.find('-');
        if (!absl::ConsumePrefix(&v, "bytes=") || dash == absl::string_view::npos ||
            !absl::SimpleAtoi(v.substr(0, v.find('-')), &first) ||
            !absl::SimpleAtoi(v.substr(v.find('-') + 1), &end)) {
          return absl::DataLossError(
              absl::StrCat("upload ", Uri(), ": malformed Range '", range, "' in a 308"));
        }
        persisted = end + 1;
      }
      if (persisted < offset_) {
        return absl::DataLossError(absl::StrCat("upload ", Uri(), ": the session holds ", persisted,
                                                " bytes, fewer than the ", offset_,
                                                " it confirmed before"));
      }
      pending_.RemovePrefix(std::min<uint64_t>(persisted - offset_, pending_.size()));
      offset_ = persisted;
      return absl::OkStatus();
    }
    // 200/201: the object exists.
    auto j = ParseJsonBody(r, absl::StrCat("upload ", Uri()));
    if (!j.ok()) return j.status();
    auto meta = MetaFromResource(*j, absl::StrCat("upload ", Uri()));
    if (!meta.ok()) return meta.status();
    const uint64_t total = offset_ + pending_.size();
    if (!last || meta->size != total) {
      return absl::DataLossError(absl::StrCat("upload ", Uri(),
                                              ": the server finished the object at ", meta->size,
                                              " bytes; ", total, " were written"));
    }
    offset_ = total;
    pending_.Clear();
    meta_ = *std::move(meta);
    completed_ = true;
    return absl::OkStatus();
  }

  // PUT with "bytes */TOTAL" (or */*): the session's persisted offset (or its completion).
  absl::Status QueryOffset(uint64_t total) {
    auto call = std::make_shared<GcsJsonStore::Call>();
    call->op = "query upload";
    call->key = key_;
    call->method = "PUT";
    call->url = session_;
    call->accept = {308};
    call->headers = {{"content-range", total > 0 ? absl::StrCat("bytes */", total) : "bytes */*"}};
    auto r = WaitFor<HttpResponse>(
        [&](Callback<HttpResponse> cb) { store_->Execute(std::move(call), std::move(cb)); });
    if (!r.ok()) return r.status();
    return Accept(*r, total > 0);
  }

  GcsJsonStore* const store_;
  const std::string key_;
  const PutOptions options_;
  std::string session_;  // the resumable session URI once started
  absl::Cord pending_;   // bytes from offset_ on that the server does not hold yet
  uint64_t offset_ = 0;  // bytes the server has persisted
  ObjectMeta meta_;
  bool completed_ = false;  // the final chunk was answered with the object
  bool closed_ = false;
  absl::Status failure_;
};

absl::StatusOr<std::unique_ptr<ObjectWriter>> GcsJsonStore::NewWriter(std::string key) {
  return NewWriter(std::move(key), PutOptions{});
}

absl::StatusOr<std::unique_ptr<ObjectWriter>> GcsJsonStore::NewWriter(std::string key,
                                                                      const PutOptions& options) {
  if (absl::Status valid = ValidatePutOptions(options); !valid.ok()) {
    return Annotate(valid, absl::StrCat("write ", Uri(key)));
  }
  WHARF_RETURN_IF_ERROR(RequireObjectKey("write", Uri(key), key));
  return std::unique_ptr<ObjectWriter>(new GcsResumableWriter(this, std::move(key), options));
}

// ---- Buckets ----

absl::StatusOr<std::vector<BucketInfo>> GcsJsonStore::ListBuckets() {
  if (config_.project.empty()) {
    return absl::FailedPreconditionError(
        "list buckets gs://: no project (set GOOGLE_CLOUD_PROJECT, or use a service-account "
        "key, which names its project)");
  }
  std::vector<BucketInfo> buckets;
  std::string token;
  do {
    auto call = std::make_shared<Call>();
    call->op = "list buckets";
    call->url =
        absl::StrCat(config_.endpoint, "/storage/v1/b?project=", EncodeComponent(config_.project));
    if (!token.empty()) absl::StrAppend(&call->url, "&pageToken=", EncodeComponent(token));
    auto r = WaitFor<HttpResponse>(
        [&](Callback<HttpResponse> cb) { Execute(std::move(call), std::move(cb)); });
    if (!r.ok()) return r.status();
    WHARF_ASSIGN_OR_RETURN(json j, ParseJsonBody(*r, "list buckets gs://"));
    if (auto items = j.find("items"); items != j.end() && items->is_array()) {
      for (const json& b : *items) {
        buckets.push_back({JsonString(b, "name"), ParseRfc3339(JsonString(b, "timeCreated"))});
      }
    }
    const std::string next = JsonString(j, "nextPageToken");
    if (next == token) break;
    token = next;
  } while (!token.empty());
  return buckets;
}

absl::Status GcsJsonStore::CreateBucket() {
  auto call = std::make_shared<Call>();
  call->op = "create bucket";
  call->method = "POST";
  call->url = absl::StrCat(config_.endpoint, "/storage/v1/b?project=",
                           EncodeComponent(config_.project.empty() ? "wharf" : config_.project));
  call->headers = {{"content-type", "application/json"}};
  call->body = absl::Cord(json({{"name", bucket_}}).dump());
  return WaitFor<HttpResponse>(
             [&](Callback<HttpResponse> cb) { Execute(std::move(call), std::move(cb)); })
      .status();
}

absl::Status GcsJsonStore::DeleteBucket() {
  auto call = std::make_shared<Call>();
  call->op = "delete bucket";
  call->method = "DELETE";
  call->url = absl::StrCat(config_.endpoint, "/storage/v1/b/", EncodeComponent(bucket_));
  return WaitFor<HttpResponse>(
             [&](Callback<HttpResponse> cb) { Execute(std::move(call), std::move(cb)); })
      .status();
}

}  // namespace wharf::gcs
