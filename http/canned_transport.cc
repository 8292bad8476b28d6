#include "http/canned_transport.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "http/response_builder.h"

namespace wharf {
namespace {

HttpRequest CopyWithoutDestination(const HttpRequest& request) {
  HttpRequest copy;
  copy.method = request.method;
  copy.url = request.url;
  copy.headers = request.headers;
  copy.body = request.body;
  copy.timeout = request.timeout;
  return copy;
}

// Feeds `canned` through `builder` as the curl transport feeds what it reads off a socket.
absl::StatusOr<HttpResponse> Deliver(const HttpRequest& request, const CannedResponse& canned,
                                     internal_http::ResponseBuilder& builder) {
  auto finish = [&](absl::Status transport_error) {
    return builder.Finish(std::move(transport_error), 0, canned.time_to_first_byte,
                          canned.total_time);
  };
  bool ok = builder.OnHeaderLine(absl::StrCat("HTTP/1.1 ", canned.status, " Canned\r\n"));
  bool has_length = false;
  for (const auto& [name, value] : canned.headers) {
    has_length = has_length || absl::EqualsIgnoreCase(name, "content-length");
    ok = ok && builder.OnHeaderLine(absl::StrCat(name, ": ", value, "\r\n"));
  }
  if (!has_length && !canned.no_content_length) {
    ok = ok && builder.OnHeaderLine(absl::StrCat("Content-Length: ", canned.body.size(), "\r\n"));
  }
  ok = ok && builder.OnHeaderLine("\r\n");
  if (!ok) return finish(absl::OkStatus());  // the builder's own error wins

  absl::string_view body = request.method == "HEAD" ? absl::string_view() : canned.body;
  if (!canned.failure.ok())
    body = body.substr(0, std::min<uint64_t>(body.size(), canned.fail_after_bytes));
  const size_t chunk = std::max<size_t>(1, canned.chunk_bytes);
  for (size_t offset = 0; offset < body.size(); offset += chunk) {
    // A token that fired mid-body aborts between chunks, as curl's loop would.
    if (IsCancelled(request.cancel)) return finish(absl::CancelledError("cancelled"));
    if (!builder.OnBody(body.substr(offset, chunk))) return finish(absl::OkStatus());
  }
  return finish(canned.failure);
}

}  // namespace

CannedTransport::CannedTransport(CannedHandler handler) : handler_(std::move(handler)) {}

void CannedTransport::Send(HttpRequest request, HttpCallback done) {
  {
    absl::MutexLock lock(&mu_);
    ++stats_.queued;
  }
  thread_.Schedule([this, request = std::move(request), done = std::move(done)]() mutable {
    Serve(std::move(request), std::move(done));
  });
}

void CannedTransport::Serve(HttpRequest request, HttpCallback done) {
  if (IsCancelled(request.cancel)) {  // never reaches the handler, nor requests()
    absl::Status status = absl::CancelledError(
        absl::StrCat("HTTP ", request.method, " ", request.url, ": cancelled"));
    SetDeliveredBytes(status, 0);
    {
      absl::MutexLock lock(&mu_);
      --stats_.queued;
      ++stats_.requests_completed;
      ++stats_.requests_failed;
    }
    request = HttpRequest();
    std::move(done)(std::move(status));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    requests_.push_back(CopyWithoutDestination(request));
    --stats_.queued;
    ++stats_.requests_started;
    ++stats_.in_flight;
    stats_.bytes_sent += request.body.size();
  }
  internal_http::ResponseBuilder builder;
  builder.Start(&request);
  absl::StatusOr<CannedResponse> canned = handler_(request);
  absl::StatusOr<HttpResponse> result =
      canned.ok() ? Deliver(request, *canned, builder)
                  : builder.Failure(canned.status().code(), canned.status().message());
  {
    absl::MutexLock lock(&mu_);
    --stats_.in_flight;
    ++stats_.requests_completed;
    if (!result.ok()) ++stats_.requests_failed;
    stats_.bytes_received += result.ok() ? result->body_bytes : DeliveredBytes(result.status());
  }
  // As with curl, the request (its body, its streaming callback) is released before `done`.
  request = HttpRequest();
  std::move(done)(std::move(result));
}

TransportStats CannedTransport::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

std::vector<HttpRequest> CannedTransport::requests() const {
  absl::MutexLock lock(&mu_);
  std::vector<HttpRequest> copies;
  copies.reserve(requests_.size());
  for (const HttpRequest& request : requests_) copies.push_back(CopyWithoutDestination(request));
  return copies;
}

size_t CannedTransport::request_count() const {
  absl::MutexLock lock(&mu_);
  return requests_.size();
}

}  // namespace wharf
