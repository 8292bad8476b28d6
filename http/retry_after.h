// Retry-After (RFC 9110 10.2.3): how long a server that answered 429 or 503 asks a client to
// wait before it asks again. Retry loops (store/s3, store/gcs) wait the longer of their own
// backoff and this, so a throttling server is not asked again sooner than it said.
#pragma once

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "http/transport.h"

namespace wharf {

// The longest wait a Retry-After is followed for: a server asking for more (minutes, or a
// date far ahead) gets this, and the retry budget decides what is left.
inline constexpr absl::Duration kMaxRetryAfter = absl::Seconds(30);

// The delay before retrying after `response`: `backoff`, or the response's Retry-After
// (delta-seconds or an HTTP date, relative to `now`) when longer, capped at kMaxRetryAfter
// and at `left` (what the retry budget has left; never below `backoff`).
absl::Duration RetryDelay(const absl::StatusOr<HttpResponse>& response, absl::Duration backoff,
                          absl::Duration left, absl::Time now = absl::Now());

}  // namespace wharf
