// TestHttpServer: a tiny scripted HTTP/1.1 server on 127.0.0.1 (ephemeral port) for the
// transport's tests and benchmark. One thread accepts; one thread per connection serves
// keep-alive requests in order. Routes (any method unless noted):
//   /ok              200 "hello world", Content-Type: text/plain, X-Padded: "  spaced  "
//   /bytes/<n>       200 with n bytes of PatternBytes(n) (HEAD: headers only)
//   /chunked/<n>     200 with the same n bytes, chunked (no Content-Length)
//   /slow/<ms>       waits <ms> milliseconds, then 200 "slow"
//   /hang            never answers (until the server stops)
//   /reset/<n>       Content-Length 2n, sends n bytes, waits 100 ms, closes with RST
//   /short           Content-Length 100, sends 50 bytes, closes with FIN
//   /status/<code>   <code> with an S3-style XML error body (kErrorXml)
//   /big-error       500 with a 2 MiB body
//   /echo            200 echoing the request body; the method as "echo-method", each
//                    request header as "echo-<lowercased name>"
// Anything else is 404.
//
// Thread-safety: all methods may be called from any thread. The destructor unblocks and
// joins every server thread (hanging and slow requests included).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace wharf::http_testing {

inline constexpr absl::string_view kErrorXml =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";

// Deterministic content: byte i is 'a' + i % 26 ... with a twist every 1000 bytes so that
// misplaced chunks are caught.
char PatternByte(uint64_t i);
std::string PatternBytes(uint64_t n);

class TestHttpServer {
 public:
  TestHttpServer();
  ~TestHttpServer();
  TestHttpServer(const TestHttpServer&) = delete;
  TestHttpServer& operator=(const TestHttpServer&) = delete;

  int port() const { return port_; }
  // "http://127.0.0.1:<port><path>".
  std::string Url(absl::string_view path) const;

  int connections_accepted() const { return accepted_.load(); }
  int requests_served() const { return requests_.load(); }

 private:
  void AcceptLoop();
  void ServeConnection(int fd);
  // Handles one parsed request; returns false when the connection must close (after any
  // special close the route did itself, in which case *closed is set).
  bool Respond(int fd, absl::string_view method, absl::string_view path,
               const std::vector<std::pair<std::string, std::string>>& headers,
               const std::string& body, bool* closed);
  // Sleeps up to `ms` unless the server stops first; returns false if it stopped.
  bool SleepUnlessStopped(int ms);
  // Closes `fd` unless the destructor already did, forgetting it.
  void CloseConnection(int fd, bool reset);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<int> accepted_{0};
  std::atomic<int> requests_{0};

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<int> open_fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> connection_threads_ ABSL_GUARDED_BY(mu_);
  std::thread accept_thread_;
};

}  // namespace wharf::http_testing
