// The JSON API backend against canned responses shaped as the API documents them
// (https://cloud.google.com/storage/docs/json_api/v1): what the local emulator lacks
// (pagination, startOffset/endOffset, preconditions, authorization) and the error paths
// (retries, token refresh, error mapping, resumed reads and uploads, integrity checks). The
// live behaviour is in gcs_conformance_test.cc.
#include "store/gcs/gcs_json_store.h"

#include <atomic>
#include <map>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/crc32c.h"
#include "base/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "http/canned_transport.h"
#include "nlohmann/json.hpp"

namespace wharf::gcs {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

constexpr char kToken[] = "ya29.secret-token-value";

GcsJsonConfig TestConfig() {
  GcsJsonConfig c;
  c.endpoint = "http://127.0.0.1:9";
  c.chunk_size = 256 << 10;
  c.retry.initial_backoff = absl::Milliseconds(1);
  c.retry.max_backoff = absl::Milliseconds(4);
  c.retry.max_attempts = 4;
  return c;
}

std::unique_ptr<GcsJsonStore> MakeStore(std::shared_ptr<HttpTransport> transport,
                                        GcsJsonConfig config = TestConfig()) {
  return *GcsJsonStore::Open("bkt", std::move(config), std::move(transport));
}

CannedResponse Json(int status, json body,
                    std::vector<std::pair<std::string, std::string>> headers = {}) {
  CannedResponse r;
  r.status = status;
  r.body = body.dump();
  r.headers = std::move(headers);
  r.headers.emplace_back("content-type", "application/json; charset=UTF-8");
  return r;
}

json ErrorBody(int code, const std::string& reason, const std::string& message) {
  return {{"error",
           {{"code", code},
            {"message", message},
            {"errors", {{{"domain", "global"}, {"reason", reason}, {"message", message}}}}}}};
}

json Resource(const std::string& name, uint64_t size, const std::string& generation) {
  return {{"kind", "storage#object"},
          {"name", name},
          {"bucket", "bkt"},
          {"size", absl::StrCat(size)},
          {"generation", generation},
          {"metageneration", "1"},
          {"updated", "2026-11-26T10:00:00.123Z"}};
}

std::string Crc32cBase64(absl::string_view data) {
  const uint32_t crc = Crc32c(data);
  const char raw[4] = {static_cast<char>(crc >> 24), static_cast<char>(crc >> 16),
                       static_cast<char>(crc >> 8), static_cast<char>(crc)};
  return absl::Base64Escape(absl::string_view(raw, 4));
}

// A media response for `data` at generation `gen`, with the crc32c GCS sends.
CannedResponse Media(const std::string& data, const std::string& gen) {
  CannedResponse r;
  r.body = data;
  r.headers = {{"x-goog-generation", gen},
               {"x-goog-hash", absl::StrCat("crc32c=", Crc32cBase64(data))},
               {"x-goog-hash", "md5=AAAAAAAAAAAAAAAAAAAAAA=="}};
  return r;
}

// `r` with the connection reset after `after` bytes of its body.
CannedResponse ResetAfter(CannedResponse r, uint64_t after) {
  r.failure = absl::UnavailableError("Recv failure: Connection reset by peer");
  r.fail_after_bytes = after;
  r.chunk_bytes = 10000;
  return r;
}

// Bytes [from, to) of `data` at generation `gen`, as a 206 answers a ranged read.
CannedResponse Part(const std::string& data, const std::string& gen, uint64_t from, uint64_t to) {
  CannedResponse r;
  r.status = 206;
  r.body = data.substr(from, to - from);
  r.headers = {{"x-goog-generation", gen},
               {"content-range", absl::StrCat("bytes ", from, "-", to - 1, "/", data.size())}};
  return r;
}

std::string HeaderOf(const HttpRequest& r, absl::string_view name) {
  for (const auto& [k, v] : r.headers) {
    if (absl::EqualsIgnoreCase(k, name)) return v;
  }
  return "";
}

// ---- Listing ----

TEST(GcsJsonStoreTest, ListSendsBoundsAndPagesThroughTokens) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest& r) {
    if (!absl::StrContains(r.url, "pageToken=")) {
      // The server includes the start bound (startOffset is inclusive) and is 2 per page.
      return Json(200, {{"items", {Resource("d/a", 1, "11"), Resource("d/b", 2, "12")}},
                        {"prefixes", {"d/a/"}},
                        {"nextPageToken", "tok/1+"}});
    }
    return Json(200, {{"items", {Resource("d/c", 3, "13"), Resource("d/z", 4, "14")}}});
  });
  auto store = MakeStore(transport);
  ListOptions options{
      .prefix = "d/", .delimiter = "/", .start_after = "d/a", .end_before = "d/y", .page_size = 2};
  auto first = store->List(options);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->objects.size(), 1u);  // "d/a" is the exclusive lower bound
  EXPECT_EQ(first->objects[0].key, "d/b");
  EXPECT_EQ(first->objects[0].size, 2u);
  EXPECT_EQ(first->objects[0].etag, "12");
  EXPECT_NE(first->objects[0].mtime, absl::InfinitePast());
  EXPECT_THAT(first->common_prefixes, ElementsAre("d/a/"));  // holds keys above "d/a"
  EXPECT_EQ(first->continuation, "tok/1+");
  auto second = store->List(options, first->continuation);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->objects.size(), 1u);  // "d/z" is past the end bound
  EXPECT_EQ(second->objects[0].key, "d/c");
  EXPECT_EQ(second->continuation, "");  // past the end: no further page
  const auto requests = transport->requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].url,
            "http://127.0.0.1:9/storage/v1/b/bkt/o?maxResults=2&prefix=d%2F&delimiter=%2F"
            "&startOffset=d%2Fa&endOffset=d%2Fy");
  EXPECT_THAT(requests[1].url, HasSubstr("&pageToken=tok%2F1%2B"));
  EXPECT_THAT(requests[1].url, HasSubstr("&endOffset=d%2Fy"));  // same query on every page
}

TEST(GcsJsonStoreTest, ObjectNamesAreOneEncodedPathSegment) {
  auto transport = std::make_shared<CannedTransport>(
      [](const HttpRequest&) { return Json(200, Resource("a b/ü?#%.txt", 5, "7")); });
  auto store = MakeStore(transport);
  auto head = store->Head("a b/ü?#%.txt");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->etag, "7");
  EXPECT_EQ(transport->requests()[0].url,
            "http://127.0.0.1:9/storage/v1/b/bkt/o/a%20b%2F%C3%BC%3F%23%25.txt");
}

// ---- Reads ----

TEST(GcsJsonStoreTest, GetSendsGenerationPreconditionsAndMapsTheAnswers) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest& r) {
    if (absl::StrContains(r.url, "ifGenerationMatch=5")) {
      return Json(412, ErrorBody(412, "conditionNotMet",
                                 "At least one of the pre-conditions "
                                 "you specified did not hold."));
    }
    if (absl::StrContains(r.url, "ifGenerationNotMatch=9")) {
      CannedResponse not_modified;
      not_modified.status = 304;
      return not_modified;
    }
    return Media("hello", "9");
  });
  auto store = MakeStore(transport);
  std::string buffer(5, '\0');
  GetRequest stale{.key = "k", .buffer = absl::MakeSpan(buffer), .if_match = "5"};
  auto got = store->Get(stale);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(got.status().message(), HasSubstr("gs://bkt/k"));
  GetRequest current{.key = "k", .buffer = absl::MakeSpan(buffer), .if_none_match = "9"};
  got = store->Get(current);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->not_modified);
  EXPECT_EQ(got->meta.etag, "9");
  EXPECT_EQ(buffer, std::string(5, '\0'));
  // An etag that is no generation (another store's MD5) matches nothing, without a request.
  const size_t sent = transport->request_count();
  GetRequest md5{.key = "k", .buffer = absl::MakeSpan(buffer), .if_match = "0123abcd"};
  EXPECT_EQ(store->Get(md5).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(transport->request_count(), sent);
  EXPECT_THAT(transport->requests()[0].url,
              HasSubstr("/storage/v1/b/bkt/o/k?alt=media&ifGenerationMatch=5"));
}

TEST(GcsJsonStoreTest, AServerIgnoringPreconditionsStillNeverHandsOutTheWrongGeneration) {
  // As the emulator does: every read answers generation 9 whatever the query says.
  auto transport =
      std::make_shared<CannedTransport>([](const HttpRequest&) { return Media("hello", "9"); });
  auto store = MakeStore(transport);
  std::string buffer(5, '\0');
  GetRequest stale{.key = "k", .buffer = absl::MakeSpan(buffer), .if_match = "5"};
  auto got = store->Get(stale);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("generation 9, not 5"));
  EXPECT_EQ(buffer, std::string(5, '\0'));
  GetRequest current{.key = "k", .buffer = absl::MakeSpan(buffer), .if_none_match = "9"};
  got = store->Get(current);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->not_modified);
  EXPECT_EQ(buffer, std::string(5, '\0'));
  GetRequest older{.key = "k", .buffer = absl::MakeSpan(buffer), .if_none_match = "8"};
  got = store->Get(older);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->not_modified);
  EXPECT_EQ(buffer, "hello");
  EXPECT_EQ(got->meta.etag, "9");
}

TEST(GcsJsonStoreTest, InterruptedReadResumesFromTheNextByteOfTheSameGeneration) {
  const std::string data(100000, 'x');
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest& r) {
    if (calls++ == 0) return ResetAfter(Media(data, "42"), 40000);
    EXPECT_EQ(HeaderOf(r, "range"), "bytes=40000-99999");
    EXPECT_THAT(r.url, HasSubstr("ifGenerationMatch=42"));
    return Part(data, "42", 40000, data.size());
  });
  auto store = MakeStore(transport);
  std::string buffer(data.size(), '\0');
  auto got = store->Get({.key = "big", .buffer = absl::MakeSpan(buffer)});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->bytes, data.size());
  EXPECT_EQ(got->attempts, 2);
  EXPECT_EQ(buffer, data);
}

TEST(GcsJsonStoreTest, AnAttemptThatFailsBeforeItsHeadersDoesNotCountThePreviousBytesAgain) {
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 11);
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>(
      [&](const HttpRequest& r) -> absl::StatusOr<CannedResponse> {
        const int call = ++calls;
        if (call == 1) return ResetAfter(Media(data, "42"), 40000);
        if (call == 2) return absl::UnavailableError("Failed to connect: Connection refused");
        EXPECT_EQ(HeaderOf(r, "range"), "bytes=40000-99999");
        return Part(data, "42", 40000, data.size());
      });
  auto store = MakeStore(transport);
  std::string buffer(data.size(), '\0');
  auto got = store->Get({.key = "big", .buffer = absl::MakeSpan(buffer)});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->bytes, data.size());
  EXPECT_EQ(buffer, data);
  EXPECT_EQ(calls.load(), 3);
}

TEST(GcsJsonStoreTest, AResumeAnsweredWithTheWholeObjectDeliversTheRestOfTheRange) {
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest&) {
    if (calls++ == 0) return ResetAfter(Part(data, "42", 10000, 60000), 20000);
    CannedResponse whole = Media(data, "42");  // the resume's Range ignored
    whole.chunk_bytes = 9999;
    return whole;
  });
  auto store = MakeStore(transport);
  std::string buffer(50000, '\0');
  auto got = store->Get(
      {.key = "big", .range = ByteRange::Of(10000, 50000), .buffer = absl::MakeSpan(buffer)});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(buffer, data.substr(10000, 50000));
  EXPECT_EQ(got->bytes, 50000u);
  EXPECT_EQ(calls.load(), 2);
  calls = 0;
  absl::StatusOr<std::string> streamed = store->Read("big", ByteRange::Of(10000, 50000));
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(*streamed, data.substr(10000, 50000));
  EXPECT_EQ(calls.load(), 2);
}

TEST(GcsJsonStoreTest, WholeObjectReadsAreCheckedAgainstTheServersCrc32c) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest&) {
    CannedResponse r = Media("hello", "3");
    r.body = "jello";  // corrupted on the way
    return r;
  });
  auto store = MakeStore(transport);
  auto got = store->Read("k");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(), HasSubstr("CRC32C"));
}

TEST(GcsJsonStoreTest, RangesAreSentAndTheirExtentReported) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest& r) {
    EXPECT_EQ(HeaderOf(r, "range"), "bytes=2-4");
    CannedResponse part;
    part.status = 206;
    part.body = "llo";
    part.headers = {{"x-goog-generation", "3"}, {"content-range", "bytes 2-4/5"}};
    return part;
  });
  auto store = MakeStore(transport);
  auto got = store->Read("k", ByteRange::Of(2, 3));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "llo");
}

// ---- Errors, retries, tokens ----

TEST(GcsJsonStoreTest, ErrorsNameTheObjectAndTheCause) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest& r) {
    if (absl::StrContains(r.url, "/o/missing")) {
      return Json(404, ErrorBody(404, "notFound", "No such object: bkt/missing"));
    }
    if (absl::StrContains(r.url, "/o/bucket-notes")) {  // a key that says "bucket"
      return Json(404, ErrorBody(404, "notFound", "No such object: bkt/bucket-notes"));
    }
    if (absl::StrContains(r.url, "/b/gone/")) {
      return Json(404, ErrorBody(404, "notFound", "The specified bucket does not exist."));
    }
    if (absl::StrContains(r.url, "/o/bad-range")) {
      return Json(416, ErrorBody(416, "requestedRangeNotSatisfiable", "Range not satisfiable"));
    }
    return Json(403, ErrorBody(403, "forbidden",
                               "sa@p.iam.gserviceaccount.com does not have storage.objects.get"));
  });
  GcsJsonConfig config = TestConfig();
  config.credentials = std::make_shared<StaticCredentialsProvider>(
      Credentials{.bearer_token = kToken}, "service account sa@p (key /k.json)");
  config.credentials_source = "service account sa@p (key /k.json)";
  auto store = MakeStore(transport, config);
  auto missing = store->Head("missing");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("head gs://bkt/missing"));
  EXPECT_THAT(missing.status().message(), HasSubstr("No such object"));
  EXPECT_EQ(store->Read("bad-range", ByteRange::From(10)).status().code(),
            absl::StatusCode::kOutOfRange);
  auto denied = store->Read("secret");
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(denied.status().message(), HasSubstr("service account sa@p (key /k.json)"));
  EXPECT_THAT(denied.status().message(), Not(HasSubstr(kToken)));
  // Deleting a missing object succeeds, whatever its name; in a missing bucket it does not.
  EXPECT_TRUE(store->Delete("missing").ok());
  EXPECT_TRUE(store->Delete("bucket-notes").ok());
  auto gone = *GcsJsonStore::Open("gone", config, transport);
  EXPECT_EQ(gone->Delete("k").code(), absl::StatusCode::kNotFound);
  // Every request carried the token.
  for (const HttpRequest& r : transport->requests()) {
    EXPECT_EQ(HeaderOf(r, "authorization"), absl::StrCat("Bearer ", kToken));
  }
}

TEST(GcsJsonStoreTest, ThrottlingAndServerErrorsAreRetriedThenSucceed) {
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest&) {
    switch (calls++) {
      case 0:
        return Json(429, ErrorBody(429, "rateLimitExceeded", "slow down"));
      case 1:
        return Json(503, ErrorBody(503, "backendError", "try again"));
      default:
        return Json(200, Resource("k", 1, "2"));
    }
  });
  auto store = MakeStore(transport);
  auto head = store->Head("k");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(calls.load(), 3);
  // Always failing: gives up after max_attempts with the last cause.
  auto failing = std::make_shared<CannedTransport>(
      [](const HttpRequest&) { return Json(503, ErrorBody(503, "backendError", "down")); });
  auto down = MakeStore(failing)->Head("k");
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(down.status().message(), HasSubstr("gave up after 4 attempts"));
  EXPECT_EQ(failing->request_count(), 4u);
}

// Counts fetches; hands out token-1, token-2, ...
class CountingProvider : public CredentialsProvider {
 public:
  absl::StatusOr<Credentials> Fetch() override {
    Credentials c;
    c.bearer_token = absl::StrCat("token-", ++fetches);
    c.expiration = absl::Now() + absl::Hours(1);
    return c;
  }
  std::string Describe() const override { return "counting provider"; }
  std::atomic<int> fetches{0};
};

TEST(GcsJsonStoreTest, ARefusedTokenIsRefreshedOnceAndTheRequestRetried) {
  auto transport = std::make_shared<CannedTransport>([](const HttpRequest& r) {
    if (HeaderOf(r, "authorization") == "Bearer token-1") {
      return Json(401, ErrorBody(401, "authError", "Invalid Credentials"));
    }
    return Json(200, Resource("k", 1, "2"));
  });
  auto provider = std::make_shared<CountingProvider>();
  GcsJsonConfig config = TestConfig();
  config.credentials = provider;
  config.credentials_source = provider->Describe();
  auto head = MakeStore(transport, config)->Head("k");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(provider->fetches.load(), 2);
  EXPECT_EQ(transport->request_count(), 2u);
}

// A credential that cannot be had because something is missing (the token endpoint answers
// 404, a key file is gone) fails the request as unauthenticated naming that cause: not as
// NotFound, which a listing would report as "no such bucket".
TEST(GcsJsonStoreTest, AMissingCredentialIsNotAMissingBucket) {
  class MissingProvider : public CredentialsProvider {
   public:
    absl::StatusOr<Credentials> Fetch() override {
      return absl::NotFoundError("POST http://127.0.0.1:1/token answered 404: Not Found");
    }
    std::string Describe() const override { return "a service account"; }
  };
  auto transport = std::make_shared<CannedTransport>(
      [](const HttpRequest&) { return Json(404, ErrorBody(404, "notFound", "no bucket")); });
  auto provider = std::make_shared<MissingProvider>();
  GcsJsonConfig config = TestConfig();
  config.credentials = provider;
  config.credentials_source = provider->Describe();
  auto listed = MakeStore(transport, config)->List(ListOptions{}, "");
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kUnauthenticated) << listed.status();
  EXPECT_THAT(listed.status().message(), HasSubstr("answered 404: Not Found"));
  EXPECT_THAT(listed.status().message(), Not(HasSubstr("no such bucket")));
  EXPECT_EQ(transport->request_count(), 0u);  // nothing was sent unsigned
}

// ---- Writes ----

TEST(GcsJsonStoreTest, PutSendsTheMd5AndRefusesADifferentStoredOne) {
  std::atomic<bool> corrupt{false};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest& r) {
    const std::string body(r.body);
    EXPECT_THAT(r.url, HasSubstr("/upload/storage/v1/b/bkt/o?uploadType=multipart"));
    EXPECT_THAT(HeaderOf(r, "content-type"), HasSubstr("multipart/related; boundary="));
    const std::string md5 = Base64(absl::HexStringToBytes(Md5Hex("data")));
    EXPECT_THAT(body, HasSubstr(absl::StrCat("\"md5Hash\":\"", md5, "\"")));
    EXPECT_THAT(body, HasSubstr("\"contentType\":\"text/plain\""));
    json resource = Resource("k", 4, "77");
    resource["md5Hash"] = corrupt ? "AAAAAAAAAAAAAAAAAAAAAA==" : md5;
    return Json(200, resource);
  });
  auto store = MakeStore(transport);
  PutOptions typed;
  typed.content_type = "text/plain";
  auto put = store->Put("k", absl::Cord("data"), typed);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->etag, "77");
  corrupt = true;
  EXPECT_EQ(store->Put("k", absl::Cord("data"), typed).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(GcsJsonStoreTest, CreateOnlyPutsSendGenerationZeroAndA412IsAlreadyExists) {
  std::atomic<bool> taken{false};
  std::atomic<int> resumable_starts{0};
  auto transport = std::make_shared<CannedTransport>(
      [&](const HttpRequest& r) -> absl::StatusOr<CannedResponse> {
        const std::string range = HeaderOf(r, "content-range");
        if (absl::StrContains(r.url, "/upload/session/") && absl::EndsWith(range, "/*")) {
          CannedResponse incomplete;  // a chunk before the last: held
          incomplete.status = 308;
          incomplete.headers = {
              {"range",
               absl::StrCat("bytes=0-", range.substr(range.find('-') + 1,
                                                     range.find('/') - range.find('-') - 1))}};
          return incomplete;
        }
        if (!absl::StrContains(r.url, "/upload/session/")) {
          EXPECT_THAT(r.url, HasSubstr("ifGenerationMatch=0"));
        }
        if (absl::StrContains(r.url, "uploadType=resumable")) {
          ++resumable_starts;
          CannedResponse start;
          start.headers = {{"location", "http://127.0.0.1:9/upload/session/1"}};
          return start;
        }
        if (absl::StrContains(r.url, "/upload/session/") || taken) {
          // The final request of an upload (multipart, or a session's last chunk) is where GCS
          // checks the precondition.
          return Json(412, json{{"error", {{"code", 412}, {"message", "Precondition Failed"}}}});
        }
        return Json(200, Resource("k", 4, "77"));
      });
  auto store = MakeStore(transport);  // chunks of 256 KiB
  PutOptions create;
  create.if_absent = true;
  ASSERT_TRUE(store->Put("k", absl::Cord("data"), create).ok());
  taken = true;
  auto refused = store->Put("k", absl::Cord("data"), create);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("gs://bkt/k"));
  auto writer = store->NewWriter("big", create);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Write(absl::Cord(std::string(300 * 1024, 'x'))).ok());
  EXPECT_EQ((*writer)->Close().status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(resumable_starts.load(), 1);
}

// A resumable-upload session that keeps what it is sent, drops the connection once, and
// answers status queries with what it holds.
class FakeSession {
 public:
  absl::StatusOr<CannedResponse> Handle(const HttpRequest& r) {
    absl::MutexLock lock(&mu_);
    log_.push_back(absl::StrCat(r.method, " ", HeaderOf(r, "content-range")));
    if (r.method == "POST") {
      EXPECT_THAT(r.url, HasSubstr("uploadType=resumable&name=big%2Fobj"));
      CannedResponse start;
      start.headers = {{"location", "http://127.0.0.1:9/upload/session/1"}};
      return start;
    }
    if (r.method == "DELETE") {
      CannedResponse cancelled;
      cancelled.status = 499;
      return cancelled;
    }
    const std::string range = HeaderOf(r, "content-range");
    uint64_t first = 0, last = 0;
    std::string total;
    if (range.rfind("bytes */", 0) != 0) {
      const auto dash = range.find('-'), slash = range.find('/');
      first = std::stoull(range.substr(6, dash - 6));
      last = std::stoull(range.substr(dash + 1, slash - dash - 1));
      total = range.substr(slash + 1);
      EXPECT_EQ(first, data_.size()) << "a chunk must continue where the session stands";
      EXPECT_EQ(last - first + 1, r.body.size()) << range;
      if (drop_next_) {
        // Keeps the first 128 KiB of the chunk, then the connection drops.
        drop_next_ = false;
        data_ += std::string(r.body).substr(0, 128 << 10);
        return absl::UnavailableError("Send failure: Broken pipe");
      }
      data_ += std::string(r.body);
    } else {
      total = range.substr(8);
    }
    if (total != "*" && data_.size() == std::stoull(total)) {
      json resource = Resource("big/obj", data_.size(), "1234");
      return Json(200, resource);
    }
    CannedResponse incomplete;
    incomplete.status = 308;
    if (!data_.empty()) {
      incomplete.headers = {{"range", absl::StrCat("bytes=0-", data_.size() - 1)}};
    }
    return incomplete;
  }
  std::string data() {
    absl::MutexLock lock(&mu_);
    return data_;
  }
  std::vector<std::string> log() {
    absl::MutexLock lock(&mu_);
    return log_;
  }
  bool drop_next_ = false;

 private:
  absl::Mutex mu_;
  std::string data_;
  std::vector<std::string> log_;
};

TEST(GcsJsonStoreTest, ResumableWriterResumesFromThePersistedOffsetAfterADrop) {
  FakeSession session;
  session.drop_next_ = true;
  auto transport =
      std::make_shared<CannedTransport>([&](const HttpRequest& r) { return session.Handle(r); });
  auto store = MakeStore(transport);  // chunks of 256 KiB
  std::string data;
  for (int i = 0; i < 700 * 1024; ++i) data += static_cast<char>('a' + i % 26);
  auto writer = store->NewWriter("big/obj");
  ASSERT_TRUE(writer.ok());
  for (size_t i = 0; i < data.size(); i += 100000) {
    ASSERT_TRUE((*writer)->Write(absl::Cord(data.substr(i, 100000))).ok());
  }
  auto meta = (*writer)->Close();
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->etag, "1234");
  EXPECT_EQ(meta->size, data.size());
  EXPECT_EQ(session.data(), data);
  EXPECT_THAT(session.log(),
              ElementsAre("POST ",                          // start the session
                          "PUT bytes 0-262143/*",           // dropped after 128 KiB
                          "PUT bytes */*",                  // what do you hold?
                          "PUT bytes 131072-262143/*",      // the rest of the chunk
                          "PUT bytes 262144-524287/*",      // the second chunk
                          "PUT bytes 524288-716799/716800"  // the last carries the total
                          ));
}

TEST(GcsJsonStoreTest, AbortedWriterCancelsItsSessionAndASmallOneIsOnePut) {
  FakeSession session;
  auto transport =
      std::make_shared<CannedTransport>([&](const HttpRequest& r) { return session.Handle(r); });
  auto store = MakeStore(transport);
  {
    auto writer = store->NewWriter("big/obj");
    ASSERT_TRUE((*writer)->Write(absl::Cord(std::string(300 << 10, 'x'))).ok());
    (*writer)->Abort();
  }
  const auto log = session.log();
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.back(), "DELETE ");
  // Less than a chunk: no session at all, one multipart upload.
  auto small_transport = std::make_shared<CannedTransport>([](const HttpRequest& r) {
    EXPECT_THAT(r.url, HasSubstr("uploadType=multipart"));
    return Json(200, Resource("s", 3, "5"));
  });
  auto small_store = MakeStore(small_transport);
  auto writer = small_store->NewWriter("s");
  ASSERT_TRUE((*writer)->Write(absl::Cord("abc")).ok());
  auto meta = (*writer)->Close();
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(small_transport->request_count(), 1u);
}

TEST(GcsJsonStoreTest, CopyLoopsOnRewriteTokensAndComposeBoundsItsSources) {
  std::atomic<int> calls{0};
  auto transport = std::make_shared<CannedTransport>([&](const HttpRequest& r) {
    if (absl::StrContains(r.url, "/compose")) {
      const json body = json::parse(std::string(r.body));
      EXPECT_EQ(body["sourceObjects"].size(), 2u);
      return Json(200, Resource("all", 10, "9"));
    }
    if (calls++ == 0) {
      EXPECT_THAT(r.url, HasSubstr("/o/src/rewriteTo/b/bkt/o/dst"));
      return Json(200,
                  {{"kind", "storage#rewriteResponse"}, {"done", false}, {"rewriteToken", "more"}});
    }
    EXPECT_THAT(r.url, HasSubstr("rewriteToken=more"));
    return Json(200, {{"done", true}, {"resource", Resource("dst", 3, "8")}});
  });
  auto store = MakeStore(transport);
  auto copied = store->Copy("src", "dst");
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(copied->etag, "8");
  auto composed = store->Compose({"a", "b"}, "all");
  ASSERT_TRUE(composed.ok()) << composed.status();
  EXPECT_EQ(composed->size, 10u);
  std::vector<std::string> too_many(33, "x");
  EXPECT_EQ(store->Compose(too_many, "all").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GcsJsonStoreTest, OpenRefusesAMalformedEndpointOrChunkSize) {
  GcsJsonConfig config = TestConfig();
  config.endpoint = "127.0.0.1:9";
  EXPECT_EQ(GcsJsonStore::Open("b", config, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  config = TestConfig();
  config.chunk_size = 1000;
  EXPECT_EQ(GcsJsonStore::Open("b", config, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace wharf::gcs
