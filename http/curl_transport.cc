#include "http/curl_transport.h"

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/fork.h"
#include "base/log.h"
#include "base/runtime.h"
#include "http/response_builder.h"

namespace wharf {
namespace {

void GlobalInitOnce() {
  static std::once_flag once;
  // Never paired with curl_global_cleanup: other transports (or other libraries in the
  // process) may still use curl, and the OS reclaims it at exit anyway.
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// Maps a curl failure to a status code and a reason without method or URL (the response
// builder adds those). Retryable failures are Unavailable.
absl::Status CurlError(CURLcode code, const char* detail) {
  absl::StatusCode status_code;
  switch (code) {
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:  // mostly a reset during the handshake
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_AGAIN:
    case CURLE_NO_CONNECTION_AVAILABLE:
      status_code = absl::StatusCode::kUnavailable;
      break;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
      status_code = absl::StatusCode::kFailedPrecondition;
      break;
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_BAD_FUNCTION_ARGUMENT:
      status_code = absl::StatusCode::kInvalidArgument;
      break;
    case CURLE_OUT_OF_MEMORY:
      status_code = absl::StatusCode::kResourceExhausted;
      break;
    case CURLE_ABORTED_BY_CALLBACK:
      status_code = absl::StatusCode::kCancelled;
      break;
    default:
      status_code = absl::StatusCode::kUnknown;
  }
  if (detail == nullptr || detail[0] == '\0') {
    return absl::Status(status_code, curl_easy_strerror(code));
  }
  // A handshake answered by something that is not TLS (a plain-HTTP server behind an https://
  // endpoint) fails the same way every time: not worth the retries of a reset handshake.
  if (code == CURLE_SSL_CONNECT_ERROR && (absl::StrContains(detail, "wrong version number") ||
                                          absl::StrContains(detail, "packet length too long") ||
                                          absl::StrContains(detail, "unknown protocol"))) {
    return absl::FailedPreconditionError(
        absl::StrCat(curl_easy_strerror(code), " (", detail,
                     "; the endpoint does not speak TLS: is it an http:// endpoint?)"));
  }
  return absl::Status(status_code, absl::StrCat(curl_easy_strerror(code), " (", detail, ")"));
}

absl::Duration Micros(curl_off_t us) { return absl::Microseconds(us); }

// One reusable exchange slot: an easy handle plus everything its callbacks touch. Owned
// and used only by the loop thread.
struct Transfer {
  CURL* easy = nullptr;
  curl_slist* header_list = nullptr;
  HttpRequest request;
  HttpCallback done;
  internal_http::ResponseBuilder builder;
  absl::Cord::CharIterator upload_position;
  uint64_t upload_remaining = 0;
  bool active = false;
  // The request's registrations on its cancel and scope tokens (0: none); forgotten at
  // completion.
  uint64_t cancel_id = 0;
  uint64_t scope_id = 0;
  std::string scratch;  // a header line being formatted for curl_slist_append
  char error_buffer[CURL_ERROR_SIZE] = {};
};

// Whether either of the request's tokens fired.
bool Fired(const HttpRequest& request) {
  return IsCancelled(request.cancel) || IsCancelled(request.scope);
}

size_t OnHeader(char* data, size_t size, size_t count, void* arg) {
  auto* transfer = static_cast<Transfer*>(arg);
  size_t length = size * count;
  return transfer->builder.OnHeaderLine(absl::string_view(data, length)) ? length : 0;
}

size_t OnWrite(char* data, size_t size, size_t count, void* arg) {
  auto* transfer = static_cast<Transfer*>(arg);
  size_t length = size * count;
  // A short count makes curl fail the transfer with CURLE_WRITE_ERROR; the builder keeps
  // the real reason.
  return transfer->builder.OnBody(absl::string_view(data, length)) ? length : 0;
}

// Streams the request Cord chunk by chunk into curl's upload buffer; the Cord is never
// flattened.
size_t OnRead(char* buffer, size_t size, size_t count, void* arg) {
  auto* transfer = static_cast<Transfer*>(arg);
  size_t capacity = size * count;
  size_t copied = 0;
  while (copied < capacity && transfer->upload_remaining > 0) {
    absl::string_view chunk = absl::Cord::ChunkRemaining(transfer->upload_position);
    size_t n = std::min(chunk.size(), capacity - copied);
    std::memcpy(buffer + copied, chunk.data(), n);
    absl::Cord::Advance(&transfer->upload_position, n);
    copied += n;
    transfer->upload_remaining -= n;
  }
  return copied;
}

// curl rewinds an upload when it resends the request, e.g. after a reused keep-alive
// connection turned out to be closed by the server. Without this, such a resend fails.
int OnSeek(void* arg, curl_off_t offset, int origin) {
  auto* transfer = static_cast<Transfer*>(arg);
  const absl::Cord& body = transfer->request.body;
  if (origin != SEEK_SET || offset < 0 || static_cast<uint64_t>(offset) > body.size()) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  transfer->upload_position = body.char_begin();
  absl::Cord::Advance(&transfer->upload_position, static_cast<size_t>(offset));
  transfer->upload_remaining = body.size() - static_cast<uint64_t>(offset);
  return CURL_SEEKFUNC_OK;
}

class CurlTransport final : public HttpTransport {
 public:
  explicit CurlTransport(CurlTransportOptions options);
  ~CurlTransport() override;
  CurlTransport(const CurlTransport&) = delete;
  CurlTransport& operator=(const CurlTransport&) = delete;

  void Send(HttpRequest request, HttpCallback done) override;
  TransportStats stats() const override;

 private:
  struct Pending {
    HttpRequest request;
    HttpCallback done;
    uint64_t cancel_id = 0;  // see Transfer::cancel_id
    uint64_t scope_id = 0;
  };

  void Loop();
  Transfer* AcquireTransfer();
  void Start(Pending pending);
  // Completes every transfer curl reports as done.
  void DrainCompletions();
  // Finishes an exchange already removed from the multi handle, recycles its slot, then
  // runs its `done`.
  void Complete(Transfer* transfer, absl::Status transport_error);
  // Fails what is in flight and queued with Cancelled until nothing is left.
  void CancelEverything();
  // Runs on a canceller's thread (a token's callback): makes the loop look for cancelled
  // requests. Must not block.
  void NoteCancel();
  // Aborts the transfers and drops the queued requests whose tokens fired.
  void AbortCancelled();
  // Fails a request that never reached the network with Cancelled("<why>").
  void FailUnsent(Pending pending, absl::string_view why);

  const CurlTransportOptions options_;
  CURLM* const multi_;
  CURLSH* const share_;

  // ---- Loop-thread state (also touched by the destructor after the join) ----
  std::vector<std::unique_ptr<Transfer>> transfers_;  // every slot ever created
  std::vector<Transfer*> free_;                       // idle slots
  int in_flight_ = 0;

  // ---- Shared with Send() ----
  mutable absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  // The loop is in (or about to enter) curl_multi_poll, so a new request needs a wakeup.
  bool polling_ ABSL_GUARDED_BY(mu_) = false;
  // A wakeup was sent since the loop last looked at the queue.
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The loop has exited; later Sends are cancelled inline.
  bool exited_ ABSL_GUARDED_BY(mu_) = false;
  // A cancel token of some request fired since the loop last looked.
  std::atomic<bool> cancel_requested_{false};

  // ---- Counters: written by the loop thread, read by stats() ----
  std::atomic<uint64_t> started_{0};
  std::atomic<uint64_t> completed_{0};
  std::atomic<uint64_t> failed_{0};
  std::atomic<uint64_t> connections_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> in_flight_now_{0};

  std::thread thread_;  // last: starts once everything above exists
};

CurlTransport::CurlTransport(CurlTransportOptions options)
    : options_(std::move(options)),
      multi_((GlobalInitOnce(), curl_multi_init())),
      share_(curl_share_init()) {
  const long max_connections = options_.max_connections;
  curl_multi_setopt(multi_, CURLMOPT_MAX_TOTAL_CONNECTIONS, max_connections);
  curl_multi_setopt(multi_, CURLMOPT_MAX_HOST_CONNECTIONS, max_connections);
  // The idle-connection cache; curl's default (4 x handles added) would close connections
  // that a burst of small requests is about to need again.
  curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS, max_connections);
  // Connections are pooled by the multi handle, but TLS session tickets live per easy
  // handle unless shared; sharing them lets any slot resume any session. Only the loop
  // thread uses the share, so it needs no lock callbacks.
  curl_share_setopt(share_, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
  thread_ = StartThread([this] { Loop(); });
}

CurlTransport::~CurlTransport() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  curl_multi_wakeup(multi_);
  thread_.join();
  for (auto& transfer : transfers_) curl_easy_cleanup(transfer->easy);
  transfers_.clear();
  curl_multi_cleanup(multi_);
  curl_share_cleanup(share_);
}

void CurlTransport::Send(HttpRequest request, HttpCallback done) {
  bool accepted = false;
  bool wake = false;
  if (request.scope == nullptr) request.scope = AmbientCancel();
  if (request.scope == request.cancel) request.scope = nullptr;
  // Registered before queueing, so a cancel at any later point reaches the loop. An already
  // fired token runs NoteCancel inline; Start() then fails the request unsent.
  const CancelToken cancel = request.cancel;
  const CancelToken scope = request.scope;
  const uint64_t cancel_id = cancel ? cancel->OnCancel([this] { NoteCancel(); }) : 0;
  const uint64_t scope_id = scope ? scope->OnCancel([this] { NoteCancel(); }) : 0;
  {
    absl::MutexLock lock(&mu_);
    if (!exited_) {
      queue_.push_back(Pending{std::move(request), std::move(done), cancel_id, scope_id});
      accepted = true;
      // One wakeup per sleep is enough however many requests arrive meanwhile.
      wake = polling_ && !woken_;
      woken_ = woken_ || wake;
    }
  }
  if (wake) curl_multi_wakeup(multi_);
  if (!accepted) {  // Send() raced the destructor (a caller bug): fail it, don't lose it
    if (cancel) cancel->Forget(cancel_id);
    if (scope) scope->Forget(scope_id);
    absl::Status status = absl::CancelledError(
        absl::StrCat("HTTP ", request.method, " ", request.url, ": transport destroyed"));
    SetDeliveredBytes(status, 0);
    std::move(done)(std::move(status));
  }
}

TransportStats CurlTransport::stats() const {
  TransportStats stats;
  stats.requests_started = started_.load(std::memory_order_relaxed);
  stats.requests_completed = completed_.load(std::memory_order_relaxed);
  stats.requests_failed = failed_.load(std::memory_order_relaxed);
  stats.connections_opened = connections_.load(std::memory_order_relaxed);
  stats.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  stats.bytes_received = bytes_received_.load(std::memory_order_relaxed);
  stats.in_flight = in_flight_now_.load(std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  stats.queued = queue_.size();
  return stats;
}

void CurlTransport::Loop() {
  std::vector<Pending> batch;
  while (true) {
    if (cancel_requested_.exchange(false, std::memory_order_acq_rel)) AbortCancelled();
    {
      absl::MutexLock lock(&mu_);
      polling_ = false;
      woken_ = false;
      if (stopping_) break;
      while (!queue_.empty() && in_flight_ < options_.max_in_flight) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
        ++in_flight_;  // counted here so the loop condition sees it; Start() keeps it
      }
    }
    for (Pending& pending : batch) Start(std::move(pending));
    batch.clear();

    int running = 0;
    curl_multi_perform(multi_, &running);
    DrainCompletions();

    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
      // More work is startable right now (a completion freed a slot, or a `done` sent a
      // follow-up request): go round without sleeping.
      if (!queue_.empty() && in_flight_ < options_.max_in_flight) continue;
      polling_ = true;
    }
    // Returns on socket activity, curl's next timer, a wakeup from Send(), a cancel token or
    // the destructor, or after a second at most.
    curl_multi_poll(multi_, nullptr, 0, 1000, nullptr);
  }
  CancelEverything();
}

void CurlTransport::NoteCancel() {
  cancel_requested_.store(true, std::memory_order_release);
  curl_multi_wakeup(multi_);
}

void CurlTransport::AbortCancelled() {
  for (const auto& owned : transfers_) {
    Transfer* transfer = owned.get();
    if (!transfer->active || !Fired(transfer->request)) continue;
    // Removing a handle mid-transfer closes its connection; nothing more is read or sent.
    curl_multi_remove_handle(multi_, transfer->easy);
    Complete(transfer, absl::CancelledError("cancelled"));
  }
  std::vector<Pending> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (Fired(it->request)) {
        dropped.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Pending& pending : dropped) FailUnsent(std::move(pending), "cancelled");
}

void CurlTransport::FailUnsent(Pending pending, absl::string_view why) {
  if (pending.request.cancel) pending.request.cancel->Forget(pending.cancel_id);
  if (pending.request.scope) pending.request.scope->Forget(pending.scope_id);
  // `done` runs with the request's scope as the ambient token (HttpRequest::scope).
  ScopedAmbientCancel ambient(std::move(pending.request.scope));
  absl::Status status = absl::CancelledError(
      absl::StrCat("HTTP ", pending.request.method, " ", pending.request.url, ": ", why));
  SetDeliveredBytes(status, 0);
  completed_.fetch_add(1, std::memory_order_relaxed);
  failed_.fetch_add(1, std::memory_order_relaxed);
  pending.request = HttpRequest();  // released before `done`, as Complete() does
  std::move(pending.done)(std::move(status));
}

Transfer* CurlTransport::AcquireTransfer() {
  if (!free_.empty()) {
    Transfer* transfer = free_.back();
    free_.pop_back();
    return transfer;
  }
  auto owned = std::make_unique<Transfer>();
  Transfer* transfer = owned.get();
  CURL* easy = curl_easy_init();
  transfer->easy = easy;
  // Options that never change between the requests a slot carries.
  curl_easy_setopt(easy, CURLOPT_PRIVATE, transfer);
  curl_easy_setopt(easy, CURLOPT_SHARE, share_);
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, transfer->error_buffer);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
  // Object keys may contain "." and ".." segments; the signer signed the path as is.
  curl_easy_setopt(easy, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
  if (options_.low_speed_limit_bytes > 0) {
    curl_easy_setopt(easy, CURLOPT_LOW_SPEED_LIMIT,
                     static_cast<long>(options_.low_speed_limit_bytes));
    curl_easy_setopt(
        easy, CURLOPT_LOW_SPEED_TIME,
        static_cast<long>(std::max<int64_t>(1, absl::ToInt64Seconds(options_.low_speed_time))));
  }
  curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, options_.verify_tls ? 1L : 0L);
  curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, options_.verify_tls ? 2L : 0L);
  if (!options_.ca_bundle.empty()) {
    curl_easy_setopt(easy, CURLOPT_CAINFO, options_.ca_bundle.c_str());
  }
  curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl_easy_setopt(easy, CURLOPT_HEADERDATA, transfer);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &OnWrite);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, transfer);
  curl_easy_setopt(easy, CURLOPT_READFUNCTION, &OnRead);
  curl_easy_setopt(easy, CURLOPT_READDATA, transfer);
  curl_easy_setopt(easy, CURLOPT_SEEKFUNCTION, &OnSeek);
  curl_easy_setopt(easy, CURLOPT_SEEKDATA, transfer);
  transfers_.push_back(std::move(owned));
  return transfer;
}

void CurlTransport::Start(Pending pending) {
  if (Fired(pending.request)) {  // fired while queued: never sent
    --in_flight_;
    FailUnsent(std::move(pending), "cancelled");
    return;
  }
  Transfer* transfer = AcquireTransfer();
  transfer->active = true;
  transfer->request = std::move(pending.request);
  transfer->done = std::move(pending.done);
  transfer->cancel_id = pending.cancel_id;
  transfer->scope_id = pending.scope_id;
  transfer->builder.Start(&transfer->request);
  transfer->error_buffer[0] = '\0';
  started_.fetch_add(1, std::memory_order_relaxed);
  in_flight_now_.fetch_add(1, std::memory_order_relaxed);

  const HttpRequest& request = transfer->request;
  CURL* easy = transfer->easy;
  curl_easy_setopt(easy, CURLOPT_URL, request.url.c_str());

  // Every per-request option is set on every request (no curl_easy_reset: it would undo
  // the fixed options above). HTTPGET clears what the slot's previous request set.
  const std::string& method = request.method;
  const bool upload =
      !request.body.empty() || !(method == "GET" || method == "HEAD" || method == "DELETE");
  curl_easy_setopt(easy, CURLOPT_HTTPGET, 1L);
  curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, static_cast<const char*>(nullptr));
  if (method == "HEAD") {
    curl_easy_setopt(easy, CURLOPT_NOBODY, 1L);
  } else if (upload) {
    // UPLOAD streams the body from OnRead with Content-Length; CUSTOMREQUEST turns the PUT
    // into POST (or anything else) without curl's form-encoding behaviour.
    curl_easy_setopt(easy, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(easy, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
    if (method != "PUT") curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, method.c_str());
  } else if (method != "GET") {
    curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  transfer->upload_position = request.body.char_begin();
  transfer->upload_remaining = request.body.size();

  curl_slist* list = nullptr;
  for (const auto& [name, value] : request.headers) {
    // "Name;" is curl's spelling of a header with an empty value ("Name:" would remove it).
    transfer->scratch.assign(name);
    if (value.empty()) {
      transfer->scratch.push_back(';');
    } else {
      absl::StrAppend(&transfer->scratch, ": ", value);
    }
    list = curl_slist_append(list, transfer->scratch.c_str());
  }
  // Suppress "Expect: 100-continue": it costs a round trip per upload, and S3 answers
  // errors just as well after the body.
  if (upload) list = curl_slist_append(list, "Expect:");
  transfer->header_list = list;
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, list);

  absl::Duration timeout =
      request.timeout > absl::ZeroDuration() ? request.timeout : options_.default_timeout;
  long timeout_ms = 0;
  if (timeout > absl::ZeroDuration()) {
    timeout_ms = static_cast<long>(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
  }
  curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(easy, CURLOPT_FRESH_CONNECT, request.fresh_connection ? 1L : 0L);

  CURLMcode added = curl_multi_add_handle(multi_, easy);
  if (added != CURLM_OK) {
    Complete(transfer, absl::InternalError(
                           absl::StrCat("curl_multi_add_handle: ", curl_multi_strerror(added))));
  }
}

void CurlTransport::DrainCompletions() {
  int left = 0;
  while (CURLMsg* message = curl_multi_info_read(multi_, &left)) {
    if (message->msg != CURLMSG_DONE) continue;
    CURL* easy = message->easy_handle;
    CURLcode code = message->data.result;  // `message` dies with the removal below
    char* slot = nullptr;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, &slot);
    auto* transfer = reinterpret_cast<Transfer*>(slot);
    curl_multi_remove_handle(multi_, easy);
    Complete(transfer,
             code == CURLE_OK ? absl::OkStatus() : CurlError(code, transfer->error_buffer));
  }
}

void CurlTransport::Complete(Transfer* transfer, absl::Status transport_error) {
  CURL* easy = transfer->easy;
  long status_code = 0;
  long connects = 0;
  curl_off_t first_byte_us = 0;
  curl_off_t total_us = 0;
  curl_off_t uploaded = 0;
  curl_off_t downloaded = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status_code);
  curl_easy_getinfo(easy, CURLINFO_NUM_CONNECTS, &connects);
  curl_easy_getinfo(easy, CURLINFO_STARTTRANSFER_TIME_T, &first_byte_us);
  curl_easy_getinfo(easy, CURLINFO_TOTAL_TIME_T, &total_us);
  curl_easy_getinfo(easy, CURLINFO_SIZE_UPLOAD_T, &uploaded);
  curl_easy_getinfo(easy, CURLINFO_SIZE_DOWNLOAD_T, &downloaded);

  absl::StatusOr<HttpResponse> result =
      transfer->builder.Finish(std::move(transport_error), static_cast<int>(status_code),
                               Micros(first_byte_us), Micros(total_us));
  HttpCallback done = std::move(transfer->done);

  // Recycle the slot before running `done`, so the request's Cord and callback are released
  // first and a follow-up Send() from `done` finds the capacity free.
  if (transfer->request.cancel) transfer->request.cancel->Forget(transfer->cancel_id);
  if (transfer->request.scope) transfer->request.scope->Forget(transfer->scope_id);
  transfer->cancel_id = 0;
  transfer->scope_id = 0;
  // `done` runs with the request's scope as the ambient token (HttpRequest::scope).
  ScopedAmbientCancel ambient(std::move(transfer->request.scope));
  curl_slist_free_all(transfer->header_list);
  transfer->header_list = nullptr;
  transfer->request = HttpRequest();
  transfer->upload_position = absl::Cord::CharIterator();
  transfer->active = false;
  free_.push_back(transfer);
  --in_flight_;

  connections_.fetch_add(static_cast<uint64_t>(std::max(0L, connects)), std::memory_order_relaxed);
  bytes_sent_.fetch_add(static_cast<uint64_t>(std::max<curl_off_t>(0, uploaded)),
                        std::memory_order_relaxed);
  bytes_received_.fetch_add(static_cast<uint64_t>(std::max<curl_off_t>(0, downloaded)),
                            std::memory_order_relaxed);
  if (!result.ok()) failed_.fetch_add(1, std::memory_order_relaxed);
  in_flight_now_.fetch_sub(1, std::memory_order_relaxed);
  completed_.fetch_add(1, std::memory_order_relaxed);

  std::move(done)(std::move(result));
}

void CurlTransport::CancelEverything() {
  while (true) {
    for (const auto& owned : transfers_) {
      Transfer* transfer = owned.get();
      if (!transfer->active) continue;
      curl_multi_remove_handle(multi_, transfer->easy);
      Complete(transfer, absl::CancelledError("transport destroyed"));
    }
    std::deque<Pending> queued;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) {
        exited_ = true;
        return;
      }
      queued.swap(queue_);
    }
    // Queued requests never started: fail them without touching curl.
    for (Pending& pending : queued) FailUnsent(std::move(pending), "transport destroyed");
  }
}

}  // namespace

std::unique_ptr<HttpTransport> NewCurlTransport(CurlTransportOptions options) {
  options.max_connections = std::max(1, options.max_connections);
  options.max_in_flight = std::max(1, options.max_in_flight);
  return std::make_unique<CurlTransport>(std::move(options));
}

absl::Duration StallTimeout() {
  static const absl::Duration timeout = [] {
    const absl::Duration fallback = CurlTransportOptions().low_speed_time;
    const char* v = std::getenv("WHARF_STALL_TIMEOUT");
    if (v == nullptr || *v == '\0') return fallback;
    int seconds = 0;
    if (!absl::SimpleAtoi(v, &seconds) || seconds < 1) {
      LogLine(LogLevel::kWarning, absl::StrCat("WHARF_STALL_TIMEOUT='", v,
                                               "' is not a whole number of seconds >= 1; using ",
                                               absl::FormatDuration(fallback)));
      return fallback;
    }
    return absl::Seconds(seconds);
  }();
  return timeout;
}

std::shared_ptr<HttpTransport> SharedCurlTransport(const std::string& ca_bundle) {
  return Runtime::Default()->Shared<HttpTransport>(absl::StrCat("curl:", ca_bundle), [&] {
    CurlTransportOptions options;
    options.low_speed_time = StallTimeout();
    options.ca_bundle = ca_bundle;
    return std::shared_ptr<HttpTransport>(NewCurlTransport(options));
  });
}

}  // namespace wharf
