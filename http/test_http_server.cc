#include "http/test_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"

namespace wharf::http_testing {
namespace {

bool SendAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string Head(int status, uint64_t content_length, absl::string_view extra = "") {
  return absl::StrCat("HTTP/1.1 ", status, " X\r\nContent-Length: ", content_length, "\r\n", extra,
                      "\r\n");
}

}  // namespace

char PatternByte(uint64_t i) { return static_cast<char>('a' + (i + i / 1000) % 26); }

std::string PatternBytes(uint64_t n) {
  std::string out(n, '\0');
  for (uint64_t i = 0; i < n; ++i) out[i] = PatternByte(i);
  return out;
}

TestHttpServer::TestHttpServer() {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) std::abort();
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listen_fd_, 1024) != 0) {
    std::abort();
  }
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

TestHttpServer::~TestHttpServer() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // Unblocks accept() and every recv()/send(); the threads close their own fds.
    shutdown(listen_fd_, SHUT_RDWR);
    for (int fd : open_fds_) shutdown(fd, SHUT_RDWR);
  }
  accept_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    threads.swap(connection_threads_);
  }
  for (std::thread& thread : threads) thread.join();
  close(listen_fd_);
}

std::string TestHttpServer::Url(absl::string_view path) const {
  return absl::StrCat("http://127.0.0.1:", port_, path);
}

void TestHttpServer::AcceptLoop() {
  while (true) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      if (fd >= 0) close(fd);
      return;
    }
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    accepted_.fetch_add(1);
    open_fds_.insert(fd);
    connection_threads_.emplace_back([this, fd] { ServeConnection(fd); });
  }
}

void TestHttpServer::CloseConnection(int fd, bool reset) {
  absl::MutexLock lock(&mu_);
  open_fds_.erase(fd);
  if (reset) {
    linger hard = {1, 0};  // close() then sends RST instead of FIN
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
  }
  close(fd);
}

bool TestHttpServer::SleepUnlessStopped(int ms) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(ms));
  return !stopping_;
}

void TestHttpServer::ServeConnection(int fd) {
  std::string in;
  char buf[65536];
  bool closed = false;
  while (!closed) {
    size_t end;
    while ((end = in.find("\r\n\r\n")) == std::string::npos) {
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        CloseConnection(fd, false);
        return;
      }
      in.append(buf, static_cast<size_t>(n));
    }
    std::vector<absl::string_view> lines =
        absl::StrSplit(absl::string_view(in).substr(0, end), "\r\n");
    std::vector<absl::string_view> request_line = absl::StrSplit(lines[0], ' ');
    if (request_line.size() < 2) break;
    std::string method(request_line[0]);
    std::string path(request_line[1]);
    std::vector<std::pair<std::string, std::string>> headers;
    uint64_t content_length = 0;
    bool keep_alive = true;
    for (size_t i = 1; i < lines.size(); ++i) {
      size_t colon = lines[i].find(':');
      if (colon == absl::string_view::npos) continue;
      std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
      std::string value(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
      if (name == "content-length") (void)absl::SimpleAtoi(value, &content_length);
      if (name == "connection" && absl::EqualsIgnoreCase(value, "close")) keep_alive = false;
      headers.emplace_back(std::move(name), std::move(value));
    }
    in.erase(0, end + 4);
    while (in.size() < content_length) {
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        CloseConnection(fd, false);
        return;
      }
      in.append(buf, static_cast<size_t>(n));
    }
    std::string body = in.substr(0, content_length);
    in.erase(0, content_length);
    requests_.fetch_add(1);
    if (!Respond(fd, method, path, headers, body, &closed) || !keep_alive) break;
  }
  if (!closed) CloseConnection(fd, false);
}

bool TestHttpServer::Respond(int fd, absl::string_view method, absl::string_view path,
                             const std::vector<std::pair<std::string, std::string>>& headers,
                             const std::string& body, bool* closed) {
  uint64_t n = 0;
  if (path == "/ok") {
    return SendAll(fd, absl::StrCat(Head(200, 11,
                                         "Content-Type: text/plain\r\n"
                                         "X-Padded:   spaced  \r\n"),
                                    "hello world"));
  }
  if (absl::ConsumePrefix(&path, "/bytes/") && absl::SimpleAtoi(path, &n)) {
    std::string response = Head(200, n);
    if (method != "HEAD") response += PatternBytes(n);
    return SendAll(fd, response);
  }
  if (absl::ConsumePrefix(&path, "/chunked/") && absl::SimpleAtoi(path, &n)) {
    std::string response = "HTTP/1.1 200 X\r\nTransfer-Encoding: chunked\r\n\r\n";
    std::string data = PatternBytes(n);
    for (uint64_t offset = 0; offset < n; offset += 1000) {
      absl::string_view piece = absl::string_view(data).substr(offset, 1000);
      absl::StrAppend(&response, absl::Hex(piece.size()), "\r\n", piece, "\r\n");
    }
    response += "0\r\n\r\n";
    return SendAll(fd, response);
  }
  if (absl::ConsumePrefix(&path, "/slow/") && absl::SimpleAtoi(path, &n)) {
    if (!SleepUnlessStopped(static_cast<int>(n))) return false;
    return SendAll(fd, absl::StrCat(Head(200, 4), "slow"));
  }
  if (path == "/hang") {
    SleepUnlessStopped(1000 * 1000);
    return false;
  }
  if (absl::ConsumePrefix(&path, "/reset/") && absl::SimpleAtoi(path, &n)) {
    SendAll(fd, absl::StrCat(Head(200, 2 * n), PatternBytes(n)));
    // Lets the client read what was sent before the RST arrives, so what it received is
    // deterministic.
    SleepUnlessStopped(100);
    CloseConnection(fd, /*reset=*/true);
    *closed = true;
    return false;
  }
  if (path == "/short") {
    SendAll(fd, absl::StrCat(Head(200, 100), PatternBytes(50)));
    shutdown(fd, SHUT_WR);
    return false;
  }
  int code = 0;
  if (absl::ConsumePrefix(&path, "/status/") && absl::SimpleAtoi(path, &code)) {
    return SendAll(
        fd,
        absl::StrCat(Head(code, kErrorXml.size(), "Content-Type: application/xml\r\n"), kErrorXml));
  }
  if (path == "/big-error") {
    return SendAll(fd, absl::StrCat(Head(500, 2 << 20), std::string(2 << 20, 'e')));
  }
  if (path == "/echo") {
    std::string extra = absl::StrCat("echo-method: ", method, "\r\n");
    for (const auto& [name, value] : headers) {
      absl::StrAppend(&extra, "echo-", name, ": ", value, "\r\n");
    }
    return SendAll(fd, absl::StrCat(Head(200, body.size(), extra), body));
  }
  return SendAll(fd, Head(404, 0));
}

}  // namespace wharf::http_testing
