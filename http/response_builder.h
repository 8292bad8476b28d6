// ResponseBuilder: turns the raw pieces of one HTTP exchange (header lines, body chunks,
// how it ended) into what HttpTransport::Send reports. Shared by every transport so that
// body routing (string / buffer / callback, error bodies captured and capped), header
// parsing and failure statuses are identical everywhere. Not a public API.
//
// Thread-safety: none; one exchange is driven by one thread at a time. Reusable: Start()
// begins the next exchange and keeps nothing from the previous one.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "http/transport.h"

namespace wharf::internal_http {

class ResponseBuilder {
 public:
  ResponseBuilder() = default;
  ResponseBuilder(const ResponseBuilder&) = delete;
  ResponseBuilder& operator=(const ResponseBuilder&) = delete;

  // Begins an exchange for `request`, which must outlive it (its destination and, for
  // messages, its method and URL are used until Finish()).
  void Start(HttpRequest* request);

  // One header line as received, CRLF included: the status line ("HTTP/1.1 200 OK"),
  // a "name: value" line, or the blank line ending the header block. A new status line
  // (after a 1xx interim response) starts the headers afresh. Returns false to abort the
  // exchange (a 2xx Content-Length larger than the request's buffer); error() says why.
  bool OnHeaderLine(absl::string_view line);

  // A piece of the body. Returns false to abort the exchange; error() says why.
  bool OnBody(absl::string_view data);

  // Why the builder aborted the exchange; OK if it did not.
  const absl::Status& error() const { return error_; }

  // 2xx body bytes that reached a buffer or callback destination so far.
  uint64_t delivered() const { return delivered_; }

  // Ends the exchange. `transport_error` is OK if the exchange completed; otherwise the
  // failure, already mapped to a code and a reason without method or URL. An abort by the
  // builder itself (error()) takes precedence over the transport's own report of it.
  // `status_code` overrides the parsed status when non-zero (the transport's own view).
  absl::StatusOr<HttpResponse> Finish(absl::Status transport_error, int status_code,
                                      absl::Duration time_to_first_byte, absl::Duration total_time);

  // A failure status for this exchange: "HTTP <method> <url>: <message>", with the
  // delivered byte count in the message (when non-zero) and as a payload.
  absl::Status Failure(absl::StatusCode code, absl::string_view message) const;

 private:
  bool is_success() const { return response_.status >= 200 && response_.status < 300; }
  bool Abort(absl::Status status);

  HttpRequest* request_ = nullptr;
  HttpResponse response_;
  absl::Status error_;
  uint64_t delivered_ = 0;
  bool in_body_ = false;  // the final header block has ended
};

}  // namespace wharf::internal_http
