#include "http/retry_after.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"

namespace wharf {

absl::Duration RetryDelay(const absl::StatusOr<HttpResponse>& response, absl::Duration backoff,
                          absl::Duration left, absl::Time now) {
  if (!response.ok()) return backoff;
  const std::optional<std::string_view> header = response->header("retry-after");
  if (!header.has_value()) return backoff;
  const absl::string_view text =
      absl::StripAsciiWhitespace(absl::string_view(header->data(), header->size()));
  absl::Duration asked;
  int64_t seconds = 0;
  if (absl::SimpleAtoi(text, &seconds)) {
    if (seconds <= 0) return backoff;
    asked = absl::Seconds(std::min<int64_t>(seconds, absl::ToInt64Seconds(kMaxRetryAfter)));
  } else {
    const absl::Time at = ParseHttpDate(std::string_view(text.data(), text.size()));
    if (at == absl::InfinitePast() || at <= now) return backoff;
    asked = at - now;
  }
  asked = std::min({asked, kMaxRetryAfter, left});
  return std::max(backoff, asked);
}

}  // namespace wharf
