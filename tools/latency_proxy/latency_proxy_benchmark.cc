// Measures what wharf-latency-proxy costs: the same workloads run directly against a built-in
// server and through the proxy, reporting throughput, request rate, latency and the proxy's CPU.
//
//   wharf-latency-proxy-benchmark --proxy build/tools/latency_proxy/wharf-latency-proxy
//       [--delay-ms 0] [--connections 64] [--response-kib 100] [--seconds 5] [--rate 2000]
//       [--bulk-mib 1024] [--json PATH] [--proxy-arg ARG]...
//
// Workloads: "bulk" streams --bulk-mib over one connection (a large GET); "rr" runs
// --connections connections each doing request (128 B) / response (--response-kib) in a closed
// loop (small GETs over keep-alive); "rr-paced" is rr held to --rate requests/s, to read the
// proxy's CPU at a fixed load. Server and client are one thread each in this process, so on a
// 2-core machine the proxied runs share the cores three ways: compare CPU seconds, not only rates.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kRequestSize = 128;
constexpr size_t kIoSize = 256 << 10;

double NowS() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "wharf-latency-proxy-benchmark: %s: %s\n", what.c_str(),
               std::strerror(errno));
  std::exit(1);
}

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// ---- Server: answers each 128-byte request (first 8 bytes = response size) with that many bytes.

class Server {
 public:
  Server() {
    // CLOEXEC throughout: the proxy is forked from this process and must not keep these open.
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) Die("bind");
    if (listen(listen_fd_, 4096) < 0) Die("listen");
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    payload_.assign(kIoSize, 'x');
    thread_ = std::thread([this] { Loop(); });
  }
  ~Server() {
    stop_ = true;
    thread_.join();
    close(listen_fd_);
  }
  int port() const { return port_; }

 private:
  struct Conn {
    int fd;
    size_t have = 0;         // request bytes read
    uint64_t remaining = 0;  // response bytes still to write
    char request[kRequestSize] = {};
  };

  void Loop() {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    epoll_ctl(ep, EPOLL_CTL_ADD, listen_fd_, &ev);
    std::vector<epoll_event> events(256);
    while (!stop_) {
      int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), 50);
      for (int i = 0; i < n; ++i) {
        auto* c = static_cast<Conn*>(events[i].data.ptr);
        if (c == nullptr) {
          int fd;
          while ((fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
            NoDelay(fd);
            auto* nc = new Conn{fd};
            epoll_event cev{};
            cev.events = EPOLLIN;
            cev.data.ptr = nc;
            epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
          }
          continue;
        }
        if (!Serve(ep, c)) {
          epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, nullptr);
          close(c->fd);
          delete c;
        }
      }
    }
    close(ep);
  }

  // Level-triggered: reads a request, then writes the response, switching interest as needed.
  bool Serve(int ep, Conn* c) {
    for (;;) {
      if (c->remaining > 0) {
        ssize_t w =
            send(c->fd, payload_.data(), std::min<uint64_t>(c->remaining, kIoSize), MSG_NOSIGNAL);
        if (w < 0) {
          if (errno != EAGAIN) return false;
          epoll_event ev{};
          ev.events = EPOLLOUT;
          ev.data.ptr = c;
          epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
          return true;
        }
        c->remaining -= static_cast<uint64_t>(w);
        if (c->remaining == 0) {
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.ptr = c;
          epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        }
        continue;
      }
      ssize_t r = recv(c->fd, c->request + c->have, kRequestSize - c->have, 0);
      if (r == 0) return false;
      if (r < 0) return errno == EAGAIN;
      c->have += static_cast<size_t>(r);
      if (c->have == kRequestSize) {
        std::memcpy(&c->remaining, c->request, sizeof(c->remaining));
        c->have = 0;
      }
    }
  }

  int listen_fd_;
  int port_;
  std::string payload_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---- Proxy process -------------------------------------------------------------------------

struct Proxy {
  pid_t pid = -1;
  int port = 0;
};

Proxy StartProxy(const std::string& binary, int upstream_port, double delay_ms,
                 const std::vector<std::string>& extra_args) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) < 0) Die("pipe");
  pid_t pid = fork();
  if (pid < 0) Die("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive the benchmark
    dup2(pipefd[1], 1);                // dup2 clears CLOEXEC on the copy
    std::vector<std::string> args = {binary,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--upstream",
                                     "127.0.0.1:" + std::to_string(upstream_port),
                                     "--delay-ms",
                                     std::to_string(delay_ms)};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(pipefd[1]);
  std::string line;
  char ch;
  while (read(pipefd[0], &ch, 1) == 1 && ch != '\n') line += ch;
  close(pipefd[0]);
  size_t colon = line.rfind(':');
  if (line.rfind("listening on ", 0) != 0 || colon == std::string::npos) {
    std::fprintf(stderr, "proxy did not start (got '%s')\n", line.c_str());
    std::exit(1);
  }
  return Proxy{pid, std::atoi(line.c_str() + colon + 1)};
}

void StopProxy(const Proxy& proxy) {
  kill(proxy.pid, SIGTERM);
  int status;
  waitpid(proxy.pid, &status, 0);
}

// User+system CPU seconds of a process, from /proc/PID/stat.
double ProcessCpuS(pid_t pid) {
  if (pid < 0) return 0;
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return 0;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // fields after the command name
  if (p == nullptr) return 0;
  unsigned long utime = 0, stime = 0;
  // Fields 3..15 after ')': state ppid pgrp session tty tpgid flags minflt cminflt majflt
  // cmajflt utime stime.
  std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime);
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double SelfCpuS() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

// ---- Client --------------------------------------------------------------------------------

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) Die("connect");
  NoDelay(fd);
  return fd;
}

void SendRequest(int fd, uint64_t response_size) {
  char request[kRequestSize] = {};
  std::memcpy(request, &response_size, sizeof(response_size));
  if (send(fd, request, sizeof(request), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(request))) {
    Die("send request");
  }
}

struct Result {
  std::string workload;
  std::string path;
  double seconds = 0;
  double requests = 0;
  double bytes = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  double proxy_cpu_s = 0;
  double self_cpu_s = 0;
};

Result Bulk(int port, uint64_t bytes, pid_t proxy_pid) {
  int fd = Connect(port);
  std::vector<char> buf(kIoSize);
  double cpu0 = ProcessCpuS(proxy_pid), self0 = SelfCpuS(), t0 = NowS();
  SendRequest(fd, bytes);
  uint64_t got = 0;
  while (got < bytes) {
    ssize_t r = recv(fd, buf.data(), buf.size(), 0);
    if (r <= 0) Die("bulk recv");
    got += static_cast<uint64_t>(r);
  }
  Result res;
  res.seconds = NowS() - t0;
  res.proxy_cpu_s = ProcessCpuS(proxy_pid) - cpu0;
  res.self_cpu_s = SelfCpuS() - self0;
  res.workload = "bulk";
  res.bytes = static_cast<double>(bytes);
  close(fd);
  return res;
}

// Closed-loop request/response on `connections` connections; with rate > 0, request k is not
// sent before start + k / rate.
Result RequestResponse(int port, int connections, uint64_t response_size, double seconds,
                       double rate, pid_t proxy_pid) {
  struct C {
    int fd;
    uint64_t want = 0;
    double sent_at = 0;
    bool waiting_slot = false;
  };
  int ep = epoll_create1(EPOLL_CLOEXEC);
  std::vector<C> conns(static_cast<size_t>(connections));
  for (size_t i = 0; i < conns.size(); ++i) {
    conns[i].fd = Connect(port);
    fcntl(conns[i].fd, F_SETFL, O_NONBLOCK);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = i;
    epoll_ctl(ep, EPOLL_CTL_ADD, conns[i].fd, &ev);
  }
  std::vector<char> buf(kIoSize);
  std::vector<double> latencies;
  latencies.reserve(1 << 20);
  std::vector<size_t> idle;  // connections waiting for a pacing slot
  uint64_t issued = 0;
  double cpu0 = ProcessCpuS(proxy_pid), self0 = SelfCpuS();
  double t0 = NowS(), end = t0 + seconds;
  auto issue = [&](size_t i, double now) {
    if (rate > 0 && now < t0 + static_cast<double>(issued) / rate) {
      idle.push_back(i);
      return;
    }
    ++issued;
    conns[i].want = response_size;
    conns[i].sent_at = now;
    SendRequest(conns[i].fd, response_size);
  };
  for (size_t i = 0; i < conns.size(); ++i) issue(i, NowS());
  std::vector<epoll_event> events(1024);
  double now = NowS();
  while (now < end) {
    double wait_s = 0.1;
    if (!idle.empty()) {
      wait_s = std::clamp(t0 + static_cast<double>(issued) / rate - now, 0.0, 0.1);
    }
    // Nanosecond timeout: pacing at 2,000/s with millisecond timeouts would spin or burst.
    timespec ts{0, static_cast<long>(wait_s * 1e9)};
    int n = epoll_pwait2(ep, events.data(), static_cast<int>(events.size()), &ts, nullptr);
    now = NowS();
    for (int k = 0; k < n; ++k) {
      C& c = conns[events[k].data.u64];
      for (;;) {
        ssize_t r = recv(c.fd, buf.data(), std::min<uint64_t>(buf.size(), c.want), 0);
        if (r < 0 && errno == EAGAIN) break;
        if (r <= 0) Die("rr recv");
        c.want -= static_cast<uint64_t>(r);
        if (c.want == 0) {
          latencies.push_back(now - c.sent_at);
          if (now < end) issue(events[k].data.u64, now);
          break;
        }
      }
    }
    while (!idle.empty() && now >= t0 + static_cast<double>(issued) / rate && now < end) {
      size_t i = idle.back();
      idle.pop_back();
      issue(i, now);
    }
  }
  Result res;
  res.seconds = NowS() - t0;
  res.proxy_cpu_s = ProcessCpuS(proxy_pid) - cpu0;
  res.self_cpu_s = SelfCpuS() - self0;
  res.workload = rate > 0 ? "rr-paced" : "rr";
  res.requests = static_cast<double>(latencies.size());
  res.bytes = res.requests * static_cast<double>(response_size);
  std::sort(latencies.begin(), latencies.end());
  if (!latencies.empty()) {
    res.p50_ms = latencies[latencies.size() / 2] * 1e3;
    res.p99_ms = latencies[latencies.size() * 99 / 100] * 1e3;
  }
  for (C& c : conns) close(c.fd);
  close(ep);
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  std::string proxy_binary, json_path;
  std::vector<std::string> proxy_args;
  double delay_ms = 0, seconds = 5, rate = 2000;
  int connections = 64;
  uint64_t response_kib = 100, bulk_mib = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string arg = argv[i];
    const char* v = argv[i + 1];
    if (arg == "--proxy") {
      proxy_binary = v;
    } else if (arg == "--delay-ms") {
      delay_ms = std::atof(v);
    } else if (arg == "--connections") {
      connections = std::atoi(v);
    } else if (arg == "--response-kib") {
      response_kib = std::strtoull(v, nullptr, 10);
    } else if (arg == "--seconds") {
      seconds = std::atof(v);
    } else if (arg == "--rate") {
      rate = std::atof(v);
    } else if (arg == "--bulk-mib") {
      bulk_mib = std::strtoull(v, nullptr, 10);
    } else if (arg == "--json") {
      json_path = v;
    } else if (arg == "--proxy-arg") {
      proxy_args.push_back(v);
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 1;
    }
  }
  if (proxy_binary.empty()) {
    std::fprintf(stderr,
                 "usage: %s --proxy PATH [--delay-ms D] [--connections N] "
                 "[--response-kib K] [--seconds S] [--rate R] [--bulk-mib M] [--json PATH] "
                 "[--proxy-arg ARG]...\n",
                 argv[0]);
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  Server server;
  std::vector<Result> results;
  for (const char* path : {"direct", "proxy"}) {
    bool proxied = std::strcmp(path, "proxy") == 0;
    Proxy proxy;
    int port = server.port();
    if (proxied) {
      proxy = StartProxy(proxy_binary, server.port(), delay_ms, proxy_args);
      port = proxy.port;
    }
    std::vector<Result> run;
    if (bulk_mib > 0) run.push_back(Bulk(port, bulk_mib << 20, proxy.pid));
    run.push_back(RequestResponse(port, connections, response_kib << 10, seconds, 0, proxy.pid));
    if (rate > 0) {
      run.push_back(
          RequestResponse(port, connections, response_kib << 10, seconds, rate, proxy.pid));
    }
    if (proxied) StopProxy(proxy);
    for (Result& r : run) {
      r.path = path;
      results.push_back(r);
    }
  }

  std::printf("delay %.1f ms, %d connections, %llu KiB responses, %u cores\n", delay_ms,
              connections, static_cast<unsigned long long>(response_kib),
              std::thread::hardware_concurrency());
  std::printf("%-9s %-7s %9s %10s %9s %9s %9s %11s %10s\n", "workload", "path", "seconds", "MB/s",
              "req/s", "p50 ms", "p99 ms", "proxy CPU%", "bench CPU%");
  for (const Result& r : results) {
    std::printf("%-9s %-7s %9.2f %10.1f %9.0f %9.2f %9.2f %11.1f %10.1f\n", r.workload.c_str(),
                r.path.c_str(), r.seconds, r.bytes / r.seconds / 1e6, r.requests / r.seconds,
                r.p50_ms, r.p99_ms, 100 * r.proxy_cpu_s / r.seconds,
                100 * r.self_cpu_s / r.seconds);
  }
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr) Die("open " + json_path);
    std::fprintf(f,
                 "{\"delay_ms\": %g, \"connections\": %d, \"response_kib\": %llu, "
                 "\"results\": [",
                 delay_ms, connections, static_cast<unsigned long long>(response_kib));
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(f,
                   "%s{\"workload\": \"%s\", \"path\": \"%s\", \"seconds\": %.4f, "
                   "\"mb_per_s\": %.2f, \"requests_per_s\": %.1f, \"p50_ms\": %.3f, "
                   "\"p99_ms\": %.3f, \"proxy_cpu_percent\": %.1f, \"bench_cpu_percent\": %.1f}",
                   i ? ", " : "", r.workload.c_str(), r.path.c_str(), r.seconds,
                   r.bytes / r.seconds / 1e6, r.requests / r.seconds, r.p50_ms, r.p99_ms,
                   100 * r.proxy_cpu_s / r.seconds, 100 * r.self_cpu_s / r.seconds);
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return 0;
}
