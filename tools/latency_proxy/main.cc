// wharf-latency-proxy: relays TCP connections with an added one-way delay in each direction.
// See latency_proxy.h for the model. Prints "listening on HOST:PORT" once ready; exits 0 on
// SIGTERM/SIGINT, 1 with a one-line error otherwise.
#include <malloc.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tools/latency_proxy/latency_proxy.h"

namespace {

constexpr char kUsage[] =
    "usage: wharf-latency-proxy --listen 127.0.0.1:PORT --upstream 127.0.0.1:PORT --delay-ms D\n"
    "         [--bandwidth-mbps B] [--max-buffer-mib M] [--simulate-handshake]\n"
    "         [--stats-file PATH] [--control 127.0.0.1:PORT] [--allow-non-loopback]\n"
    "         [--fill-empty-complete-etag]\n"
    "\n"
    "  --listen ADDR           address to accept on; port 0 picks one (printed on stdout)\n"
    "  --upstream ADDR         address every connection is relayed to\n"
    "  --delay-ms D            one-way delay per direction (round trip = 2 D), fractions allowed\n"
    "  --bandwidth-mbps B      per-direction cap, shared by all connections (default: none)\n"
    "  --max-buffer-mib M      per-connection, per-direction buffer before reading pauses\n"
    "                          (default 4; one connection moves at most M per D)\n"
    "  --simulate-handshake    charge new connections one extra round trip (TCP handshake)\n"
    "  --stats-file PATH       write JSON counters here at exit\n"
    "  --control ADDR          accept commands on ADDR (port 0 picks one, printed as\n"
    "                          'control on HOST:PORT'): a line 'delay MS' changes the\n"
    "                          delay while running, 'get' reports it\n"
    "  --allow-non-loopback    permit addresses outside 127.0.0.0/8 and ::1\n"
    "  --fill-empty-complete-etag\n"
    "                          put a placeholder into the empty <ETag> of Ceph RGW 16.2's\n"
    "                          CompleteMultipartUpload replies (Ceph BZ 2266579), which AWS CRT\n"
    "                          clients (s3torchconnector) reject; for benchmarking them only\n";

bool ParseDouble(const char* text, double* out) {
  char* end = nullptr;
  *out = std::strtod(text, &end);
  return end != text && *end == '\0';
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "wharf-latency-proxy: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  wharf::tools::LatencyProxyOptions options;
  bool have_delay = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto next = [&](std::string* out) {
      if (has_value) {
        *out = value;
        return true;
      }
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    double d = 0;
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--listen") {
      if (!next(&options.listen)) return Fail("--listen needs a value");
    } else if (arg == "--upstream") {
      if (!next(&options.upstream)) return Fail("--upstream needs a value");
    } else if (arg == "--delay-ms") {
      if (!next(&v) || !ParseDouble(v.c_str(), &d)) return Fail("--delay-ms needs a number");
      options.delay_ms = d;
      have_delay = true;
    } else if (arg == "--bandwidth-mbps") {
      if (!next(&v) || !ParseDouble(v.c_str(), &d)) return Fail("--bandwidth-mbps needs a number");
      options.bandwidth_mbps = d;
    } else if (arg == "--max-buffer-mib") {
      if (!next(&v) || !ParseDouble(v.c_str(), &d) || d <= 0) {
        return Fail("--max-buffer-mib needs a positive number");
      }
      options.max_buffer_bytes = static_cast<size_t>(d * (1 << 20));
    } else if (arg == "--control") {
      if (!next(&options.control)) return Fail("--control needs a value");
    } else if (arg == "--stats-file") {
      if (!next(&options.stats_file)) return Fail("--stats-file needs a value");
    } else if (arg == "--simulate-handshake" && !has_value) {
      options.simulate_handshake = true;
    } else if (arg == "--allow-non-loopback" && !has_value) {
      options.allow_non_loopback = true;
    } else if (arg == "--fill-empty-complete-etag" && !has_value) {
      options.fill_empty_complete_etag = true;
    } else {
      std::fputs(kUsage, stderr);
      return Fail("unknown argument '" + std::string(argv[i]) + "'");
    }
  }
  if (options.upstream.empty()) return Fail("--upstream is required");
  if (!have_delay) return Fail("--delay-ms is required (0 for none)");

  // Consumed through a signalfd by the event loop; blocked before any other thread could exist.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Chunk buffers (up to --read-size each) come and go thousands of times a second. Keep glibc
  // from serving them with fresh mmap()s or trimming the heap after each free: page faults and
  // zeroing otherwise cost more CPU than the copying (measured with perf at 2,000 requests/s).
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);

  wharf::tools::LatencyProxy proxy(options);
  if (std::string error = proxy.Start(); !error.empty()) return Fail(error);
  std::printf("listening on %s\n", proxy.listen_address().c_str());
  if (!proxy.control_address().empty()) {
    std::printf("control on %s\n", proxy.control_address().c_str());
  }
  std::fflush(stdout);
  if (std::string error = proxy.Run(); !error.empty()) return Fail(error);
  return 0;
}
