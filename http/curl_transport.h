// The production HttpTransport: libcurl's multi interface driven by ONE event-loop thread
// per transport (convention 5: a few I/O threads, never a thread per request).
//
// Send() hands the request to the loop through a mutex-protected FIFO and wakes the loop
// (curl_multi_wakeup); the loop starts up to `max_in_flight` transfers, reuses keep-alive
// connections from one pool of at most `max_connections`, and calls `done` from the loop
// thread. Easy handles are recycled, so a steady stream of small requests allocates little
// beyond the response itself.
//
// Cancellation (HttpRequest::cancel): Send() registers a callback on the token that flags the
// loop and wakes it; the loop then removes the cancelled transfers from the multi handle
// (closing their connections mid-body) and drops cancelled requests from its queue, so a
// cancel takes effect within one loop turn whether the transfer is streaming or stalled.
//
// Thread-safety: Send() and stats() may be called from any thread, including from `done`.
// The destructor must not race with Send() from other threads and must not be called from a
// transport callback; it fails every queued and in-flight request with Cancelled (their
// `done` runs before it returns) and joins the loop thread.
#pragma once

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "http/transport.h"

namespace wharf {

struct CurlTransportOptions {
  // Size of the connection pool: the most connections open at once, in total and to any one
  // host, and the most idle keep-alive connections kept for reuse. HTTP/1.1 carries one
  // exchange per connection, so this also bounds the exchanges on the wire: by Little's
  // law 256 sustains ~8,000 small GETs/s at S3's ~30 ms per request, and saturates a
  // 25 Gb/s NIC with large GETs (~80 MB/s per S3 connection) several times over.
  int max_connections = 256;
  // The most transfers handed to curl at once; more are queued FIFO in the transport.
  // Transfers beyond max_connections wait inside curl for a free connection and their
  // `timeout` runs while they wait, whereas time in the transport's queue does not count;
  // so the default equals max_connections. Raise it only for multi-host workloads.
  int max_in_flight = 256;
  // Limit on establishing a connection (TCP and TLS handshakes).
  absl::Duration connect_timeout = absl::Seconds(10);
  // A transfer slower than `low_speed_limit_bytes` per second for `low_speed_time` is
  // aborted (Unavailable). This, not a total timeout, is what catches a stalled peer
  // without limiting large objects. Whole seconds; 0 bytes disables the check. The wait
  // for the first response byte counts, so a server that thinks longer than this before
  // answering (without sending keep-alive whitespace as S3 does) is cut off.
  int low_speed_limit_bytes = 1;
  absl::Duration low_speed_time = absl::Seconds(30);
  // Limit on a whole exchange for requests whose own `timeout` is zero. Zero: none (the
  // connect timeout and the low-speed check still apply).
  absl::Duration default_timeout = absl::ZeroDuration();
  // Verify the server's certificate chain and host name. Off only for test endpoints.
  bool verify_tls = true;
  // PEM file of trusted CAs; empty: the system default. The S3 layer passes AWS_CA_BUNDLE.
  std::string ca_bundle;
};

// The low-speed time of the process's shared transports: WHARF_STALL_TIMEOUT (whole seconds,
// >= 1; read once; a malformed value is reported once and the default kept), else 30 s.
absl::Duration StallTimeout();

// Starts the loop thread. Never fails: a URL or TLS problem surfaces per request.
// max_connections and max_in_flight below 1 are taken as 1.
std::unique_ptr<HttpTransport> NewCurlTransport(CurlTransportOptions options = {});

// The default runtime's curl transport for `ca_bundle` ("": the system's CA store), created
// on first use: one connection pool and event loop per runtime and TLS setting, shared by every
// store and credentials source. A forked child has its own runtime, so its own transport.
std::shared_ptr<HttpTransport> SharedCurlTransport(const std::string& ca_bundle = "");

}  // namespace wharf
