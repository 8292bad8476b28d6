// Error paths of the S3 backend against canned responses: retries, error mapping, resumed
// GETs, integrity checks, multipart abort. The live behaviour is in s3_conformance_test.cc.
#include "store/s3/s3_store.h"

#include <atomic>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "http/canned_transport.h"

namespace wharf::s3 {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSecret[] = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

S3ClientConfig TestConfig() {
  S3ClientConfig c;
  c.credentials = {"AKIDEXAMPLE", kSecret, ""};
  c.credentials_source = "explicit options";
  c.region = "us-east-1";
  c.endpoint = "http://127.0.0.1:9";
  c.path_style = true;
  return c;
}

std::unique_ptr<S3Store> MakeStore(std::shared_ptr<HttpTransport> transport) {
  S3StoreOptions options;
  options.retry.initial_backoff = absl::Milliseconds(1);
  options.retry.max_backoff = absl::Milliseconds(4);
  options.retry.max_attempts = 4;
  options.part_size = 5 << 20;
  options.upload_concurrency = 2;
  return *S3Store::Open("bkt", TestConfig(), std::move(transport), options);
}

std::string ErrorXml(absl::string_view code, absl::string_view message) {
  return absl::StrCat("<?xml version=\"1.0\"?><Error><Code>", code, "</Code><Message>", message,
                      "</Message><RequestId>req-123</RequestId></Error>");
}

CannedResponse Ok(std::string body, std::vector<std::pair<std::string, std::string>> headers = {}) {
  CannedResponse r;
  r.body = std::move(body);
  r.headers = std::move(headers);
  return r;
}

CannedResponse Err(int status, absl::string_view code) {
  CannedResponse r;
  r.status = status;
  r.body = ErrorXml(code, "simulated");
  return r;
}

TEST(S3StoreTest, RetriesSlowDownThenSucceeds) {
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest&) {
    return ++calls <= 2 ? Err(503, "SlowDown") : Ok("payload", {{"etag", "\"e\""}});
  });
  auto store = MakeStore(transport);
  auto read = store->Read("k");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "payload");
  EXPECT_EQ(calls.load(), 3);
}

TEST(S3StoreTest, RetriesResetConnectionsAnd500s) {
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>(
      [&](const HttpRequest&) -> absl::StatusOr<CannedResponse> {
        switch (++calls) {
          case 1: return absl::UnavailableError("Recv failure: Connection reset by peer");
          case 2: return Err(500, "InternalError");
          default: return Ok("", {{"content-length", "0"}, {"etag", "\"x\""}});
        }
      });
  auto store = MakeStore(transport);
  EXPECT_TRUE(store->Head("k").ok());
  EXPECT_EQ(calls.load(), 3);
}

TEST(S3StoreTest, GivesUpAfterMaxAttempts) {
  auto transport =
      std::make_shared<CannedTransport>([](const HttpRequest&) { return Err(503, "SlowDown"); });
  auto store = MakeStore(transport);
  auto read = store->Read("k");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("SlowDown"));
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("4 attempts"));
  EXPECT_EQ(transport->request_count(), 4u);
}

TEST(S3StoreTest, NotFoundIsNotRetriedAndNamesTheObject) {
  auto transport = std::make_shared<CannedTransport>(
      [](const HttpRequest&) { return Err(404, "NoSuchKey"); });
  auto store = MakeStore(transport);
  auto read = store->Read("a/b.jpg");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("get s3://bkt/a/b.jpg: NoSuchKey"));
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("req-123"));
  EXPECT_EQ(transport->request_count(), 1u);
}

TEST(S3StoreTest, BadSignatureHintsAtTheSettingAndHidesTheSecret) {
  auto transport = std::make_shared<CannedTransport>(
      [](const HttpRequest&) { return Err(403, "SignatureDoesNotMatch"); });
  auto store = MakeStore(transport);
  auto listed = store->List({});
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kPermissionDenied);
  const std::string msg(listed.status().message());
  EXPECT_THAT(msg, HasSubstr("AWS_SECRET_ACCESS_KEY"));
  EXPECT_THAT(msg, Not(HasSubstr(kSecret)));
  EXPECT_EQ(transport->request_count(), 1u);
}

TEST(S3StoreTest, InterruptedGetResumesFromDeliveredBytesOfTheSameVersion) {
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest& req) {
    if (++calls == 1) {
      CannedResponse r = Ok(data, {{"etag", "\"v1\""}});
      r.failure = absl::UnavailableError("Recv failure: Connection reset by peer");
      r.fail_after_bytes = 30000;
      return r;
    }
    std::string range, if_match;
    for (const auto& [k, v] : req.headers) {
      if (k == "range") range = v;
      if (k == "if-match") if_match = v;
    }
    EXPECT_EQ(range, "bytes=30000-99999");
    EXPECT_EQ(if_match, "\"v1\"");
    CannedResponse r = Ok(data.substr(30000), {{"etag", "\"v1\""},
                                               {"content-range", "bytes 30000-99999/100000"}});
    r.status = 206;
    return r;
  });
  auto store = MakeStore(transport);
  std::string buffer(data.size(), '\0');
  auto got = store->Get({.key = "big", .buffer = absl::MakeSpan(buffer)});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->bytes, data.size());
  EXPECT_EQ(got->meta.size, data.size());
  EXPECT_EQ(buffer, data);
  EXPECT_EQ(calls.load(), 2);
}

TEST(S3StoreTest, ShortBodyIntoASinkResumesWithoutSplicing) {
  const std::string data = "0123456789";
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest& req) {
    CannedResponse r = Ok(data, {{"etag", "\"v\""}});
    if (++calls == 1) {
      r.failure = absl::UnavailableError("transfer closed with 5 bytes remaining to read");
      r.fail_after_bytes = 5;
      return r;
    }
    for (const auto& [k, v] : req.headers) {
      if (k == "range") {  // serve the range like S3 does
        EXPECT_EQ(v, "bytes=5-9");
        r.status = 206;
        r.body = data.substr(5);
        r.headers.emplace_back("content-range", "bytes 5-9/10");
      }
    }
    return r;
  });
  auto store = MakeStore(transport);
  auto read = store->Read("k");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, data);
  EXPECT_EQ(calls.load(), 2);
}

TEST(S3StoreTest, ChangedObjectDuringResumeFailsInsteadOfSplicing) {
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest& req) {
    for (const auto& [k, v] : req.headers) {
      if (k == "if-match") return Err(412, "PreconditionFailed");
    }
    CannedResponse r = Ok("0123456789", {{"etag", "\"v1\""}});
    r.failure = absl::UnavailableError("Connection reset by peer");
    r.fail_after_bytes = 4;
    return r;
  });
  auto store = MakeStore(transport);
  EXPECT_EQ(store->Read("k").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(S3StoreTest, PutChecksTheEtagAgainstTheMd5Sent) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest& req) {
    std::string md5;
    for (const auto& [k, v] : req.headers) {
      if (k == "content-md5") md5 = v;
    }
    EXPECT_EQ(md5, Base64(std::string("\x5d\x41\x40\x2a\xbc\x4b\x2a\x76\xb9\x71\x9d\x91\x10\x17\xc5\x92", 16)));
    return Ok("", {{"etag", "\"00000000000000000000000000000000\""}});
  });
  auto store = MakeStore(transport);
  auto put = store->Put("k", absl::Cord("hello"));
  EXPECT_EQ(put.status().code(), absl::StatusCode::kDataLoss);
}

TEST(S3StoreTest, KeysAreEncodedOnceInTheUrl) {
  auto transport = std::make_shared<CannedTransport>(
      [](const HttpRequest&) { return Ok("", {{"etag", "\"e\""}}); });
  auto store = MakeStore(transport);
  (void)store->Head("dir/a b+c%d=é~*");
  ASSERT_EQ(transport->request_count(), 1u);
  EXPECT_EQ(transport->requests()[0].url,
            "http://127.0.0.1:9/bkt/dir/a%20b%2Bc%25d%3D%C3%A9~%2A");
}

TEST(S3StoreTest, ListDecodesKeysAndStopsAtEndBefore) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest& req) {
    EXPECT_THAT(req.url, HasSubstr("encoding-type=url"));
    return Ok(
        "<ListBucketResult><IsTruncated>true</IsTruncated><EncodingType>url</EncodingType>"
        "<NextContinuationToken>tok</NextContinuationToken>"
        "<Contents><Key>a+b%2Bc</Key><Size>3</Size><ETag>\"e1\"</ETag>"
        "<LastModified>2024-01-02T03:04:05.000Z</LastModified></Contents>"
        "<Contents><Key>m</Key><Size>1</Size><ETag>\"e2\"</ETag></Contents>"
        "<Contents><Key>z</Key><Size>1</Size><ETag>\"e3\"</ETag></Contents>"
        "</ListBucketResult>");
  });
  auto store = MakeStore(transport);
  auto page = store->List({.end_before = "n"});
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].key, "a b+c");
  EXPECT_EQ(page->objects[0].etag, "e1");
  EXPECT_EQ(page->objects[0].mtime, absl::FromUnixSeconds(1704164645));
  EXPECT_EQ(page->continuation, "");  // past end_before: done
}

TEST(S3StoreTest, FailedPartAbortsTheMultipartUpload) {
  std::atomic<bool> aborted{false};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest& req) {
    if (req.method == "POST" && absl::StrContains(req.url, "uploads")) {
      return Ok("<InitiateMultipartUploadResult><UploadId>u1</UploadId>"
                "</InitiateMultipartUploadResult>");
    }
    if (req.method == "PUT") return Err(400, "InvalidArgument");
    if (req.method == "DELETE" && absl::StrContains(req.url, "uploadId=u1")) {
      aborted = true;
      CannedResponse r;
      r.status = 204;
      return r;
    }
    return Err(500, "Unexpected");
  });
  auto store = MakeStore(transport);
  auto writer = store->NewWriter("big");
  ASSERT_TRUE(writer.ok());
  absl::Status s = (*writer)->Write(absl::Cord(std::string(6 << 20, 'x')));
  absl::StatusOr<ObjectMeta> closed = s.ok() ? (*writer)->Close() : s;
  EXPECT_FALSE(closed.ok());
  EXPECT_THAT(std::string(closed.status().message()), HasSubstr("upload part 1"));
  writer->reset();
  EXPECT_TRUE(aborted.load());
}

TEST(S3StoreTest, CompleteThatFailsInsideA200IsAnError) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest& req) {
    if (req.method == "POST" && absl::StrContains(req.url, "uploads")) {
      return Ok("<InitiateMultipartUploadResult><UploadId>u1</UploadId>"
                "</InitiateMultipartUploadResult>");
    }
    if (req.method == "PUT") {
      std::string body(req.body);
      return Ok("", {{"etag", absl::StrCat("\"", Md5Hex(body), "\"")}});
    }
    if (req.method == "POST") return Ok(ErrorXml("InternalError", "try again"));
    CannedResponse r;
    r.status = 204;
    return r;
  });
  auto store = MakeStore(transport);
  auto writer = store->NewWriter("big");
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Write(absl::Cord(std::string(6 << 20, 'y'))).ok());
  auto closed = (*writer)->Close();
  EXPECT_FALSE(closed.ok());
  EXPECT_THAT(std::string(closed.status().message()), HasSubstr("InternalError"));
}

}  // namespace
}  // namespace wharf::s3
