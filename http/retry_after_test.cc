#include "http/retry_after.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace wharf {
namespace {

HttpResponse Throttled(std::string retry_after) {
  HttpResponse r;
  r.status = 503;
  r.headers.emplace_back("retry-after", std::move(retry_after));
  return r;
}

TEST(RetryAfterTest, TheLongerOfTheBackoffAndWhatTheServerAsked) {
  const absl::Duration backoff = absl::Milliseconds(400);
  const absl::Duration left = absl::Seconds(100);
  EXPECT_EQ(RetryDelay(Throttled("2"), backoff, left), absl::Seconds(2));
  EXPECT_EQ(RetryDelay(Throttled(" 3 "), backoff, left), absl::Seconds(3));
  EXPECT_EQ(RetryDelay(Throttled("0"), backoff, left), backoff);  // now: the backoff still
  EXPECT_EQ(RetryDelay(HttpResponse{}, backoff, left), backoff);  // none asked
  EXPECT_EQ(RetryDelay(absl::UnavailableError("reset"), backoff, left), backoff);
  EXPECT_EQ(RetryDelay(Throttled("soon"), backoff, left), backoff);  // unreadable: ignored
  // Capped: at kMaxRetryAfter, and at what the retry budget has left.
  EXPECT_EQ(RetryDelay(Throttled("3600"), backoff, left), kMaxRetryAfter);
  EXPECT_EQ(RetryDelay(Throttled("10"), backoff, absl::Seconds(4)), absl::Seconds(4));
  EXPECT_EQ(RetryDelay(Throttled("10"), backoff, absl::ZeroDuration()), backoff);
}

TEST(RetryAfterTest, AnHttpDateIsRelativeToNow) {
  const absl::Time now = absl::FromUnixSeconds(1700000000);  // Tue, 14 Nov 2023 22:13:20 GMT
  const absl::Duration backoff = absl::Milliseconds(100);
  EXPECT_EQ(RetryDelay(Throttled("Tue, 14 Nov 2023 22:13:25 GMT"), backoff, absl::Hours(1), now),
            absl::Seconds(5));
  EXPECT_EQ(RetryDelay(Throttled("Tue, 14 Nov 2023 22:13:00 GMT"), backoff, absl::Hours(1), now),
            backoff);  // past
}

}  // namespace
}  // namespace wharf
