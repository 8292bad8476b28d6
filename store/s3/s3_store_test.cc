// Error paths of the S3 backend against canned responses: retries, error mapping, resumed
// GETs, integrity checks, multipart abort and the uploads a retried create leaves behind,
// upload options, bucket listing, unsigned requests. The live behaviour is in
// s3_conformance_test.cc.
#include "store/s3/s3_store.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/hash.h"
#include "base/runtime.h"
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

// n bytes of a pattern that differs at every offset (mod 256) for `step` odd.
std::string Pattern(size_t n, int step) {
  std::string data(n, '\0');
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<char>(i * step);
  return data;
}

// `data` as version `etag`, the connection reset after `after` bytes of it.
CannedResponse ResetAfter(const std::string& data, absl::string_view etag, uint64_t after) {
  CannedResponse r = Ok(data, {{"etag", absl::StrCat("\"", etag, "\"")}});
  r.failure = absl::UnavailableError("Recv failure: Connection reset by peer");
  r.fail_after_bytes = after;
  return r;
}

// The rest of `data` from byte `from`, as S3 answers a ranged GET (206).
CannedResponse RestFrom(const std::string& data, absl::string_view etag, uint64_t from) {
  CannedResponse r =
      Ok(data.substr(from),
         {{"etag", absl::StrCat("\"", etag, "\"")},
          {"content-range", absl::StrCat("bytes ", from, "-", data.size() - 1, "/", data.size())}});
  r.status = 206;
  return r;
}

std::string HeaderOf(const HttpRequest& req, absl::string_view name) {
  for (const auto& [k, v] : req.headers) {
    if (absl::EqualsIgnoreCase(k, name)) return v;
  }
  return "";
}

Counter* Retries(const std::string& cause) {
  return Runtime::Default()->metrics().GetCounter("wharf_s3_retries_total", "", {{"cause", cause}});
}

TEST(S3StoreTest, RetriesSlowDownThenSucceeds) {
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest&) {
    return ++calls <= 2 ? Err(503, "SlowDown") : Ok("payload", {{"etag", "\"e\""}});
  });
  const uint64_t throttled = Retries("throttled")->value();
  auto store = MakeStore(transport);
  auto read = store->Read("k");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "payload");
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(Retries("throttled")->value() - throttled, 2u);  // counted by cause
}

TEST(S3StoreTest, RetriesResetConnectionsAnd500s) {
  std::atomic<int> calls{0};
  auto transport =
      std::make_shared<CannedTransport>([&](const HttpRequest&) -> absl::StatusOr<CannedResponse> {
        switch (++calls) {
          case 1:
            return absl::UnavailableError("Recv failure: Connection reset by peer");
          case 2:
            return Err(500, "InternalError");
          default:
            return Ok("", {{"content-length", "0"}, {"etag", "\"x\""}});
        }
      });
  const uint64_t connection = Retries("connection")->value();
  const uint64_t server = Retries("server_error")->value();
  auto store = MakeStore(transport);
  EXPECT_TRUE(store->Head("k").ok());
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(Retries("connection")->value() - connection, 1u);
  EXPECT_EQ(Retries("server_error")->value() - server, 1u);
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

// A DeleteObjects reply of 200 that fails some keys: the retryable ones are sent again alone,
// the others are reported.
std::string DeleteErrors(std::vector<std::pair<std::string, std::string>> key_codes) {
  std::string xml = "<?xml version=\"1.0\"?><DeleteResult>";
  for (const auto& [key, code] : key_codes) {
    absl::StrAppend(&xml, "<Error><Key>", key, "</Key><Code>", code,
                    "</Code><Message>simulated</Message></Error>");
  }
  return absl::StrCat(xml, "</DeleteResult>");
}

TEST(S3StoreTest, DeleteManyRetriesTheKeysFailedWithRetryableCodes) {
  std::vector<std::string> bodies;
  absl::Mutex mu;
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest& req) {
    absl::MutexLock lock(&mu);
    bodies.emplace_back(req.body);
    if (bodies.size() == 1) {
      return Ok(DeleteErrors(
          {{"a", "InternalError"}, {"b", "AccessDenied"}, {"c", "NoSuchKey"}, {"d", "SlowDown"}}));
    }
    return Ok(DeleteErrors({}));
  });
  const uint64_t throttled = Retries("throttled")->value();
  const uint64_t server = Retries("server_error")->value();
  auto store = MakeStore(transport);
  absl::Status s = store->DeleteMany({"a", "b", "c", "d", "e"});
  EXPECT_THAT(std::string(s.message()), HasSubstr("delete s3://bkt/b: AccessDenied"));
  ASSERT_EQ(bodies.size(), 2u);
  EXPECT_THAT(bodies[1], HasSubstr("<Key>a</Key>"));
  EXPECT_THAT(bodies[1], HasSubstr("<Key>d</Key>"));
  for (const char* key : {"<Key>b</Key>", "<Key>c</Key>", "<Key>e</Key>"}) {
    EXPECT_THAT(bodies[1], Not(HasSubstr(key)));
  }
  EXPECT_EQ(Retries("throttled")->value() + Retries("server_error")->value() - throttled - server,
            1u);
}

TEST(S3StoreTest, DeleteManyGivesUpOnKeysThatKeepFailing) {
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest&) {
    ++calls;
    return Ok(DeleteErrors({{"a", "SlowDown"}}));
  });
  auto store = MakeStore(transport);
  absl::Status s = store->DeleteMany({"a", "b"});
  EXPECT_EQ(calls.load(), 4);  // max_attempts
  EXPECT_THAT(std::string(s.message()), HasSubstr("delete s3://bkt/a: SlowDown"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("gave up after 4 attempts"));
}

TEST(S3StoreTest, BadDigestIsSentAgainThenDataLoss) {
  // A body damaged on the way (the server's MD5 of it differs from Content-MD5): the request
  // still holds the bytes, so it is sent again; if it never arrives whole, DataLoss.
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest&) {
    return ++calls == 1 ? Err(400, "BadDigest")
                        : Ok("", {{"etag", absl::StrCat("\"", Md5Hex("data"), "\"")}});
  });
  auto store = MakeStore(transport);
  EXPECT_TRUE(store->Put("k", absl::Cord("data")).ok());
  EXPECT_EQ(calls.load(), 2);
  auto always = std::make_shared<CannedTransport>(
      [](const HttpRequest&) { return Err(400, "XAmzContentSHA256Mismatch"); });
  auto failing = MakeStore(always);
  absl::Status s = failing->Put("k", absl::Cord("data")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("damaged on the way"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("4 attempts"));
}

TEST(S3StoreTest, NotImplementedIsNotRetried) {
  // 501 (a header asks for what the server does not do) and 505 answer every attempt alike.
  for (int status : {501, 505}) {
    auto transport = std::make_shared<CannedTransport>(
        [status](const HttpRequest&) { return Err(status, "NotImplemented"); });
    auto store = MakeStore(transport);
    auto read = store->Read("k");
    EXPECT_EQ(read.status().code(), absl::StatusCode::kUnimplemented) << read.status();
    EXPECT_THAT(std::string(read.status().message()), HasSubstr("s3://bkt/k: NotImplemented"));
    EXPECT_EQ(transport->request_count(), 1u) << status;
  }
  EXPECT_TRUE(IsRetryableHttpStatus(502));
  EXPECT_TRUE(IsRetryableHttpStatus(429));
  EXPECT_FALSE(IsRetryableHttpStatus(501));
  EXPECT_FALSE(IsRetryableHttpStatus(404));
}

TEST(S3StoreTest, NotFoundIsNotRetriedAndNamesTheObject) {
  auto transport =
      std::make_shared<CannedTransport>([](const HttpRequest&) { return Err(404, "NoSuchKey"); });
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
  const std::string data = Pattern(100000, 7);
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest& req) {
    if (++calls == 1) return ResetAfter(data, "v1", 30000);
    EXPECT_EQ(HeaderOf(req, "range"), "bytes=30000-99999");
    EXPECT_EQ(HeaderOf(req, "if-match"), "\"v1\"");
    return RestFrom(data, "v1", 30000);
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

TEST(S3StoreTest, AnAttemptThatFailsBeforeItsHeadersDoesNotCountThePreviousBytesAgain) {
  const std::string data = Pattern(100000, 11);
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>(
      [&](const HttpRequest& req) -> absl::StatusOr<CannedResponse> {
        const int call = ++calls;
        if (call == 1) return ResetAfter(data, "v1", 30000);
        if (call == 2) return absl::UnavailableError("Failed to connect: Connection refused");
        EXPECT_EQ(HeaderOf(req, "range"), "bytes=30000-99999");
        return RestFrom(data, "v1", 30000);
      });
  auto store = MakeStore(transport);
  std::string buffer(data.size(), '\0');
  auto got = store->Get({.key = "big", .buffer = absl::MakeSpan(buffer)});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(buffer, data);
  EXPECT_EQ(got->bytes, data.size());
  EXPECT_EQ(calls.load(), 3);
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

// A server that ignores Range (HTTP allows it) answers 200 with the whole object.
CannedHandler IgnoresRange(const std::string& data, std::atomic<int>* calls,
                           size_t chunk_bytes = 7) {
  return [&data, calls, chunk_bytes](const HttpRequest&) {
    ++*calls;
    CannedResponse r = Ok(data, {{"etag", "\"v\""}});
    r.chunk_bytes = chunk_bytes;  // the range starts and ends inside chunks
    return r;
  };
}

TEST(S3StoreTest, ARangeTheServerIgnoredIsCutFromTheWholeObject) {
  std::string data(1000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>('a' + i % 26);
  std::atomic<int> calls{0};
  auto store = MakeStore(std::make_shared<CannedTransport>(IgnoresRange(data, &calls)));
  struct Case {
    ByteRange range;
    uint64_t begin, end;
  };
  for (const Case& c :
       {Case{ByteRange::Of(100, 250), 100, 350}, Case{ByteRange::From(990), 990, 1000},
        Case{ByteRange::Last(33), 967, 1000}, Case{ByteRange::Of(0, 5000), 0, 1000},
        Case{ByteRange::Of(995, 10), 995, 1000}}) {
    SCOPED_TRACE(c.range.ToHttp());
    std::string buffer(c.end - c.begin, '\0');
    auto got = store->Get({.key = "k", .range = c.range, .buffer = absl::MakeSpan(buffer)});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(buffer, data.substr(c.begin, c.end - c.begin));
    EXPECT_EQ(got->offset, c.begin);
    EXPECT_EQ(got->bytes, c.end - c.begin);
    EXPECT_EQ(got->meta.size, data.size());
    absl::StatusOr<std::string> streamed = store->Read("k", c.range);  // through a sink
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    EXPECT_EQ(*streamed, data.substr(c.begin, c.end - c.begin));
  }
  // A range past the end is refused as S3 refuses it (416), once: not retried.
  calls = 0;
  std::string buffer(10, '\0');
  auto past =
      store->Get({.key = "k", .range = ByteRange::Of(1000, 10), .buffer = absl::MakeSpan(buffer)});
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange) << past.status();
  EXPECT_THAT(past.status().message(), HasSubstr("s3://bkt/k"));
  EXPECT_EQ(calls.load(), 1);
}

TEST(S3StoreTest, AResumedRangeTheServerIgnoredIsCutFromTheWholeObject) {
  const std::string data = Pattern(100000, 13);
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest& req) {
    if (++calls == 1) return ResetAfter(data, "v1", 30000);
    EXPECT_EQ(HeaderOf(req, "range"), "bytes=30000-99999");
    return Ok(data, {{"etag", "\"v1\""}});  // the resume's Range ignored: the whole object
  });
  auto store = MakeStore(transport);
  std::string buffer(data.size(), '\0');
  auto got = store->Get({.key = "big", .buffer = absl::MakeSpan(buffer)});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(buffer, data);
  EXPECT_EQ(got->bytes, data.size());
  EXPECT_EQ(calls.load(), 2);
}

TEST(S3StoreTest, ARangeTheServerIgnoredIsCutFromABodyOfUnknownSize) {
  std::string data(1000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>('A' + i % 26);
  auto store = MakeStore(std::make_shared<CannedTransport>([&](const HttpRequest&) {
    CannedResponse r = Ok(data, {{"etag", "\"v\""}});
    r.no_content_length = true;  // chunked
    r.chunk_bytes = 7;
    return r;
  }));
  for (const ByteRange& range : {ByteRange::From(990), ByteRange::Of(100, 250)}) {
    SCOPED_TRACE(range.ToHttp());
    const uint64_t n = range.length.value_or(data.size() - range.offset);
    std::string buffer(n, '\0');
    auto got = store->Get({.key = "k", .range = range, .buffer = absl::MakeSpan(buffer)});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(buffer, data.substr(range.offset, n));
    EXPECT_EQ(got->bytes, n);
  }
  // The last bytes of an object of unknown size cannot be found: refused, by name.
  std::string buffer(10, '\0');
  auto got =
      store->Get({.key = "k", .range = ByteRange::Last(10), .buffer = absl::MakeSpan(buffer)});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnimplemented) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("get s3://bkt/k: the server ignored the Range"));
}

TEST(S3StoreTest, AResumeAnsweredWithAnotherVersionsWholeObjectFails) {
  const std::string data(100000, 'a');
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest&) {
    if (++calls == 1) return ResetAfter(data, "v1", 30000);
    return Ok(std::string(100000, 'b'), {{"etag", "\"v2\""}});  // Range and If-Match ignored
  });
  auto store = MakeStore(transport);
  std::string buffer(data.size(), '\0');
  auto got = store->Get({.key = "big", .buffer = absl::MakeSpan(buffer)});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("changed from ETag v1 to v2"));
  EXPECT_EQ(buffer.find('b'), std::string::npos);  // nothing of the other version
  EXPECT_EQ(calls.load(), 2);
}

TEST(S3StoreTest, ABufferTooSmallFailsBeforeTheBodyAndIsNotRetried) {
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest&) {
    ++calls;
    return Ok(std::string(100, 'x'));
  });
  auto store = MakeStore(transport);
  std::string buffer(99, '\0');
  auto got = store->Get({.key = "k", .buffer = absl::MakeSpan(buffer)});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kOutOfRange) << got.status();
  EXPECT_THAT(
      got.status().message(),
      HasSubstr("get s3://bkt/k: the response body of 100 bytes does not fit the 99-byte buffer"));
  EXPECT_EQ(buffer, std::string(99, '\0'));
  EXPECT_EQ(calls.load(), 1);
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

TEST(S3StoreTest, IfNoneMatchOfTheCurrentEtagIs304NotModified) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest& req) {
    if (HeaderOf(req, "if-none-match") == "\"v1\"") {
      // What S3 answers: no body, the validators of the current version.
      CannedResponse r;
      r.status = 304;
      r.headers = {{"etag", "\"v1\""}, {"last-modified", "Wed, 12 Oct 2009 17:50:00 GMT"}};
      return r;
    }
    return Ok("current bytes", {{"etag", "\"v2\""}});
  });
  auto store = MakeStore(transport);
  std::string buffer(13, 'x');
  auto got = store->Get({.key = "k", .buffer = absl::MakeSpan(buffer), .if_none_match = "v1"});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->not_modified);
  EXPECT_EQ(got->bytes, 0u);
  EXPECT_EQ(got->meta.etag, "v1");
  EXPECT_EQ(got->meta.mtime, absl::FromUnixSeconds(1255369800));
  EXPECT_EQ(buffer, std::string(13, 'x'));
  EXPECT_EQ(transport->request_count(), 1u);  // a 304 is an answer, not an error to retry

  auto changed = store->Get({.key = "k", .buffer = absl::MakeSpan(buffer), .if_none_match = "v0"});
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(changed->not_modified);
  EXPECT_EQ(buffer, "current bytes");
  // The header is sent quoted, and only when asked for.
  EXPECT_EQ(HeaderOf(transport->requests()[1], "if-none-match"), "\"v0\"");
  ASSERT_TRUE(store->Read("k").ok());
  EXPECT_EQ(HeaderOf(transport->requests()[2], "if-none-match"), "");
}

TEST(S3StoreTest, A304WithoutIfNoneMatchIsAnError) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest&) {
    CannedResponse r;
    r.status = 304;
    return r;
  });
  auto store = MakeStore(transport);
  auto read = store->Read("k");
  EXPECT_FALSE(read.ok());
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("s3://bkt/k"));
}

TEST(S3StoreTest, PreCancelledGetSendsNothing) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest&) {
    return Ok("payload", {{"etag", "\"e\""}});
  });
  auto store = MakeStore(transport);
  CancelToken cancel = NewCancelToken();
  cancel->Cancel();
  std::string buffer(7, '\0');
  GetRequest request{.key = "a/b", .buffer = absl::MakeSpan(buffer)};
  request.cancel = cancel;
  auto got = store->Get(request);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(got.status().message(), "get s3://bkt/a/b: cancelled");
  EXPECT_EQ(transport->request_count(), 0u);
  EXPECT_EQ(transport->stats().requests_started, 0u);
}

// A sink that cancels the read after its first chunk.
class CancellingSink : public ReadSink {
 public:
  explicit CancellingSink(CancelToken cancel) : cancel_(std::move(cancel)) {}
  absl::Status Append(absl::string_view chunk) override {
    bytes += chunk.size();
    cancel_->Cancel();
    return absl::OkStatus();
  }
  uint64_t bytes = 0;

 private:
  CancelToken cancel_;
};

TEST(S3StoreTest, CancelMidBodyStopsTheTransferAndIsNotResumed) {
  // The connection also breaks after 40000 bytes: without the cancel this GET would resume.
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest&) {
    CannedResponse r = Ok(std::string(100000, 'z'), {{"etag", "\"v\""}});
    r.chunk_bytes = 10000;
    r.failure = absl::UnavailableError("Connection reset by peer");
    r.fail_after_bytes = 40000;
    return r;
  });
  auto store = MakeStore(transport);
  CancelToken cancel = NewCancelToken();
  CancellingSink sink(cancel);
  GetRequest request{.key = "big", .sink = &sink};
  request.cancel = cancel;
  auto got = store->Get(request);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled) << got.status();
  EXPECT_EQ(got.status().message(), "get s3://bkt/big: cancelled");
  EXPECT_EQ(sink.bytes, 10000u);  // the first chunk only
  EXPECT_EQ(transport->request_count(), 1u);
}

TEST(S3StoreTest, CancelDuringRetryBackoffEndsTheCallWithoutWaitingItOut) {
  auto transport =
      std::make_shared<CannedTransport>([](const HttpRequest&) { return Err(503, "SlowDown"); });
  S3StoreOptions options;
  options.retry.initial_backoff = absl::Seconds(60);
  options.retry.max_backoff = absl::Seconds(60);
  auto store = *S3Store::Open("bkt", TestConfig(), transport, options);
  CancelToken cancel = NewCancelToken();
  std::string buffer(10, '\0');
  GetRequest request{.key = "k", .buffer = absl::MakeSpan(buffer)};
  request.cancel = cancel;
  absl::Notification done;
  absl::Status status;
  store->GetAsync(std::move(request), [&](absl::StatusOr<GetResult> r) {
    status = r.status();
    done.Notify();
  });
  while (transport->request_count() < 1) absl::SleepFor(absl::Milliseconds(1));
  cancel->Cancel();
  // The backoff drawn is up to a minute: the cancel, not the timer, ends the wait.
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("get s3://bkt/k: cancelled"));
  EXPECT_LE(transport->request_count(), 2u);
}

TEST(S3StoreTest, PutChecksTheEtagAgainstTheMd5Sent) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest& req) {
    std::string md5;
    for (const auto& [k, v] : req.headers) {
      if (k == "content-md5") md5 = v;
    }
    EXPECT_EQ(md5, Base64(std::string(
                       "\x5d\x41\x40\x2a\xbc\x4b\x2a\x76\xb9\x71\x9d\x91\x10\x17\xc5\x92", 16)));
    return Ok("", {{"etag", "\"00000000000000000000000000000000\""}});
  });
  auto store = MakeStore(transport);
  auto put = store->Put("k", absl::Cord("hello"));
  EXPECT_EQ(put.status().code(), absl::StatusCode::kDataLoss);
}

TEST(S3StoreTest, KeysAreEncodedOnceInTheUrl) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest&) {
    return Ok("", {{"etag", "\"e\""}});
  });
  auto store = MakeStore(transport);
  (void)store->Head("dir/a b+c%d=é~*");
  ASSERT_EQ(transport->request_count(), 1u);
  EXPECT_EQ(transport->requests()[0].url, "http://127.0.0.1:9/bkt/dir/a%20b%2Bc%25d%3D%C3%A9~%2A");
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

TEST(S3StoreTest, AListingPageIsNeverTakenOnTrustAsTheLast) {
  // A page that cannot be the last (truncated without a token) and one that would list for
  // ever (the token asked with, again) are DataLoss naming the prefix, not the listing's end.
  for (const char* body : {"<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
                           "<ListBucketResult><IsTruncated>true</IsTruncated>"
                           "<NextContinuationToken>T</NextContinuationToken></ListBucketResult>",
                           "<html><body>upstream busy</body></html>"}) {
    auto transport =
        std::make_shared<CannedTransport>([body](const HttpRequest&) { return Ok(body); });
    auto store = MakeStore(transport);
    auto page = store->List({.prefix = "d/"}, "T");
    EXPECT_EQ(page.status().code(), absl::StatusCode::kDataLoss) << body;
    EXPECT_THAT(std::string(page.status().message()), HasSubstr("list s3://bkt/d/: ")) << body;
  }
}

TEST(S3StoreTest, FailedPartAbortsTheMultipartUpload) {
  std::atomic<bool> aborted{false};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest& req) {
    if (req.method == "POST" && absl::StrContains(req.url, "uploads")) {
      return Ok(
          "<InitiateMultipartUploadResult><UploadId>u1</UploadId>"
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
      return Ok(
          "<InitiateMultipartUploadResult><UploadId>u1</UploadId>"
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

// ---- Credentials from a provider ----

// Temporary credentials "ASIA<n>" with session token "token-<n>" at the n-th fetch.
class CountingProvider : public CredentialsProvider {
 public:
  explicit CountingProvider(std::string name) : name_(std::move(name)) {}
  absl::StatusOr<Credentials> Fetch() override {
    const int n = ++fetches_;
    if (fail_) return absl::UnavailableError("the source is down");
    Credentials c;
    c.access_key_id = absl::StrCat("ASIA", n);
    c.secret_access_key = kSecret;
    c.session_token = absl::StrCat("token-", n);
    c.expiration = absl::Now() + absl::Hours(1);
    return c;
  }
  std::string Describe() const override { return name_; }
  std::atomic<int> fetches_{0};
  std::atomic<bool> fail_{false};

 private:
  const std::string name_;
};

// A config whose credentials come only from `provider` (no static keys). Each test names its
// provider uniquely: stores of one runtime share a cache per source description.
std::unique_ptr<S3Store> MakeStoreWithProvider(std::shared_ptr<HttpTransport> transport,
                                               std::shared_ptr<CredentialsProvider> provider) {
  S3ClientConfig config = TestConfig();
  config.credentials = {};
  config.credentials_source = provider->Describe();
  config.credentials_provider = std::move(provider);
  S3StoreOptions options;
  options.retry.initial_backoff = absl::Milliseconds(1);
  options.retry.max_attempts = 4;
  return *S3Store::Open("bkt", std::move(config), std::move(transport), options);
}

TEST(S3StoreTest, SignsWithFetchedCredentialsAndTheirSessionToken) {
  auto provider = std::make_shared<CountingProvider>("test provider: session token");
  std::vector<std::string> authorizations, tokens;
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest& req) {
    authorizations.push_back(HeaderOf(req, "authorization"));
    tokens.push_back(HeaderOf(req, "x-amz-security-token"));
    return Ok("payload", {{"etag", "\"e\""}});
  });
  auto store = MakeStoreWithProvider(transport, provider);
  ASSERT_TRUE(store->Read("a").ok());
  ASSERT_TRUE(store->Read("b").ok());
  EXPECT_EQ(provider->fetches_.load(), 1);  // cached between requests
  ASSERT_EQ(authorizations.size(), 2u);
  EXPECT_THAT(authorizations[1], HasSubstr("Credential=ASIA1/"));
  EXPECT_THAT(authorizations[1], HasSubstr("x-amz-security-token"));
  EXPECT_EQ(tokens[1], "token-1");
}

TEST(S3StoreTest, ExpiredTokenRefreshesTheCredentialsAndRetriesOnce) {
  auto provider = std::make_shared<CountingProvider>("test provider: expired token");
  std::vector<std::string> authorizations;
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest& req) {
    authorizations.push_back(HeaderOf(req, "authorization"));
    if (absl::StrContains(authorizations.back(), "Credential=ASIA1/")) {
      return Err(400, "ExpiredToken");
    }
    return Ok("payload", {{"etag", "\"e\""}});
  });
  auto store = MakeStoreWithProvider(transport, provider);
  auto read = store->Read("k");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "payload");
  EXPECT_EQ(provider->fetches_.load(), 2);
  ASSERT_EQ(authorizations.size(), 2u);
  EXPECT_THAT(authorizations[1], HasSubstr("Credential=ASIA2/"));

  // A server that keeps refusing: one refresh per call, then the error.
  auto refusing = std::make_shared<CannedTransport>(
      [&](const HttpRequest&) { return Err(403, "InvalidToken"); });
  auto provider2 = std::make_shared<CountingProvider>("test provider: always refused");
  auto store2 = MakeStoreWithProvider(refusing, provider2);
  read = store2->Read("k");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("InvalidToken"));
  EXPECT_THAT(std::string(read.status().message()),
              HasSubstr("credentials from test provider: always refused"));
  EXPECT_EQ(provider2->fetches_.load(), 2);
}

TEST(S3StoreTest, CredentialFailuresNameTheSourceAndTheObject) {
  auto provider = std::make_shared<CountingProvider>("test provider: down");
  provider->fail_ = true;
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest&) {
    ++calls;
    return Ok("payload");
  });
  auto store = MakeStoreWithProvider(transport, provider);
  auto read = store->Read("k");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(read.status().message(),
            "get s3://bkt/k: credentials from test provider: down: the source is down");
  EXPECT_EQ(calls.load(), 0);
}

// ---- Upload options ----

// The names in the Authorization header's SignedHeaders=.
std::vector<std::string> SignedHeaders(const HttpRequest& req) {
  const std::string auth = HeaderOf(req, "authorization");
  const size_t at = auth.find("SignedHeaders=");
  if (at == std::string::npos) return {};
  const size_t from = at + std::strlen("SignedHeaders=");
  return absl::StrSplit(auth.substr(from, auth.find(',', from) - from), ';');
}

TEST(S3StoreTest, AnSseKmsObjectsEtagIsNotTakenForAnMd5) {
  // AWS: the ETag of an object (and a part) encrypted with SSE-KMS or SSE-C is no MD5 of its
  // content; a bucket encrypting by default answers so for every upload. Content-MD5 has the
  // server check the body. Without such a header, an ETag that is not the MD5 is DataLoss.
  for (const char* encryption : {"aws:kms", "aws:kms:dsse", "SSE-C", ""}) {
    auto transport = std::make_shared<CannedTransport>([&](const HttpRequest& req) {
      std::vector<std::pair<std::string, std::string>> headers = {
          {"etag", "\"0123456789abcdef0123456789abcdef\""}};
      if (absl::string_view(encryption) == "SSE-C") {
        headers.emplace_back("x-amz-server-side-encryption-customer-algorithm", "AES256");
      } else if (*encryption != '\0') {
        headers.emplace_back("x-amz-server-side-encryption", encryption);
      }
      if (req.method == "POST" && absl::StrContains(req.url, "uploads")) {
        return Ok(
            "<InitiateMultipartUploadResult><UploadId>u1</UploadId>"
            "</InitiateMultipartUploadResult>");
      }
      if (req.method == "POST") {  // complete
        return Ok(
            "<CompleteMultipartUploadResult><ETag>\"e-2\"</ETag>"
            "</CompleteMultipartUploadResult>");
      }
      return Ok("", headers);
    });
    auto store = MakeStore(transport);
    const bool opaque = *encryption != '\0';
    auto put = store->Put("k", absl::Cord("hello"));
    EXPECT_EQ(put.ok(), opaque) << encryption << ": " << put.status();
    if (!opaque) {
      EXPECT_EQ(put.status().code(), absl::StatusCode::kDataLoss);
    }
    auto writer = store->NewWriter("big");
    ASSERT_TRUE(writer.ok());
    absl::Status wrote = (*writer)->Write(absl::Cord(std::string(6 << 20, 'x')));
    absl::StatusOr<ObjectMeta> closed =
        wrote.ok() ? (*writer)->Close() : absl::StatusOr<ObjectMeta>(wrote);
    EXPECT_EQ(closed.ok(), opaque) << encryption << ": " << closed.status();
  }
}

TEST(S3StoreTest, AGetOrHeadOfAnSseKmsObjectMarksItsEtagOpaque) {
  for (bool kms : {true, false}) {
    auto transport = std::make_shared<CannedTransport>([&](const HttpRequest&) {
      std::vector<std::pair<std::string, std::string>> headers = {
          {"etag", "\"0123456789abcdef0123456789abcdef\""}};
      if (kms) headers.emplace_back("x-amz-server-side-encryption", "aws:kms");
      return Ok("data", headers);
    });
    auto store = MakeStore(transport);
    auto head = store->Head("k");
    ASSERT_TRUE(head.ok()) << head.status();
    EXPECT_EQ(head->etag_opaque, kms);
    EXPECT_EQ(ContentMd5(*head).empty(), kms);
    std::string buffer(4, '\0');
    auto got = store->Get({.key = "k", .buffer = absl::MakeSpan(buffer)});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->meta.etag_opaque, kms);
  }
}

TEST(S3StoreTest, UploadOptionsAreSentAndSigned) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest& req) {
    if (req.method == "POST") {
      return Ok(
          "<InitiateMultipartUploadResult><UploadId>u1</UploadId>"
          "</InitiateMultipartUploadResult>");
    }
    if (req.method == "PUT") {
      return Ok("", {{"etag", absl::StrCat("\"", Md5Hex(std::string(req.body)), "\"")}});
    }
    return Err(500, "Unexpected");
  });
  auto store = MakeStore(transport);
  PutOptions options;
  options.content_type = "text/html; charset=utf-8";
  options.storage_class = "STANDARD_IA";
  options.sse = "aws:kms";
  options.sse_kms_key_id = "arn:aws:kms:us-east-1:123456789012:key/abc";
  ASSERT_TRUE(store->Put("k", absl::Cord("hello"), options).ok());
  // A writer sends them on the create, not on the parts.
  auto writer = store->NewWriter("big", options);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Write(absl::Cord(std::string(5 << 20, 'x'))).ok());
  (*writer)->Abort();

  const auto requests = transport->requests();
  ASSERT_GE(requests.size(), 3u);
  for (int i : {0, 1}) {
    const HttpRequest& req = requests[i];
    EXPECT_EQ(req.method, i == 0 ? "PUT" : "POST");
    EXPECT_EQ(HeaderOf(req, "content-type"), "text/html; charset=utf-8");
    EXPECT_EQ(HeaderOf(req, "x-amz-storage-class"), "STANDARD_IA");
    EXPECT_EQ(HeaderOf(req, "x-amz-server-side-encryption"), "aws:kms");
    EXPECT_EQ(HeaderOf(req, "x-amz-server-side-encryption-aws-kms-key-id"),
              "arn:aws:kms:us-east-1:123456789012:key/abc");
    EXPECT_THAT(SignedHeaders(req),
                testing::IsSupersetOf({"content-type", "x-amz-storage-class",
                                       "x-amz-server-side-encryption",
                                       "x-amz-server-side-encryption-aws-kms-key-id"}));
  }
  EXPECT_EQ(requests[2].method, "PUT");  // part 1
  EXPECT_EQ(HeaderOf(requests[2], "x-amz-server-side-encryption"), "");
  EXPECT_EQ(HeaderOf(requests[2], "x-amz-storage-class"), "");
}

TEST(S3StoreTest, CreateOnlyPutsSendIfNoneMatchAndTellTheirOwnLandedRetryFromAnother) {
  // The first PUT lands but its reply is lost (503); the retry finds the key taken (412),
  // and the HEAD shows this put's bytes: success. Then a put of other bytes is refused.
  std::atomic<int> puts{0};
  const std::string etag = absl::StrCat("\"", Md5Hex("mine"), "\"");
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest& req) {
    if (req.method == "HEAD") return Ok("", {{"etag", etag}, {"content-length", "4"}});
    EXPECT_EQ(HeaderOf(req, "if-none-match"), "*");
    EXPECT_THAT(SignedHeaders(req), testing::Contains("if-none-match"));
    if (++puts == 1) return Err(503, "SlowDown");
    return Err(412, "PreconditionFailed");
  });
  auto store = MakeStore(transport);
  PutOptions create;
  create.if_absent = true;
  auto landed = store->Put("k", absl::Cord("mine"), create);
  ASSERT_TRUE(landed.ok()) << landed.status();
  EXPECT_EQ(landed->etag, Md5Hex("mine"));
  auto refused = store->Put("k", absl::Cord("theirs"), create);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("already exists"));
  // The multipart create does not carry the condition (S3 takes it on the complete).
  auto writer = store->NewWriter("big", create);
  ASSERT_TRUE(writer.ok());
}

TEST(S3StoreTest, InvalidUploadOptionsAreRefusedBeforeSending) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest&) {
    return Ok("", {{"etag", "\"e\""}});
  });
  auto store = MakeStore(transport);
  PutOptions lowercase;
  lowercase.sse = "aes256";
  PutOptions key_without_kms;
  key_without_kms.sse = "AES256";
  key_without_kms.sse_kms_key_id = "k";
  PutOptions key_alone;
  key_alone.sse_kms_key_id = "k";
  PutOptions newline;
  newline.content_type = "text/plain\r\nx-amz-acl: public-read";
  for (const PutOptions& bad : {lowercase, key_without_kms, key_alone, newline}) {
    auto put = store->Put("a/k", absl::Cord("x"), bad);
    EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(put.status().message()), HasSubstr("put s3://bkt/a/k: "));
    EXPECT_EQ(store->NewWriter("a/k", bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(transport->request_count(), 0u);
}

// ---- Multipart uploads left behind ----

// A fake S3 multipart endpoint for one bucket: creates (whose replies can be lost after the
// upload was created), parts, completes (whose replies can be lost after completing),
// aborts, ListMultipartUploads and HEAD. Thread-safe (the handler runs on the transport
// thread; the test reads the state after the writer is done).
class FakeMultipartServer {
 public:
  struct Upload {
    std::string key, id;
    absl::Time initiated;
  };

  CannedHandler Handler() {
    return [this](const HttpRequest& req) { return Serve(req); };
  }

  absl::Mutex mu;
  std::vector<Upload> uploads ABSL_GUARDED_BY(mu);
  // key -> ETag of completed objects
  std::map<std::string, std::pair<std::string, uint64_t>> objects ABSL_GUARDED_BY(mu);
  int lose_create_replies ABSL_GUARDED_BY(mu) = 0;
  int lose_complete_replies ABSL_GUARDED_BY(mu) = 0;
  int creates ABSL_GUARDED_BY(mu) = 0;
  int listings ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::string> aborted ABSL_GUARDED_BY(mu);

  std::vector<std::string> UploadIds(absl::string_view key) {
    absl::MutexLock lock(&mu);
    std::vector<std::string> ids;
    for (const Upload& u : uploads) {
      if (u.key == key) ids.push_back(u.id);
    }
    return ids;
  }

 private:
  static std::string Query(const std::string& url, absl::string_view name) {
    const size_t q = url.find('?');
    if (q == std::string::npos) return "";
    for (absl::string_view kv : absl::StrSplit(absl::string_view(url).substr(q + 1), '&')) {
      std::pair<absl::string_view, absl::string_view> p = absl::StrSplit(kv, '=');
      if (p.first == name) return std::string(p.second);
    }
    return "";
  }
  static std::string KeyOf(const std::string& url) {
    absl::string_view path = url;
    path.remove_prefix(path.find("/bkt/") + 5);
    return std::string(path.substr(0, path.find('?')));
  }
  static CannedResponse Lost(CannedResponse r) {
    r.failure = absl::UnavailableError("Recv failure: Connection reset by peer");
    r.fail_after_bytes = 0;
    return r;
  }

  absl::StatusOr<CannedResponse> Serve(const HttpRequest& req) {
    absl::MutexLock lock(&mu);
    const bool has_uploads =
        absl::StrContains(req.url, "?uploads=") || absl::StrContains(req.url, "&uploads=");
    const std::string upload_id = Query(req.url, "uploadId");
    if (req.method == "POST" && has_uploads) {  // create
      Upload u{KeyOf(req.url), absl::StrCat("u", ++creates), absl::Now()};
      uploads.push_back(u);
      CannedResponse r = Ok(absl::StrCat("<InitiateMultipartUploadResult><UploadId>", u.id,
                                         "</UploadId></InitiateMultipartUploadResult>"));
      if (lose_create_replies > 0) {
        --lose_create_replies;
        return Lost(r);
      }
      return r;
    }
    if (req.method == "GET" && has_uploads) {  // ListMultipartUploads
      ++listings;
      std::string prefix = Query(req.url, "prefix");
      std::string xml = "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>";
      for (const Upload& u : uploads) {
        if (!absl::StartsWith(u.key, prefix)) continue;
        absl::StrAppend(&xml, "<Upload><Key>", u.key, "</Key><UploadId>", u.id,
                        "</UploadId><Initiated>",
                        absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", u.initiated, absl::UTCTimeZone()),
                        "</Initiated></Upload>");
      }
      absl::StrAppend(&xml, "</ListMultipartUploadsResult>");
      return Ok(xml, {{"date", absl::FormatTime("%a, %d %b %Y %H:%M:%S GMT", absl::Now(),
                                                absl::UTCTimeZone())}});
    }
    auto find = [&]() {
      return std::find_if(uploads.begin(), uploads.end(),
                          [&](const Upload& u) { return u.id == upload_id; });
    };
    if (req.method == "PUT" && !upload_id.empty()) {  // part
      if (find() == uploads.end()) return Err(404, "NoSuchUpload");
      return Ok("", {{"etag", absl::StrCat("\"", Md5Hex(std::string(req.body)), "\"")}});
    }
    if (req.method == "POST" && !upload_id.empty()) {  // complete
      auto it = find();
      if (it == uploads.end()) return Err(404, "NoSuchUpload");
      // The parts' ETags as the client listed them: the multipart ETag is their MD5.
      Md5 md5;
      int parts = 0;
      const std::string body(req.body);
      for (size_t at = body.find("<ETag>"); at != std::string::npos;
           at = body.find("<ETag>", at + 1)) {
        std::string etag = body.substr(at + 7, 32);  // skip <ETag>"
        md5.Update(absl::HexStringToBytes(etag));
        ++parts;
      }
      const std::string etag = absl::StrCat(HexLower(md5.Finish()), "-", parts);
      objects[it->key] = {etag, 0};
      uploads.erase(it);
      CannedResponse r = Ok(absl::StrCat("<CompleteMultipartUploadResult><ETag>\"", etag,
                                         "\"</ETag>"
                                         "</CompleteMultipartUploadResult>"));
      if (lose_complete_replies > 0) {
        --lose_complete_replies;
        return Lost(r);
      }
      return r;
    }
    if (req.method == "DELETE" && !upload_id.empty()) {  // abort
      aborted.push_back(upload_id);
      auto it = find();
      if (it == uploads.end()) return Err(404, "NoSuchUpload");
      uploads.erase(it);
      CannedResponse r;
      r.status = 204;
      return r;
    }
    if (req.method == "HEAD") {
      auto it = objects.find(KeyOf(req.url));
      if (it == objects.end()) return Err(404, "NoSuchKey");
      return Ok("", {{"etag", absl::StrCat("\"", it->second.first, "\"")},
                     {"content-length", "6291456"}});
    }
    return Err(500, "Unexpected");
  }
};

constexpr uint64_t kSixMiB = 6 << 20;  // two parts of MakeStore's 5 MiB

TEST(S3StoreTest, RetriedCreateAbortsOnlyTheUploadsItStarted) {
  FakeMultipartServer server;
  {
    absl::MutexLock lock(&server.mu);
    server.lose_create_replies = 2;  // u1 and u2 are created but their replies lost
    server.uploads = {
        {"big", "before", absl::Now() - absl::Hours(1)},  // another writer's, earlier
        {"big2", "other-key", absl::Now()},               // a key the prefix also matches
        {"big", "later", absl::Now() + absl::Hours(1)},   // another writer's, after ours
    };
  }
  auto transport = std::make_shared<CannedTransport>(server.Handler());
  auto store = MakeStore(transport);
  auto writer = store->NewWriter("big");
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Write(absl::Cord(std::string(kSixMiB, 'x'))).ok());
  auto closed = (*writer)->Close();
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->size, kSixMiB);
  EXPECT_THAT(closed->etag, testing::EndsWith("-2"));
  absl::MutexLock lock(&server.mu);
  EXPECT_EQ(server.creates, 3);
  EXPECT_EQ(server.objects.count("big"), 1u);  // u3, completed
  EXPECT_THAT(server.aborted, testing::UnorderedElementsAre("u1", "u2"));
  std::vector<std::string> left;
  for (const auto& u : server.uploads) left.push_back(u.id);
  EXPECT_THAT(left, testing::UnorderedElementsAre("before", "other-key", "later"));
}

TEST(S3StoreTest, ListUploadsBelowAPrefixAndAbortOne) {
  FakeMultipartServer server;  // (its listing compares the prefix undecoded: no "/")
  const absl::Time then = absl::FromUnixSeconds(1700000000);
  {
    absl::MutexLock lock(&server.mu);
    server.uploads = {{"ckpt-a", "u-a", then}, {"ckpt-b", "u-b", then}, {"other", "u-o", then}};
  }
  auto store = MakeStore(std::make_shared<CannedTransport>(server.Handler()));
  auto uploads = store->ListUploads("ckpt-");
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  ASSERT_EQ(uploads->size(), 2u);
  EXPECT_EQ((*uploads)[0].key, "ckpt-a");
  EXPECT_EQ((*uploads)[0].upload_id, "u-a");
  EXPECT_EQ((*uploads)[0].initiated, then);
  EXPECT_TRUE(store->AbortUpload("ckpt-a", "u-a").ok());
  EXPECT_TRUE(store->AbortUpload("ckpt-a", "u-a").ok());  // gone already: success
  EXPECT_THAT(server.UploadIds("ckpt-a"), testing::IsEmpty());
  EXPECT_THAT(server.UploadIds("ckpt-b"), testing::ElementsAre("u-b"));
}

TEST(S3StoreTest, CreateThatNeverGetsAReplyLeavesNothing) {
  FakeMultipartServer server;
  {
    absl::MutexLock lock(&server.mu);
    server.lose_create_replies = 100;  // every attempt creates an upload, none hears of it
  }
  auto transport = std::make_shared<CannedTransport>(server.Handler());
  auto store = MakeStore(transport);
  auto writer = store->NewWriter("big");
  ASSERT_TRUE(writer.ok());
  absl::Status s = (*writer)->Write(absl::Cord(std::string(kSixMiB, 'x')));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("start upload s3://bkt/big"));
  // The failure is sticky and the uploads are gone before the writer is.
  EXPECT_EQ((*writer)->Close().status(), s);
  EXPECT_TRUE(server.UploadIds("big").empty());
  writer->reset();
  absl::MutexLock lock(&server.mu);
  EXPECT_EQ(server.creates, 4);  // MakeStore's max_attempts
  EXPECT_THAT(server.aborted, testing::UnorderedElementsAre("u1", "u2", "u3", "u4"));
}

TEST(S3StoreTest, CompleteWhoseReplyWasLostStillSucceeds) {
  FakeMultipartServer server;
  {
    absl::MutexLock lock(&server.mu);
    server.lose_complete_replies = 1;  // completed, then the retry finds NoSuchUpload
  }
  auto transport = std::make_shared<CannedTransport>(server.Handler());
  auto store = MakeStore(transport);
  auto writer = store->NewWriter("big");
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Write(absl::Cord(std::string(kSixMiB, 'x'))).ok());
  auto closed = (*writer)->Close();
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_THAT(closed->etag, testing::EndsWith("-2"));
  writer->reset();
  absl::MutexLock lock(&server.mu);
  EXPECT_EQ(server.objects.count("big"), 1u);
  EXPECT_TRUE(server.aborted.empty());
  EXPECT_EQ(server.listings, 0);  // a create answered at once needs no listing
}

TEST(S3StoreTest, FailedWriterAbortsItsUploadBeforeReturning) {
  FakeMultipartServer server;
  std::atomic<bool> fail_parts{false};
  auto transport = std::make_shared<CannedTransport>(
      [&, serve = server.Handler()](const HttpRequest& req) -> absl::StatusOr<CannedResponse> {
        if (fail_parts && req.method == "PUT") return Err(400, "InvalidDigest");
        return serve(req);
      });
  auto store = MakeStore(transport);
  auto writer = store->NewWriter("big");
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Write(absl::Cord(std::string(5 << 20, 'x'))).ok());
  fail_parts = true;
  absl::Status s = (*writer)->Write(absl::Cord(std::string(10 << 20, 'y')));
  if (s.ok()) s = (*writer)->Close().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // Aborted already, with the writer still alive.
  EXPECT_TRUE(server.UploadIds("big").empty());
  EXPECT_EQ((*writer)->Write(absl::Cord("more")), s);
}

// ---- Bucket listing and unsigned requests ----

TEST(S3StoreTest, ListBucketsAsksTheEndpoint) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest& req) {
    EXPECT_EQ(req.method, "GET");
    EXPECT_EQ(req.url, "http://127.0.0.1:9/");
    return Ok(
        "<?xml version=\"1.0\"?><ListAllMyBucketsResult xmlns=\"http://s3.amazonaws.com/doc/"
        "2006-03-01/\"><Owner><ID>me</ID></Owner><Buckets>"
        "<Bucket><Name>alpha</Name><CreationDate>2024-01-02T03:04:05.000Z</CreationDate></Bucket>"
        "<Bucket><Name>beta</Name><CreationDate>2024-02-03T04:05:06.000Z</CreationDate></Bucket>"
        "</Buckets></ListAllMyBucketsResult>");
  });
  for (bool path_style : {true, false}) {
    S3ClientConfig config = TestConfig();
    config.path_style = path_style;  // the endpoint's own host either way
    auto endpoint = *S3Store::Open("", config, transport);
    EXPECT_EQ(endpoint->Uri(""), "s3://");
    auto buckets = endpoint->ListBuckets();
    ASSERT_TRUE(buckets.ok()) << buckets.status();
    ASSERT_EQ(buckets->size(), 2u);
    EXPECT_EQ((*buckets)[0].name, "alpha");
    EXPECT_EQ((*buckets)[0].creation_time, absl::FromUnixSeconds(1704164645));
    EXPECT_EQ((*buckets)[1].name, "beta");
  }
  auto in_bucket = MakeStore(transport);
  EXPECT_EQ(in_bucket->ListBuckets().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(S3StoreTest, AnonymousRequestsAreUnsignedAndDenialsSaySo) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest& req) {
    return HeaderOf(req, "x-amz-date").empty() ? Err(403, "AccessDenied") : Err(500, "Signed");
  });
  S3ClientConfig config = TestConfig();
  config.credentials = {};
  config.anonymous = true;
  config.credentials_source = "anonymous (requests are not signed)";
  auto store = *S3Store::Open("bkt", config, transport);
  auto read = store->Read("private.txt");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(read.status().message()),
              HasSubstr("get s3://bkt/private.txt: AccessDenied"));
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("unsigned"));
  ASSERT_EQ(transport->request_count(), 1u);
  EXPECT_EQ(HeaderOf(transport->requests()[0], "authorization"), "");
}

}  // namespace
}  // namespace wharf::s3
