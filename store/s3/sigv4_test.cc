#include "store/s3/sigv4.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/civil_time.h"
#include "base/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wharf::s3 {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

// The inputs of the examples in the S3 API reference, "Signature Calculations for the
// Authorization Header: Transferring Payload in a Single Chunk (AWS Signature Version 4)".
constexpr absl::string_view kExampleHost = "examplebucket.s3.amazonaws.com";
constexpr absl::string_view kExampleDate = "20130524T000000Z";

Credentials ExampleCredentials() {
  Credentials c;
  c.access_key_id = "AKIAIOSFODNN7EXAMPLE";
  c.secret_access_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
  return c;
}

absl::Time ExampleTime() {
  return absl::FromCivil(absl::CivilSecond(2013, 5, 24, 0, 0, 0), absl::UTCTimeZone());
}

SigningRequest ExampleRequest(std::string method, std::string path) {
  SigningRequest r;
  r.method = std::move(method);
  r.host = std::string(kExampleHost);
  r.path = std::move(path);
  r.payload_sha256 = std::string(kEmptyPayloadSha256);
  return r;
}

SignedRequest SignExample(const SigningRequest& request) {
  absl::StatusOr<SignedRequest> signed_request =
      SignV4(request, ExampleCredentials(), "us-east-1", "s3", ExampleTime());
  EXPECT_TRUE(signed_request.ok()) << signed_request.status();
  return signed_request.ok() ? *std::move(signed_request) : SignedRequest{};
}

std::string ExpectedStringToSign(absl::string_view canonical_request_sha256) {
  return absl::StrCat("AWS4-HMAC-SHA256\n", kExampleDate, "\n20130524/us-east-1/s3/aws4_request\n",
                      canonical_request_sha256);
}

TEST(SigV4Test, AwsExampleGetObject) {
  SigningRequest request = ExampleRequest("GET", "/test.txt");
  request.headers = {{"Range", "bytes=0-9"}};
  const SignedRequest s = SignExample(request);

  EXPECT_EQ(s.canonical_request,
            "GET\n"
            "/test.txt\n"
            "\n"
            "host:examplebucket.s3.amazonaws.com\n"
            "range:bytes=0-9\n"
            "x-amz-content-sha256:"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
            "x-amz-date:20130524T000000Z\n"
            "\n"
            "host;range;x-amz-content-sha256;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(
      s.string_to_sign,
      ExpectedStringToSign("7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"));
  EXPECT_EQ(s.signature, "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  EXPECT_EQ(s.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  EXPECT_EQ(s.canonical_target, "/test.txt");
  EXPECT_THAT(s.headers,
              ElementsAre(Pair("Range", "bytes=0-9"), Pair("x-amz-date", "20130524T000000Z"),
                          Pair("x-amz-content-sha256", std::string(kEmptyPayloadSha256)),
                          Pair("authorization", s.authorization)));
}

TEST(SigV4Test, AwsExamplePutObject) {
  const std::string payload_sha256 = Sha256Hex("Welcome to Amazon S3.");
  ASSERT_EQ(payload_sha256, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  SigningRequest request = ExampleRequest("PUT", "/test$file.text");
  request.headers = {{"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                     {"x-amz-storage-class", "REDUCED_REDUNDANCY"}};
  request.payload_sha256 = payload_sha256;
  const SignedRequest s = SignExample(request);

  EXPECT_EQ(s.canonical_request,
            "PUT\n"
            "/test%24file.text\n"
            "\n"
            "date:Fri, 24 May 2013 00:00:00 GMT\n"
            "host:examplebucket.s3.amazonaws.com\n"
            "x-amz-content-sha256:"
            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072\n"
            "x-amz-date:20130524T000000Z\n"
            "x-amz-storage-class:REDUCED_REDUNDANCY\n"
            "\n"
            "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class\n"
            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  EXPECT_EQ(
      s.string_to_sign,
      ExpectedStringToSign("9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d"));
  EXPECT_EQ(s.signature, "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
  EXPECT_EQ(s.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
            "SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class,"
            "Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
  EXPECT_EQ(s.canonical_target, "/test%24file.text");
}

TEST(SigV4Test, AwsExampleGetBucketLifecycle) {
  SigningRequest request = ExampleRequest("GET", "/");
  request.query = {{"lifecycle", ""}};
  const SignedRequest s = SignExample(request);

  EXPECT_EQ(s.canonical_request,
            "GET\n"
            "/\n"
            "lifecycle=\n"
            "host:examplebucket.s3.amazonaws.com\n"
            "x-amz-content-sha256:"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
            "x-amz-date:20130524T000000Z\n"
            "\n"
            "host;x-amz-content-sha256;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(
      s.string_to_sign,
      ExpectedStringToSign("9766c798316ff2757b517bc739a67f6213b4ab36dd5da2f94eaebf79c77395ca"));
  EXPECT_EQ(s.signature, "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
  EXPECT_EQ(s.canonical_target, "/?lifecycle=");
}

TEST(SigV4Test, AwsExampleListObjects) {
  SigningRequest request = ExampleRequest("GET", "/");
  request.query = {{"prefix", "J"}, {"max-keys", "2"}};  // out of order on purpose
  const SignedRequest s = SignExample(request);

  EXPECT_EQ(s.canonical_request,
            "GET\n"
            "/\n"
            "max-keys=2&prefix=J\n"
            "host:examplebucket.s3.amazonaws.com\n"
            "x-amz-content-sha256:"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
            "x-amz-date:20130524T000000Z\n"
            "\n"
            "host;x-amz-content-sha256;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(
      s.string_to_sign,
      ExpectedStringToSign("df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0f1e7df1b9b7"));
  EXPECT_EQ(s.signature, "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
  EXPECT_EQ(s.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
            "SignedHeaders=host;x-amz-content-sha256;x-amz-date,"
            "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
  EXPECT_EQ(s.canonical_target, "/?max-keys=2&prefix=J");
}

// AWS General Reference, "Examples of how to derive a signing key for Signature Version 4".
TEST(SigV4Test, DeriveSigningKeyMatchesPublishedExample) {
  EXPECT_EQ(HexLower(DeriveSigningKey("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215",
                                      "us-east-1", "iam")),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d");
}

TEST(SigV4Test, FormatAmzDateIsUtcAndDropsSubseconds) {
  EXPECT_EQ(FormatAmzDate(ExampleTime()), "20130524T000000Z");
  EXPECT_EQ(FormatAmzDate(absl::FromUnixMillis(1700000000123)), "20231114T221320Z");
}

TEST(UriEncodeTest, KeepsUnreservedBytes) {
  EXPECT_EQ(UriEncode("AZaz09-_.~", true), "AZaz09-_.~");
}

TEST(UriEncodeTest, EncodesAwkwardKeys) {
  EXPECT_EQ(UriEncode("my key", false), "my%20key");
  EXPECT_EQ(UriEncode("a+b", false), "a%2Bb");
  EXPECT_EQ(UriEncode("100%", false), "100%25");
  EXPECT_EQ(UriEncode("%20", false), "%2520");  // already-encoded text is encoded again
  EXPECT_EQ(UriEncode("k=v&x", false), "k%3Dv%26x");
  EXPECT_EQ(UriEncode("a*b", false), "a%2Ab");
  EXPECT_EQ(UriEncode("~tilde", false), "~tilde");
  EXPECT_EQ(UriEncode("caf\xc3\xa9", false), "caf%C3%A9");                        // é
  EXPECT_EQ(UriEncode("\xe6\x97\xa5\xe6\x9c\xac", false), "%E6%97%A5%E6%9C%AC");  // 日本
  EXPECT_EQ(UriEncode("test$file.text", false), "test%24file.text");
  EXPECT_EQ(UriEncode(absl::string_view("a\0b", 3), false), "a%00b");
  EXPECT_EQ(UriEncode("\xff", false), "%FF");
}

TEST(UriEncodeTest, SlashIsKeptOnlyWhenAsked) {
  EXPECT_EQ(UriEncode("a/b/c/d", false), "a/b/c/d");
  EXPECT_EQ(UriEncode("a/b/c/d", true), "a%2Fb%2Fc%2Fd");
  // No path normalization: empty and dot segments are kept.
  EXPECT_EQ(UriEncode("/a//./../b/", false), "/a//./../b/");
}

TEST(CanonicalQueryStringTest, EncodesAndSortsByEncodedNameThenValue) {
  EXPECT_EQ(CanonicalQueryString({}), "");
  EXPECT_EQ(CanonicalQueryString({{"prefix", "a/b c+d"}, {"delimiter", "/"}}),
            "delimiter=%2F&prefix=a%2Fb%20c%2Bd");
  EXPECT_EQ(CanonicalQueryString({{"a", "2"}, {"a", "1"}, {"a", ""}}), "a=&a=1&a=2");
  // Byte order of the encoded names: "%20" < "%2B" < "B" < "a".
  EXPECT_EQ(CanonicalQueryString({{"a", ""}, {"B", ""}, {"a+b", ""}, {"a b", ""}}),
            "B=&a=&a%20b=&a%2Bb=");
  EXPECT_EQ(CanonicalQueryString({{"list-type", "2"}, {"continuation-token", "1/x=="}}),
            "continuation-token=1%2Fx%3D%3D&list-type=2");
}

TEST(SigV4Test, PathStyleTargetEncodesKeyOnce) {
  SigningRequest request;
  request.method = "GET";
  request.host = "localhost:9000";
  request.path = "/bucket/my key+x/\xe6\x97\xa5\xe6\x9c\xac/a=b&c";
  request.query = {{"versionId", "3/L4kqtJl"}};
  request.payload_sha256 = std::string(kUnsignedPayload);
  absl::StatusOr<SignedRequest> s =
      SignV4(request, ExampleCredentials(), "us-east-1", "s3", ExampleTime());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->canonical_target,
            "/bucket/my%20key%2Bx/%E6%97%A5%E6%9C%AC/a%3Db%26c?versionId=3%2FL4kqtJl");
  EXPECT_TRUE(absl::StartsWith(s->canonical_request,
                               "GET\n/bucket/my%20key%2Bx/%E6%97%A5%E6%9C%AC/a%3Db%26c\n"
                               "versionId=3%2FL4kqtJl\nhost:localhost:9000\n"));
  EXPECT_TRUE(absl::EndsWith(s->canonical_request, "\nUNSIGNED-PAYLOAD"));
  EXPECT_THAT(s->headers, testing::Contains(Pair("x-amz-content-sha256", "UNSIGNED-PAYLOAD")));
}

TEST(SigV4Test, HeadersAreLowercasedTrimmedCollapsedAndMerged) {
  SigningRequest request = ExampleRequest("GET", "/test.txt");
  request.headers = {{"X-Amz-Meta-B", "  two   words\there  "},
                     {"x-amz-meta-a", "first"},
                     {"X-AMZ-META-A", "second"}};
  const SignedRequest s = SignExample(request);
  EXPECT_THAT(s.canonical_request, HasSubstr("\nhost:examplebucket.s3.amazonaws.com\n"
                                             "x-amz-content-sha256:" +
                                             std::string(kEmptyPayloadSha256) +
                                             "\nx-amz-date:20130524T000000Z\n"
                                             "x-amz-meta-a:first,second\n"
                                             "x-amz-meta-b:two words here\n\n"));
  EXPECT_EQ(s.signed_headers, "host;x-amz-content-sha256;x-amz-date;x-amz-meta-a;x-amz-meta-b");
  // Sent as given: the server canonicalizes what it receives the same way.
  EXPECT_THAT(s.headers[0], Pair("X-Amz-Meta-B", "  two   words\there  "));
}

TEST(SigV4Test, SignatureDoesNotDependOnHeaderOrderOrCase) {
  SigningRequest a = ExampleRequest("PUT", "/k");
  a.headers = {{"Content-MD5", "1B2M2Y8AsgTpgAmY7PhCfg=="}, {"x-amz-meta-x", "1"}};
  SigningRequest b = a;
  b.headers = {{"x-amz-meta-x", "1"}, {"content-md5", "1B2M2Y8AsgTpgAmY7PhCfg=="}};
  EXPECT_EQ(SignExample(a).signature, SignExample(b).signature);
}

TEST(SigV4Test, SessionTokenIsSentSignedAndRedactable) {
  Credentials credentials = ExampleCredentials();
  credentials.session_token = "FQoGZXIvYXdzEXAMPLETOKEN//+=";
  SigningRequest request = ExampleRequest("GET", "/test.txt");
  absl::StatusOr<SignedRequest> s = SignV4(request, credentials, "us-east-1", "s3", ExampleTime());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->signed_headers, "host;x-amz-content-sha256;x-amz-date;x-amz-security-token");
  EXPECT_THAT(s->canonical_request,
              HasSubstr("\nx-amz-security-token:FQoGZXIvYXdzEXAMPLETOKEN//+=\n\n"));
  EXPECT_THAT(s->headers,
              testing::Contains(Pair("x-amz-security-token", "FQoGZXIvYXdzEXAMPLETOKEN//+=")));
  const std::string redacted = s->RedactedCanonicalRequest();
  EXPECT_THAT(redacted, Not(HasSubstr("EXAMPLETOKEN")));
  EXPECT_THAT(redacted, HasSubstr("\nx-amz-security-token:<redacted>\n\n"));
  // Without a token there is nothing to redact.
  const SignedRequest plain = SignExample(request);
  EXPECT_EQ(plain.RedactedCanonicalRequest(), plain.canonical_request);
  // The token is covered by the signature.
  EXPECT_NE(s->signature, plain.signature);
}

TEST(SigV4Test, RejectsMalformedRequests) {
  const Credentials credentials = ExampleCredentials();
  auto sign = [&](const SigningRequest& r, const Credentials& c) {
    return SignV4(r, c, "us-east-1", "s3", ExampleTime()).status();
  };
  const SigningRequest good = ExampleRequest("GET", "/k");
  ASSERT_TRUE(sign(good, credentials).ok());

  auto expect_invalid = [&](const SigningRequest& r, const Credentials& c, absl::string_view what) {
    const absl::Status status = sign(r, c);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << what << ": " << status;
    EXPECT_THAT(status.message(), Not(HasSubstr(credentials.secret_access_key))) << what;
  };
  expect_invalid(good, Credentials{}, "anonymous");
  Credentials no_secret = credentials;
  no_secret.secret_access_key.clear();
  expect_invalid(good, no_secret, "no secret");
  Credentials bad_token = credentials;
  bad_token.session_token = "a\r\nX-Evil: 1";
  expect_invalid(good, bad_token, "token with CRLF");

  SigningRequest r = good;
  r.method = "get";
  expect_invalid(r, credentials, "lowercase method");
  r = good;
  r.host = "";
  expect_invalid(r, credentials, "empty host");
  r.host = "a b";
  expect_invalid(r, credentials, "host with space");
  r = good;
  r.path = "k";
  expect_invalid(r, credentials, "relative path");
  r.path = "";
  expect_invalid(r, credentials, "empty path");
  r = good;
  r.query = {{"", "x"}};
  expect_invalid(r, credentials, "empty query name");
  r = good;
  r.headers = {{"bad name", "x"}};
  expect_invalid(r, credentials, "header name with space");
  r.headers = {{"x-amz-meta-a", "v\r\nx-evil: 1"}};
  expect_invalid(r, credentials, "header value with CRLF");
  for (const char* reserved :
       {"Host", "Authorization", "X-Amz-Date", "x-amz-content-sha256", "X-Amz-Security-Token"}) {
    r.headers = {{reserved, "x"}};
    expect_invalid(r, credentials, reserved);
  }
  r = good;
  r.payload_sha256 = "";
  expect_invalid(r, credentials, "empty payload hash");
  r.payload_sha256 = "E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855";
  expect_invalid(r, credentials, "uppercase hex");
  r.payload_sha256 = "unsigned-payload";
  expect_invalid(r, credentials, "lowercase sentinel");

  EXPECT_EQ(SignV4(good, credentials, "", "s3", ExampleTime()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SignV4(good, credentials, "us-east-1", "s3/x", ExampleTime()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SigV4Test, HeaderValueIsNeverQuotedInErrors) {
  SigningRequest r = ExampleRequest("PUT", "/k");
  r.headers = {{"x-amz-server-side-encryption-customer-key", "c2VjcmV0a2V5\n"}};
  const absl::Status status =
      SignV4(r, ExampleCredentials(), "us-east-1", "s3", ExampleTime()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("x-amz-server-side-encryption-customer-key"));
  EXPECT_THAT(status.message(), Not(HasSubstr("c2VjcmV0a2V5")));
}

}  // namespace
}  // namespace wharf::s3
