#include "tools/latency_proxy/latency_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <queue>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace wharf::tools {
namespace {

constexpr uint32_t kListenerSlot = 0xffffffffu;
constexpr uint32_t kSignalSlot = 0xfffffffeu;
constexpr uint32_t kControlSlot = 0xfffffffdu;
constexpr uint32_t kGenMask = 0x7fffffffu;  // generation bits that fit in an epoll tag
constexpr int kMaxEvents = 1024;
// Reads per readiness event before other connections get a turn (fairness under bulk load).
constexpr int kReadsPerTurn = 16;
constexpr int kMaxIov = 64;
// --fill-empty-complete-etag holds back and rewrites only replies with an XML body this small.
constexpr size_t kMaxFilledReply = 8192;

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

struct Address {
  sockaddr_storage storage{};
  socklen_t len = 0;
  bool loopback = false;
};

// Parses "host:port" where host is an IPv4 literal, "localhost" or "[IPv6 literal]".
bool ParseAddress(const std::string& text, Address* out, std::string* error) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size()) {
    *error = "address '" + text + "' is not host:port";
    return false;
  }
  std::string host = text.substr(0, colon);
  std::string port_text = text.substr(colon + 1);
  char* end = nullptr;
  long port = std::strtol(port_text.c_str(), &end, 10);
  if (*end != '\0' || port < 0 || port > 65535) {
    *error = "address '" + text + "' has a bad port";
    return false;
  }
  if (host == "localhost") host = "127.0.0.1";
  *out = Address{};
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&out->storage);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &sin6->sin6_addr) != 1) {
      *error = "address '" + text + "' has a bad IPv6 literal";
      return false;
    }
    out->len = sizeof(sockaddr_in6);
    out->loopback = IN6_IS_ADDR_LOOPBACK(&sin6->sin6_addr);
    return true;
  }
  auto* sin = reinterpret_cast<sockaddr_in*>(&out->storage);
  sin->sin_family = AF_INET;
  sin->sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &sin->sin_addr) != 1) {
    *error = "address '" + text +
             "' is not an IP literal (host names other than localhost are "
             "not resolved)";
    return false;
  }
  out->len = sizeof(sockaddr_in);
  out->loopback = (ntohl(sin->sin_addr.s_addr) >> 24) == 127;
  return true;
}

std::string FormatAddress(const sockaddr_storage& storage) {
  char host[INET6_ADDRSTRLEN] = {};
  if (storage.ss_family == AF_INET6) {
    auto* sin6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(sin6->sin6_port));
  }
  auto* sin = reinterpret_cast<const sockaddr_in*>(&storage);
  inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
  return std::string(host) + ":" + std::to_string(ntohs(sin->sin_port));
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Makes the next close() send RST instead of FIN.
void SetAbortive(int fd) {
  linger lg{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
}

bool IsTransient(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

// What follows the last buffered chunk of a direction once its source has stopped.
enum class End : uint8_t { kNone, kFin, kRst };

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};
// malloc()ed so that a read buffer can be shrunk in place (realloc) and kept as a chunk.
using Buffer = std::unique_ptr<char, FreeDeleter>;

Buffer AllocateBuffer(size_t size) {
  char* p = static_cast<char*>(std::malloc(size));
  if (p == nullptr) std::abort();
  return Buffer(p);
}

struct Chunk {
  int64_t due_ns;
  Buffer data;  // `size` bytes, the first `offset` of them already written
  uint32_t size;
  uint32_t offset;
};

// One direction of one connection: bytes read from `src`, waiting to be written to `dst`.
struct Direction {
  int src = -1;
  int dst = -1;
  std::deque<Chunk> chunks;
  size_t buffered = 0;
  // Edge-triggered readiness as last learned: set by epoll, cleared when a call says otherwise.
  bool src_readable = false;
  // The source reported RDHUP/HUP/ERR: read until EOF (no short-read shortcut).
  bool src_hup = false;
  bool dst_writable = false;
  bool src_done = false;  // the source returned EOF or an error; nothing more will be read
  End end = End::kNone;
  int64_t end_due_ns = 0;
  bool end_sent = false;
  bool in_read_queue = false;
  bool in_throttle_queue = false;
  int64_t not_before_ns = 0;  // --simulate-handshake: arrivals count from here at the earliest
};

struct Conn {
  uint32_t slot = 0;  // index in the slot table, fixed for the object's life
  uint32_t gen = 0;   // bumped when the slot is reused, so stale events and timers are ignored
  bool live = false;
  bool connecting = false;
  bool upstream_ok = false;
  int client = -1;
  int upstream = -1;
  Direction dir[2];  // 0: client -> upstream, 1: upstream -> client
  // --fill-empty-complete-etag: a CompleteMultipartUpload request (a POST with an uploadId)
  // started a read from the client, and its reply has not passed yet; the start of that
  // reply, held back until the rest of it arrives (RGW sends its header before its body).
  bool awaiting_complete = false;
  std::string held_reply;
};

struct Ref {
  uint32_t slot;
  uint32_t gen;
  uint8_t dir;
};

struct TimerEntry {
  int64_t due_ns;
  Ref ref;
  bool operator>(const TimerEntry& other) const { return due_ns > other.due_ns; }
};

// Aggregate bandwidth of one direction. Tokens are bytes; they accrue at `rate` up to `burst`.
struct TokenBucket {
  double rate_bytes_per_ns = 0;
  double burst = 0;
  double quantum = 0;  // smallest grant worth a wakeup, so a slow link is not fed byte by byte
  double tokens = 0;
  int64_t last_ns = 0;
  int64_t wake_ns = 0;  // 0: nobody waiting
  std::deque<Ref> waiting;

  void Refill(int64_t now) {
    tokens = std::min(burst, tokens + static_cast<double>(now - last_ns) * rate_bytes_per_ns);
    last_ns = now;
  }
};

uint64_t Tag(uint32_t slot, uint32_t gen, int side) {
  return (uint64_t{gen & kGenMask} << 33) | (uint64_t(side) << 32) | slot;
}

// --fill-empty-complete-etag (see LatencyProxyOptions).
constexpr char kEmptyCompleteEtag[] = "<ETag></ETag></CompleteMultipartUploadResult>";
constexpr char kFilledEtag[] = "&quot;filled-by-wharf-latency-proxy&quot;";

// Where the value of the header `name` (lowercase, with its colon) starts in the header
// `head` (up to its blank line), or npos. Header names match without regard to case.
size_t HeaderValue(std::string_view head, std::string_view name) {
  size_t line = head.find("\r\n");
  while (line != std::string_view::npos && line + 2 < head.size()) {
    line += 2;
    const std::string_view text = head.substr(line, head.find("\r\n", line) - line);
    if (text.size() >= name.size() &&
        std::equal(name.begin(), name.end(), text.begin(), [](char a, char b) {
          return a == std::tolower(static_cast<unsigned char>(b));
        })) {
      size_t value = line + name.size();
      while (value < head.size() && head[value] == ' ') ++value;
      return value;
    }
    line = head.find("\r\n", line);
  }
  return std::string_view::npos;
}

// When `data` starts with the whole header of a reply with an XML body of at most
// kMaxFilledReply bytes: the size of header and body together; else 0.
size_t SmallXmlReplySize(std::string_view data) {
  if (!data.starts_with("HTTP/1.")) return 0;
  const size_t header_end = data.find("\r\n\r\n");
  if (header_end == std::string_view::npos) return 0;
  const std::string_view head = data.substr(0, header_end + 2);
  const size_t type = HeaderValue(head, "content-type:");
  if (type == std::string_view::npos || head.substr(type, 15) != "application/xml") return 0;
  const size_t value = HeaderValue(head, "content-length:");
  if (value == std::string_view::npos) return 0;
  size_t length = 0;
  for (size_t i = value; i < head.size() && std::isdigit(static_cast<unsigned char>(head[i]));
       ++i) {
    length = length * 10 + static_cast<size_t>(head[i] - '0');
    if (length > kMaxFilledReply) return 0;
  }
  return header_end + 4 + length;
}

// `reply`, one whole reply as SmallXmlReplySize measured it: with kFilledEtag in an empty
// CompleteMultipartUpload <ETag> and its Content-Length raised to match; unchanged otherwise.
std::string FillEmptyCompleteEtag(std::string reply) {
  const size_t empty = reply.find(kEmptyCompleteEtag);
  const size_t header_end = reply.find("\r\n\r\n");
  if (empty == std::string::npos || empty < header_end) return reply;
  reply.insert(empty + std::strlen("<ETag>"), kFilledEtag);
  const size_t value =
      HeaderValue(std::string_view(reply).substr(0, header_end + 2), "content-length:");
  size_t end = value;
  while (std::isdigit(static_cast<unsigned char>(reply[end]))) ++end;
  reply.replace(value, end - value, std::to_string(reply.size() - (header_end + 4)));
  return reply;
}

}  // namespace

class LatencyProxy::Impl {
 public:
  explicit Impl(LatencyProxyOptions options) : options_(std::move(options)) {}

  ~Impl() {
    for (auto& conn : conns_) {
      if (conn->live) CloseConn(*conn, /*abortive=*/true);
    }
    if (listen_fd_ >= 0) close(listen_fd_);
    if (signal_fd_ >= 0) close(signal_fd_);
    if (control_fd_ >= 0) close(control_fd_);
    if (epoll_fd_ >= 0) close(epoll_fd_);
    if (reserve_fd_ >= 0) close(reserve_fd_);
  }

  std::string Start() {
    std::string error;
    Address listen_addr;
    if (!ParseAddress(options_.listen, &listen_addr, &error)) return "--listen: " + error;
    if (!ParseAddress(options_.upstream, &upstream_, &error)) return "--upstream: " + error;
    if (!options_.allow_non_loopback && !listen_addr.loopback) {
      return "--listen " + options_.listen + " is not a loopback address (--allow-non-loopback)";
    }
    if (!options_.allow_non_loopback && !upstream_.loopback) {
      return "--upstream " + options_.upstream +
             " is not a loopback address (--allow-non-loopback)";
    }
    if (!(options_.delay_ms >= 0) || !(options_.bandwidth_mbps >= 0)) {
      return "--delay-ms and --bandwidth-mbps must be >= 0";
    }
    if (options_.max_buffer_bytes == 0 || options_.read_size == 0) {
      return "buffer sizes must be > 0";
    }
    delay_ns_ = static_cast<int64_t>(std::llround(options_.delay_ms * 1e6));
    delay_ms_ = options_.delay_ms;
    if (options_.bandwidth_mbps > 0) {
      for (auto& bucket : buckets_) {
        bucket.rate_bytes_per_ns = options_.bandwidth_mbps * 1e6 / 8 / 1e9;
        // 10 ms of line rate (at least 64 KiB) of burst; wake for >= 1 ms worth (>= 16 KiB).
        bucket.burst = std::max(65536.0, bucket.rate_bytes_per_ns * 10e6);
        bucket.quantum = std::min(bucket.burst, std::max(16384.0, bucket.rate_bytes_per_ns * 1e6));
        bucket.tokens = bucket.burst;
        bucket.last_ns = NowNs();
      }
      throttled_ = true;
    }

    // Thousands of connections need two descriptors each.
    rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
    // Kept to shed connections when descriptors run out (otherwise accept() fails forever).
    reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);

    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) return Errno("epoll_create1");

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    signal_fd_ = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (signal_fd_ < 0) return Errno("signalfd");
    epoll_event sev{};
    sev.events = EPOLLIN;
    sev.data.u64 = kSignalSlot;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, signal_fd_, &sev) < 0) return Errno("epoll_ctl");

    if (std::string e = Listen(listen_addr, options_.listen, 4096, EPOLLIN | EPOLLET, kListenerSlot,
                               &listen_fd_, &listen_address_);
        !e.empty()) {
      return e;
    }
    if (!options_.control.empty()) {
      Address control_addr;
      if (!ParseAddress(options_.control, &control_addr, &error)) return "--control: " + error;
      if (!options_.allow_non_loopback && !control_addr.loopback) {
        return "--control " + options_.control +
               " is not a loopback address (--allow-non-loopback)";
      }
      return Listen(control_addr, options_.control, 16, EPOLLIN, kControlSlot, &control_fd_,
                    &control_address_);
    }
    return "";
  }

  // A non-blocking listening socket on `addr` (spelt `text` in errors), registered with the
  // event loop under `slot`; its bound address goes to `bound`. "" or a one-line error.
  std::string Listen(const Address& addr, const std::string& text, int backlog, uint32_t events,
                     uint64_t slot, int* fd, std::string* bound) {
    *fd = socket(addr.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (*fd < 0) return Errno("socket");
    int one = 1;
    setsockopt(*fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(*fd, reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) < 0) {
      return Errno(("bind " + text).c_str());
    }
    if (listen(*fd, backlog) < 0) return Errno("listen");
    sockaddr_storage local{};
    socklen_t local_len = sizeof(local);
    getsockname(*fd, reinterpret_cast<sockaddr*>(&local), &local_len);
    *bound = FormatAddress(local);
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = slot;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, *fd, &ev) < 0) return Errno("epoll_ctl");
    return "";
  }

  const std::string& listen_address() const { return listen_address_; }
  const std::string& control_address() const { return control_address_; }
  const LatencyProxyStats& stats() const { return stats_; }

  std::string Run() {
    std::vector<epoll_event> events(kMaxEvents);
    bool use_pwait2 = true;
    while (!stopping_) {
      int64_t now = NowNs();
      RunDueWork(now);

      int64_t next = 0;  // 0: no deadline
      if (!timers_.empty()) next = timers_.top().due_ns;
      for (auto& bucket : buckets_) {
        if (bucket.wake_ns != 0 && (next == 0 || bucket.wake_ns < next)) next = bucket.wake_ns;
      }
      int64_t wait_ns = -1;
      if (!read_queue_.empty()) {
        wait_ns = 0;
      } else if (next != 0) {
        wait_ns = std::max<int64_t>(0, next - NowNs());
      }

      int n;
      if (use_pwait2) {
        timespec ts{static_cast<time_t>(wait_ns / 1'000'000'000),
                    static_cast<long>(wait_ns % 1'000'000'000)};
        n = epoll_pwait2(epoll_fd_, events.data(), kMaxEvents, wait_ns < 0 ? nullptr : &ts,
                         nullptr);
        if (n < 0 && errno == ENOSYS) {
          use_pwait2 = false;
          continue;
        }
      } else {
        // Rounded up: waking early only costs a loop; due times are re-checked anyway.
        int wait_ms = wait_ns < 0 ? -1 : static_cast<int>((wait_ns + 999'999) / 1'000'000);
        n = epoll_wait(epoll_fd_, events.data(), kMaxEvents, wait_ms);
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        return Errno("epoll_wait");
      }
      ++stats_.wakeups;
      now = NowNs();
      for (int i = 0; i < n; ++i) Dispatch(events[i], now);
    }
    for (auto& conn : conns_) {
      if (conn->live) CloseConn(*conn, /*abortive=*/true, /*count=*/false);
    }
    return WriteStats();
  }

 private:
  // ---- Event handling --------------------------------------------------------------------

  void Dispatch(const epoll_event& ev, int64_t now) {
    uint32_t slot = static_cast<uint32_t>(ev.data.u64);
    if (slot == kListenerSlot) return AcceptAll(now);
    if (slot == kControlSlot) return AcceptControl();
    if (slot == kSignalSlot) {
      signalfd_siginfo info;
      while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
      }
      stopping_ = true;
      return;
    }
    int side = static_cast<int>((ev.data.u64 >> 32) & 1);
    uint32_t gen = static_cast<uint32_t>(ev.data.u64 >> 33);
    if (slot >= conns_.size()) return;
    Conn& conn = *conns_[slot];
    // A stale event for a connection closed earlier in this batch (its slot may be reused).
    if (!conn.live || (conn.gen & kGenMask) != gen) return;
    uint32_t e = ev.events;

    if (side == 1 && conn.connecting) {
      if (!(e & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
      if (!FinishConnect(conn)) return;
    }
    // Writable socket `side` is the destination of the direction flowing toward it.
    if (e & (EPOLLOUT | EPOLLERR | EPOLLHUP)) {
      int out = side == 0 ? 1 : 0;
      conn.dir[out].dst_writable = true;
      Flush(conn, out, now);
      if (!conn.live) return;
    }
    if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
      Direction& in = conn.dir[side];
      in.src_readable = true;
      if (e & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) in.src_hup = true;
      ReadFrom(conn, side, now);
      if (!conn.live) return;
      // An error we cannot discover by reading (source already finished or paused).
      if ((e & EPOLLERR) && (in.src_done || in.buffered >= options_.max_buffer_bytes)) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(side == 0 ? conn.client : conn.upstream, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) CloseConn(conn, /*abortive=*/true);
      }
    }
  }

  // A control connection: its commands are read and answered at once. The client sends them
  // right after connecting, so waiting for them (at most 200 ms) is rare and short; the
  // relayed data's due times do not depend on this loop's timing.
  void AcceptControl() {
    for (;;) {
      int fd = accept4(control_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      std::string pending;
      char buf[256];
      for (;;) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 200) <= 0) break;
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        pending.append(buf, static_cast<size_t>(n));
        size_t eol;
        bool done = false;
        while ((eol = pending.find('\n')) != std::string::npos) {
          std::string line = pending.substr(0, eol);
          pending.erase(0, eol + 1);
          if (!line.empty() && line.back() == '\r') line.pop_back();
          std::string reply = ControlCommand(line) + "\n";
          if (send(fd, reply.data(), reply.size(), MSG_NOSIGNAL) < 0) done = true;
        }
        if (done || pending.size() > 4096) break;
      }
      close(fd);
    }
  }

  std::string ControlCommand(const std::string& line) {
    char state[64];
    if (line.rfind("delay ", 0) == 0) {
      char* end = nullptr;
      const double ms = std::strtod(line.c_str() + 6, &end);
      if (end == line.c_str() + 6 || *end != '\0' || !(ms >= 0) || ms > 1e6) {
        return "error: expected 'delay MS' with 0 <= MS <= 1000000";
      }
      delay_ms_ = ms;
      delay_ns_ = static_cast<int64_t>(std::llround(ms * 1e6));
    } else if (line != "get") {
      return "error: unknown command (expected 'delay MS' or 'get')";
    }
    std::snprintf(state, sizeof state, "ok delay_ms=%g", delay_ms_);
    return state;
  }

  void AcceptAll(int64_t now) {
    for (;;) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if ((errno == EMFILE || errno == ENFILE) && reserve_fd_ >= 0) {
          // Out of descriptors: accept and drop (RST) one pending connection so the client
          // learns at once, instead of the listener staying readable forever.
          std::fprintf(stderr, "wharf-latency-proxy: out of file descriptors; refusing\n");
          close(reserve_fd_);
          int victim = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
          if (victim >= 0) {
            SetAbortive(victim);
            close(victim);
          }
          reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
          if (victim < 0) return;
          continue;
        }
        std::fprintf(stderr, "wharf-latency-proxy: accept: %s\n", std::strerror(errno));
        return;
      }
      ++stats_.connections_accepted;
      SetNoDelay(fd);
      int up = socket(upstream_.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (up < 0) {
        ++stats_.upstream_connect_failures;
        SetAbortive(fd);
        close(fd);
        continue;
      }
      SetNoDelay(up);
      bool connected = false;
      if (connect(up, reinterpret_cast<sockaddr*>(&upstream_.storage), upstream_.len) == 0) {
        connected = true;
      } else if (errno != EINPROGRESS) {
        ++stats_.upstream_connect_failures;
        ++stats_.connections_reset;
        close(up);
        SetAbortive(fd);
        close(fd);
        continue;
      }

      uint32_t slot = AllocateSlot();
      Conn& conn = *conns_[slot];
      conn.live = true;
      conn.connecting = !connected;
      conn.upstream_ok = connected;
      conn.client = fd;
      conn.upstream = up;
      conn.dir[0].src = fd;
      conn.dir[0].dst = up;
      conn.dir[1].src = up;
      conn.dir[1].dst = fd;
      if (options_.simulate_handshake) conn.dir[0].not_before_ns = now + 2 * delay_ns_;
      ++active_;
      stats_.connections_peak = std::max<uint64_t>(stats_.connections_peak, active_);

      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
      ev.data.u64 = Tag(slot, conn.gen, 0);
      bool ok = epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) == 0;
      ev.data.u64 = Tag(slot, conn.gen, 1);
      ok = ok && epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, up, &ev) == 0;
      if (!ok) {
        std::fprintf(stderr, "wharf-latency-proxy: epoll_ctl: %s\n", std::strerror(errno));
        CloseConn(conn, /*abortive=*/true);
      }
    }
  }

  // Returns false if the connection failed (and was closed).
  bool FinishConnect(Conn& conn) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(conn.upstream, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
    conn.connecting = false;
    if (err != 0) {
      ++stats_.upstream_connect_failures;
      std::fprintf(stderr, "wharf-latency-proxy: connecting to %s: %s\n", options_.upstream.c_str(),
                   std::strerror(err));
      CloseConn(conn, /*abortive=*/true);
      return false;
    }
    conn.upstream_ok = true;
    return true;
  }

  // ---- Data path ---------------------------------------------------------------------------

  // Reads from the source of direction `d` while it has data and the buffer has room.
  void ReadFrom(Conn& conn, int d, int64_t now) {
    Direction& dir = conn.dir[d];
    int turns = kReadsPerTurn;
    bool ended = false;
    while (dir.src_readable && !dir.src_done && dir.buffered < options_.max_buffer_bytes) {
      if (turns-- == 0) {
        QueueRead(conn, d);
        break;
      }
      if (!read_buffer_) read_buffer_ = AllocateBuffer(options_.read_size);
      ssize_t n = recv(dir.src, read_buffer_.get(), options_.read_size, 0);
      if (n > 0) {
        // A short read drained the socket; edge-triggered epoll reports the next arrival. Not
        // after a hangup, whose EOF must still be read.
        if (static_cast<size_t>(n) < options_.read_size && !dir.src_hup) dir.src_readable = false;
        Deliver(conn, d, static_cast<size_t>(n), now);
        if (!conn.live) return;
        continue;
      }
      if (n < 0 && IsTransient(errno)) {
        if (errno != EINTR) dir.src_readable = false;
        continue;
      }
      // EOF (n == 0) or an error such as ECONNRESET: forward it after the data before it
      // (and after the start of a reply held for --fill-empty-complete-etag).
      if (d == 1 && !conn.held_reply.empty()) {
        const std::string held = std::move(conn.held_reply);
        conn.held_reply.clear();
        LoadReadBuffer(held);
        Deliver(conn, d, held.size(), now, /*may_hold=*/false);
        if (!conn.live) return;
      }
      dir.src_done = true;
      dir.end = n == 0 ? End::kFin : End::kRst;
      dir.end_due_ns = std::max(now, dir.not_before_ns) + delay_ns_;
      ended = true;
    }
    if (ended) {
      if (dir.end_due_ns > now) {
        PushTimer(dir.end_due_ns, conn, d);
      } else {
        Flush(conn, d, now);
      }
    }
  }

  // --fill-empty-complete-etag on the `size` bytes just read from the upstream into
  // read_buffer_ while a CompleteMultipartUpload reply is awaited: a small XML reply is
  // completed from what was held of it, held whole if it is still incomplete (0 returned),
  // and filled when it is whole. Returns the bytes of read_buffer_ to deliver.
  size_t FillEtags(Conn& conn, size_t size) {
    std::string_view data(read_buffer_.get(), size);
    std::string joined;
    if (!conn.held_reply.empty()) {
      joined = std::move(conn.held_reply);
      conn.held_reply.clear();
      joined.append(data);
      data = joined;
    }
    const size_t need = SmallXmlReplySize(data);
    if (need > data.size()) {
      conn.held_reply.assign(data);
      return 0;
    }
    conn.awaiting_complete = false;  // the reply passes now (filled or not)
    if (need == 0 && joined.empty()) return size;
    std::string out(data);
    if (need != 0) {
      std::string reply = FillEmptyCompleteEtag(out.substr(0, need));
      if (reply.size() != need) ++stats_.etags_filled;
      out.replace(0, need, reply);
    }
    LoadReadBuffer(out);
    return out.size();
  }

  // Puts `bytes` at the start of read_buffer_ (made larger when they do not fit), so that
  // Deliver hands them on as if just read.
  void LoadReadBuffer(std::string_view bytes) {
    if (!read_buffer_ || bytes.size() > options_.read_size) {
      read_buffer_ = AllocateBuffer(std::max(bytes.size(), options_.read_size));
    }
    std::memcpy(read_buffer_.get(), bytes.data(), bytes.size());
  }

  // Hands the `size` bytes just read into read_buffer_ to direction `d`.
  // `may_hold`: false for the last bytes before the upstream's end.
  void Deliver(Conn& conn, int d, size_t size, int64_t now, bool may_hold = true) {
    Direction& dir = conn.dir[d];
    if (options_.fill_empty_complete_etag) {
      if (d == 0) {
        const std::string_view data(read_buffer_.get(), size);
        const std::string_view line = data.substr(0, data.find("\r\n"));
        if (line.starts_with("POST ") && line.find("uploadId=") != std::string_view::npos) {
          conn.awaiting_complete = true;
        }
      } else if (conn.awaiting_complete && may_hold) {
        size = FillEtags(conn, size);
        if (size == 0) return;  // held until the rest of the reply arrives
      }
    }
    int64_t due = std::max(now, dir.not_before_ns) + delay_ns_;
    size_t written = 0;
    if (due <= now && dir.chunks.empty() && dir.dst_writable && !throttled_ &&
        (d == 1 || conn.upstream_ok)) {
      // Nothing to wait for: write straight from the read buffer and keep only the rest.
      ssize_t w = send(dir.dst, read_buffer_.get(), size, MSG_NOSIGNAL);
      if (w < 0) {
        if (!IsTransient(errno)) return CloseConn(conn, /*abortive=*/true);
        if (errno != EINTR) dir.dst_writable = false;
        w = 0;
      }
      CountWritten(d, static_cast<size_t>(w));
      written = static_cast<size_t>(w);
      if (written == size) return;  // read_buffer_ is reused for the next read
      // A short write on a non-blocking socket means it is full; EPOLLOUT will follow.
      if (w > 0) dir.dst_writable = false;
    }
    // The read buffer becomes the chunk, shrunk in place to what was read (glibc realloc does
    // not copy when shrinking), so delayed data is never copied in user space.
    char* data = static_cast<char*>(std::realloc(read_buffer_.release(), size));
    if (data == nullptr) std::abort();
    dir.chunks.push_back(
        Chunk{due, Buffer(data), static_cast<uint32_t>(size), static_cast<uint32_t>(written)});
    dir.buffered += size - written;
    if (due > now) {
      PushTimer(due, conn, d);
    } else {
      Flush(conn, d, now);
    }
  }

  // Writes every due chunk of direction `d` that the destination and the bandwidth cap accept,
  // then forwards the direction's end (FIN/RST) if it is due and nothing precedes it.
  void Flush(Conn& conn, int d, int64_t now) {
    Direction& dir = conn.dir[d];
    if (d == 0 && !conn.upstream_ok) return;  // still connecting
    TokenBucket* bucket = throttled_ ? &buckets_[d] : nullptr;
    while (dir.dst_writable && !dir.chunks.empty() && dir.chunks.front().due_ns <= now) {
      size_t allowance = SIZE_MAX;
      if (bucket != nullptr) {
        bucket->Refill(now);
        const Chunk& front = dir.chunks.front();
        double need = std::min<double>(front.size - front.offset, bucket->quantum);
        if (bucket->tokens < need) {
          Throttle(*bucket, conn, d, now, need);
          break;
        }
        allowance = static_cast<size_t>(bucket->tokens);
      }
      iovec iov[kMaxIov];
      int count = 0;
      size_t total = 0;
      for (const Chunk& c : dir.chunks) {
        if (count == kMaxIov || c.due_ns > now || total >= allowance) break;
        size_t len = std::min<size_t>(c.size - c.offset, allowance - total);
        iov[count++] = iovec{c.data.get() + c.offset, len};
        total += len;
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(count);
      ssize_t w = sendmsg(dir.dst, &msg, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          dir.dst_writable = false;
          break;
        }
        return CloseConn(conn, /*abortive=*/true);
      }
      if (bucket != nullptr) bucket->tokens -= static_cast<double>(w);
      CountWritten(d, static_cast<size_t>(w));
      dir.buffered -= static_cast<size_t>(w);
      size_t left = static_cast<size_t>(w);
      while (left > 0) {
        Chunk& c = dir.chunks.front();
        size_t rest = c.size - c.offset;
        if (left >= rest) {
          left -= rest;
          dir.chunks.pop_front();
        } else {
          c.offset += static_cast<uint32_t>(left);
          left = 0;
        }
      }
      // A short write on a non-blocking socket means it is full; EPOLLOUT will follow.
      if (static_cast<size_t>(w) < total) dir.dst_writable = false;
    }
    // Resume a source paused on a full buffer once half of it has drained.
    if (dir.src_readable && !dir.src_done && dir.buffered <= options_.max_buffer_bytes / 2) {
      QueueRead(conn, d);
    }
    if (dir.chunks.empty() && dir.end != End::kNone && !dir.end_sent && dir.end_due_ns <= now) {
      if (dir.end == End::kRst) return CloseConn(conn, /*abortive=*/true);
      shutdown(dir.dst, SHUT_WR);
      dir.end_sent = true;
      if (conn.dir[1 - d].end_sent) CloseConn(conn, /*abortive=*/false);
    }
  }

  void CountWritten(int d, size_t n) {
    if (d == 0) {
      stats_.bytes_client_to_upstream += n;
    } else {
      stats_.bytes_upstream_to_client += n;
    }
  }

  // ---- Scheduling --------------------------------------------------------------------------

  void PushTimer(int64_t due, const Conn& conn, int d) {
    timers_.push(TimerEntry{due, Ref{SlotOf(conn), conn.gen, static_cast<uint8_t>(d)}});
  }

  void QueueRead(Conn& conn, int d) {
    Direction& dir = conn.dir[d];
    if (dir.in_read_queue) return;
    dir.in_read_queue = true;
    read_queue_.push_back(Ref{SlotOf(conn), conn.gen, static_cast<uint8_t>(d)});
  }

  void Throttle(TokenBucket& bucket, Conn& conn, int d, int64_t now, double need) {
    Direction& dir = conn.dir[d];
    int64_t wake =
        now + static_cast<int64_t>(std::ceil((need - bucket.tokens) / bucket.rate_bytes_per_ns));
    if (bucket.wake_ns == 0 || wake < bucket.wake_ns) bucket.wake_ns = wake;
    if (dir.in_throttle_queue) return;
    dir.in_throttle_queue = true;
    bucket.waiting.push_back(Ref{SlotOf(conn), conn.gen, static_cast<uint8_t>(d)});
  }

  Conn* Lookup(const Ref& ref) {
    if (ref.slot >= conns_.size()) return nullptr;
    Conn* conn = conns_[ref.slot].get();
    return conn->live && conn->gen == ref.gen ? conn : nullptr;
  }

  void RunDueWork(int64_t now) {
    while (!timers_.empty() && timers_.top().due_ns <= now) {
      Ref ref = timers_.top().ref;
      timers_.pop();
      if (Conn* conn = Lookup(ref)) Flush(*conn, ref.dir, now);
    }
    for (auto& bucket : buckets_) {
      if (bucket.wake_ns == 0 || bucket.wake_ns > now) continue;
      bucket.wake_ns = 0;
      // Only those waiting now; a direction that throttles again goes to the back (round robin).
      for (size_t k = bucket.waiting.size(); k > 0; --k) {
        Ref ref = bucket.waiting.front();
        bucket.waiting.pop_front();
        if (Conn* conn = Lookup(ref)) {
          conn->dir[ref.dir].in_throttle_queue = false;
          Flush(*conn, ref.dir, now);
        }
      }
    }
    if (!read_queue_.empty()) {
      std::vector<Ref> queue;
      queue.swap(read_queue_);
      for (const Ref& ref : queue) {
        if (Conn* conn = Lookup(ref)) {
          conn->dir[ref.dir].in_read_queue = false;
          ReadFrom(*conn, ref.dir, now);
        }
      }
    }
  }

  // ---- Connection slots --------------------------------------------------------------------

  static uint32_t SlotOf(const Conn& conn) { return conn.slot; }

  uint32_t AllocateSlot() {
    if (!free_slots_.empty()) {
      uint32_t slot = free_slots_.back();
      free_slots_.pop_back();
      return slot;
    }
    conns_.push_back(std::make_unique<Conn>());
    uint32_t slot = static_cast<uint32_t>(conns_.size() - 1);
    conns_.back()->slot = slot;
    return slot;
  }

  void CloseConn(Conn& conn, bool abortive, bool count = true) {
    if (!conn.live) return;
    if (abortive && count) ++stats_.connections_reset;
    for (int fd : {conn.client, conn.upstream}) {
      if (fd < 0) continue;
      if (abortive) SetAbortive(fd);
      close(fd);  // also removes it from the epoll set
    }
    uint32_t slot = conn.slot;
    uint32_t next_gen = (conn.gen + 1) & kGenMask;
    conn = Conn{};  // frees the buffers
    conn.slot = slot;
    conn.gen = next_gen;
    free_slots_.push_back(slot);
    --active_;
  }

  std::string WriteStats() {
    const std::pair<const char*, uint64_t> counters[] = {
        {"connections_accepted", stats_.connections_accepted},
        {"connections_peak", stats_.connections_peak},
        {"connections_reset", stats_.connections_reset},
        {"upstream_connect_failures", stats_.upstream_connect_failures},
        {"bytes_client_to_upstream", stats_.bytes_client_to_upstream},
        {"bytes_upstream_to_client", stats_.bytes_upstream_to_client},
        {"wakeups", stats_.wakeups},
        {"etags_filled", stats_.etags_filled}};
    std::fprintf(stderr,
                 "wharf-latency-proxy: %llu connections (peak %llu, %llu reset, %llu upstream "
                 "connect failures), %llu bytes to upstream, %llu bytes to clients, %llu "
                 "wakeups\n",
                 static_cast<unsigned long long>(counters[0].second),
                 static_cast<unsigned long long>(counters[1].second),
                 static_cast<unsigned long long>(counters[2].second),
                 static_cast<unsigned long long>(counters[3].second),
                 static_cast<unsigned long long>(counters[4].second),
                 static_cast<unsigned long long>(counters[5].second),
                 static_cast<unsigned long long>(counters[6].second));
    if (options_.stats_file.empty()) return "";
    std::string json = "{";
    for (const auto& [name, value] : counters) {
      json += "\"" + std::string(name) + "\": " + std::to_string(value) + ", ";
    }
    char tail[96];
    std::snprintf(tail, sizeof tail, "\"delay_ms\": %g, \"bandwidth_mbps\": %g}\n", delay_ms_,
                  options_.bandwidth_mbps);
    json += tail;
    FILE* f = std::fopen(options_.stats_file.c_str(), "w");
    if (f == nullptr) return Errno(("writing stats file " + options_.stats_file).c_str());
    const bool written = std::fwrite(json.data(), 1, json.size(), f) == json.size();
    if (std::fclose(f) != 0 || !written) {
      return Errno(("writing stats file " + options_.stats_file).c_str());
    }
    return "";
  }

  const LatencyProxyOptions options_;
  Address upstream_;
  std::string listen_address_;
  std::string control_address_;
  int64_t delay_ns_ = 0;
  double delay_ms_ = 0;  // as set last (--delay-ms or a control command)
  bool throttled_ = false;
  TokenBucket buckets_[2];

  int epoll_fd_ = -1;
  int listen_fd_ = -1;
  int signal_fd_ = -1;
  int control_fd_ = -1;
  int reserve_fd_ = -1;
  bool stopping_ = false;
  Buffer read_buffer_;  // the next recv() goes here; handed over to a chunk when kept

  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<uint32_t> free_slots_;
  uint64_t active_ = 0;
  std::priority_queue<TimerEntry, std::vector<TimerEntry>, std::greater<TimerEntry>> timers_;
  std::vector<Ref> read_queue_;
  LatencyProxyStats stats_;
};

LatencyProxy::LatencyProxy(LatencyProxyOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
LatencyProxy::~LatencyProxy() = default;
std::string LatencyProxy::Start() { return impl_->Start(); }
std::string LatencyProxy::listen_address() const { return impl_->listen_address(); }
std::string LatencyProxy::control_address() const { return impl_->control_address(); }
std::string LatencyProxy::Run() { return impl_->Run(); }
const LatencyProxyStats& LatencyProxy::stats() const { return impl_->stats(); }

}  // namespace wharf::tools
