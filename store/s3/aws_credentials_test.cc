// Each AWS credential source against a loopback stand-in of its endpoint (IMDSv2, the
// container endpoint, STS), credential_process with small shell scripts, the chain's order,
// and the cache refreshing credentials before they expire. Nothing here contacts a
// non-loopback address: every test that could reach instance metadata either points
// AWS_EC2_METADATA_SERVICE_ENDPOINT at a stand-in or never fetches.
#include "store/s3/aws_credentials.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/credentials.h"
#include "base/hash.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "http/curl_transport.h"
#include "store/s3/sigv4.h"

namespace wharf::s3 {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Distinctive secrets: no message or description may contain them.
constexpr char kSecret[] = "STANDINSECRETwJalrXUtnFEMIK7MDENG";
constexpr char kToken[] = "STANDINSESSIONTOKENxxxxxxxxxxxxxx";
constexpr char kWebToken[] = "eyJWEBIDENTITYTOKENyyyyyyyyyyyyy";
constexpr char kContainerToken[] = "CONTAINERAUTHTOKENzzzzzzzzzzzzzz";

void ExpectNoSecrets(absl::string_view text) {
  for (absl::string_view secret : {kSecret, kToken, kWebToken, kContainerToken}) {
    EXPECT_THAT(text, Not(HasSubstr(secret)));
  }
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
  bool HasHeader(absl::string_view name) const {
    for (const auto& [k, v] : headers) {
      if (k == name) return true;
    }
    return false;
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
  int port() const { return port_; }
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
        absl::StrCat("HTTP/1.1 ", reply.status, " X\r\nContent-Length: ", reply.body.size(),
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

std::string Rfc3339(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

std::string JsonCredentials(absl::string_view id, absl::Time expiration,
                            absl::string_view token_field = "Token") {
  return absl::StrCat("{\"Code\":\"Success\",\"Type\":\"AWS-HMAC\",\"AccessKeyId\":\"", id,
                      "\",\"SecretAccessKey\":\"", kSecret, "\",\"", token_field, "\":\"", kToken,
                      "\",\"Expiration\":\"", Rfc3339(expiration), "\"}");
}

std::string StsXml(absl::string_view action, absl::string_view id, absl::Time expiration) {
  return absl::StrCat("<", action, "Response xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><",
                      action, "Result><Credentials><AccessKeyId>", id,
                      "</AccessKeyId><SecretAccessKey>", kSecret,
                      "</SecretAccessKey><SessionToken>", kToken, "</SessionToken><Expiration>",
                      Rfc3339(expiration), "</Expiration></Credentials></", action,
                      "Result><ResponseMetadata><RequestId>req-1</RequestId></ResponseMetadata></",
                      action, "Response>");
}

std::string StsErrorXml(absl::string_view code, absl::string_view message) {
  return absl::StrCat("<ErrorResponse><Error><Type>Sender</Type><Code>", code, "</Code><Message>",
                      message, "</Message></Error><RequestId>req-err</RequestId></ErrorResponse>");
}

// ---------------------------------------------------------------------------------------------
// Fixture: a temporary HOME with ~/.aws, and an environment map.

class CredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/aws_credentials_test_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "_",
                        getpid());
    ASSERT_EQ(mkdir(dir_.c_str(), 0700), 0) << dir_;
    ASSERT_EQ(mkdir((dir_ + "/.aws").c_str(), 0700), 0);
    env_["HOME"] = dir_;
  }
  void TearDown() override {
    for (const std::string& path : files_) unlink(path.c_str());
    rmdir((dir_ + "/.aws").c_str());
    rmdir(dir_.c_str());
  }

  std::string Write(absl::string_view name, absl::string_view content, bool executable = false) {
    const std::string path = absl::StrCat(dir_, "/", name);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << content;
    out.close();
    if (executable) chmod(path.c_str(), 0700);
    files_.push_back(path);
    return path;
  }
  void WriteConfig(absl::string_view content) { Write(".aws/config", content); }
  void WriteCredentials(absl::string_view content) { Write(".aws/credentials", content); }
  std::string config_path() const { return dir_ + "/.aws/config"; }
  std::string credentials_path() const { return dir_ + "/.aws/credentials"; }

  EnvLookup Env() const {
    return [env = env_](absl::string_view name) -> std::optional<std::string> {
      auto it = env.find(std::string(name));
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
  }

  AwsCredentialsOptions Options() const {
    AwsCredentialsOptions options;
    options.env = Env();
    options.transport = transport_;
    options.region = "us-west-2";
    options.imds_timeout = absl::Seconds(2);
    return options;
  }

  absl::StatusOr<std::shared_ptr<CredentialsProvider>> Chain(
      absl::string_view profile = "default") {
    return ChainWith(profile, Options());
  }
  absl::StatusOr<std::shared_ptr<CredentialsProvider>> ChainWith(
      absl::string_view profile, const AwsCredentialsOptions& options) {
    absl::StatusOr<AwsSharedFile> credentials =
        LoadAwsSharedFile(options.env, "AWS_SHARED_CREDENTIALS_FILE", "credentials");
    absl::StatusOr<AwsSharedFile> config =
        LoadAwsSharedFile(options.env, "AWS_CONFIG_FILE", "config");
    EXPECT_TRUE(credentials.ok() && config.ok());
    auto chain = ResolveAwsCredentialsChain(profile, *credentials, *config, options);
    if (chain.ok()) {
      ExpectNoSecrets((*chain)->Describe());
    } else {
      ExpectNoSecrets(chain.status().ToString());
    }
    return chain;
  }

  // Fetches through the chain's provider; errors must not carry a secret either.
  static absl::StatusOr<Credentials> Fetch(CredentialsProvider& provider) {
    absl::StatusOr<Credentials> credentials = provider.Fetch();
    if (!credentials.ok()) ExpectNoSecrets(credentials.status().ToString());
    return credentials;
  }

  std::string dir_;
  std::vector<std::string> files_;
  std::map<std::string, std::string> env_;
  std::shared_ptr<HttpTransport> transport_ = NewCurlTransport();
};

// ---------------------------------------------------------------------------------------------
// IMDSv2

// An IMDSv2 stand-in: the token is required on every metadata GET (401 without it, as EC2
// answers when IMDSv1 is disabled).
Reply ImdsHandler(const Request& r, absl::string_view role, absl::Time expiration,
                  absl::string_view key_id) {
  constexpr absl::string_view kSession = "IMDSSESSION-abc";
  if (r.path == "/latest/api/token") {
    if (r.method != "PUT" || r.Header("x-aws-ec2-metadata-token-ttl-seconds").empty()) {
      return {400, "missing ttl"};
    }
    return {200, std::string(kSession)};
  }
  if (r.Header("x-aws-ec2-metadata-token") != kSession) return {401, ""};
  if (r.path == "/latest/meta-data/iam/security-credentials/") {
    if (role.empty()) return {404, "<html>Not Found</html>"};
    return {200, absl::StrCat(role, "\n")};
  }
  if (r.path == absl::StrCat("/latest/meta-data/iam/security-credentials/", role)) {
    return {200, JsonCredentials(key_id, expiration)};
  }
  return {404, ""};
}

TEST_F(CredentialsTest, ImdsV2FetchesTheRoleCredentialsWithASessionToken) {
  const absl::Time expiration = absl::FromUnixSeconds(absl::ToUnixSeconds(absl::Now()) + 3600);
  StandIn imds(
      [&](const Request& r) { return ImdsHandler(r, "node-role", expiration, "AKIAIMDS"); });
  env_["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = imds.Url() + "/";

  auto provider = Chain();
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_EQ((*provider)->Describe(), absl::StrCat("IMDS at ", imds.Url()));
  absl::StatusOr<Credentials> credentials = Fetch(**provider);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->access_key_id, "AKIAIMDS");
  EXPECT_EQ(credentials->secret_access_key, kSecret);
  EXPECT_EQ(credentials->session_token, kToken);
  EXPECT_EQ(credentials->expiration, expiration);

  const std::vector<Request> requests = imds.requests();
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0].method, "PUT");
  EXPECT_EQ(requests[0].path, "/latest/api/token");
  EXPECT_EQ(requests[0].Header("x-aws-ec2-metadata-token-ttl-seconds"), "21600");
  EXPECT_EQ(requests[1].method, "GET");
  EXPECT_EQ(requests[1].path, "/latest/meta-data/iam/security-credentials/");
  EXPECT_EQ(requests[2].path, "/latest/meta-data/iam/security-credentials/node-role");

  // The stand-in really enforces IMDSv2: a GET without the token is refused.
  HttpRequest bare;
  bare.url = imds.Url() + "/latest/meta-data/iam/security-credentials/";
  absl::Notification done;
  absl::StatusOr<HttpResponse> response;
  transport_->Send(std::move(bare), [&](absl::StatusOr<HttpResponse> r) {
    response = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 401);
}

TEST_F(CredentialsTest, ImdsWithoutARoleNamesTheStep) {
  StandIn imds([&](const Request& r) { return ImdsHandler(r, "", absl::Now(), ""); });
  ImdsCredentialsProvider provider(imds.Url(), Options());
  absl::StatusOr<Credentials> credentials = Fetch(provider);
  EXPECT_EQ(credentials.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(credentials.status().message(),
              HasSubstr("GET /latest/meta-data/iam/security-credentials/ answered 404"));
  EXPECT_THAT(credentials.status().message(), HasSubstr("no IAM role is attached"));
}

TEST_F(CredentialsTest, ImdsRetriesOnceThenGivesUp) {
  std::atomic<int> token_requests{0};
  StandIn imds([&](const Request& r) -> Reply {
    if (r.path == "/latest/api/token" && ++token_requests == 1) return {503, "busy"};
    return ImdsHandler(r, "role", absl::Now() + absl::Hours(1), "AKIAAFTERRETRY");
  });
  ImdsCredentialsProvider provider(imds.Url(), Options());
  absl::StatusOr<Credentials> credentials = Fetch(provider);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->access_key_id, "AKIAAFTERRETRY");
  EXPECT_EQ(token_requests.load(), 2);

  // Always busy: two attempts (one retry), then the error.
  StandIn busy([](const Request&) { return Reply{503, "busy"}; });
  ImdsCredentialsProvider busy_provider(busy.Url(), Options());
  credentials = Fetch(busy_provider);
  EXPECT_EQ(credentials.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(credentials.status().message(), HasSubstr("PUT /latest/api/token answered 503"));
  EXPECT_EQ(busy.requests().size(), 2u);
}

TEST_F(CredentialsTest, ImdsAsLastResortFailsFastAsUnauthenticated) {
  env_["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = absl::StrCat("http://127.0.0.1:", ClosedPort());
  auto provider = Chain();
  ASSERT_TRUE(provider.ok()) << provider.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<Credentials> credentials = Fetch(**provider);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(credentials.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(credentials.status().message(), HasSubstr("PUT /latest/api/token"));
  EXPECT_THAT(credentials.status().message(), HasSubstr("no other AWS credentials are configured"));
}

TEST_F(CredentialsTest, MetadataDisabledLeavesNoSource) {
  // Never fetched: choosing the source does no I/O, so the real address is safe to name.
  auto provider = Chain();
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_EQ((*provider)->Describe(), "IMDS at http://169.254.169.254");
  env_["AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE"] = "IPv6";
  EXPECT_EQ((*Chain())->Describe(), "IMDS at http://[fd00:ec2::254]");

  env_["AWS_EC2_METADATA_DISABLED"] = "TRUE";
  provider = Chain();
  EXPECT_EQ(provider.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(provider.status().message(), HasSubstr("no AWS credentials found"));

  // A role that asks for the instance's credentials cannot get them either.
  WriteConfig(
      "[default]\nrole_arn = arn:aws:iam::1:role/r\ncredential_source = Ec2InstanceMetadata\n");
  provider = Chain();
  EXPECT_EQ(provider.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(provider.status().message(), HasSubstr("AWS_EC2_METADATA_DISABLED"));
}

TEST_F(CredentialsTest, MetadataTimeoutAndAttemptsFromTheEnvironment) {
  env_["AWS_METADATA_SERVICE_NUM_ATTEMPTS"] = "3";
  StandIn busy([](const Request&) { return Reply{500, ""}; });
  env_["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = busy.Url();
  auto provider = Chain();
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_FALSE(Fetch(**provider).ok());
  EXPECT_EQ(busy.requests().size(), 3u);

  env_["AWS_METADATA_SERVICE_TIMEOUT"] = "soon";
  EXPECT_EQ(Chain().status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Container credentials

TEST_F(CredentialsTest, ContainerFullUriSendsTheTokenFromItsFile) {
  const absl::Time expiration = absl::FromUnixSeconds(absl::ToUnixSeconds(absl::Now()) + 3600);
  StandIn agent([&](const Request& r) -> Reply {
    if (r.Header("authorization") != kContainerToken) return {401, "{\"message\":\"bad token\"}"};
    if (r.path != "/v1/credentials") return {404, ""};
    return {200, JsonCredentials("AKIAPODIDENTITY", expiration)};
  });
  env_["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = agent.Url() + "/v1/credentials";
  env_["AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"] =
      Write("pod-token", absl::StrCat(kContainerToken, "\n"));
  env_["AWS_CONTAINER_AUTHORIZATION_TOKEN"] = "ignored-when-the-file-is-set";

  auto provider = Chain();
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_EQ((*provider)->Describe(),
            absl::StrCat("container credentials at ", agent.Url(), "/v1/credentials"));
  absl::StatusOr<Credentials> credentials = Fetch(**provider);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->access_key_id, "AKIAPODIDENTITY");
  EXPECT_EQ(credentials->session_token, kToken);
  EXPECT_EQ(credentials->expiration, expiration);

  // The token from the variable, when there is no file; a wrong one is refused with a hint.
  env_.erase("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
  env_["AWS_CONTAINER_AUTHORIZATION_TOKEN"] = "wrong";
  provider = Chain();
  ASSERT_TRUE(provider.ok()) << provider.status();
  credentials = Fetch(**provider);
  EXPECT_EQ(credentials.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(credentials.status().message(), HasSubstr("answered 401"));
  EXPECT_THAT(credentials.status().message(), HasSubstr("AWS_CONTAINER_AUTHORIZATION_TOKEN"));
}

TEST_F(CredentialsTest, ContainerRelativeUriGoesToTheEcsAgent) {
  StandIn agent([&](const Request& r) -> Reply {
    if (r.path != "/v2/credentials/task-uuid") return {404, ""};
    if (r.HasHeader("authorization")) return {400, "unexpected authorization"};
    return {200, JsonCredentials("AKIAECSTASK", absl::Now() + absl::Hours(6))};
  });
  env_["AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"] = "/v2/credentials/task-uuid";
  env_["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = "http://127.0.0.1:1/loses";
  AwsCredentialsOptions options = Options();
  options.container_relative_host = agent.Url();
  auto provider = ChainWith("default", options);
  ASSERT_TRUE(provider.ok()) << provider.status();
  absl::StatusOr<Credentials> credentials = Fetch(**provider);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->access_key_id, "AKIAECSTASK");

  // The default agent address, named without being contacted.
  EXPECT_EQ((*Chain())->Describe(),
            "container credentials at http://169.254.170.2/v2/credentials/task-uuid");
}

TEST_F(CredentialsTest, ContainerFullUriMustBeHttpsOrALocalAgent) {
  for (absl::string_view ok :
       {"https://creds.example.com/x", "http://localhost:8080/x", "http://127.0.0.2/x",
        "http://[::1]:9/x", "http://169.254.170.23/v1/credentials",
        "http://[fd00:ec2::23]/v1/credentials"}) {
    env_["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = std::string(ok);
    auto provider = Chain();
    EXPECT_TRUE(provider.ok()) << ok << ": " << provider.status();
  }
  for (absl::string_view bad :
       {"http://creds.example.com/x", "http://10.0.0.1/x", "http://169.254.169.254/x",
        "ftp://localhost/x", "http://user@localhost/x"}) {
    env_["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = std::string(bad);
    auto provider = Chain();
    EXPECT_EQ(provider.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// ---------------------------------------------------------------------------------------------
// STS: web identity and assume role

TEST_F(CredentialsTest, WebIdentityFromTheEnvironmentCallsStsUnsigned) {
  const absl::Time expiration = absl::FromUnixSeconds(absl::ToUnixSeconds(absl::Now()) + 3600);
  StandIn sts([&](const Request& r) -> Reply {
    const auto form = r.Form();
    if (r.method != "POST" || form.count("Action") == 0) return {400, "bad request"};
    if (form.at("WebIdentityToken") != kWebToken) {
      return {400, StsErrorXml("InvalidIdentityToken", "token rejected")};
    }
    return {200, StsXml("AssumeRoleWithWebIdentity", "ASIAWEBIDENTITY", expiration)};
  });
  env_["AWS_WEB_IDENTITY_TOKEN_FILE"] = Write("token", kWebToken);
  env_["AWS_ROLE_ARN"] = "arn:aws:iam::123456789012:role/eks-pod";
  env_["AWS_ROLE_SESSION_NAME"] = "pod-session";
  env_["AWS_ENDPOINT_URL_STS"] = sts.Url();
  env_["AWS_ENDPOINT_URL"] = "http://127.0.0.1:1";  // the STS-specific one wins
  // Web identity comes before the shared files' keys.
  WriteCredentials("[default]\naws_access_key_id = AKIAFILE\naws_secret_access_key = x\n");

  auto provider = Chain();
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_EQ((*provider)->Describe(),
            absl::StrCat("web identity token ", dir_,
                         "/token for role arn:aws:iam::123456789012:role/eks-pod via STS at ",
                         sts.Url()));
  absl::StatusOr<Credentials> credentials = Fetch(**provider);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->access_key_id, "ASIAWEBIDENTITY");
  EXPECT_EQ(credentials->secret_access_key, kSecret);
  EXPECT_EQ(credentials->session_token, kToken);
  EXPECT_EQ(credentials->expiration, expiration);

  ASSERT_EQ(sts.requests().size(), 1u);
  const Request request = sts.requests()[0];
  EXPECT_EQ(request.path, "/");
  EXPECT_FALSE(request.HasHeader("authorization"));
  EXPECT_THAT(request.Header("content-type"), StartsWith("application/x-www-form-urlencoded"));
  const auto form = request.Form();
  EXPECT_EQ(form.at("Action"), "AssumeRoleWithWebIdentity");
  EXPECT_EQ(form.at("Version"), "2011-06-15");
  EXPECT_EQ(form.at("RoleArn"), "arn:aws:iam::123456789012:role/eks-pod");
  EXPECT_EQ(form.at("RoleSessionName"), "pod-session");

  // The token file is read at every fetch (EKS rotates it); a rejected one is reported.
  Write("token", "rotated-but-wrong");
  credentials = Fetch(**provider);
  EXPECT_EQ(credentials.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(credentials.status().message(),
              HasSubstr("AssumeRoleWithWebIdentity answered 400: InvalidIdentityToken: "
                        "token rejected [request id req-err]"));
}

TEST_F(CredentialsTest, WebIdentityFromAProfile) {
  StandIn sts([&](const Request&) {
    return Reply{200,
                 StsXml("AssumeRoleWithWebIdentity", "ASIAPROFILE", absl::Now() + absl::Hours(1))};
  });
  const std::string token = Write("profile-token", kWebToken);
  WriteConfig(absl::StrCat(
      "[profile eks]\nrole_arn = arn:aws:iam::1:role/from-profile\n",
      "web_identity_token_file = ", token, "\n",
      "services = local\n[services local]\nsts =\n  endpoint_url = ", sts.Url(), "\n"));
  auto provider = Chain("eks");
  ASSERT_TRUE(provider.ok()) << provider.status();
  absl::StatusOr<Credentials> credentials = Fetch(**provider);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->access_key_id, "ASIAPROFILE");
  const auto form = sts.requests().at(0).Form();
  EXPECT_EQ(form.at("RoleArn"), "arn:aws:iam::1:role/from-profile");
  EXPECT_THAT(form.at("RoleSessionName"), StartsWith("wharf-"));

  // Without a role to assume, the token alone is a configuration error.
  env_["AWS_WEB_IDENTITY_TOKEN_FILE"] = token;
  auto missing_role = Chain();
  EXPECT_EQ(missing_role.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing_role.status().message(), HasSubstr("AWS_ROLE_ARN"));
}

// Checks that `request` carries a valid SigV4 signature for service "sts" by `credentials`.
void ExpectSignedForSts(const Request& request, const Credentials& credentials,
                        absl::string_view region, int port) {
  absl::Time when;
  std::string error;
  ASSERT_TRUE(absl::ParseTime("%E4Y%m%dT%H%M%SZ", request.Header("x-amz-date"), &when, &error))
      << request.Header("x-amz-date");
  SigningRequest expected;
  expected.method = request.method;
  expected.host = absl::StrCat("127.0.0.1:", port);
  expected.path = request.path;
  expected.headers = {{"content-type", request.Header("content-type")}};
  expected.payload_sha256 = Sha256Hex(request.body);
  absl::StatusOr<SignedRequest> signed_request = SignV4(expected, credentials, region, "sts", when);
  ASSERT_TRUE(signed_request.ok()) << signed_request.status();
  EXPECT_THAT(request.Header("authorization"),
              StartsWith(absl::StrCat("AWS4-HMAC-SHA256 Credential=", credentials.access_key_id,
                                      "/", absl::FormatTime("%Y%m%d", when, absl::UTCTimeZone()),
                                      "/", region, "/sts/aws4_request")));
  EXPECT_EQ(request.Header("authorization"), signed_request->authorization);
  EXPECT_EQ(request.Header("x-amz-security-token"), credentials.session_token);
}

TEST_F(CredentialsTest, AssumeRoleIsSignedWithTheSourceProfile) {
  const absl::Time expiration = absl::FromUnixSeconds(absl::ToUnixSeconds(absl::Now()) + 900);
  StandIn sts([&](const Request& r) -> Reply {
    if (r.Form()["Action"] != "AssumeRole") return {400, StsErrorXml("InvalidAction", "no")};
    return {200, StsXml("AssumeRole", "ASIAASSUMED", expiration)};
  });
  WriteCredentials(absl::StrCat(
      "[base]\naws_access_key_id = AKIABASE\naws_secret_access_key = ", kSecret, "\n"));
  WriteConfig(absl::StrCat("[profile dev]\nrole_arn = arn:aws:iam::1:role/dev\n",
                           "source_profile = base\nexternal_id = ext-42\n",
                           "duration_seconds = 900\nrole_session_name = me\n"
                           "endpoint_url = ",
                           sts.Url(), "\n"));
  auto provider = Chain("dev");
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_EQ((*provider)->Describe(),
            absl::StrCat("role arn:aws:iam::1:role/dev via STS at ", sts.Url(),
                         " with profile 'base' in ", credentials_path()));
  absl::StatusOr<Credentials> credentials = Fetch(**provider);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->access_key_id, "ASIAASSUMED");
  EXPECT_EQ(credentials->session_token, kToken);
  EXPECT_EQ(credentials->expiration, expiration);

  ASSERT_EQ(sts.requests().size(), 1u);
  const Request request = sts.requests()[0];
  const auto form = request.Form();
  EXPECT_EQ(form.at("Action"), "AssumeRole");
  EXPECT_EQ(form.at("Version"), "2011-06-15");
  EXPECT_EQ(form.at("RoleArn"), "arn:aws:iam::1:role/dev");
  EXPECT_EQ(form.at("RoleSessionName"), "me");
  EXPECT_EQ(form.at("ExternalId"), "ext-42");
  EXPECT_EQ(form.at("DurationSeconds"), "900");
  Credentials base;
  base.access_key_id = "AKIABASE";
  base.secret_access_key = kSecret;
  ExpectSignedForSts(request, base, "us-west-2", sts.port());
}

TEST_F(CredentialsTest, AssumeRoleChainsThroughRolesToACredentialProcess) {
  // a -> (role A) source b -> (role B) source c -> credential_process.
  StandIn sts([&](const Request& r) -> Reply {
    const std::string arn = r.Form()["RoleArn"];
    return {200, StsXml("AssumeRole", arn == "arn:aws:iam::1:role/B" ? "ASIAROLEB" : "ASIAROLEA",
                        absl::Now() + absl::Hours(1))};
  });
  const std::string script =
      Write("process.sh",
            absl::StrCat("#!/bin/sh\necho '{\"Version\": 1, \"AccessKeyId\": \"AKIAPROCESS\", "
                         "\"SecretAccessKey\": \"",
                         kSecret, "\"}'\n"),
            /*executable=*/true);
  env_["AWS_ENDPOINT_URL_STS"] = sts.Url();
  WriteConfig(absl::StrCat("[profile a]\nrole_arn = arn:aws:iam::1:role/A\nsource_profile = b\n",
                           "[profile b]\nrole_arn = arn:aws:iam::1:role/B\nsource_profile = c\n",
                           "[profile c]\ncredential_process = ", script, "\n"));
  auto provider = Chain("a");
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_THAT((*provider)->Describe(),
              HasSubstr(absl::StrCat("with credential_process of profile 'c' in ", config_path())));
  absl::StatusOr<Credentials> credentials = Fetch(**provider);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->access_key_id, "ASIAROLEA");

  const std::vector<Request> requests = sts.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].Form()["RoleArn"], "arn:aws:iam::1:role/B");
  Credentials process;
  process.access_key_id = "AKIAPROCESS";
  process.secret_access_key = kSecret;
  ExpectSignedForSts(requests[0], process, "us-west-2", sts.port());
  EXPECT_EQ(requests[1].Form()["RoleArn"], "arn:aws:iam::1:role/A");
  Credentials role_b;
  role_b.access_key_id = "ASIAROLEB";
  role_b.secret_access_key = kSecret;
  role_b.session_token = kToken;
  ExpectSignedForSts(requests[1], role_b, "us-west-2", sts.port());
}

TEST_F(CredentialsTest, AssumeRoleErrors) {
  WriteConfig(
      "[profile loop1]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = loop2\n"
      "[profile loop2]\nrole_arn = arn:aws:iam::1:role/y\nsource_profile = loop1\n"
      "[profile orphan]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = nowhere\n"
      "[profile empty-source]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = bare\n"
      "[profile bare]\nregion = us-east-1\n"
      "[profile mfa]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = bare\n"
      "mfa_serial = arn:aws:iam::1:mfa/me\n"
      "[profile bad-source]\nrole_arn = arn:aws:iam::1:role/x\ncredential_source = Moon\n"
      "[profile no-source]\nrole_arn = arn:aws:iam::1:role/x\n"
      "[profile self]\nrole_arn = arn:aws:iam::1:role/self\nsource_profile = self\n"
      "aws_access_key_id = AKIASELF\naws_secret_access_key = s\n"
      "[profile env-source]\nrole_arn = arn:aws:iam::1:role/x\ncredential_source = Environment\n");
  EXPECT_THAT(Chain("loop1").status().message(), HasSubstr("cycle"));
  EXPECT_EQ(Chain("orphan").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Chain("empty-source").status().message(), HasSubstr("has no credentials"));
  EXPECT_EQ(Chain("mfa").status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Chain("bad-source").status().message(),
              HasSubstr("must be Environment, Ec2InstanceMetadata or EcsContainer"));
  EXPECT_THAT(Chain("no-source").status().message(), HasSubstr("nothing to assume the role"));
  // A profile naming itself as the source uses its own keys.
  auto self = Chain("self");
  ASSERT_TRUE(self.ok()) << self.status();
  EXPECT_THAT((*self)->Describe(), HasSubstr("with profile 'self' in "));
  // credential_source = Environment needs the variables.
  EXPECT_EQ(Chain("env-source").status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// credential_process

TEST_F(CredentialsTest, CredentialProcessFromAProfile) {
  const std::string expiration = Rfc3339(absl::FromUnixSeconds(2000000000));
  const std::string script =
      Write("creds.sh",
            absl::StrCat("#!/bin/sh\n"
                         "echo 'progress goes to stderr' >&2\n"
                         "cat <<EOF\n{\"Version\": 1, \"AccessKeyId\": \"AKIAPROC\",\n"
                         " \"SecretAccessKey\": \"",
                         kSecret, "\", \"SessionToken\": \"", kToken, "\",\n \"Expiration\": \"",
                         expiration, "\"}\nEOF\n"),
            /*executable=*/true);
  // Arguments are split by the shell, quotes included.
  WriteConfig(absl::StrCat("[profile proc]\ncredential_process = ", script,
                           " --flag 'an argument with spaces'\n"));
  auto provider = Chain("proc");
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_EQ((*provider)->Describe(),
            absl::StrCat("credential_process of profile 'proc' in ", config_path()));
  absl::StatusOr<Credentials> credentials = Fetch(**provider);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->access_key_id, "AKIAPROC");
  EXPECT_EQ(credentials->secret_access_key, kSecret);
  EXPECT_EQ(credentials->session_token, kToken);
  EXPECT_EQ(credentials->expiration, absl::FromUnixSeconds(2000000000));
}

TEST_F(CredentialsTest, CredentialProcessFailures) {
  {
    ProcessCredentialsProvider provider("echo 'token expired, run sso login' >&2; exit 3", "test");
    absl::StatusOr<Credentials> credentials = Fetch(provider);
    EXPECT_EQ(credentials.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(credentials.status().message(),
                HasSubstr("exited with status 3: token expired, run sso login"));
  }
  {
    ProcessCredentialsProvider provider("sleep 10", "test", absl::Milliseconds(200));
    const absl::Time start = absl::Now();
    EXPECT_EQ(Fetch(provider).status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  }
  struct Case {
    std::string json, message;
  };
  for (const Case& c : std::vector<Case>{
           {"not json", "not a JSON object"},
           {"{\"Version\": 2, \"AccessKeyId\": \"a\", \"SecretAccessKey\": \"b\"}",
            "\"Version\": 1"},
           {absl::StrCat("{\"Version\": 1, \"SecretAccessKey\": \"", kSecret, "\"}"),
            "no AccessKeyId"},
           {"{\"Version\": 1, \"AccessKeyId\": \"a\", \"SecretAccessKey\": \"b\", "
            "\"Expiration\": \"tomorrow\"}",
            "Expiration 'tomorrow'"},
       }) {
    absl::StatusOr<Credentials> parsed = ParseProcessCredentials(c.json);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.message)) << c.json;
    ExpectNoSecrets(parsed.status().message());
  }
  // Without Expiration the credentials never expire; fractional seconds and offsets parse.
  absl::StatusOr<Credentials> parsed = ParseProcessCredentials(
      "{\"Version\": 1, \"AccessKeyId\": \"a\", \"SecretAccessKey\": \"b\"}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->expiration, absl::InfiniteFuture());
  parsed = ParseProcessCredentials(
      "{\"Version\": 1, \"AccessKeyId\": \"a\", \"SecretAccessKey\": \"b\", "
      "\"Expiration\": \"2033-05-18T05:33:20.500+02:00\"}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->expiration, absl::FromUnixSeconds(2000000000) + absl::Milliseconds(500));
}

// ---------------------------------------------------------------------------------------------
// The chain's order

TEST_F(CredentialsTest, ChainFollowsBotocoresOrder) {
  // Every source configured at once; each step removes the winner and looks at the next.
  StandIn unused([](const Request&) { return Reply{500, ""}; });
  const std::string token = Write("web-token", kWebToken);
  const std::string process = Write("p.sh", "#!/bin/sh\nexit 1\n", /*executable=*/true);
  env_["AWS_ACCESS_KEY_ID"] = "AKIAENV";
  env_["AWS_SECRET_ACCESS_KEY"] = kSecret;
  env_["AWS_ENDPOINT_URL_STS"] = unused.Url();
  env_["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = unused.Url() + "/container";
  env_["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = unused.Url();
  WriteCredentials(absl::StrCat(
      "[default]\naws_access_key_id = AKIACREDFILE\naws_secret_access_key = ", kSecret, "\n",
      "[base]\naws_access_key_id = AKIABASE\naws_secret_access_key = ", kSecret, "\n"));
  const std::string config_text =
      absl::StrCat("[default]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = base\n",
                   "web_identity_token_file = ", token, "\n", "credential_process = ", process,
                   "\n", "aws_access_key_id = AKIACONFIG\naws_secret_access_key = ", kSecret, "\n");
  WriteConfig(config_text);

  const auto describe = [&] {
    auto provider = Chain();
    EXPECT_TRUE(provider.ok()) << provider.status();
    return provider.ok() ? (*provider)->Describe() : provider.status().ToString();
  };
  EXPECT_EQ(describe(), "environment (AWS_ACCESS_KEY_ID)");
  env_.erase("AWS_ACCESS_KEY_ID");
  env_.erase("AWS_SECRET_ACCESS_KEY");
  // role_arn with web_identity_token_file in the profile: web identity for that role.
  EXPECT_THAT(describe(), StartsWith("web identity token "));
  WriteConfig(absl::StrReplaceAll(config_text, {{"web_identity_token_file", "unused_key"}}));
  EXPECT_THAT(describe(), StartsWith("role arn:aws:iam::1:role/r via STS at "));
  // Without a source, role_arn leaves the role to web identity from the environment.
  WriteConfig(absl::StrReplaceAll(config_text, {{"web_identity_token_file", "unused_key"},
                                                {"source_profile", "unused_source"}}));
  env_["AWS_WEB_IDENTITY_TOKEN_FILE"] = token;
  EXPECT_THAT(describe(), StartsWith("web identity token "));
  env_.erase("AWS_WEB_IDENTITY_TOKEN_FILE");
  WriteConfig(absl::StrReplaceAll(
      config_text, {{"web_identity_token_file", "unused_key"}, {"role_arn", "unused_role"}}));
  EXPECT_EQ(describe(), absl::StrCat("profile 'default' in ", credentials_path()));
  WriteCredentials("[base]\n");
  EXPECT_EQ(describe(), absl::StrCat("credential_process of profile 'default' in ", config_path()));
  WriteConfig(absl::StrReplaceAll(config_text, {{"web_identity_token_file", "unused_key"},
                                                {"role_arn", "unused_role"},
                                                {"credential_process", "unused_process"}}));
  EXPECT_EQ(describe(), absl::StrCat("profile 'default' in ", config_path()));
  WriteConfig("[default]\nregion = us-east-1\n");
  EXPECT_EQ(describe(), absl::StrCat("container credentials at ", unused.Url(), "/container"));
  env_.erase("AWS_CONTAINER_CREDENTIALS_FULL_URI");
  EXPECT_EQ(describe(), absl::StrCat("IMDS at ", unused.Url()));
  // Choosing never fetched anything.
  EXPECT_TRUE(unused.requests().empty());
}

TEST_F(CredentialsTest, SsoAndIncompleteRolesStopTheChainBeforeTheMachinesRole) {
  env_["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = "http://127.0.0.1:1/container";
  WriteConfig("[default]\nsso_session = corp\n");
  EXPECT_EQ(Chain().status().code(), absl::StatusCode::kUnimplemented);
  WriteConfig("[default]\nrole_arn = arn:aws:iam::1:role/r\n");
  EXPECT_EQ(Chain().status().code(), absl::StatusCode::kInvalidArgument);
  // Static keys beat an SSO setting, as before.
  WriteConfig("[default]\nsso_session = corp\naws_access_key_id = A\naws_secret_access_key = B\n");
  ASSERT_TRUE(Chain().ok());
}

// ---------------------------------------------------------------------------------------------
// The cache refreshes before expiry

TEST_F(CredentialsTest, CacheRefetchesCredentialsThatExpireSoonBeforeTheyExpire) {
  // The container endpoint hands out credentials that expire in 2 minutes, then fresh ones.
  std::atomic<int> served{0};
  StandIn agent([&](const Request&) -> Reply {
    const int n = ++served;
    const absl::Time expiration = absl::Now() + (n == 1 ? absl::Minutes(2) : absl::Hours(1));
    return {200, JsonCredentials(absl::StrCat("ASIAGEN", n), expiration)};
  });
  env_["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = agent.Url() + "/creds";
  auto provider = Chain();
  ASSERT_TRUE(provider.ok()) << provider.status();
  ThreadPool pool(2);
  CredentialsCacheOptions cache_options;
  cache_options.refresh_before = absl::Minutes(5);
  struct Forward : CredentialsProvider {
    explicit Forward(std::shared_ptr<CredentialsProvider> p) : p(std::move(p)) {}
    absl::StatusOr<Credentials> Fetch() override { return p->Fetch(); }
    std::string Describe() const override { return p->Describe(); }
    std::shared_ptr<CredentialsProvider> p;
  };
  CredentialsCache cache(std::make_unique<Forward>(*provider), &pool, cache_options);
  EXPECT_EQ(cache.Describe(), absl::StrCat("container credentials at ", agent.Url(), "/creds"));

  absl::StatusOr<Credentials> first = cache.Get();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->access_key_id, "ASIAGEN1");
  // Still valid, so handed out at once, but within refresh_before: a background refresh.
  absl::StatusOr<Credentials> second = cache.Get();
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->access_key_id, "ASIAGEN1");
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (cache.fetches() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(cache.fetches(), 2);
  absl::StatusOr<Credentials> third = cache.Get();
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->access_key_id, "ASIAGEN2");
  // Fresh for an hour: no more fetches.
  EXPECT_EQ(cache.Get()->access_key_id, "ASIAGEN2");
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(cache.fetches(), 2);
  EXPECT_EQ(served.load(), 2);

  // Invalidate (what a store does on ExpiredToken) makes the next caller wait for a fetch.
  cache.Invalidate();
  EXPECT_EQ(cache.Get()->access_key_id, "ASIAGEN3");
}

TEST_F(CredentialsTest, CacheErrorsNameTheSource) {
  env_["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = absl::StrCat("http://127.0.0.1:", ClosedPort());
  auto provider = Chain();
  ASSERT_TRUE(provider.ok()) << provider.status();
  const std::string source = (*provider)->Describe();
  ThreadPool pool(1);
  struct Forward : CredentialsProvider {
    explicit Forward(std::shared_ptr<CredentialsProvider> p) : p(std::move(p)) {}
    absl::StatusOr<Credentials> Fetch() override { return p->Fetch(); }
    std::string Describe() const override { return p->Describe(); }
    std::shared_ptr<CredentialsProvider> p;
  };
  CredentialsCache cache(std::make_unique<Forward>(*provider), &pool);
  absl::StatusOr<Credentials> credentials = cache.Get();
  EXPECT_FALSE(credentials.ok());
  EXPECT_THAT(std::string(credentials.status().message()),
              StartsWith("credentials from IMDS at http://127.0.0.1:"));
  EXPECT_THAT(credentials.status().message(), HasSubstr(source));
}

}  // namespace
}  // namespace wharf::s3
