// A TCP proxy that adds a fixed one-way delay (and optionally a bandwidth cap) to every byte it
// relays, so that tests and benchmarks against local object-storage servers see cloud-like round
// trips. The kernel here has no netem; this is its user-space stand-in.
//
// Model: each chunk read from one side is written to the other side no earlier than its arrival
// time + delay, independently in each direction, so a request/response round trip costs
// 2 x delay + server time. Order within a direction is preserved. A half-close (FIN) is
// forwarded as shutdown(SHUT_WR) once the data read before it has been delivered and its own
// delay has passed; a reset (RST) is forwarded the same way, as an abortive close of both sides.
//
// Memory is bounded: each direction of each connection buffers at most `max_buffer_bytes`
// (+ one read) before the proxy stops reading its source, which closes that source's TCP window.
// Like a TCP window, this caps one connection at about max_buffer_bytes per delay
// (4 MiB / 25 ms = 160 MiB/s); raise it for single-stream bulk benchmarks at high delay.
//
// The bandwidth cap is one token bucket per direction shared by all connections (an aggregate
// link capacity, like a NIC or a WAN uplink), applied after the delay.
//
// Thread-safety: a LatencyProxy is driven by one thread (single-threaded epoll event loop).
// Run() returns when SIGTERM or SIGINT arrives; the caller must have blocked those signals in
// every thread (main.cc does) so they are consumed through a signalfd.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace wharf::tools {

struct LatencyProxyOptions {
  // host:port to listen on; port 0 picks a free port. IPv4 literals, "localhost" and "[::1]".
  std::string listen = "127.0.0.1:0";
  // host:port every accepted connection is relayed to.
  std::string upstream;
  // Added to every chunk in each direction. 25 ms one way = 50 ms RTT, a typical same-region
  // object store time-to-first-byte floor.
  double delay_ms = 0;
  // Per-direction cap in megabits per second, aggregate over all connections; 0 = none.
  double bandwidth_mbps = 0;
  // Per connection, per direction; see the header comment for its throughput consequence.
  size_t max_buffer_bytes = size_t{4} << 20;
  // One recv() of up to this many bytes; large so bulk transfers cost few syscalls.
  size_t read_size = size_t{256} << 10;
  // Without it, both addresses must be loopback (127.0.0.0/8 or ::1).
  bool allow_non_loopback = false;
  // Also charge a TCP handshake (one round trip, 2 x delay) to each new connection: its first
  // client bytes are held until accept time + 2 x delay before their own delay starts. The local
  // kernel completes the real handshake at once, so without this a new connection is one round
  // trip cheaper than over a WAN.
  bool simulate_handshake = false;
  // A workaround for Ceph RGW 16.2 (Ceph BZ 2266579): it answers CompleteMultipartUpload with
  // an empty <ETag>, and clients built on the AWS CRT (s3torchconnector, mountpoint-s3) then
  // fail the upload ("Header ETag not found"). With this set, the reply to a POST with an
  // uploadId, when its XML body is small, is held until it is whole (RGW sends the header
  // first) and, where its <ETag> is empty, gets a placeholder ETag,
  // "filled-by-wharf-latency-proxy", and a Content-Length to match; every other byte passes
  // unchanged. Only for benchmarking those clients against that server: the placeholder is not the
  // object's ETag (a HEAD tells the real one).
  bool fill_empty_complete_etag = false;
  // If set, a JSON object of counters is written here when Run() returns.
  std::string stats_file;
  // host:port of a control listener (port 0 picks one; loopback unless allowed): each
  // connection sends lines "delay MS" (sets the one-way delay of data read from then on;
  // bytes already held keep their due time, and order is kept) or "get", and gets one line
  // back per command: "ok delay_ms=D". Empty: no control listener.
  std::string control;
};

struct LatencyProxyStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_peak = 0;
  uint64_t upstream_connect_failures = 0;
  uint64_t connections_reset = 0;         // closed abortively (RST or socket error on either side)
  uint64_t bytes_client_to_upstream = 0;  // bytes written to the upstream
  uint64_t bytes_upstream_to_client = 0;  // bytes written to clients
  uint64_t wakeups = 0;                   // event loop iterations (a CPU cost indicator)
  uint64_t etags_filled = 0;              // replies fill_empty_complete_etag changed
};

class LatencyProxy {
 public:
  explicit LatencyProxy(LatencyProxyOptions options);
  ~LatencyProxy();
  LatencyProxy(const LatencyProxy&) = delete;
  LatencyProxy& operator=(const LatencyProxy&) = delete;

  // Validates the options, binds and listens. Returns an empty string on success, otherwise a
  // one-line error naming what failed.
  std::string Start();
  // The bound address ("127.0.0.1:PORT"). REQUIRES: Start() succeeded.
  std::string listen_address() const;
  // The bound control address, or "" without one.
  std::string control_address() const;
  // Runs the event loop until SIGTERM/SIGINT; then closes every connection, writes the stats
  // file if asked and returns an empty string, or an error if the loop failed.
  // REQUIRES: Start() succeeded.
  std::string Run();
  const LatencyProxyStats& stats() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wharf::tools
