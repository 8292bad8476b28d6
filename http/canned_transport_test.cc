#include "http/canned_transport.h"

#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wharf {
namespace {

using ::testing::HasSubstr;

constexpr char kUrl[] = "http://bucket.s3.test/key";

HttpRequest Get(std::string url = kUrl) {
  HttpRequest request;
  request.url = std::move(url);
  return request;
}

absl::StatusOr<HttpResponse> SendAndWait(HttpTransport& transport, HttpRequest request,
                                         std::thread::id* done_thread = nullptr) {
  absl::Notification done;
  std::optional<absl::StatusOr<HttpResponse>> result;
  transport.Send(std::move(request), [&](absl::StatusOr<HttpResponse> response) {
    if (done_thread != nullptr) *done_thread = std::this_thread::get_id();
    result.emplace(std::move(response));
    done.Notify();
  });
  done.WaitForNotification();
  return *std::move(result);
}

CannedHandler Always(CannedResponse canned) {
  return [canned](const HttpRequest&) -> absl::StatusOr<CannedResponse> { return canned; };
}

TEST(CannedTransportTest, DeliversIntoStringOnItsOwnThread) {
  CannedTransport transport(
      Always({.status = 200, .headers = {{"ETag", "\"abc\""}}, .body = "hello"}));
  std::thread::id done_thread;
  absl::StatusOr<HttpResponse> response = SendAndWait(transport, Get(), &done_thread);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "hello");
  EXPECT_EQ(response->body_bytes, 5u);
  EXPECT_EQ(response->header("etag"), "\"abc\"");
  EXPECT_EQ(response->header("Content-Length"), "5");  // added like a server would
  EXPECT_EQ(response->headers[0].first, "etag");       // names lowercased as with curl
  EXPECT_NE(done_thread, std::this_thread::get_id());
}

TEST(CannedTransportTest, BufferExactFit) {
  CannedTransport transport(Always({.body = "0123456789"}));
  std::string buffer(10, '\0');
  HttpRequest request = Get();
  request.response = ResponseBody::Buffer(absl::MakeSpan(buffer));
  absl::StatusOr<HttpResponse> response = SendAndWait(transport, std::move(request));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(buffer, "0123456789");
  EXPECT_EQ(response->body, "");
  EXPECT_EQ(response->body_bytes, 10u);
}

TEST(CannedTransportTest, BufferTooSmallIsOutOfRange) {
  CannedTransport transport(Always({.body = "0123456789"}));
  std::string buffer(9, '\0');
  HttpRequest request = Get();
  request.response = ResponseBody::Buffer(absl::MakeSpan(buffer));
  absl::StatusOr<HttpResponse> response = SendAndWait(transport, std::move(request));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kOutOfRange) << response.status();
  EXPECT_THAT(response.status().message(), HasSubstr(kUrl));
}

TEST(CannedTransportTest, BufferTooSmallWithoutContentLength) {
  // A wrong Content-Length passes the early check; the overflow is caught as bytes arrive.
  CannedTransport transport(
      Always({.headers = {{"Content-Length", "4"}}, .body = "0123456789", .chunk_bytes = 4}));
  std::string buffer(6, '\0');
  HttpRequest request = Get();
  request.response = ResponseBody::Buffer(absl::MakeSpan(buffer));
  absl::StatusOr<HttpResponse> response = SendAndWait(transport, std::move(request));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kOutOfRange) << response.status();
  EXPECT_EQ(DeliveredBytes(response.status()), 4u);
  EXPECT_EQ(buffer.substr(0, 4), "0123");
}

TEST(CannedTransportTest, CallbackReceivesChunksInOrder) {
  CannedTransport transport(Always({.body = std::string(95, 'z'), .chunk_bytes = 10}));
  int calls = 0;
  std::string received;
  HttpRequest request = Get();
  request.response = ResponseBody::Stream([&](std::string_view piece) {
    ++calls;
    received.append(piece);
    return absl::OkStatus();
  });
  absl::StatusOr<HttpResponse> response = SendAndWait(transport, std::move(request));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(calls, 10);
  EXPECT_EQ(received, std::string(95, 'z'));
}

TEST(CannedTransportTest, CallbackErrorAbortsWithItsCode) {
  CannedTransport transport(Always({.body = std::string(100, 'z'), .chunk_bytes = 30}));
  HttpRequest request = Get();
  int calls = 0;
  request.response = ResponseBody::Stream([&](std::string_view) {
    return ++calls == 2 ? absl::DataLossError("checksum mismatch") : absl::OkStatus();
  });
  absl::StatusOr<HttpResponse> response = SendAndWait(transport, std::move(request));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(response.status().message(), HasSubstr("checksum mismatch"));
  EXPECT_EQ(DeliveredBytes(response.status()), 30u);
  EXPECT_EQ(calls, 2);
}

TEST(CannedTransportTest, FailureAfterSomeBytesReportsDeliveredBytes) {
  CannedTransport transport(
      Always({.body = "0123456789abcdef",
              .failure = absl::UnavailableError("Recv failure: Connection reset by peer"),
              .fail_after_bytes = 6,
              .chunk_bytes = 4}));
  std::string buffer(16, '.');
  HttpRequest request = Get();
  request.response = ResponseBody::Buffer(absl::MakeSpan(buffer));
  absl::StatusOr<HttpResponse> response = SendAndWait(transport, std::move(request));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(response.status().message(),
              HasSubstr(absl::StrCat("HTTP GET ", kUrl, ": Recv failure")));
  EXPECT_THAT(response.status().message(), HasSubstr("6 body bytes"));
  EXPECT_EQ(DeliveredBytes(response.status()), 6u);
  EXPECT_EQ(buffer, "012345..........");
}

TEST(CannedTransportTest, HandlerErrorIsAFailureBeforeAnyByte) {
  CannedTransport transport([](const HttpRequest&) -> absl::StatusOr<CannedResponse> {
    return absl::UnavailableError("Couldn't connect to server");
  });
  absl::StatusOr<HttpResponse> response = SendAndWait(transport, Get());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(response.status().message(), HasSubstr(kUrl));
  EXPECT_EQ(DeliveredBytes(response.status()), 0u);
  EXPECT_EQ(transport.stats().requests_failed, 1u);
}

TEST(CannedTransportTest, ErrorStatusBodyIsCapturedWhateverTheDestination) {
  const std::string xml = "<Error><Code>NoSuchKey</Code></Error>";
  CannedTransport transport(Always({.status = 404, .body = xml}));
  std::string buffer(4, '.');
  HttpRequest request = Get();
  request.response = ResponseBody::Buffer(absl::MakeSpan(buffer));
  absl::StatusOr<HttpResponse> response = SendAndWait(transport, std::move(request));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 404);
  EXPECT_EQ(response->body, xml);
  EXPECT_EQ(buffer, "....");
}

TEST(CannedTransportTest, ErrorBodyIsCapped) {
  CannedTransport transport(
      Always({.status = 500, .body = std::string(kMaxErrorBodyBytes + 5, 'e')}));
  absl::StatusOr<HttpResponse> response = SendAndWait(transport, Get());
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->body.size(), kMaxErrorBodyBytes);
  EXPECT_EQ(response->body_bytes, kMaxErrorBodyBytes + 5);
}

TEST(CannedTransportTest, HeadGetsHeadersOnly) {
  CannedTransport transport(Always({.headers = {{"Content-Length", "1234"}}, .body = "ignored"}));
  HttpRequest request = Get();
  request.method = "HEAD";
  absl::StatusOr<HttpResponse> response = SendAndWait(transport, std::move(request));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->header("content-length"), "1234");
  EXPECT_EQ(response->body, "");
}

TEST(CannedTransportTest, RecordsEveryRequest) {
  CannedTransport transport([](const HttpRequest& request) -> absl::StatusOr<CannedResponse> {
    return CannedResponse{.status = request.method == "PUT" ? 200 : 404};
  });
  HttpRequest put = Get("http://b.s3.test/a");
  put.method = "PUT";
  put.headers = {{"x-amz-content-sha256", "UNSIGNED-PAYLOAD"}};
  put.body = absl::Cord("payload");
  put.timeout = absl::Seconds(3);
  ASSERT_EQ(SendAndWait(transport, std::move(put))->status, 200);
  ASSERT_EQ(SendAndWait(transport, Get("http://b.s3.test/b"))->status, 404);

  std::vector<HttpRequest> requests = transport.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(transport.request_count(), 2u);
  EXPECT_EQ(requests[0].method, "PUT");
  EXPECT_EQ(requests[0].url, "http://b.s3.test/a");
  EXPECT_EQ(requests[0].headers[0].second, "UNSIGNED-PAYLOAD");
  EXPECT_EQ(requests[0].body, "payload");
  EXPECT_EQ(requests[0].timeout, absl::Seconds(3));
  EXPECT_EQ(requests[1].method, "GET");
  EXPECT_EQ(requests[1].url, "http://b.s3.test/b");

  TransportStats stats = transport.stats();
  EXPECT_EQ(stats.requests_completed, 2u);
  EXPECT_EQ(stats.requests_failed, 0u);  // a 404 is a completed exchange
  EXPECT_EQ(stats.bytes_sent, 7u);
}

TEST(CannedTransportTest, DestructorFinishesRequestsAlreadySent) {
  int done = 0;
  {
    absl::Notification release;
    CannedTransport transport([&](const HttpRequest&) -> absl::StatusOr<CannedResponse> {
      release.WaitForNotification();
      return CannedResponse{};
    });
    for (int i = 0; i < 5; ++i) {
      // Only the transport thread touches `done`, one request at a time.
      transport.Send(Get(), [&](absl::StatusOr<HttpResponse> response) {
        EXPECT_TRUE(response.ok());
        ++done;
      });
    }
    EXPECT_EQ(done, 0);  // never inline
    release.Notify();
  }
  EXPECT_EQ(done, 5);
}

}  // namespace
}  // namespace wharf
