#include "http/curl_transport.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "http/test_http_server.h"

namespace wharf {
namespace {

using ::testing::HasSubstr;
using ::wharf::http_testing::kErrorXml;
using ::wharf::http_testing::PatternBytes;
using ::wharf::http_testing::TestHttpServer;

HttpRequest Request(std::string method, std::string url) {
  HttpRequest request;
  request.method = std::move(method);
  request.url = std::move(url);
  return request;
}

absl::StatusOr<HttpResponse> SendAndWait(HttpTransport& transport, HttpRequest request) {
  absl::Notification done;
  std::optional<absl::StatusOr<HttpResponse>> result;
  transport.Send(std::move(request), [&](absl::StatusOr<HttpResponse> response) {
    result.emplace(std::move(response));
    done.Notify();
  });
  done.WaitForNotification();
  return *std::move(result);
}

// Collects the results of many requests sent at once.
class Results {
 public:
  HttpCallback Callback(size_t index) {
    {
      absl::MutexLock lock(&mu_);
      if (results_.size() <= index) results_.resize(index + 1);
      ++outstanding_;
    }
    return [this, index](absl::StatusOr<HttpResponse> response) {
      absl::MutexLock lock(&mu_);
      results_[index].emplace(std::move(response));
      --outstanding_;
    };
  }
  std::vector<std::optional<absl::StatusOr<HttpResponse>>> Wait() {
    absl::MutexLock lock(&mu_);
    auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return outstanding_ == 0; };
    mu_.Await(absl::Condition(&all_done));
    return std::move(results_);
  }

 private:
  absl::Mutex mu_;
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::optional<absl::StatusOr<HttpResponse>>> results_ ABSL_GUARDED_BY(mu_);
};

// A TCP socket bound to a free loopback port (its number in *port); -1 on failure.
int BoundLoopbackSocket(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

class CurlTransportTest : public ::testing::Test {
 protected:
  TestHttpServer server_;
  std::unique_ptr<HttpTransport> transport_ = NewCurlTransport();
};

TEST_F(CurlTransportTest, GetIntoString) {
  absl::StatusOr<HttpResponse> response =
      SendAndWait(*transport_, Request("GET", server_.Url("/ok")));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "hello world");
  EXPECT_EQ(response->body_bytes, 11u);
  EXPECT_EQ(response->header("Content-Type"), "text/plain");
  EXPECT_EQ(response->header("content-length"), "11");
  EXPECT_EQ(response->header("x-padded"), "spaced");
  EXPECT_EQ(response->header("x-missing"), std::nullopt);
  for (const auto& [name, value] : response->headers) EXPECT_EQ(name, absl::AsciiStrToLower(name));
  EXPECT_GT(response->time_to_first_byte, absl::ZeroDuration());
  EXPECT_LE(response->time_to_first_byte, response->total_time);
}

TEST_F(CurlTransportTest, HeadReturnsHeadersOnly) {
  absl::StatusOr<HttpResponse> response =
      SendAndWait(*transport_, Request("HEAD", server_.Url("/bytes/5000")));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->header("content-length"), "5000");
  EXPECT_EQ(response->body, "");
}

TEST_F(CurlTransportTest, GetIntoBufferExactFit) {
  std::string buffer(100000, '\0');
  HttpRequest request = Request("GET", server_.Url("/bytes/100000"));
  request.response = ResponseBody::Buffer(absl::MakeSpan(buffer));
  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, std::move(request));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body_bytes, 100000u);
  EXPECT_EQ(response->body, "");
  EXPECT_TRUE(buffer == PatternBytes(100000));
}

TEST_F(CurlTransportTest, BufferTooSmallForContentLengthIsOutOfRange) {
  std::string buffer(999, '\0');
  HttpRequest request = Request("GET", server_.Url("/bytes/1000"));
  request.response = ResponseBody::Buffer(absl::MakeSpan(buffer));
  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, std::move(request));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kOutOfRange) << response.status();
  EXPECT_THAT(response.status().message(), HasSubstr(server_.Url("/bytes/1000")));
  EXPECT_EQ(DeliveredBytes(response.status()), 0u);
}

TEST_F(CurlTransportTest, BufferTooSmallForChunkedBodyIsOutOfRange) {
  // No Content-Length: the overflow is found while the body streams in.
  std::string buffer(4500, '\0');
  HttpRequest request = Request("GET", server_.Url("/chunked/10000"));
  request.response = ResponseBody::Buffer(absl::MakeSpan(buffer));
  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, std::move(request));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kOutOfRange) << response.status();
  uint64_t delivered = DeliveredBytes(response.status());
  EXPECT_LE(delivered, 4500u);
  EXPECT_EQ(buffer.substr(0, delivered), PatternBytes(delivered));
}

TEST_F(CurlTransportTest, ChunkedBodyIntoBuffer) {
  std::string buffer(20000, '\0');
  HttpRequest request = Request("GET", server_.Url("/chunked/10000"));
  request.response = ResponseBody::Buffer(absl::MakeSpan(buffer));
  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, std::move(request));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->body_bytes, 10000u);
  EXPECT_EQ(buffer.substr(0, 10000), PatternBytes(10000));
}

TEST_F(CurlTransportTest, GetIntoCallback) {
  std::string received;
  int calls = 0;
  std::thread::id callback_thread;
  HttpRequest request = Request("GET", server_.Url("/bytes/1000000"));
  request.response = ResponseBody::Stream([&](std::string_view piece) {
    received.append(piece);
    ++calls;
    callback_thread = std::this_thread::get_id();
    return absl::OkStatus();
  });
  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, std::move(request));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->body_bytes, 1000000u);
  EXPECT_EQ(response->body, "");
  EXPECT_TRUE(received == PatternBytes(1000000));
  EXPECT_GT(calls, 1);
  EXPECT_NE(callback_thread, std::this_thread::get_id());
}

TEST_F(CurlTransportTest, CallbackErrorAbortsTransfer) {
  uint64_t accepted = 0;
  HttpRequest request = Request("GET", server_.Url("/bytes/1000000"));
  request.response = ResponseBody::Stream([&](std::string_view piece) {
    if (accepted > 0) return absl::ResourceExhaustedError("memory budget spent");
    accepted += piece.size();
    return absl::OkStatus();
  });
  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, std::move(request));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(response.status().message(), HasSubstr("memory budget spent"));
  EXPECT_THAT(response.status().message(), HasSubstr(server_.Url("/bytes/1000000")));
  EXPECT_EQ(DeliveredBytes(response.status()), accepted);
  // The transport stays usable (the aborted connection is not reused half-read).
  EXPECT_TRUE(SendAndWait(*transport_, Request("GET", server_.Url("/ok"))).ok());
}

TEST_F(CurlTransportTest, PutMultiChunkCordArrivesIntact) {
  absl::Cord body;
  std::string expected;
  for (int i = 0; i < 5; ++i) {
    std::string piece = PatternBytes(300000 + i * 7);
    piece[0] = static_cast<char>('A' + i);
    expected += piece;
    body.Append(absl::Cord(std::move(piece)));
  }
  body.Append("tail");
  expected += "tail";
  ASSERT_GT(std::distance(body.Chunks().begin(), body.Chunks().end()), 1);

  HttpRequest request = Request("PUT", server_.Url("/echo"));
  request.body = body;
  request.headers = {{"X-Amz-Meta-Color", "blue"}, {"x-amz-empty", ""}};
  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, std::move(request));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_TRUE(response->body == expected);
  EXPECT_EQ(response->header("echo-method"), "PUT");
  EXPECT_EQ(response->header("echo-content-length"), absl::StrCat(expected.size()));
  EXPECT_EQ(response->header("echo-x-amz-meta-color"), "blue");
  EXPECT_EQ(response->header("echo-x-amz-empty"), "");
  EXPECT_EQ(response->header("echo-expect"), std::nullopt);
  EXPECT_EQ(transport_->stats().bytes_sent, expected.size());
}

TEST_F(CurlTransportTest, PostWithEmptyBodySendsContentLengthZero) {
  absl::StatusOr<HttpResponse> response =
      SendAndWait(*transport_, Request("POST", server_.Url("/echo")));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->header("echo-method"), "POST");
  EXPECT_EQ(response->header("echo-content-length"), "0");
  EXPECT_EQ(response->header("echo-content-type"), std::nullopt);
}

TEST_F(CurlTransportTest, MethodsAfterEachOtherOnOneSlot) {
  // Slots are recycled: each request's method must not leak into the next.
  for (const char* method : {"PUT", "GET", "HEAD", "DELETE", "POST", "GET"}) {
    absl::StatusOr<HttpResponse> response =
        SendAndWait(*transport_, Request(method, server_.Url("/echo")));
    ASSERT_TRUE(response.ok()) << method << ": " << response.status();
    EXPECT_EQ(response->header("echo-method"), method);
  }
}

TEST_F(CurlTransportTest, ErrorStatusIsNotATransportError) {
  std::string buffer(10, 'x');
  HttpRequest request = Request("GET", server_.Url("/status/503"));
  request.response = ResponseBody::Buffer(absl::MakeSpan(buffer));
  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, std::move(request));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 503);
  EXPECT_EQ(response->body, kErrorXml);  // captured although the body was bound for a buffer
  EXPECT_EQ(buffer, std::string(10, 'x'));
}

TEST_F(CurlTransportTest, ErrorBodyIsCapped) {
  absl::StatusOr<HttpResponse> response =
      SendAndWait(*transport_, Request("GET", server_.Url("/big-error")));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 500);
  EXPECT_EQ(response->body.size(), kMaxErrorBodyBytes);
  EXPECT_EQ(response->body_bytes, 2u << 20);
}

TEST_F(CurlTransportTest, TlsToAPlainHttpServerFailsAsNotRetryable) {
  // A plain-HTTP server answers the TLS ClientHello with a 400 at once, as RGW or nginx do.
  int port = 0;
  const int listener = BoundLoopbackSocket(&port);
  ASSERT_GE(listener, 0);
  ASSERT_EQ(listen(listener, 1), 0);
  std::thread server([listener] {
    int conn = accept(listener, nullptr, nullptr);
    if (conn < 0) return;
    char hello[512];
    (void)!read(conn, hello, sizeof(hello));
    const std::string reply = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
    (void)!write(conn, reply.data(), reply.size());
    close(conn);
  });
  const std::string url = absl::StrCat("https://127.0.0.1:", port, "/ok");
  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, Request("GET", url));
  server.join();
  close(listener);
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kFailedPrecondition) << response.status();
  EXPECT_THAT(std::string(response.status().message()), HasSubstr("does not speak TLS"));
  EXPECT_THAT(std::string(response.status().message()), HasSubstr(url));
}

TEST_F(CurlTransportTest, ResetMidBodyIsUnavailableWithDeliveredBytes) {
  std::string buffer(10000, '\0');
  HttpRequest request = Request("GET", server_.Url("/reset/5000"));
  request.response = ResponseBody::Buffer(absl::MakeSpan(buffer));
  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, std::move(request));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable) << response.status();
  EXPECT_THAT(response.status().message(), HasSubstr(server_.Url("/reset/5000")));
  EXPECT_THAT(response.status().message(), HasSubstr("5000 body bytes"));
  EXPECT_EQ(DeliveredBytes(response.status()), 5000u);
  EXPECT_EQ(buffer.substr(0, 5000), PatternBytes(5000));
}

TEST_F(CurlTransportTest, ResetMidBodyIntoCallback) {
  uint64_t received = 0;
  HttpRequest request = Request("GET", server_.Url("/reset/3000"));
  request.response = ResponseBody::Stream([&](std::string_view piece) {
    received += piece.size();
    return absl::OkStatus();
  });
  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, std::move(request));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable) << response.status();
  EXPECT_EQ(received, 3000u);
  EXPECT_EQ(DeliveredBytes(response.status()), 3000u);
}

TEST_F(CurlTransportTest, ShortBodyIsUnavailableWithDeliveredBytes) {
  std::string buffer(100, '\0');
  HttpRequest request = Request("GET", server_.Url("/short"));
  request.response = ResponseBody::Buffer(absl::MakeSpan(buffer));
  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, std::move(request));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable) << response.status();
  EXPECT_THAT(response.status().message(), HasSubstr(server_.Url("/short")));
  EXPECT_EQ(DeliveredBytes(response.status()), 50u);
  EXPECT_EQ(buffer.substr(0, 50), PatternBytes(50));
}

TEST_F(CurlTransportTest, ShortBodyIntoStringDeliversNothing) {
  absl::StatusOr<HttpResponse> response =
      SendAndWait(*transport_, Request("GET", server_.Url("/short")));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable) << response.status();
  EXPECT_EQ(DeliveredBytes(response.status()), 0u);
}

TEST_F(CurlTransportTest, ConnectionRefusedIsUnavailable) {
  // A port that was just free: bind, read it back, close.
  int port = 0;
  const int fd = BoundLoopbackSocket(&port);
  ASSERT_GE(fd, 0);
  close(fd);
  std::string url = absl::StrCat("http://127.0.0.1:", port, "/ok");

  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, Request("GET", url));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable) << response.status();
  EXPECT_THAT(response.status().message(), HasSubstr(url));
  EXPECT_EQ(DeliveredBytes(response.status()), 0u);
}

TEST_F(CurlTransportTest, UnsupportedSchemeIsInvalidArgument) {
  absl::StatusOr<HttpResponse> response =
      SendAndWait(*transport_, Request("GET", "ftp://127.0.0.1/x"));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << response.status();
}

TEST_F(CurlTransportTest, RequestTimeoutIsUnavailable) {
  HttpRequest request = Request("GET", server_.Url("/slow/30000"));
  request.timeout = absl::Milliseconds(200);
  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, std::move(request));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable) << response.status();
  EXPECT_THAT(response.status().message(), HasSubstr("Timeout"));
}

TEST_F(CurlTransportTest, DefaultTimeoutFromOptions) {
  CurlTransportOptions options;
  options.default_timeout = absl::Milliseconds(200);
  std::unique_ptr<HttpTransport> transport = NewCurlTransport(options);
  absl::StatusOr<HttpResponse> response =
      SendAndWait(*transport, Request("GET", server_.Url("/slow/30000")));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable) << response.status();
}

TEST_F(CurlTransportTest, QueuedTimeDoesNotCountAgainstTimeout) {
  // One connection, ten 200 ms requests each allowed 1.5 s: the last waits ~1.8 s for its
  // turn, which must not count (it would inside curl's own queue).
  CurlTransportOptions options;
  options.max_connections = 1;
  options.max_in_flight = 1;
  std::unique_ptr<HttpTransport> transport = NewCurlTransport(options);
  Results results;
  for (size_t i = 0; i < 10; ++i) {
    HttpRequest request = Request("GET", server_.Url("/slow/200"));
    request.timeout = absl::Milliseconds(1500);
    transport->Send(std::move(request), results.Callback(i));
  }
  for (auto& result : results.Wait()) {
    ASSERT_TRUE(result.has_value());
    EXPECT_TRUE(result->ok()) << result->status();
  }
}

TEST_F(CurlTransportTest, ManyConcurrentRequestsReuseConnections) {
  CurlTransportOptions options;
  options.max_connections = 16;
  options.max_in_flight = 1024;
  std::unique_ptr<HttpTransport> transport = NewCurlTransport(options);
  constexpr size_t kRequests = 500;
  Results results;
  for (size_t i = 0; i < kRequests; ++i) {
    transport->Send(Request("GET", server_.Url(absl::StrCat("/bytes/", i))), results.Callback(i));
  }
  std::vector<std::optional<absl::StatusOr<HttpResponse>>> all = results.Wait();
  ASSERT_EQ(all.size(), kRequests);
  for (size_t i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(all[i].has_value() && all[i]->ok()) << i << ": " << all[i]->status();
    EXPECT_EQ((*all[i])->body, PatternBytes(i));
  }
  EXPECT_LE(server_.connections_accepted(), 16);
  TransportStats stats = transport->stats();
  EXPECT_EQ(stats.requests_started, kRequests);
  EXPECT_EQ(stats.requests_completed, kRequests);
  EXPECT_EQ(stats.requests_failed, 0u);
  EXPECT_EQ(stats.connections_opened, static_cast<uint64_t>(server_.connections_accepted()));
  EXPECT_EQ(stats.bytes_received, kRequests * (kRequests - 1) / 2);
  EXPECT_EQ(stats.in_flight, 0u);
  EXPECT_EQ(stats.queued, 0u);
}

TEST_F(CurlTransportTest, SendFromDoneReusesTheConnection) {
  absl::Notification finished;
  int remaining = 20;
  std::function<void(absl::StatusOr<HttpResponse>)> next;
  next = [&](absl::StatusOr<HttpResponse> response) {
    EXPECT_TRUE(response.ok()) << response.status();
    if (--remaining == 0) {
      finished.Notify();
      return;
    }
    transport_->Send(Request("GET", server_.Url("/ok")),
                     [&](absl::StatusOr<HttpResponse> r) { next(std::move(r)); });
  };
  transport_->Send(Request("GET", server_.Url("/ok")),
                   [&](absl::StatusOr<HttpResponse> r) { next(std::move(r)); });
  finished.WaitForNotification();
  EXPECT_EQ(server_.connections_accepted(), 1);
  EXPECT_EQ(transport_->stats().connections_opened, 1u);
}

TEST_F(CurlTransportTest, AFreshConnectionRequestNeverTakesAnIdleOne) {
  // A multipart create goes on a new connection: on a reused one that died, libcurl would
  // send it again unseen (two uploads started, one left behind).
  ASSERT_TRUE(SendAndWait(*transport_, Request("GET", server_.Url("/ok"))).ok());
  ASSERT_TRUE(SendAndWait(*transport_, Request("GET", server_.Url("/ok"))).ok());
  EXPECT_EQ(server_.connections_accepted(), 1);  // the idle one is reused
  HttpRequest fresh = Request("GET", server_.Url("/ok"));
  fresh.fresh_connection = true;
  ASSERT_TRUE(SendAndWait(*transport_, std::move(fresh)).ok());
  EXPECT_EQ(server_.connections_accepted(), 2);
  ASSERT_TRUE(SendAndWait(*transport_, Request("GET", server_.Url("/ok"))).ok());
  EXPECT_LE(server_.connections_accepted(), 2);  // later requests reuse again
}

TEST_F(CurlTransportTest, DestructorCancelsQueuedAndInFlightRequests) {
  CurlTransportOptions options;
  options.max_in_flight = 4;
  std::unique_ptr<HttpTransport> transport = NewCurlTransport(options);
  Results results;
  for (size_t i = 0; i < 10; ++i) {
    transport->Send(Request("GET", server_.Url("/hang")), results.Callback(i));
  }
  // Wait until the four in flight reached the server, so both kinds are cancelled.
  while (server_.requests_served() < 4) absl::SleepFor(absl::Milliseconds(5));
  transport.reset();
  for (auto& result : results.Wait()) {
    ASSERT_TRUE(result.has_value());
    EXPECT_EQ(result->status().code(), absl::StatusCode::kCancelled) << result->status();
    EXPECT_THAT(result->status().message(), HasSubstr(server_.Url("/hang")));
  }
}

TEST_F(CurlTransportTest, PreCancelledRequestIsNeverSent) {
  CancelToken cancel = NewCancelToken();
  cancel->Cancel();
  HttpRequest request = Request("GET", server_.Url("/ok"));
  request.cancel = cancel;
  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, std::move(request));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kCancelled) << response.status();
  EXPECT_THAT(response.status().message(), HasSubstr(server_.Url("/ok")));
  EXPECT_EQ(DeliveredBytes(response.status()), 0u);
  EXPECT_EQ(server_.requests_served(), 0);
  EXPECT_EQ(server_.connections_accepted(), 0);
  EXPECT_EQ(transport_->stats().requests_started, 0u);
}

TEST_F(CurlTransportTest, CancelAbortsAStalledTransferPromptlyAndSparesOthers) {
  CancelToken cancel = NewCancelToken();
  Results results;
  HttpRequest hanging = Request("GET", server_.Url("/hang"));
  hanging.cancel = cancel;
  transport_->Send(std::move(hanging), results.Callback(0));
  HttpRequest other = Request("GET", server_.Url("/slow/300"));
  other.cancel = NewCancelToken();  // a different token: unaffected
  transport_->Send(std::move(other), results.Callback(1));
  while (server_.requests_served() < 2) absl::SleepFor(absl::Milliseconds(5));
  const absl::Time cancelled_at = absl::Now();
  cancel->Cancel();
  auto all = results.Wait();
  // Far below the loop's 1 s poll and curl's progress interval: the cancel woke the loop.
  EXPECT_LT(absl::Now() - cancelled_at, absl::Seconds(5));
  ASSERT_TRUE(all[0].has_value() && all[1].has_value());
  EXPECT_EQ(all[0]->status().code(), absl::StatusCode::kCancelled) << all[0]->status();
  EXPECT_THAT(all[0]->status().message(), HasSubstr(server_.Url("/hang")));
  ASSERT_TRUE(all[1]->ok()) << all[1]->status();
  EXPECT_EQ((*all[1])->body, "slow");
  // The transport stays usable.
  absl::StatusOr<HttpResponse> after = SendAndWait(*transport_, Request("GET", server_.Url("/ok")));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->body, "hello world");
}

TEST_F(CurlTransportTest, TheAmbientTokenCancelsARequestAndFollowsItsCallback) {
  // A request sent while an ambient token is set carries it (HttpRequest::scope): cancelling
  // it aborts the request, and `done` runs with it as the ambient token, so a follow-up
  // request started there belongs to the same operation.
  CancelToken scope = NewCancelToken();
  absl::Notification done;
  CancelToken seen_in_done;
  absl::StatusOr<HttpResponse> result;
  {
    ScopedAmbientCancel ambient(scope);
    transport_->Send(Request("GET", server_.Url("/hang")), [&](absl::StatusOr<HttpResponse> r) {
      seen_in_done = AmbientCancel();
      result = std::move(r);
      done.Notify();
    });
  }
  EXPECT_EQ(AmbientCancel(), nullptr);  // restored
  while (server_.requests_served() < 1) absl::SleepFor(absl::Milliseconds(5));
  scope->Cancel();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  EXPECT_EQ(seen_in_done, scope);
  // Sent under a cancelled ambient token: failed unsent.
  {
    ScopedAmbientCancel ambient(scope);
    absl::StatusOr<HttpResponse> r = SendAndWait(*transport_, Request("GET", server_.Url("/ok")));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  }
  EXPECT_EQ(server_.requests_served(), 1);
  // An explicit token and the ambient one: either cancels. Here neither fires.
  CancelToken own = NewCancelToken();
  HttpRequest with_own = Request("GET", server_.Url("/ok"));
  with_own.cancel = own;
  absl::StatusOr<HttpResponse> ok;
  {
    ScopedAmbientCancel ambient(NewCancelToken());
    ok = SendAndWait(*transport_, std::move(with_own));
  }
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->body, "hello world");
}

TEST_F(CurlTransportTest, CancelMidBodyKeepsTheDeliveredBytes) {
  // A callback destination that cancels after its first piece: the transfer stops there.
  CancelToken cancel = NewCancelToken();
  uint64_t received = 0;
  HttpRequest request = Request("GET", server_.Url("/bytes/50000000"));
  request.cancel = cancel;
  request.response = ResponseBody::Stream([&](std::string_view piece) {
    received += piece.size();
    cancel->Cancel();
    return absl::OkStatus();
  });
  absl::StatusOr<HttpResponse> response = SendAndWait(*transport_, std::move(request));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kCancelled) << response.status();
  EXPECT_EQ(DeliveredBytes(response.status()), received);
  EXPECT_LT(received, 50000000u);
}

TEST_F(CurlTransportTest, CancelWhileQueuedDropsTheRequest) {
  CurlTransportOptions options;
  options.max_in_flight = 1;
  std::unique_ptr<HttpTransport> transport = NewCurlTransport(options);
  Results results;
  HttpRequest blocker = Request("GET", server_.Url("/slow/500"));
  transport->Send(std::move(blocker), results.Callback(0));
  CancelToken cancel = NewCancelToken();
  HttpRequest queued = Request("GET", server_.Url("/ok"));
  queued.cancel = cancel;
  transport->Send(std::move(queued), results.Callback(1));
  while (server_.requests_served() < 1) absl::SleepFor(absl::Milliseconds(5));
  cancel->Cancel();
  auto all = results.Wait();
  ASSERT_TRUE(all[0]->ok()) << all[0]->status();
  EXPECT_EQ(all[1]->status().code(), absl::StatusCode::kCancelled) << all[1]->status();
  EXPECT_EQ(server_.requests_served(), 1);
}

TEST_F(CurlTransportTest, SendFromDoneDuringDestructionIsCancelledToo) {
  CurlTransportOptions options;
  options.max_in_flight = 1;
  std::unique_ptr<HttpTransport> transport = NewCurlTransport(options);
  HttpTransport* raw = transport.get();  // unique_ptr::reset() nulls itself before deleting
  absl::Notification retried;
  std::optional<absl::Status> first;
  std::optional<absl::Status> second;
  transport->Send(Request("GET", server_.Url("/hang")), [&](absl::StatusOr<HttpResponse> r) {
    first = r.status();
    // A caller retrying on any failure must not hang the destructor.
    raw->Send(Request("GET", server_.Url("/ok")), [&](absl::StatusOr<HttpResponse> r2) {
      second = r2.status();
      retried.Notify();
    });
  });
  while (server_.requests_served() < 1) absl::SleepFor(absl::Milliseconds(5));
  transport.reset();
  ASSERT_TRUE(retried.HasBeenNotified());
  EXPECT_EQ(first->code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(second->code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace wharf
