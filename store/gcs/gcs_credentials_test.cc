// Each Google credential source against a loopback stand-in of its endpoint: a token endpoint
// that verifies the service account's RS256 JWT with the public half of a key generated here,
// one that exchanges gcloud refresh tokens, a metadata server that insists on
// "Metadata-Flavor: Google"; then the ADC order, error messages (no secret in them), malformed
// key files, and tokens flowing through CredentialsCache and BearerTokenSigner. Nothing here
// contacts a non-loopback address: every test that could reach the metadata server points it
// at a stand-in or a closed loopback port.
#include "store/gcs/gcs_credentials.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/credentials.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "http/bearer_signer.h"
#include "http/curl_transport.h"
#include "nlohmann/json.hpp"

namespace wharf::gcs {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using json = nlohmann::json;

// Distinctive secrets: no message or description may contain them.
constexpr char kAccessToken[] = "ya29.STANDINACCESSTOKENaaaaaaaaaaaaaaa";
constexpr char kClientSecret[] = "GOCSPX-STANDIN+SECRET/with=odd&chars";
constexpr char kRefreshToken[] = "1//STANDINREFRESHTOKENbbbbbbbbbbbbbbbbb";
constexpr char kClientEmail[] = "loader@wharf-test.iam.gserviceaccount.com";
constexpr char kKeyId[] = "0123456789abcdef0123456789abcdef01234567";
constexpr char kClientId[] = "764086051850-standin.apps.googleusercontent.com";

// A fixed clock: claims and expirations are exact.
const absl::Time kNow = absl::FromUnixSeconds(1700000000);

// ---------------------------------------------------------------------------------------------
// An RSA key pair for the service account, generated once: the PEM of the private half goes in
// the key file, the public half verifies the assertions the token endpoint receives.

struct PkeyDeleter {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyDeleter>;

std::string PrivatePem(EVP_PKEY* key) {
  BIO* bio = BIO_new(BIO_s_mem());
  // PKCS#8 ("BEGIN PRIVATE KEY"), as in Google's key files.
  EXPECT_EQ(PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr), 1);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<size_t>(n));
  BIO_free(bio);
  return pem;
}

struct KeyPair {
  Pkey key;
  std::string pem;
};

const KeyPair& ServiceAccountKey() {
  static const KeyPair* pair = [] {
    auto* p = new KeyPair{Pkey(EVP_RSA_gen(2048)), ""};
    p->pem = PrivatePem(p->key.get());
    return p;
  }();
  return *pair;
}

// Another key: an endpoint verifying with it must refuse the assertion.
EVP_PKEY* OtherKey() {
  static EVP_PKEY* key = EVP_RSA_gen(2048);
  return key;
}

std::optional<std::string> Base64UrlDecode(absl::string_view in) {
  std::string out;
  uint32_t bits = 0;
  int count = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z') {
      v = c - 'A';
    } else if (c >= 'a' && c <= 'z') {
      v = c - 'a' + 26;
    } else if (c >= '0' && c <= '9') {
      v = c - '0' + 52;
    } else if (c == '-') {
      v = 62;
    } else if (c == '_') {
      v = 63;
    } else {
      return std::nullopt;  // '+', '/', '=' are not base64url without padding
    }
    bits = (bits << 6) | static_cast<uint32_t>(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out += static_cast<char>((bits >> count) & 0xff);
    }
  }
  return out;
}

// base64url without padding, written independently of the provider's encoder.
std::string Base64UrlEncode(absl::string_view in) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  uint32_t bits = 0;
  int count = 0;
  for (const char c : in) {
    bits = (bits << 8) | static_cast<unsigned char>(c);
    count += 8;
    while (count >= 6) {
      count -= 6;
      out += kAlphabet[(bits >> count) & 63];
    }
  }
  if (count > 0) out += kAlphabet[(bits << (6 - count)) & 63];
  return out;
}

// RS256 verification of "header.claims.signature" with `public_key`.
bool VerifyRs256(absl::string_view jwt, EVP_PKEY* public_key) {
  const size_t last_dot = jwt.rfind('.');
  if (last_dot == absl::string_view::npos) return false;
  const absl::string_view signed_part = jwt.substr(0, last_dot);
  const std::optional<std::string> signature = Base64UrlDecode(jwt.substr(last_dot + 1));
  if (!signature.has_value()) return false;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const bool ok = EVP_DigestVerifyInit(ctx, nullptr, EVP_sha256(), nullptr, public_key) == 1 &&
                  EVP_DigestVerify(ctx, reinterpret_cast<const unsigned char*>(signature->data()),
                                   signature->size(),
                                   reinterpret_cast<const unsigned char*>(signed_part.data()),
                                   signed_part.size()) == 1;
  EVP_MD_CTX_free(ctx);
  return ok;
}

struct DecodedJwt {
  json header, claims;
};

std::optional<DecodedJwt> DecodeJwt(absl::string_view jwt) {
  std::vector<absl::string_view> parts = absl::StrSplit(jwt, '.');
  if (parts.size() != 3) return std::nullopt;
  std::optional<std::string> header = Base64UrlDecode(parts[0]);
  std::optional<std::string> claims = Base64UrlDecode(parts[1]);
  if (!header || !claims) return std::nullopt;
  DecodedJwt out{json::parse(*header, nullptr, false), json::parse(*claims, nullptr, false)};
  if (!out.header.is_object() || !out.claims.is_object()) return std::nullopt;
  return out;
}

void ExpectNoSecrets(absl::string_view text) {
  for (absl::string_view secret :
       {absl::string_view(kAccessToken), absl::string_view(kClientSecret),
        absl::string_view(kRefreshToken)}) {
    EXPECT_THAT(text, Not(HasSubstr(secret)));
  }
  EXPECT_THAT(text, Not(HasSubstr("PRIVATE KEY")));
  // A line of the key's base64 body.
  const std::vector<absl::string_view> pem_lines =
      absl::StrSplit(ServiceAccountKey().pem, '\n', absl::SkipEmpty());
  ASSERT_GT(pem_lines.size(), 3u);
  EXPECT_THAT(text, Not(HasSubstr(pem_lines[2])));
}

// ---------------------------------------------------------------------------------------------
// A loopback HTTP/1.1 stand-in: one thread, one request per connection (Connection: close),
// answered by a handler. Records every request.

struct Request {
  std::string method, path, body;
  std::vector<std::pair<std::string, std::string>> headers;  // names lowercased

  std::string Header(absl::string_view name) const {
    for (const auto& [k, v] : headers) {
      if (k == name) return v;
    }
    return "";
  }
  // The body as an x-www-form-urlencoded map.
  std::map<std::string, std::string> Form() const {
    std::map<std::string, std::string> out;
    for (absl::string_view pair : absl::StrSplit(body, '&', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
      out[Decode(kv.first)] = Decode(kv.second);
    }
    return out;
  }
  static std::string Decode(absl::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      int v = 0;
      if (s[i] == '%' && i + 2 < s.size() && absl::SimpleHexAtoi(s.substr(i + 1, 2), &v)) {
        out += static_cast<char>(v);
        i += 2;
      } else {
        out += s[i] == '+' ? ' ' : s[i];
      }
    }
    return out;
  }
};

struct Reply {
  int status = 200;
  std::string body;
};

class StandIn {
 public:
  using Handler = std::function<Reply(const Request&)>;

  explicit StandIn(Handler handler) : handler_(std::move(handler)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    EXPECT_EQ(listen(listen_fd_, 16), 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~StandIn() {
    stopping_ = true;
    shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    close(listen_fd_);
  }

  std::string Url() const { return absl::StrCat("http://127.0.0.1:", port_); }
  std::string HostPort() const { return absl::StrCat("127.0.0.1:", port_); }
  std::vector<Request> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  void Serve() {
    while (!stopping_) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (stopping_) return;
        continue;
      }
      timeval tv{5, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      HandleConnection(fd);
      close(fd);
    }
  }

  void HandleConnection(int fd) {
    std::string data;
    char buffer[8192];
    size_t header_end;
    while ((header_end = data.find("\r\n\r\n")) == std::string::npos) {
      const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) return;
      data.append(buffer, static_cast<size_t>(n));
    }
    Request request;
    std::vector<absl::string_view> lines =
        absl::StrSplit(absl::string_view(data).substr(0, header_end), "\r\n");
    std::vector<absl::string_view> first = absl::StrSplit(lines[0], ' ');
    request.method = std::string(first[0]);
    request.path = std::string(first.size() > 1 ? first[1] : "");
    size_t content_length = 0;
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == absl::string_view::npos) continue;
      std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
      std::string value(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
      if (name == "content-length") (void)absl::SimpleAtoi(value, &content_length);
      request.headers.emplace_back(std::move(name), std::move(value));
    }
    request.body = data.substr(header_end + 4);
    while (request.body.size() < content_length) {
      const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) return;
      request.body.append(buffer, static_cast<size_t>(n));
    }
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(request);
    }
    const Reply reply = handler_(request);
    const std::string response =
        absl::StrCat("HTTP/1.1 ", reply.status,
                     " X\r\nContent-Type: application/json\r\nContent-Length: ", reply.body.size(),
                     "\r\nConnection: close\r\n\r\n", reply.body);
    size_t sent = 0;
    while (sent < response.size()) {
      const ssize_t n = send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  }

  const Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  mutable absl::Mutex mu_;
  std::vector<Request> requests_ ABSL_GUARDED_BY(mu_);
};

// A loopback port nothing listens on.
int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string TokenJson(absl::string_view token, int expires_in) {
  return json{{"access_token", token}, {"expires_in", expires_in}, {"token_type", "Bearer"}}.dump();
}

std::string OAuthError(absl::string_view error, absl::string_view description) {
  return json{{"error", error}, {"error_description", description}}.dump();
}

// The token endpoint of a service account: verifies the assertion as Google does (signature
// with the public key, header, claims) and answers with kAccessToken, or with invalid_grant
// naming what was wrong.
Reply ServiceAccountTokenEndpoint(const Request& r, absl::string_view token_uri,
                                  absl::string_view scope, EVP_PKEY* public_key,
                                  int expires_in = 3599) {
  if (r.method != "POST" || r.path != "/token") return {404, ""};
  if (!absl::StartsWith(r.Header("content-type"), "application/x-www-form-urlencoded")) {
    return {400, OAuthError("invalid_request", "not a form")};
  }
  const std::map<std::string, std::string> form = r.Form();
  if (form.size() != 2 || !form.count("grant_type") || !form.count("assertion") ||
      form.at("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer") {
    return {400, OAuthError("unsupported_grant_type", "Invalid grant_type")};
  }
  const std::string& assertion = form.at("assertion");
  if (!VerifyRs256(assertion, public_key)) {
    return {400, OAuthError("invalid_grant", "Invalid JWT Signature.")};
  }
  std::optional<DecodedJwt> jwt = DecodeJwt(assertion);
  if (!jwt.has_value()) return {400, OAuthError("invalid_grant", "Malformed JWT")};
  const json expected_header = {{"alg", "RS256"}, {"typ", "JWT"}, {"kid", kKeyId}};
  if (jwt->header != expected_header) {
    return {400, OAuthError("invalid_grant", "bad header " + jwt->header.dump())};
  }
  const json& c = jwt->claims;
  if (c.value("iss", "") != kClientEmail || c.value("aud", "") != token_uri ||
      c.value("scope", "") != scope || !c.contains("iat") || !c.contains("exp") ||
      !c["iat"].is_number_integer() || !c["exp"].is_number_integer() ||
      c["exp"].get<int64_t>() - c["iat"].get<int64_t>() != 3600 ||
      c["iat"].get<int64_t>() != absl::ToUnixSeconds(kNow) || c.size() != 5) {
    return {400, OAuthError("invalid_grant", "bad claims " + c.dump())};
  }
  return {200, TokenJson(kAccessToken, expires_in)};
}

// ---------------------------------------------------------------------------------------------
// Fixture: a temporary directory for key files and gcloud's config, and an environment map.

class GoogleCredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/gcs_credentials_test_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "_",
                        getpid());
    ASSERT_EQ(mkdir(dir_.c_str(), 0700), 0) << dir_;
    env_["HOME"] = dir_;
  }
  void TearDown() override {
    for (auto it = files_.rbegin(); it != files_.rend(); ++it) {
      if (unlink(it->c_str()) != 0) rmdir(it->c_str());
    }
    rmdir(dir_.c_str());
  }

  std::string Write(absl::string_view name, absl::string_view content) {
    const std::string path = absl::StrCat(dir_, "/", name);
    // Key files hold secrets: 0600 from the start.
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
    chmod(path.c_str(), 0600);
    files_.push_back(path);
    return path;
  }
  std::string Mkdir(absl::string_view name) {
    const std::string path = absl::StrCat(dir_, "/", name);
    EXPECT_EQ(mkdir(path.c_str(), 0700), 0) << path;
    files_.push_back(path);
    return path;
  }

  static std::string ServiceAccountJson(absl::string_view token_uri,
                                        absl::string_view pem = ServiceAccountKey().pem) {
    return json{{"type", "service_account"},
                {"project_id", "wharf-test"},
                {"private_key_id", kKeyId},
                {"private_key", pem},
                {"client_email", kClientEmail},
                {"client_id", "1234567890"},
                {"auth_uri", "https://accounts.google.com/o/oauth2/auth"},
                {"token_uri", token_uri}}
        .dump(2);
  }
  static std::string AuthorizedUserJson() {
    return json{{"type", "authorized_user"},
                {"client_id", kClientId},
                {"client_secret", kClientSecret},
                {"refresh_token", kRefreshToken},
                {"quota_project_id", "wharf-test"}}
        .dump(2);
  }

  GoogleCredentialsOptions Options() const {
    GoogleCredentialsOptions options;
    options.env = [env = env_](absl::string_view name) -> std::optional<std::string> {
      auto it = env.find(std::string(name));
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
    options.transport = transport_;
    options.clock = [] { return kNow; };
    // No metadata server may be contacted by accident: tests that want one set it.
    options.metadata_host = absl::StrCat("127.0.0.1:", closed_port_);
    return options;
  }

  // Resolves; the description and any error carry no secret.
  absl::StatusOr<std::unique_ptr<CredentialsProvider>> Resolve(
      const GoogleCredentialsOptions& options) {
    auto provider = ResolveGoogleCredentials(options);
    if (provider.ok()) {
      ExpectNoSecrets((*provider)->Describe());
    } else {
      ExpectNoSecrets(provider.status().ToString());
    }
    return provider;
  }
  absl::StatusOr<std::unique_ptr<CredentialsProvider>> Resolve() { return Resolve(Options()); }

  static absl::StatusOr<Credentials> Fetch(CredentialsProvider& provider) {
    absl::StatusOr<Credentials> credentials = provider.Fetch();
    if (!credentials.ok()) ExpectNoSecrets(credentials.status().ToString());
    return credentials;
  }

  std::string dir_;
  std::vector<std::string> files_;
  std::map<std::string, std::string> env_;
  std::shared_ptr<HttpTransport> transport_ = NewCurlTransport();
  const int closed_port_ = ClosedPort();
};

// ---------------------------------------------------------------------------------------------
// Service account

TEST_F(GoogleCredentialsTest, ServiceAccountJwtIsSignedRs256AndExchanged) {
  std::string token_uri;
  StandIn endpoint([&](const Request& r) {
    return ServiceAccountTokenEndpoint(r, token_uri, kGcsFullControlScope,
                                       ServiceAccountKey().key.get(), /*expires_in=*/1234);
  });
  token_uri = endpoint.Url() + "/token";
  const std::string key_file = Write("key.json", ServiceAccountJson(token_uri));
  struct stat st;
  ASSERT_EQ(stat(key_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  auto provider = ServiceAccountCredentialsProvider::FromFile(key_file, Options());
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_EQ((*provider)->Describe(),
            absl::StrCat("service account ", kClientEmail, " (key ", key_file, ")"));
  EXPECT_EQ((*provider)->token_uri(), token_uri);
  EXPECT_EQ((*provider)->scope(), kGcsFullControlScope);

  absl::StatusOr<Credentials> credentials = Fetch(**provider);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->bearer_token, kAccessToken);
  // expires_in counts from the request.
  EXPECT_EQ(credentials->expiration, kNow + absl::Seconds(1234));
  EXPECT_TRUE(credentials->access_key_id.empty());

  const std::vector<Request> requests = endpoint.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].method, "POST");
  // The body is the form, with the grant type's ':' percent-encoded.
  EXPECT_THAT(requests[0].body,
              StartsWith("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer"
                         "&assertion="));

  // The stand-in's verification is not vacuous: the same assertion fails under another key,
  // and a tampered claim breaks the signature.
  const std::string assertion = requests[0].Form().at("assertion");
  EXPECT_TRUE(VerifyRs256(assertion, ServiceAccountKey().key.get()));
  EXPECT_FALSE(VerifyRs256(assertion, OtherKey()));
  std::vector<std::string> parts = absl::StrSplit(assertion, '.');
  ASSERT_EQ(parts.size(), 3u);
  std::optional<DecodedJwt> jwt = DecodeJwt(assertion);
  ASSERT_TRUE(jwt.has_value());
  jwt->claims["scope"] = kGcsReadOnlyScope;
  const std::string forged_claims = Base64UrlEncode(jwt->claims.dump());
  EXPECT_FALSE(VerifyRs256(absl::StrCat(parts[0], ".", forged_claims, ".", parts[2]),
                           ServiceAccountKey().key.get()));
  // MakeAssertion is what Fetch sent (PKCS#1 v1.5 signatures are deterministic).
  absl::StatusOr<std::string> again = (*provider)->MakeAssertion(kNow);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, assertion);
}

TEST_F(GoogleCredentialsTest, ServiceAccountScopeFollowsTheOptions) {
  std::string token_uri, scope;
  StandIn endpoint([&](const Request& r) {
    return ServiceAccountTokenEndpoint(r, token_uri, scope, ServiceAccountKey().key.get());
  });
  token_uri = endpoint.Url() + "/token";
  const std::string key_file = Write("key.json", ServiceAccountJson(token_uri));

  GoogleCredentialsOptions options = Options();
  options.read_only = true;
  scope = kGcsReadOnlyScope;
  auto read_only = ServiceAccountCredentialsProvider::FromFile(key_file, options);
  ASSERT_TRUE(read_only.ok()) << read_only.status();
  absl::StatusOr<Credentials> credentials = Fetch(**read_only);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->expiration, kNow + absl::Seconds(3599));

  options.scope = "https://www.googleapis.com/auth/cloud-platform";
  scope = options.scope;
  auto custom = ServiceAccountCredentialsProvider::FromFile(key_file, options);
  ASSERT_TRUE(custom.ok()) << custom.status();
  EXPECT_TRUE(Fetch(**custom).ok());

  // The endpoint does check the scope: a mismatch is refused.
  scope = kGcsFullControlScope;
  absl::StatusOr<Credentials> refused = Fetch(**custom);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(refused.status().message(), HasSubstr("bad claims"));
}

TEST_F(GoogleCredentialsTest, InvalidGrantNamesTheOAuthErrorAndNeverTheAssertion) {
  std::string token_uri;
  // Verifies with the wrong key, as Google does for a deleted key: invalid_grant.
  StandIn endpoint([&](const Request& r) {
    return ServiceAccountTokenEndpoint(r, token_uri, kGcsFullControlScope, OtherKey());
  });
  token_uri = endpoint.Url() + "/token";
  const std::string key_file = Write("key.json", ServiceAccountJson(token_uri));
  auto provider = ServiceAccountCredentialsProvider::FromFile(key_file, Options());
  ASSERT_TRUE(provider.ok()) << provider.status();
  absl::StatusOr<Credentials> credentials = Fetch(**provider);
  ASSERT_FALSE(credentials.ok());
  EXPECT_EQ(credentials.status().code(), absl::StatusCode::kUnauthenticated);
  const std::string message(credentials.status().message());
  EXPECT_THAT(message, HasSubstr(absl::StrCat("POST ", token_uri, " answered 400")));
  EXPECT_THAT(message, HasSubstr("invalid_grant: Invalid JWT Signature."));
  EXPECT_THAT(message, HasSubstr("the key may have been deleted or disabled"));
  const std::vector<Request> requests = endpoint.requests();
  ASSERT_EQ(requests.size(), 1u);  // a 400 is not retried
  const std::string assertion = requests[0].Form().at("assertion");
  EXPECT_THAT(message, Not(HasSubstr(assertion)));
  // Neither the signature nor the claims appear in pieces.
  for (absl::string_view part : absl::StrSplit(assertion, '.')) {
    EXPECT_THAT(message, Not(HasSubstr(part)));
  }

  // An endpoint (or a proxy) that echoes the request into a non-JSON error: redacted.
  StandIn echo([](const Request& r) { return Reply{400, "bad request: " + r.body}; });
  const std::string echo_file = Write("echo.json", ServiceAccountJson(echo.Url() + "/token"));
  auto echoed = ServiceAccountCredentialsProvider::FromFile(echo_file, Options());
  ASSERT_TRUE(echoed.ok()) << echoed.status();
  absl::StatusOr<Credentials> echo_result = Fetch(**echoed);
  ASSERT_FALSE(echo_result.ok());
  const std::string echo_message(echo_result.status().message());
  EXPECT_THAT(echo_message, HasSubstr("answered 400: bad request: grant_type="));
  const std::string echoed_assertion = echo.requests().at(0).Form().at("assertion");
  EXPECT_THAT(echo_message, Not(HasSubstr(echoed_assertion.substr(0, 40))));
  EXPECT_THAT(echo_message, HasSubstr("<redacted>"));
}

TEST_F(GoogleCredentialsTest, TransientFailuresAreRetried) {
  std::string token_uri;
  std::atomic<int> calls{0};
  StandIn endpoint([&](const Request& r) -> Reply {
    if (++calls == 1) return {503, OAuthError("temporarily_unavailable", "try later")};
    return ServiceAccountTokenEndpoint(r, token_uri, kGcsFullControlScope,
                                       ServiceAccountKey().key.get());
  });
  token_uri = endpoint.Url() + "/token";
  auto provider = ServiceAccountCredentialsProvider::FromFile(
      Write("key.json", ServiceAccountJson(token_uri)), Options());
  ASSERT_TRUE(provider.ok()) << provider.status();
  absl::StatusOr<Credentials> credentials = Fetch(**provider);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(calls.load(), 2);

  // Always 503: Unavailable after token_attempts.
  StandIn down([](const Request&) { return Reply{503, "{}"}; });
  GoogleCredentialsOptions options = Options();
  options.token_attempts = 2;
  auto failing = ServiceAccountCredentialsProvider::FromFile(
      Write("down.json", ServiceAccountJson(down.Url() + "/token")), options);
  ASSERT_TRUE(failing.ok());
  EXPECT_EQ(Fetch(**failing).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(down.requests().size(), 2u);
}

TEST_F(GoogleCredentialsTest, TokenResponsesAreChecked) {
  struct Case {
    std::string body;
    std::string message;  // empty: accepted
    absl::Duration lifetime = absl::ZeroDuration();
  };
  const std::vector<Case> cases = {
      {R"({"access_token":"ya29.x","expires_in":"120","token_type":"Bearer"})", "",
       absl::Seconds(120)},
      {R"({"access_token":"ya29.x","expires_in":59.5,"token_type":"bearer"})", "",
       absl::Seconds(59.5)},
      // Without expires_in, an hour (Google's tokens' lifetime).
      {R"({"access_token":"ya29.x"})", "", absl::Hours(1)},
      {"<html>proxy</html>", "not a JSON object"},
      {R"({"expires_in":3599,"token_type":"Bearer"})", "no access_token"},
      {R"({"access_token":"ya29.x","expires_in":3599,"token_type":"MAC"})", "not Bearer"},
      {R"({"access_token":"ya29.x","expires_in":-5})", "not a positive number"},
      {R"({"access_token":"ya29.x","expires_in":"soon"})", "not a positive number"},
  };
  for (const Case& c : cases) {
    StandIn endpoint([&](const Request&) { return Reply{200, c.body}; });
    GoogleCredentialsOptions options = Options();
    options.oauth_token_uri = endpoint.Url() + "/token";
    auto provider =
        AuthorizedUserCredentialsProvider::FromJson(AuthorizedUserJson(), "adc.json", options);
    ASSERT_TRUE(provider.ok()) << provider.status();
    absl::StatusOr<Credentials> credentials = Fetch(**provider);
    if (c.message.empty()) {
      ASSERT_TRUE(credentials.ok()) << c.body << ": " << credentials.status();
      EXPECT_EQ(credentials->bearer_token, "ya29.x");
      EXPECT_EQ(credentials->expiration, kNow + c.lifetime) << c.body;
    } else {
      EXPECT_EQ(credentials.status().code(), absl::StatusCode::kDataLoss) << c.body;
      EXPECT_THAT(credentials.status().message(), HasSubstr(c.message)) << c.body;
    }
  }
}

TEST_F(GoogleCredentialsTest, MalformedKeyFilesNameTheFileAndTheField) {
  const std::string pem = ServiceAccountKey().pem;
  const auto without = [&](absl::string_view field) {
    json doc = json::parse(ServiceAccountJson("https://oauth2.googleapis.com/token"));
    doc.erase(std::string(field));
    return doc.dump();
  };
  const auto with = [&](absl::string_view field, json value) {
    json doc = json::parse(ServiceAccountJson("https://oauth2.googleapis.com/token"));
    doc[std::string(field)] = std::move(value);
    return doc.dump();
  };
  // The PEM with its base64 body damaged.
  std::string bad_pem = pem;
  bad_pem[bad_pem.find('\n') + 10] = '!';
  // An EC key: RS256 needs RSA.
  EVP_PKEY* ec = EVP_EC_gen("P-256");
  ASSERT_NE(ec, nullptr);
  const std::string ec_pem = PrivatePem(ec);
  EVP_PKEY_free(ec);

  struct Case {
    std::string content;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"not json {", "not a JSON object"},
      {"[1, 2]", "not a JSON object"},
      {without("client_email"), "no \"client_email\""},
      {without("private_key"), "no \"private_key\""},
      {with("private_key", 42), "no \"private_key\""},
      {with("private_key", "-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n"),
       "\"private_key\" is not an unencrypted PEM private key"},
      {with("private_key", bad_pem), "\"private_key\" is not an unencrypted PEM private key"},
      {with("private_key", ec_pem), "\"private_key\" is not an RSA key"},
      {with("type", "authorized_user"), "\"type\" is \"authorized_user\""},
      {with("token_uri", "ftp://example.com/token"), "\"token_uri\" is not an http(s) URL"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = Write(absl::StrCat("bad", i, ".json"), cases[i].content);
    auto provider = ServiceAccountCredentialsProvider::FromFile(path, Options());
    ASSERT_FALSE(provider.ok()) << cases[i].content;
    EXPECT_EQ(provider.status().code(), absl::StatusCode::kInvalidArgument) << cases[i].content;
    EXPECT_THAT(provider.status().message(), HasSubstr(absl::StrCat("credentials file ", path)));
    EXPECT_THAT(provider.status().message(), HasSubstr(cases[i].message));
    ExpectNoSecrets(provider.status().message());
  }
  // Optional fields: no private_key_id (no kid), no token_uri (Google's endpoint).
  json minimal = {
      {"type", "service_account"}, {"client_email", kClientEmail}, {"private_key", pem}};
  auto provider =
      ServiceAccountCredentialsProvider::FromJson(minimal.dump(), "min.json", Options());
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_EQ((*provider)->token_uri(), kGoogleTokenUri);
  absl::StatusOr<std::string> assertion = (*provider)->MakeAssertion(kNow);
  ASSERT_TRUE(assertion.ok());
  std::optional<DecodedJwt> jwt = DecodeJwt(*assertion);
  ASSERT_TRUE(jwt.has_value());
  EXPECT_EQ(jwt->header, (json{{"alg", "RS256"}, {"typ", "JWT"}}));
  EXPECT_TRUE(VerifyRs256(*assertion, ServiceAccountKey().key.get()));

  // By type: a missing type, an unknown one and an unsupported one.
  const std::string untyped = Write("untyped.json", without("type"));
  EXPECT_THAT(LoadGoogleCredentialsFile(untyped, Options()).status().message(),
              HasSubstr("no \"type\""));
  const std::string unknown = Write("unknown.json", with("type", "mystery"));
  EXPECT_EQ(LoadGoogleCredentialsFile(unknown, Options()).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string external = Write("external.json", with("type", "external_account"));
  EXPECT_EQ(LoadGoogleCredentialsFile(external, Options()).status().code(),
            absl::StatusCode::kUnimplemented);
  // Missing file.
  absl::Status missing =
      ServiceAccountCredentialsProvider::FromFile(dir_ + "/nope.json", Options()).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr(dir_ + "/nope.json"));
}

// ---------------------------------------------------------------------------------------------
// gcloud user credentials

TEST_F(GoogleCredentialsTest, AuthorizedUserExchangesTheRefreshToken) {
  StandIn endpoint([&](const Request& r) -> Reply {
    if (r.method != "POST" || r.path != "/token") return {404, ""};
    const std::map<std::string, std::string> form = r.Form();
    const std::map<std::string, std::string> expected = {{"grant_type", "refresh_token"},
                                                         {"client_id", kClientId},
                                                         {"client_secret", kClientSecret},
                                                         {"refresh_token", kRefreshToken}};
    if (form != expected) return {400, OAuthError("invalid_request", "bad form")};
    return {200, TokenJson(kAccessToken, 3599)};
  });
  GoogleCredentialsOptions options = Options();
  options.oauth_token_uri = endpoint.Url() + "/token";
  const std::string path = Write("adc.json", AuthorizedUserJson());
  auto provider = AuthorizedUserCredentialsProvider::FromFile(path, options);
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_EQ((*provider)->Describe(), absl::StrCat("gcloud user credentials (", path, ")"));
  absl::StatusOr<Credentials> credentials = Fetch(**provider);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->bearer_token, kAccessToken);
  EXPECT_EQ(credentials->expiration, kNow + absl::Seconds(3599));

  const std::vector<Request> requests = endpoint.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_THAT(requests[0].Header("content-type"), StartsWith("application/x-www-form-urlencoded"));
  // The secret's '+', '/', '=' and '&' are percent-encoded, not sent raw.
  EXPECT_THAT(requests[0].body,
              HasSubstr("client_secret=GOCSPX-STANDIN%2BSECRET%2Fwith%3Dodd%26chars"));
  EXPECT_THAT(requests[0].body, StartsWith("grant_type=refresh_token&"));

  // Missing fields.
  json doc = json::parse(AuthorizedUserJson());
  doc.erase("refresh_token");
  auto incomplete = AuthorizedUserCredentialsProvider::FromJson(doc.dump(), "adc2.json", options);
  EXPECT_EQ(incomplete.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(incomplete.status().message(),
              HasSubstr("credentials file adc2.json: no \"refresh_token\""));
  ExpectNoSecrets(incomplete.status().message());
}

TEST_F(GoogleCredentialsTest, RevokedRefreshTokenIsInvalidGrantWithoutTheSecrets) {
  // An endpoint that quotes the request in its description, to prove redaction.
  StandIn endpoint([](const Request& r) {
    return Reply{400, OAuthError("invalid_grant", "Token has been expired or revoked. " + r.body)};
  });
  GoogleCredentialsOptions options = Options();
  options.oauth_token_uri = endpoint.Url() + "/token";
  auto provider =
      AuthorizedUserCredentialsProvider::FromFile(Write("adc.json", AuthorizedUserJson()), options);
  ASSERT_TRUE(provider.ok()) << provider.status();
  absl::StatusOr<Credentials> credentials = Fetch(**provider);
  EXPECT_EQ(credentials.status().code(), absl::StatusCode::kUnauthenticated);
  const std::string message(credentials.status().message());
  EXPECT_THAT(message,
              HasSubstr("answered 400: invalid_grant: Token has been expired or revoked."));
  EXPECT_THAT(message, HasSubstr("gcloud auth application-default login"));
  // The percent-encoded forms are not leaked either (the description quoted the raw body).
  EXPECT_THAT(message, Not(HasSubstr("STANDINREFRESHTOKEN")));
  EXPECT_THAT(message, Not(HasSubstr("STANDIN%2BSECRET")));
}

// ---------------------------------------------------------------------------------------------
// GCE metadata server

Reply MetadataServer(const Request& r) {
  if (r.Header("metadata-flavor") != "Google") return {403, "Missing Metadata-Flavor header"};
  if (r.method != "GET" ||
      r.path != "/computeMetadata/v1/instance/service-accounts/default/token") {
    return {404, "Not Found"};
  }
  return {200, TokenJson(kAccessToken, 3000)};
}

TEST_F(GoogleCredentialsTest, MetadataServerTokenNeedsTheFlavorHeader) {
  StandIn metadata(MetadataServer);
  GoogleCredentialsOptions options = Options();
  options.metadata_host = metadata.HostPort();
  GceMetadataCredentialsProvider provider(options);
  EXPECT_EQ(provider.Describe(), absl::StrCat("GCE metadata server at ", metadata.HostPort()));
  absl::StatusOr<Credentials> credentials = Fetch(provider);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->bearer_token, kAccessToken);
  EXPECT_EQ(credentials->expiration, kNow + absl::Seconds(3000));
  const std::vector<Request> requests = metadata.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].Header("metadata-flavor"), "Google");

  // The stand-in really insists on the header.
  HttpRequest bare;
  bare.url = metadata.Url() + "/computeMetadata/v1/instance/service-accounts/default/token";
  absl::Notification done;
  absl::StatusOr<HttpResponse> response;
  transport_->Send(std::move(bare), [&](absl::StatusOr<HttpResponse> r) {
    response = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 403);

  // GCE_METADATA_HOST names the server when the option does not; an http:// URL works too.
  env_["GCE_METADATA_HOST"] = metadata.HostPort();
  GoogleCredentialsOptions from_env = Options();
  from_env.metadata_host.clear();
  GceMetadataCredentialsProvider env_provider(from_env);
  EXPECT_EQ(env_provider.Describe(), absl::StrCat("GCE metadata server at ", metadata.HostPort()));
  EXPECT_TRUE(Fetch(env_provider).ok());
  options.metadata_host = metadata.Url() + "/";
  EXPECT_TRUE(Fetch(*std::make_unique<GceMetadataCredentialsProvider>(options)).ok());

  // The default is Google's name (not contacted here).
  env_.erase("GCE_METADATA_HOST");
  GoogleCredentialsOptions defaults = Options();
  defaults.metadata_host.clear();
  EXPECT_EQ(GceMetadataCredentialsProvider(defaults).Describe(),
            "GCE metadata server at metadata.google.internal");
}

TEST_F(GoogleCredentialsTest, MetadataServerFailuresAreClearAndFast) {
  // Off GCE: nothing answers. As the last resort, Unauthenticated naming what to set.
  GceMetadataCredentialsProvider last_resort(Options(), /*last_resort=*/true);
  const absl::Time start = absl::Now();
  absl::StatusOr<Credentials> credentials = Fetch(last_resort);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(credentials.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(credentials.status().message(), HasSubstr("GOOGLE_APPLICATION_CREDENTIALS"));
  EXPECT_THAT(credentials.status().message(), HasSubstr("gcloud auth application-default login"));
  EXPECT_THAT(credentials.status().message(), HasSubstr(absl::StrCat("127.0.0.1:", closed_port_)));
  // Not the last resort: the transport's error as is.
  GceMetadataCredentialsProvider plain(Options());
  EXPECT_EQ(Fetch(plain).status().code(), absl::StatusCode::kUnavailable);

  // A server that hangs is cut off by metadata_timeout.
  StandIn slow([](const Request& r) {
    absl::SleepFor(absl::Seconds(1));
    return MetadataServer(r);
  });
  GoogleCredentialsOptions options = Options();
  options.metadata_host = slow.HostPort();
  options.metadata_timeout = absl::Milliseconds(200);
  options.metadata_attempts = 1;
  const absl::Time slow_start = absl::Now();
  EXPECT_FALSE(Fetch(*std::make_unique<GceMetadataCredentialsProvider>(options)).ok());
  EXPECT_LT(absl::Now() - slow_start, absl::Milliseconds(1500));

  // An instance without a service account: 404 with a hint.
  StandIn no_account([](const Request&) { return Reply{404, "Not Found"}; });
  options = Options();
  options.metadata_host = no_account.HostPort();
  absl::StatusOr<Credentials> not_found =
      Fetch(*std::make_unique<GceMetadataCredentialsProvider>(options));
  EXPECT_EQ(not_found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(not_found.status().message(), HasSubstr("answered 404: Not Found"));
  EXPECT_THAT(not_found.status().message(),
              HasSubstr("no service account is attached to the instance"));
}

// ---------------------------------------------------------------------------------------------
// The ADC order

TEST_F(GoogleCredentialsTest, ResolutionFollowsTheDocumentedOrder) {
  StandIn metadata(MetadataServer);
  std::string token_uri;
  StandIn sa_endpoint([&](const Request& r) {
    return ServiceAccountTokenEndpoint(r, token_uri, kGcsFullControlScope,
                                       ServiceAccountKey().key.get());
  });
  token_uri = sa_endpoint.Url() + "/token";
  const std::string key_file = Write("key.json", ServiceAccountJson(token_uri));
  Mkdir(".config");
  Mkdir(".config/gcloud");
  const std::string well_known =
      Write(".config/gcloud/application_default_credentials.json", AuthorizedUserJson());
  env_["GOOGLE_APPLICATION_CREDENTIALS"] = key_file;
  env_["GCE_METADATA_HOST"] = metadata.HostPort();
  const auto options = [&] {
    GoogleCredentialsOptions o = Options();
    o.metadata_host.clear();  // from GCE_METADATA_HOST
    return o;
  };

  // 1. The variable beats the well-known file and the metadata server.
  auto provider = Resolve(options());
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_EQ((*provider)->Describe(),
            absl::StrCat("service account ", kClientEmail, " (key ", key_file, ")"));
  absl::StatusOr<Credentials> credentials = Fetch(**provider);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->bearer_token, kAccessToken);
  // The variable may name an authorized_user file too.
  env_["GOOGLE_APPLICATION_CREDENTIALS"] = well_known;
  provider = Resolve(options());
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_EQ((*provider)->Describe(), absl::StrCat("gcloud user credentials (", well_known, ")"));

  // 2. Without it, gcloud's well-known file under HOME...
  env_.erase("GOOGLE_APPLICATION_CREDENTIALS");
  provider = Resolve(options());
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_EQ((*provider)->Describe(), absl::StrCat("gcloud user credentials (", well_known, ")"));
  // ... or under CLOUDSDK_CONFIG, which wins over HOME.
  const std::string config_dir = Mkdir("gcloud-config");
  const std::string configured =
      Write("gcloud-config/application_default_credentials.json", ServiceAccountJson(token_uri));
  env_["CLOUDSDK_CONFIG"] = config_dir;
  EXPECT_EQ(*GcloudWellKnownFile(options()), configured);
  provider = Resolve(options());
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_EQ((*provider)->Describe(),
            absl::StrCat("service account ", kClientEmail, " (key ", configured, ")"));
  // CLOUDSDK_CONFIG without the file: the metadata server (HOME's file is not consulted).
  env_["CLOUDSDK_CONFIG"] = dir_ + "/empty-config";

  // 3. Then the metadata server.
  provider = Resolve(options());
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_EQ((*provider)->Describe(), absl::StrCat("GCE metadata server at ", metadata.HostPort()));
  credentials = Fetch(**provider);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->expiration, kNow + absl::Seconds(3000));
  env_.erase("CLOUDSDK_CONFIG");
  env_.erase("HOME");
  EXPECT_EQ(GcloudWellKnownFile(options()), std::nullopt);
  provider = Resolve(options());
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_THAT((*provider)->Describe(), StartsWith("GCE metadata server at "));
  // Choosing never fetched anything.
  EXPECT_EQ(metadata.requests().size(), 1u);
  EXPECT_EQ(sa_endpoint.requests().size(), 1u);
}

TEST_F(GoogleCredentialsTest, ABadVariableIsAnErrorNotAFallThrough) {
  // A usable well-known file and metadata server exist; the variable still wins.
  Mkdir(".config");
  Mkdir(".config/gcloud");
  Write(".config/gcloud/application_default_credentials.json", AuthorizedUserJson());

  env_["GOOGLE_APPLICATION_CREDENTIALS"] = dir_ + "/missing.json";
  auto missing = Resolve();
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              StartsWith("GOOGLE_APPLICATION_CREDENTIALS: "));
  EXPECT_THAT(missing.status().message(), HasSubstr(dir_ + "/missing.json"));

  const std::string unreadable = Write("unreadable.json", AuthorizedUserJson());
  chmod(unreadable.c_str(), 0);
  if (geteuid() != 0) {  // root reads anything
    env_["GOOGLE_APPLICATION_CREDENTIALS"] = unreadable;
    auto denied = Resolve();
    EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(denied.status().message(), HasSubstr(unreadable));
  }

  env_["GOOGLE_APPLICATION_CREDENTIALS"] =
      Write("malformed.json", "{\"type\": \"service_account\"");
  auto malformed = Resolve();
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(malformed.status().message(), HasSubstr("GOOGLE_APPLICATION_CREDENTIALS: "));
  EXPECT_THAT(malformed.status().message(), HasSubstr("malformed.json: not a JSON object"));

  // A malformed well-known file is an error too (it exists, so it was meant).
  env_.erase("GOOGLE_APPLICATION_CREDENTIALS");
  const std::string config_dir = Mkdir("cfg");
  Write("cfg/application_default_credentials.json", "{\"type\": \"authorized_user\"}");
  env_["CLOUDSDK_CONFIG"] = config_dir;
  auto bad_well_known = Resolve();
  EXPECT_EQ(bad_well_known.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_well_known.status().message(), HasSubstr("no \"client_id\""));
}

// ---------------------------------------------------------------------------------------------
// Through CredentialsCache and BearerTokenSigner

TEST_F(GoogleCredentialsTest, TokensSignRequestsThroughTheCacheAndBearerSigner) {
  std::string token_uri;
  std::atomic<bool> refuse{false};
  StandIn endpoint([&](const Request& r) -> Reply {
    if (refuse) return {400, OAuthError("invalid_grant", "account not found")};
    return ServiceAccountTokenEndpoint(r, token_uri, kGcsFullControlScope,
                                       ServiceAccountKey().key.get());
  });
  token_uri = endpoint.Url() + "/token";
  const std::string key_file = Write("key.json", ServiceAccountJson(token_uri));
  env_["GOOGLE_APPLICATION_CREDENTIALS"] = key_file;
  // The fixed clock stays: the endpoint checks iat against kNow.
  GoogleCredentialsOptions options = Options();
  auto provider = Resolve(options);
  ASSERT_TRUE(provider.ok()) << provider.status();
  const std::string source = (*provider)->Describe();

  // kNow is in the past, so a token expiring kNow + 3599 s would be stale at once: wrap the
  // provider to shift the expiration onto the real clock, as a store's cache sees it.
  struct RealTime : CredentialsProvider {
    explicit RealTime(std::unique_ptr<CredentialsProvider> p) : p(std::move(p)) {}
    absl::StatusOr<Credentials> Fetch() override {
      absl::StatusOr<Credentials> c = p->Fetch();
      if (c.ok()) c->expiration = absl::Now() + (c->expiration - kNow);
      return c;
    }
    std::string Describe() const override { return p->Describe(); }
    std::unique_ptr<CredentialsProvider> p;
  };
  ThreadPool pool(2);
  auto cache =
      std::make_shared<CredentialsCache>(std::make_unique<RealTime>(*std::move(provider)), &pool);
  BearerTokenSigner signer(cache);
  EXPECT_EQ(signer.Describe(), absl::StrCat("bearer token from ", source));

  const auto sign = [&](HttpRequest request) {
    absl::Notification done;
    std::optional<absl::StatusOr<HttpRequest>> result;
    signer.SignAsync(std::move(request), [&](absl::StatusOr<HttpRequest> r) {
      result.emplace(std::move(r));
      done.Notify();
    });
    done.WaitForNotification();
    return *std::move(result);
  };
  HttpRequest request;
  request.url = "https://storage.googleapis.com/storage/v1/b/bucket/o";
  absl::StatusOr<HttpRequest> signed_request = sign(std::move(request));
  ASSERT_TRUE(signed_request.ok()) << signed_request.status();
  std::string authorization;
  for (const auto& [name, value] : signed_request->headers) {
    if (absl::EqualsIgnoreCase(name, "authorization")) authorization = value;
  }
  EXPECT_EQ(authorization, absl::StrCat("Bearer ", kAccessToken));
  // Cached: a second request does not fetch again.
  ASSERT_TRUE(sign(HttpRequest{}).ok());
  EXPECT_EQ(cache->fetches(), 1);
  EXPECT_EQ(endpoint.requests().size(), 1u);

  // After a 401 the store invalidates; a refused refresh names the key file and the account.
  refuse = true;
  signer.Invalidate();
  absl::StatusOr<HttpRequest> refused = sign(HttpRequest{});
  ASSERT_FALSE(refused.ok());
  const std::string message(refused.status().message());
  EXPECT_THAT(message, HasSubstr(key_file));
  EXPECT_THAT(message, HasSubstr(kClientEmail));
  EXPECT_THAT(message, HasSubstr("invalid_grant: account not found"));
  ExpectNoSecrets(message);
}

}  // namespace
}  // namespace wharf::gcs
