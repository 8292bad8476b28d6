// CannedTransport: an HttpTransport that answers from a handler instead of the network, for
// unit tests of the layers above, their error paths above all (a 503 SlowDown, a 404 with
// its XML, a connection reset halfway through a GET). Responses reach the request's body
// destination through the same code as the curl transport's (buffer / callback / string,
// non-2xx bodies captured and capped, OutOfRange on a too-small buffer, DeliveredBytes() on
// failures), and `done` runs on the transport's own thread, never inline in Send(), so the
// caller sees curl's threading. A request whose cancel token fired before it is served fails
// with Cancelled without reaching the handler; one that fires while the body is delivered
// aborts it between chunks.
//
// Thread-safety: all methods may be called from any thread. The handler runs on the
// transport thread, one request at a time, in the order sent; it may block (a test may make
// it wait to simulate a slow server). The destructor finishes every request already sent.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/thread_pool.h"
#include "http/transport.h"

namespace wharf {

// What the fake server answers, and how the exchange ends.
struct CannedResponse {
  int status = 200;
  // Sent as given (names in any case); "content-length: <body size>" is added unless
  // present or `no_content_length` (a body whose size the headers do not say, as a chunked
  // one). A HEAD request gets the headers and no body.
  std::vector<std::pair<std::string, std::string>> headers;
  bool no_content_length = false;
  std::string body;
  // A simulated transport failure: when not OK, the exchange fails with this status (its
  // code kept, "HTTP <method> <url>: " prefixed) after the first `fail_after_bytes` bytes
  // of `body` arrived, e.g. absl::UnavailableError("Recv failure: Connection reset by
  // peer") after half the body. A failure before any response at all is the handler
  // returning an error instead.
  absl::Status failure;
  uint64_t fail_after_bytes = 0;
  // The body reaches a callback destination in pieces of at most this many bytes.
  size_t chunk_bytes = 16384;
  // Reported as HttpResponse::time_to_first_byte and total_time.
  absl::Duration time_to_first_byte = absl::ZeroDuration();
  absl::Duration total_time = absl::ZeroDuration();
};

// Returns the response for one request, or a status for a transport failure before any
// response byte (DNS, connect refused): the exchange then fails with that code.
using CannedHandler = std::function<absl::StatusOr<CannedResponse>(const HttpRequest&)>;

class CannedTransport final : public HttpTransport {
 public:
  explicit CannedTransport(CannedHandler handler);
  ~CannedTransport() override = default;
  CannedTransport(const CannedTransport&) = delete;
  CannedTransport& operator=(const CannedTransport&) = delete;

  void Send(HttpRequest request, HttpCallback done) override;
  TransportStats stats() const override;

  // Copies of every request the handler has been given, in order, with `response` left at
  // its default (destinations are not copyable). A request is recorded before its `done`
  // runs.
  std::vector<HttpRequest> requests() const;
  size_t request_count() const;

 private:
  void Serve(HttpRequest request, HttpCallback done);

  const CannedHandler handler_;
  mutable absl::Mutex mu_;
  std::vector<HttpRequest> requests_ ABSL_GUARDED_BY(mu_);
  TransportStats stats_ ABSL_GUARDED_BY(mu_);
  ThreadPool thread_{1};  // last: destroyed (drained and joined) before the members above
};

}  // namespace wharf
