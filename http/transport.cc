#include "http/transport.h"

#include <algorithm>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace wharf {

std::optional<std::string_view> HttpResponse::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, absl::string_view(name.data(), name.size()))) return value;
  }
  return std::nullopt;
}

uint64_t DeliveredBytes(const absl::Status& status) {
  auto payload = status.GetPayload(kDeliveredBytesPayloadUrl);
  uint64_t bytes = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(payload->Flatten(), &bytes)) return 0;
  return bytes;
}

void SetDeliveredBytes(absl::Status& status, uint64_t bytes) {
  status.SetPayload(kDeliveredBytesPayloadUrl, absl::Cord(std::to_string(bytes)));
}

absl::Duration RetryPolicy::Backoff(int attempt, double uniform01) const {
  const absl::Duration cap =
      std::min(initial_backoff * (int64_t{1} << std::clamp(attempt, 0, 20)), max_backoff);
  return absl::Nanoseconds(
      static_cast<int64_t>(uniform01 * static_cast<double>(absl::ToInt64Nanoseconds(cap) + 1)));
}

absl::StatusOr<HttpResponse> SendBlocking(HttpTransport& transport, HttpRequest request) {
  absl::Notification done;
  absl::StatusOr<HttpResponse> result;
  transport.Send(std::move(request), [&](absl::StatusOr<HttpResponse> response) {
    result = std::move(response);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

absl::StatusOr<HttpResponse> SendBlockingWithRetries(HttpTransport& transport, int attempts,
                                                     const std::function<HttpRequest()>& make) {
  absl::StatusOr<HttpResponse> response;
  for (int attempt = 1;; ++attempt) {
    response = SendBlocking(transport, make());
    const bool retryable = response.ok()
                               ? IsRetryableHttpStatus(response->status)
                               : response.status().code() == absl::StatusCode::kUnavailable;
    if (!retryable || attempt >= std::max(attempts, 1)) return response;
    absl::SleepFor(absl::Milliseconds(100) * (1 << std::min(attempt - 1, 4)));
  }
}

absl::Time ParseHttpDate(std::string_view s) {
  absl::Time t;
  std::string err;
  if (absl::ParseTime("%a, %d %b %Y %H:%M:%S GMT", std::string(s), &t, &err)) return t;
  return absl::InfinitePast();
}

}  // namespace wharf
