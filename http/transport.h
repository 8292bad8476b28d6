// HttpTransport: the one interface through which wharf speaks HTTP (convention 4). The
// curl transport (http/curl_transport.h) drives real sockets; CannedTransport
// (http/canned_transport.h) answers from a handler so error paths of the layers above can be
// unit-tested. Both deliver bodies and report failures identically.
//
// The layer is deliberately thin: it moves bytes and says whether the exchange completed.
// It does not retry, sign, follow redirects or interpret HTTP status codes; a 404 or a 503
// is a successful exchange (an OK StatusOr holding HttpResponse::status), and the layer
// above decides what it means.
//
// Thread-safety: Send() may be called concurrently from any thread, including from inside
// a `done` callback. Callbacks (`done`, ResponseBody streaming callbacks) run on a
// transport thread and must not block: hand long work to another executor.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/cancel.h"

namespace wharf {

// Where the body of a successful (2xx) response goes. Bodies of other responses are always
// captured into HttpResponse::body (up to kMaxErrorBodyBytes), since they carry the
// server's explanation (the S3 error XML), whatever destination the request chose.
class ResponseBody {
 public:
  // Receives the body piece by piece, in order, on the transport thread. Must not block.
  // Returning an error aborts the transfer; the request then fails with that status.
  using Callback = absl::AnyInvocable<absl::Status(std::string_view)>;

  // The default: into HttpResponse::body.
  ResponseBody() = default;
  // Into `buffer`: the bytes land at buffer[0..n) and HttpResponse::body stays empty. A body
  // longer than the buffer fails the request with OutOfRange (never a silent truncation).
  // REQUIRES: the buffer stays valid until `done` runs.
  static ResponseBody Buffer(absl::Span<char> buffer) { return ResponseBody(buffer); }
  // Streamed into `callback`; HttpResponse::body stays empty.
  static ResponseBody Stream(Callback callback) { return ResponseBody(std::move(callback)); }

  bool is_string() const { return std::holds_alternative<std::monostate>(dest_); }
  // nullptr unless this destination is of that kind.
  const absl::Span<char>* buffer() const { return std::get_if<absl::Span<char>>(&dest_); }
  Callback* callback() { return std::get_if<Callback>(&dest_); }

 private:
  explicit ResponseBody(absl::Span<char> buffer) : dest_(buffer) {}
  explicit ResponseBody(Callback callback) : dest_(std::move(callback)) {}

  std::variant<std::monostate, absl::Span<char>, Callback> dest_;
};

// Non-2xx bodies beyond this many bytes are dropped (HttpResponse::body_bytes still counts
// them).
inline constexpr size_t kMaxErrorBodyBytes = size_t{1} << 20;

struct HttpResponse;

// One request. Move-only (the streaming callback is).
struct HttpRequest {
  std::string method = "GET";
  // Absolute http:// or https:// URL, already percent-encoded; the path is sent as is
  // (no "." / ".." segment squashing: object keys may contain them).
  std::string url;
  // Sent in order. Host, Content-Length and Expect are managed by the transport: do not set
  // them unless overriding Host deliberately.
  std::vector<std::pair<std::string, std::string>> headers;
  // Uploaded as-is (streamed chunk by chunk from the Cord, no flattening) with
  // Content-Length set. Requests other than GET, HEAD and DELETE always send a body, even an
  // empty one (Content-Length: 0), which S3's POST calls need.
  absl::Cord body;
  ResponseBody response;
  // Optional: called once on the transport thread when the final response's status line and
  // headers are in, before any body byte (with HttpResponse::status and ::headers set). A
  // GET learns the object's ETag here, so it can resume an interrupted body from the same
  // version. Must not block.
  absl::AnyInvocable<void(const HttpResponse&)> on_headers;
  // Limit on the whole exchange, counted from when the transport starts it (time spent in
  // the transport's own FIFO queue does not count). Zero: the transport's default.
  absl::Duration timeout = absl::ZeroDuration();
  // Sent on a new connection rather than an idle pooled one. libcurl sends a request again on
  // its own, unseen, when a reused connection turns out dead before any reply byte; the
  // server may have acted on the first send (a multipart create then starts two uploads, one
  // never completed nor aborted). On a new connection it does not: a failure is the caller's
  // to see and retry knowingly.
  bool fresh_connection = false;
  // Optional: when it fires, a request not yet handed to the network is failed without being
  // sent, and one in flight is aborted (its connection closed) promptly, not at its next
  // byte; either way `done` gets Cancelled. A response that completed first is delivered.
  CancelToken cancel;
  // The ambient token of the operation the request belongs to (base/cancel.h): Send() sets
  // it from AmbientCancel() when left null, it cancels the request as `cancel` does, and
  // `done` runs with it as the ambient token, so what the callback starts (a retry, the next
  // part or page) belongs to the same operation.
  CancelToken scope;
};

struct HttpResponse {
  int status = 0;
  // In the order received; names lowercased, names and values trimmed.
  std::vector<std::pair<std::string, std::string>> headers;
  // The body of a 2xx response sent to the default destination, or the (capped) body of
  // any non-2xx response. Empty for 2xx responses streamed to a buffer or callback.
  std::string body;
  // Body bytes received (for a non-2xx response: including any beyond the capture cap).
  uint64_t body_bytes = 0;
  // From the start of the exchange (name lookup, connect, TLS included) to the first
  // response byte, and to the end.
  absl::Duration time_to_first_byte = absl::ZeroDuration();
  absl::Duration total_time = absl::ZeroDuration();

  // The value of the first header called `name` (any case); nullopt when absent. The view
  // points into `headers`.
  std::optional<std::string_view> header(std::string_view name) const;
};

// Called once per request with the response, or with why the exchange did not complete.
using HttpCallback = absl::AnyInvocable<void(absl::StatusOr<HttpResponse>) &&>;

// Counters since the transport was created. Plain snapshot; read with stats().
struct TransportStats {
  uint64_t requests_started = 0;    // handed to the network
  uint64_t requests_completed = 0;  // `done` called (OK or not, cancelled ones included)
  uint64_t requests_failed = 0;     // of those, with a non-OK status
  uint64_t connections_opened = 0;  // new connections (0 when the transport cannot tell)
  uint64_t bytes_sent = 0;          // request body bytes
  uint64_t bytes_received = 0;      // response body bytes
  uint64_t queued = 0;              // waiting in the transport's FIFO now
  uint64_t in_flight = 0;           // started and not yet completed now
};

class HttpTransport {
 public:
  virtual ~HttpTransport() = default;

  // Starts `request`; `done` runs exactly once on a transport thread and must not block.
  // A non-OK status means the exchange did not complete (see "Failures" below). An OK
  // result holds whatever status the server answered, 2xx or not.
  //
  // Failures carry the method, the URL and the underlying reason, e.g.
  //   "HTTP GET http://host/b/k: Timeout was reached (Operation timed out after 200 ms ...)".
  //   Unavailable         retryable: DNS, connect refused, reset, timeout, body shorter than
  //                       Content-Length, send/recv failure, empty reply, TLS handshake
  //   FailedPrecondition  TLS certificate problems (check the CA bundle)
  //   InvalidArgument     malformed URL or unsupported scheme
  //   OutOfRange          a 2xx body longer than the request's buffer
  //   Cancelled           the request's cancel token fired, or the transport was destroyed
  //                       first
  //   (any code)          the status returned by a ResponseBody::Callback
  // Every failure carries DeliveredBytes(): how many 2xx body bytes had already reached the
  // request's buffer or callback, so the caller can resume a GET from there.
  //
  // REQUIRES: a buffer destination stays valid until `done` runs.
  virtual void Send(HttpRequest request, HttpCallback done) = 0;

  virtual TransportStats stats() const { return {}; }
};

// ---- Bytes delivered before a failure ----

// The status payload type URL under which failures record the number of body bytes
// already delivered to a buffer or callback destination; the value is decimal ASCII.
inline constexpr char kDeliveredBytesPayloadUrl[] = "wharf.dev/http/delivered_bytes";

// The number of 2xx body bytes delivered to the request's buffer (at buffer[0..n)) or
// callback before `status` ended the exchange; 0 when the status carries none. Bytes
// collected for the default string destination are discarded on failure and count as 0.
uint64_t DeliveredBytes(const absl::Status& status);
// Records `bytes` on `status` (a no-op on OK). For transports and test fakes.
void SetDeliveredBytes(absl::Status& status, uint64_t bytes);

// ---- Retrying ----

// How a store retries a request the server or the network failed transiently.
struct RetryPolicy {
  int max_attempts = 10;
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(5);
  // No new attempt starts after this much time since the first.
  absl::Duration max_total = absl::Seconds(120);

  // The pause before retry number `attempt` (1 after the first failure): full jitter, uniform
  // in [0, min(max_backoff, initial_backoff * 2^attempt)]. `uniform01` is a uniform sample in
  // [0, 1) from the caller's generator.
  absl::Duration Backoff(int attempt, double uniform01) const;
};

// ---- Blocking exchanges ----
// For code that runs on a blocking pool (credential fetches), never on a transport thread.

// Sends `request` and waits for its end.
absl::StatusOr<HttpResponse> SendBlocking(HttpTransport& transport, HttpRequest request);

// 429 and 5xx: worth sending again, except 501 (Not Implemented) and 505 (HTTP Version Not
// Supported), which say the server will never do what was asked, however often it is asked.
inline bool IsRetryableHttpStatus(int status) {
  return status == 429 || (status >= 500 && status != 501 && status != 505);
}

// An HTTP date ("Wed, 12 Oct 2009 17:50:00 GMT", as Last-Modified and Date carry it), or
// InfinitePast when `s` is empty or not one.
absl::Time ParseHttpDate(std::string_view s);

// Sends the request `make` builds up to `attempts` times (at least once): transport failures
// (Unavailable), 429 and 5xx are retried after 100 ms, doubling up to 1.6 s. Returns the last
// response or failure.
absl::StatusOr<HttpResponse> SendBlockingWithRetries(HttpTransport& transport, int attempts,
                                                     const std::function<HttpRequest()>& make);

}  // namespace wharf
