#include "http/response_builder.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace wharf::internal_http {
namespace {

// A Content-Length this large is not trusted for a reservation: the string grows as the
// bytes actually arrive instead.
constexpr uint64_t kMaxReserveBytes = uint64_t{64} << 20;

absl::string_view StripLineEnd(absl::string_view line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  return line;
}

// "HTTP/1.1 200 OK" -> 200; 0 when malformed.
int ParseStatusLine(absl::string_view line) {
  size_t space = line.find(' ');
  if (space == absl::string_view::npos || line.size() < space + 4) return 0;
  int code = 0;
  for (size_t i = space + 1; i < space + 4; ++i) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(line[i]))) return 0;
    code = code * 10 + (line[i] - '0');
  }
  return code;
}

}  // namespace

void ResponseBuilder::Start(HttpRequest* request) {
  request_ = request;
  response_ = HttpResponse();
  // S3 answers with 8-12 headers; one allocation up front instead of several as they grow.
  response_.headers.reserve(16);
  error_ = absl::OkStatus();
  delivered_ = 0;
  in_body_ = false;
}

bool ResponseBuilder::Abort(absl::Status status) {
  error_ = std::move(status);
  SetDeliveredBytes(error_, delivered_);
  return false;
}

absl::Status ResponseBuilder::Failure(absl::StatusCode code, absl::string_view message) const {
  absl::Status status(
      code, delivered_ == 0
                ? absl::StrCat("HTTP ", request_->method, " ", request_->url, ": ", message)
                : absl::StrCat("HTTP ", request_->method, " ", request_->url, ": ", message,
                               " (after ", delivered_, " body bytes were delivered)"));
  SetDeliveredBytes(status, delivered_);
  return status;
}

bool ResponseBuilder::OnHeaderLine(absl::string_view line) {
  line = StripLineEnd(line);
  if (absl::StartsWith(line, "HTTP/")) {
    // A new response: either the first, or the final one after a 1xx interim response.
    response_.status = ParseStatusLine(line);
    response_.headers.clear();
    in_body_ = false;
    return true;
  }
  if (line.empty()) {
    if (response_.status >= 100 && response_.status < 200) return true;  // interim
    in_body_ = true;
    if (request_->on_headers) request_->on_headers(response_);
    if (request_->method == "HEAD" || response_.status == 204 || response_.status == 304) {
      return true;
    }
    uint64_t length = 0;
    std::optional<std::string_view> value = response_.header("content-length");
    if (!value.has_value() ||
        !absl::SimpleAtoi(absl::string_view(value->data(), value->size()), &length)) {
      return true;
    }
    if (!is_success()) {
      response_.body.reserve(std::min<uint64_t>(length, kMaxErrorBodyBytes));
    } else if (const absl::Span<char>* buffer = request_->response.buffer()) {
      if (length > buffer->size()) {
        return Abort(Failure(absl::StatusCode::kOutOfRange,
                             absl::StrCat("response body of ", length, " bytes does not fit the ",
                                          buffer->size(), "-byte buffer")));
      }
    } else if (request_->response.is_string()) {
      response_.body.reserve(std::min(length, kMaxReserveBytes));
    }
    return true;
  }
  if (line.front() == ' ' || line.front() == '\t') {
    // An obsolete folded continuation of the previous header's value.
    if (!response_.headers.empty()) {
      std::string& value = response_.headers.back().second;
      absl::StrAppend(&value, " ", absl::StripAsciiWhitespace(line));
    }
    return true;
  }
  size_t colon = line.find(':');
  if (colon == absl::string_view::npos) return true;  // not a header; ignore it
  std::string name(absl::StripAsciiWhitespace(line.substr(0, colon)));
  absl::AsciiStrToLower(&name);
  response_.headers.emplace_back(std::move(name),
                                 std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))));
  return true;
}

bool ResponseBuilder::OnBody(absl::string_view data) {
  if (data.empty()) return true;
  response_.body_bytes += data.size();
  if (!is_success()) {
    if (response_.body.size() < kMaxErrorBodyBytes) {
      size_t room = kMaxErrorBodyBytes - response_.body.size();
      response_.body.append(data.data(), std::min(room, data.size()));
    }
    return true;
  }
  if (request_->response.is_string()) {
    response_.body.append(data.data(), data.size());
    return true;
  }
  if (const absl::Span<char>* buffer = request_->response.buffer()) {
    if (data.size() > buffer->size() - delivered_) {
      return Abort(
          Failure(absl::StatusCode::kOutOfRange,
                  absl::StrCat("response body of at least ", delivered_ + data.size(),
                               " bytes does not fit the ", buffer->size(), "-byte buffer")));
    }
    std::memcpy(buffer->data() + delivered_, data.data(), data.size());
    delivered_ += data.size();
    return true;
  }
  absl::Status status =
      (*request_->response.callback())(std::string_view(data.data(), data.size()));
  if (!status.ok()) {
    return Abort(Annotate(status, absl::StrCat("HTTP ", request_->method, " ", request_->url,
                                               ": response body callback")));
  }
  delivered_ += data.size();
  return true;
}

absl::StatusOr<HttpResponse> ResponseBuilder::Finish(absl::Status transport_error, int status_code,
                                                     absl::Duration time_to_first_byte,
                                                     absl::Duration total_time) {
  if (!error_.ok()) return error_;
  if (!transport_error.ok()) return Failure(transport_error.code(), transport_error.message());
  if (status_code != 0) response_.status = status_code;
  response_.time_to_first_byte = time_to_first_byte;
  response_.total_time = total_time;
  return std::move(response_);
}

}  // namespace wharf::internal_http
