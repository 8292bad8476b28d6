#include "store/s3/aws_credentials.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file_io.h"
#include "base/hash.h"
#include "base/interrupt.h"
#include "base/runtime.h"
#include "base/status.h"
#include "http/curl_transport.h"
#include "nlohmann/json.hpp"
#include "pugixml.hpp"
#include "store/s3/sigv4.h"

extern char** environ;

namespace wharf::s3 {
namespace {

std::optional<std::string> NonEmpty(std::optional<std::string> value) {
  if (value.has_value() && value->empty()) return std::nullopt;
  return value;
}

// A file's content with surrounding whitespace trimmed (token files end in a newline or not).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view what) {
  WHARF_ASSIGN_OR_RETURN(
      const std::string content,
      ReadFileToString(path, absl::StrCat("reading ", what, " ", path), uint64_t{1} << 20));
  std::string token(absl::StripAsciiWhitespace(content));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is empty"));
  }
  return token;
}

bool HasLineBreakOrNul(absl::string_view s) {
  return s.find_first_of(absl::string_view("\r\n\0", 3)) != absl::string_view::npos;
}

// ---------------------------------------------------------------------------------------------
// HTTP: blocking exchanges (providers run on the blocking pool, never on an event loop).

std::shared_ptr<HttpTransport> TransportFor(const AwsCredentialsOptions& options) {
  if (options.transport != nullptr) return options.transport;
  return SharedCurlTransport(options.ca_bundle);  // the S3 stores' transport for this bundle
}

// Sends the request `make` builds, up to `attempts` times: transport failures (Unavailable),
// 429 and 5xx are retried after a short pause. Returns the last response or failure.
absl::StatusOr<HttpResponse> SendWithRetries(const AwsCredentialsOptions& options, int attempts,
                                             const std::function<HttpRequest()>& make) {
  return SendBlockingWithRetries(*TransportFor(options), attempts, make);
}

absl::StatusCode CodeForHttpStatus(int status) {
  if (IsRetryableHttpStatus(status)) return absl::StatusCode::kUnavailable;
  if (status == 401) return absl::StatusCode::kUnauthenticated;
  if (status == 403) return absl::StatusCode::kPermissionDenied;
  if (status == 404) return absl::StatusCode::kNotFound;
  return absl::StatusCode::kFailedPrecondition;
}

// "GET /path answered 404: <body>" with `hint` appended in parentheses.
absl::Status HttpError(const HttpResponse& response, absl::string_view step,
                       absl::string_view hint = "") {
  std::string message = absl::StrCat(step, " answered ", response.status);
  // These endpoints' error bodies explain, and never carry credentials.
  const std::string snippet = Snippet(response.body);
  if (!snippet.empty()) absl::StrAppend(&message, ": ", snippet);
  if (!hint.empty()) absl::StrAppend(&message, " (", hint, ")");
  return absl::Status(CodeForHttpStatus(response.status), message);
}

// ---------------------------------------------------------------------------------------------
// Credential documents

absl::StatusOr<absl::Time> ParseExpiration(const std::string& text, absl::string_view where) {
  absl::Time t;
  std::string error;
  if (absl::ParseTime(absl::RFC3339_full, text, &t, &error)) return t;
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": Expiration '", text, "' is not an RFC 3339 time"));
}

// The JSON documents of IMDS, the container endpoint and credential_process differ only in
// the session token's name (Token / SessionToken).
absl::StatusOr<Credentials> ParseJsonCredentials(absl::string_view text,
                                                 absl::string_view token_field,
                                                 absl::string_view where) {
  const nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), nullptr,
                                                   /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the answer is not a JSON object"));
  }
  const auto string_field = [&](absl::string_view name) -> std::optional<std::string> {
    auto it = doc.find(std::string(name));
    if (it == doc.end() || !it->is_string()) return std::nullopt;
    return NonEmpty(it->get<std::string>());
  };
  Credentials credentials;
  std::optional<std::string> id = string_field("AccessKeyId");
  std::optional<std::string> secret = string_field("SecretAccessKey");
  if (!id.has_value() || !secret.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": the answer has no ", !id.has_value() ? "AccessKeyId" : "SecretAccessKey"));
  }
  credentials.access_key_id = *std::move(id);
  credentials.secret_access_key = *std::move(secret);
  credentials.session_token = string_field(token_field).value_or("");
  if (std::optional<std::string> expiration = string_field("Expiration")) {
    WHARF_ASSIGN_OR_RETURN(credentials.expiration, ParseExpiration(*expiration, where));
  }
  return credentials;
}

// ---------------------------------------------------------------------------------------------
// credential_process

struct ProcessResult {
  int wait_status = 0;
  std::string out;
  std::string err;  // the last few KiB
};

constexpr size_t kMaxProcessOutput = size_t{1} << 20;
constexpr size_t kMaxProcessStderr = 4096;

// Sends `sig` to `pid` and every process below it (by their parents in /proc), the deepest
// first: `sh -c` runs the command as a child of its own.
void SignalTree(pid_t pid, int sig) {
  std::vector<std::pair<pid_t, pid_t>> parents;  // (process, parent)
  if (DIR* proc = opendir("/proc")) {
    while (dirent* e = readdir(proc)) {
      pid_t p = 0;
      if (!absl::SimpleAtoi(e->d_name, &p)) continue;
      std::string stat;
      if (!ReadFile(absl::StrCat("/proc/", p, "/stat"), &stat)) continue;
      // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
      const size_t close = stat.rfind(')');
      if (close == std::string::npos) continue;
      std::vector<absl::string_view> fields =
          absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ', absl::SkipEmpty());
      pid_t parent = 0;
      if (fields.size() > 1 && absl::SimpleAtoi(fields[1], &parent)) parents.push_back({p, parent});
    }
    closedir(proc);
  }
  std::vector<pid_t> tree = {pid};
  for (size_t i = 0; i < tree.size(); ++i) {
    for (const auto& [p, parent] : parents) {
      if (parent == tree[i]) tree.push_back(p);
    }
  }
  for (auto it = tree.rbegin(); it != tree.rend(); ++it) kill(*it, sig);
}

absl::StatusOr<ProcessResult> RunShell(const std::string& command, absl::Duration timeout) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "creating a pipe");
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    close(out_pipe[0]);
    close(out_pipe[1]);
    return ErrnoToStatus(err, "creating a pipe");
  }
  // posix_spawn, not fork: safe in a multithreaded process. dup2 clears O_CLOEXEC on the
  // child's 1 and 2; every other descriptor of ours stays closed in the child.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  // The child starts with no signal blocked: the CLI blocks SIGINT/SIGTERM/SIGHUP in all its
  // threads for its handler (base/interrupt.h), and a spawned mask would be inherited.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
  pid_t pid = 0;
  const int spawn_error =
      posix_spawn(&pid, "/bin/sh", &actions, &attr, const_cast<char* const*>(argv), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (spawn_error != 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    return ErrnoToStatus(spawn_error, "starting /bin/sh");
  }

  // SIGTERM (or SIGHUP) of the CLI while the command runs ends the command too (it survived
  // the CLI's exit); a terminal's Ctrl-C reaches it directly, as it shares the CLI's process
  // group (a group of its own could not prompt on the terminal: MFA).
  InterruptCleanup end_command([pid] { SignalTree(pid, SIGTERM); });

  ProcessResult result;
  const absl::Time deadline = absl::Now() + timeout;
  bool timed_out = false, too_long = false;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  char buffer[8192];
  while (open_fds > 0) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      timed_out = true;
      break;
    }
    const int ready = poll(
        fds, 2, static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
        continue;
      }
      std::string& sink = i == 0 ? result.out : result.err;
      sink.append(buffer, static_cast<size_t>(n));
      if (i == 1 && sink.size() > 2 * kMaxProcessStderr) {
        sink.erase(0, sink.size() - kMaxProcessStderr);
      }
      if (i == 0 && sink.size() > kMaxProcessOutput) too_long = true;
    }
    if (too_long) break;
  }
  for (pollfd& fd : fds) {
    if (fd.fd >= 0) close(fd.fd);
  }
  if (timed_out || too_long) SignalTree(pid, SIGKILL);
  end_command.Reset();  // before the wait reaps it: the id may be reused after
  while (waitpid(pid, &result.wait_status, 0) < 0) {
    if (errno != EINTR) return ErrnoToStatus(errno, "waiting for the command");
  }
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat("the command did not finish within ", absl::FormatDuration(timeout)));
  }
  if (too_long) {
    return absl::InvalidArgumentError("the command printed more than 1 MiB");
  }
  if (result.err.size() > kMaxProcessStderr) {
    result.err.erase(0, result.err.size() - kMaxProcessStderr);
  }
  return result;
}

// ---------------------------------------------------------------------------------------------
// STS

constexpr absl::string_view kStsVersion = "2011-06-15";
constexpr absl::string_view kFormContentType = "application/x-www-form-urlencoded; charset=utf-8";

std::string FormEncode(const std::vector<std::pair<std::string, std::string>>& params) {
  std::vector<std::string> parts;
  for (const auto& [name, value] : params) {
    parts.push_back(absl::StrCat(UriEncode(name, true), "=", UriEncode(value, true)));
  }
  return absl::StrJoin(parts, "&");
}

// The Host header curl sends for "scheme://authority": the authority without a default port.
std::string HostHeader(absl::string_view endpoint) {
  const size_t sep = endpoint.find("://");
  const absl::string_view scheme = endpoint.substr(0, sep);
  std::string authority(endpoint.substr(sep + 3));
  if (scheme == "http" && absl::EndsWith(authority, ":80")) authority.resize(authority.size() - 3);
  if (scheme == "https" && absl::EndsWith(authority, ":443")) {
    authority.resize(authority.size() - 4);
  }
  return authority;
}

std::string SessionName(const AssumeRoleParams& role) {
  if (!role.session_name.empty()) return role.session_name;
  return absl::StrCat("wharf-", absl::ToUnixSeconds(absl::Now()));
}

absl::Status StsError(const HttpResponse& response, absl::string_view action) {
  pugi::xml_document doc;
  std::string code, message, request_id;
  if (!response.body.empty() && doc.load_buffer(response.body.data(), response.body.size())) {
    pugi::xml_node error = doc.child("ErrorResponse").child("Error");
    if (!error) error = doc.child("Error");
    code = error.child_value("Code");
    message = error.child_value("Message");
    request_id = doc.child("ErrorResponse").child_value("RequestId");
  }
  if (code.empty()) return HttpError(response, action);
  absl::StatusCode status_code = CodeForHttpStatus(response.status);
  if (code == "InvalidIdentityToken" || code == "ExpiredTokenException" ||
      code == "IDPRejectedClaim" || code == "ExpiredToken" || code == "InvalidClientTokenId") {
    status_code = absl::StatusCode::kUnauthenticated;
  } else if (code == "AccessDenied") {
    status_code = absl::StatusCode::kPermissionDenied;
  }
  std::string text = absl::StrCat(action, " answered ", response.status, ": ", code);
  if (!message.empty()) absl::StrAppend(&text, ": ", message);
  if (!request_id.empty()) absl::StrAppend(&text, " [request id ", request_id, "]");
  return absl::Status(status_code, text);
}

absl::StatusOr<Credentials> ParseStsCredentials(const HttpResponse& response,
                                                absl::string_view action) {
  pugi::xml_document doc;
  const std::string response_name = absl::StrCat(action, "Response");
  const std::string result_name = absl::StrCat(action, "Result");
  pugi::xml_node credentials_node;
  if (doc.load_buffer(response.body.data(), response.body.size())) {
    credentials_node =
        doc.child(response_name.c_str()).child(result_name.c_str()).child("Credentials");
  }
  if (!credentials_node) {
    return absl::DataLossError(absl::StrCat(action, ": the answer has no ", action, "Response/",
                                            result_name, "/Credentials"));
  }
  Credentials credentials;
  credentials.access_key_id = credentials_node.child_value("AccessKeyId");
  credentials.secret_access_key = credentials_node.child_value("SecretAccessKey");
  credentials.session_token = credentials_node.child_value("SessionToken");
  if (credentials.access_key_id.empty() || credentials.secret_access_key.empty()) {
    return absl::DataLossError(
        absl::StrCat(action, ": the answer has no AccessKeyId or SecretAccessKey"));
  }
  const std::string expiration = credentials_node.child_value("Expiration");
  if (!expiration.empty()) {
    WHARF_ASSIGN_OR_RETURN(credentials.expiration, ParseExpiration(expiration, action));
  }
  return credentials;
}

// POSTs `params` (Action and Version first) to STS; signed with `signer` when given.
absl::StatusOr<Credentials> CallSts(absl::string_view action,
                                    std::vector<std::pair<std::string, std::string>> params,
                                    const std::string& endpoint, const Credentials* signer,
                                    const AwsCredentialsOptions& options) {
  params.insert(params.begin(),
                {{"Action", std::string(action)}, {"Version", std::string(kStsVersion)}});
  const std::string body = FormEncode(params);
  SigningRequest to_sign;
  to_sign.method = "POST";
  to_sign.host = HostHeader(endpoint);
  to_sign.path = "/";
  to_sign.headers = {{"content-type", std::string(kFormContentType)}};
  to_sign.payload_sha256 = Sha256Hex(body);
  if (signer != nullptr) {
    // What makes signing fail (a malformed key id or region) does not change between
    // attempts: check once, before anything is sent.
    absl::Status valid = SignV4(to_sign, *signer, options.region, "sts", absl::Now()).status();
    if (!valid.ok()) return Annotate(valid, absl::StrCat("signing ", action));
  }
  absl::StatusOr<HttpResponse> response =
      SendWithRetries(options, options.sts_attempts, [&]() -> HttpRequest {
        HttpRequest request;
        request.method = "POST";
        request.url = absl::StrCat(endpoint, "/");
        request.body = absl::Cord(body);
        request.timeout = options.sts_timeout;
        request.headers = to_sign.headers;
        if (signer != nullptr) {
          // Signed per attempt, so a retry carries a fresh x-amz-date.
          absl::StatusOr<SignedRequest> signed_request =
              SignV4(to_sign, *signer, options.region, "sts", absl::Now());
          request.url = absl::StrCat(endpoint, signed_request->canonical_target);
          request.headers = std::move(signed_request->headers);
        }
        return request;
      });
  if (!response.ok()) return Annotate(response.status(), action);
  if (response->status / 100 != 2) return StsError(*response, action);
  return ParseStsCredentials(*response, action);
}

// ---------------------------------------------------------------------------------------------
// The chain

// A value and where it came from.
struct Sourced {
  std::string value;
  std::string source;
};

std::optional<std::string> Value(const IniSection* section, absl::string_view key) {
  if (section == nullptr) return std::nullopt;
  auto it = section->values.find(std::string(key));
  if (it == section->values.end()) return std::nullopt;
  return NonEmpty(it->second);
}

// A key pair found in one source, with the names its fields have there (for messages).
struct CredentialCandidate {
  std::optional<std::string> id, secret, token;
  absl::string_view id_name, secret_name;
  std::string source;  // "environment (AWS_ACCESS_KEY_ID)", ...
};

// nullptr when the source has neither key; InvalidArgument when it has only one.
absl::StatusOr<std::shared_ptr<CredentialsProvider>> StaticFrom(CredentialCandidate c) {
  if (!c.id.has_value() && !c.secret.has_value()) return nullptr;
  if (!c.id.has_value() || !c.secret.has_value()) {
    const bool has_id = c.id.has_value();
    return absl::InvalidArgumentError(
        absl::StrCat(c.source, ": ", has_id ? c.id_name : c.secret_name, " is set but ",
                     has_id ? c.secret_name : c.id_name, " is missing; set both or neither"));
  }
  Credentials credentials;
  credentials.access_key_id = *std::move(c.id);
  credentials.secret_access_key = *std::move(c.secret);
  credentials.session_token = std::move(c.token).value_or("");
  return std::shared_ptr<CredentialsProvider>(
      std::make_shared<StaticCredentialsProvider>(std::move(credentials), std::move(c.source)));
}

// The profile keys of credential sources wharf does not implement.
constexpr absl::string_view kUnsupportedProviderKeys[] = {"sso_session", "sso_start_url"};

class ChainResolver {
 public:
  ChainResolver(const AwsSharedFile& credentials_file, const AwsSharedFile& config_file,
                AwsCredentialsOptions options)
      : credentials_file_(credentials_file),
        config_file_(config_file),
        options_(std::move(options)) {}

  absl::StatusOr<std::shared_ptr<CredentialsProvider>> Resolve(absl::string_view profile) {
    // 1. Environment (unless a profile was named explicitly).
    if (!options_.explicit_profile) {
      CredentialCandidate c;
      c.id = Env("AWS_ACCESS_KEY_ID");
      c.secret = Env("AWS_SECRET_ACCESS_KEY");
      c.token = Env("AWS_SESSION_TOKEN");
      c.id_name = "AWS_ACCESS_KEY_ID";
      c.secret_name = "AWS_SECRET_ACCESS_KEY";
      c.source = "environment (AWS_ACCESS_KEY_ID)";
      WHARF_ASSIGN_OR_RETURN(std::shared_ptr<CredentialsProvider> found, StaticFrom(std::move(c)));
      if (found != nullptr) return found;
    }
    // 2. Assume role with a source profile or credential source.
    const bool has_role = Get(profile, "role_arn").has_value();
    if (has_role && !Get(profile, "web_identity_token_file").has_value() &&
        (Get(profile, "source_profile").has_value() ||
         Get(profile, "credential_source").has_value())) {
      std::set<std::string> visiting = {std::string(profile)};
      return AssumeRoleOf(profile, visiting);
    }
    // 3. Web identity (the profile's settings first, then the environment's).
    {
      std::optional<Sourced> token_file = Get(profile, "web_identity_token_file");
      if (!token_file.has_value()) {
        if (std::optional<std::string> env = Env("AWS_WEB_IDENTITY_TOKEN_FILE")) {
          token_file = Sourced{*env, "AWS_WEB_IDENTITY_TOKEN_FILE"};
        }
      }
      if (token_file.has_value()) {
        AssumeRoleParams role;
        if (std::optional<Sourced> arn = Get(profile, "role_arn")) {
          role.role_arn = arn->value;
        } else if (std::optional<std::string> env = Env("AWS_ROLE_ARN")) {
          role.role_arn = *env;
        } else {
          return absl::InvalidArgumentError(absl::StrCat(
              "web identity token file from ", token_file->source,
              " is set but no role to assume: set AWS_ROLE_ARN or the profile's role_arn"));
        }
        if (std::optional<Sourced> name = Get(profile, "role_session_name")) {
          role.session_name = name->value;
        } else {
          role.session_name = Env("AWS_ROLE_SESSION_NAME").value_or("");
        }
        WHARF_ASSIGN_OR_RETURN(std::string sts, StsEndpoint(profile));
        return std::shared_ptr<CredentialsProvider>(
            std::make_shared<WebIdentityCredentialsProvider>(token_file->value, std::move(role),
                                                             std::move(sts), options_));
      }
    }
    // 4. Static keys in the credentials file.
    WHARF_ASSIGN_OR_RETURN(
        std::shared_ptr<CredentialsProvider> found,
        StaticFrom(FromSection(CredentialsSection(profile), profile, credentials_file_)));
    if (found != nullptr) return found;
    // 5. credential_process.
    if (std::optional<Sourced> process = Get(profile, "credential_process")) {
      return Process(*process);
    }
    // 6. Static keys in the config file.
    WHARF_ASSIGN_OR_RETURN(found,
                           StaticFrom(FromSection(ConfigSection(profile), profile, config_file_)));
    if (found != nullptr) return found;
    // A profile that says how to get credentials in a way wharf cannot follow is an error,
    // not a reason to use whatever role the machine has.
    for (absl::string_view key : kUnsupportedProviderKeys) {
      if (Get(profile, key).has_value()) {
        return absl::UnimplementedError(
            absl::StrCat("AWS profile '", profile, "' gets its credentials through ", key,
                         ", which wharf does not support; export static credentials instead, e.g. "
                         "eval \"$(aws configure export-credentials --profile ",
                         profile, " --format env)\""));
      }
    }
    if (has_role) {
      return absl::InvalidArgumentError(
          absl::StrCat("AWS profile '", profile, "' (", Get(profile, "role_arn")->source,
                       ") has role_arn but neither source_profile, credential_source nor "
                       "web_identity_token_file: nothing to assume the role with"));
    }
    // 7. Container credentials.
    WHARF_ASSIGN_OR_RETURN(found, Container());
    if (found != nullptr) return found;
    // 8. Instance metadata.
    WHARF_ASSIGN_OR_RETURN(found, Imds(profile, /*last_resort=*/true));
    if (found != nullptr) return found;
    return absl::UnauthenticatedError(
        "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
        "or ~/.aws/credentials");
  }

 private:
  std::optional<std::string> Env(absl::string_view name) const {
    return NonEmpty(options_.env(name));
  }

  const IniSection* CredentialsSection(absl::string_view profile) const {
    return FindIniSection(credentials_file_, profile);
  }
  const IniSection* ConfigSection(absl::string_view profile) const {
    return FindConfigProfile(config_file_, profile);
  }
  bool Exists(absl::string_view profile) const {
    return CredentialsSection(profile) != nullptr || ConfigSection(profile) != nullptr;
  }
  // The profile's setting, the credentials file's first (as the SDKs merge the two files).
  std::optional<Sourced> Get(absl::string_view profile, absl::string_view key) const {
    if (std::optional<std::string> v = Value(CredentialsSection(profile), key)) {
      return Sourced{*v, absl::StrCat("profile '", profile, "' in ", credentials_file_.path)};
    }
    if (std::optional<std::string> v = Value(ConfigSection(profile), key)) {
      return Sourced{*v, absl::StrCat("profile '", profile, "' in ", config_file_.path)};
    }
    return std::nullopt;
  }

  static CredentialCandidate FromSection(const IniSection* section, absl::string_view profile,
                                         const AwsSharedFile& file) {
    CredentialCandidate c;
    c.id = Value(section, "aws_access_key_id");
    c.secret = Value(section, "aws_secret_access_key");
    c.token = Value(section, "aws_session_token");
    c.id_name = "aws_access_key_id";
    c.secret_name = "aws_secret_access_key";
    c.source = absl::StrCat("profile '", profile, "' in ", file.path);
    return c;
  }

  // The profile's static keys (credentials file, then config file); nullptr when none.
  absl::StatusOr<std::shared_ptr<CredentialsProvider>> StaticOf(absl::string_view profile) {
    WHARF_ASSIGN_OR_RETURN(
        std::shared_ptr<CredentialsProvider> found,
        StaticFrom(FromSection(CredentialsSection(profile), profile, credentials_file_)));
    if (found != nullptr) return found;
    return StaticFrom(FromSection(ConfigSection(profile), profile, config_file_));
  }

  std::shared_ptr<CredentialsProvider> Process(const Sourced& process) {
    return std::make_shared<ProcessCredentialsProvider>(process.value, process.source,
                                                        options_.process_timeout);
  }

  // Reads the instance metadata timeout and attempts from the environment and the profile.
  absl::Status ApplyMetadataSettings(absl::string_view profile) {
    std::optional<Sourced> timeout = Get(profile, "metadata_service_timeout");
    if (std::optional<std::string> env = Env("AWS_METADATA_SERVICE_TIMEOUT")) {
      timeout = Sourced{*env, "AWS_METADATA_SERVICE_TIMEOUT"};
    }
    if (timeout.has_value()) {
      double seconds = 0;
      if (!absl::SimpleAtod(timeout->value, &seconds) || !(seconds > 0)) {
        return absl::InvalidArgumentError(absl::StrCat("metadata service timeout '", timeout->value,
                                                       "' (from ", timeout->source,
                                                       ") must be a positive number of seconds"));
      }
      options_.imds_timeout = absl::Seconds(seconds);
    }
    std::optional<Sourced> attempts = Get(profile, "metadata_service_num_attempts");
    if (std::optional<std::string> env = Env("AWS_METADATA_SERVICE_NUM_ATTEMPTS")) {
      attempts = Sourced{*env, "AWS_METADATA_SERVICE_NUM_ATTEMPTS"};
    }
    if (attempts.has_value()) {
      int n = 0;
      if (!absl::SimpleAtoi(attempts->value, &n) || n < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("metadata service attempts '", attempts->value, "' (from ",
                         attempts->source, ") must be a positive integer"));
      }
      options_.imds_attempts = n;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> StsEndpoint(absl::string_view profile) const {
    return ResolveStsEndpoint(config_file_, profile, options_);
  }

  // The provider for `profile`, which has role_arn. `visiting` holds the profiles whose role
  // is being resolved, `profile` included, to catch cycles.
  absl::StatusOr<std::shared_ptr<CredentialsProvider>> AssumeRoleOf(
      absl::string_view profile, std::set<std::string>& visiting) {
    const Sourced arn = *Get(profile, "role_arn");
    AssumeRoleParams role;
    role.role_arn = arn.value;
    if (std::optional<Sourced> name = Get(profile, "role_session_name")) {
      role.session_name = name->value;
    }
    if (std::optional<Sourced> external_id = Get(profile, "external_id")) {
      role.external_id = external_id->value;
    }
    if (std::optional<Sourced> duration = Get(profile, "duration_seconds")) {
      if (!absl::SimpleAtoi(duration->value, &role.duration_seconds) ||
          role.duration_seconds < 900) {
        return absl::InvalidArgumentError(absl::StrCat("duration_seconds '", duration->value, "' (",
                                                       duration->source,
                                                       ") must be an integer of at least 900"));
      }
    }
    WHARF_ASSIGN_OR_RETURN(std::string sts, StsEndpoint(profile));
    if (std::optional<Sourced> token_file = Get(profile, "web_identity_token_file")) {
      return std::shared_ptr<CredentialsProvider>(std::make_shared<WebIdentityCredentialsProvider>(
          token_file->value, std::move(role), std::move(sts), options_));
    }
    if (Get(profile, "mfa_serial").has_value()) {
      return absl::UnimplementedError(
          absl::StrCat("AWS profile '", profile,
                       "' assumes its role with mfa_serial, which needs an MFA "
                       "code wharf cannot prompt for; export temporary credentials instead, e.g. "
                       "eval \"$(aws configure export-credentials --profile ",
                       profile, " --format env)\""));
    }
    std::shared_ptr<CredentialsProvider> source;
    if (std::optional<Sourced> source_profile = Get(profile, "source_profile")) {
      WHARF_ASSIGN_OR_RETURN(source, SourceOf(source_profile->value, *source_profile, visiting));
    } else if (std::optional<Sourced> credential_source = Get(profile, "credential_source")) {
      WHARF_ASSIGN_OR_RETURN(source, CredentialSource(profile, *credential_source));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("AWS profile '", profile, "' (", arn.source,
                       ") has role_arn but neither source_profile nor credential_source"));
    }
    return std::shared_ptr<CredentialsProvider>(std::make_shared<AssumeRoleCredentialsProvider>(
        std::move(role), std::move(source), std::move(sts), options_));
  }

  // The credentials of a source_profile: its static keys (a profile may name itself to use
  // its own keys), else its own role, else its credential_process.
  absl::StatusOr<std::shared_ptr<CredentialsProvider>> SourceOf(const std::string& profile,
                                                                const Sourced& named_by,
                                                                std::set<std::string>& visiting) {
    if (!Exists(profile)) {
      return absl::FailedPreconditionError(  // a configuration to fix, not a missing object
          absl::StrCat("source_profile '", profile, "' (from ", named_by.source, ") not found in ",
                       credentials_file_.Describe(), " or ", config_file_.Describe()));
    }
    WHARF_ASSIGN_OR_RETURN(std::shared_ptr<CredentialsProvider> found, StaticOf(profile));
    if (found != nullptr) return found;
    if (Get(profile, "role_arn").has_value()) {
      if (!visiting.insert(profile).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("AWS profiles form a cycle through source_profile '", profile, "' (from ",
                         named_by.source, ")"));
      }
      return AssumeRoleOf(profile, visiting);
    }
    if (std::optional<Sourced> process = Get(profile, "credential_process")) {
      return Process(*process);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("source_profile '", profile, "' (from ", named_by.source,
                     ") has no credentials: no aws_access_key_id, role_arn or credential_process"));
  }

  absl::StatusOr<std::shared_ptr<CredentialsProvider>> CredentialSource(
      absl::string_view profile, const Sourced& credential_source) {
    const std::string& kind = credential_source.value;
    std::shared_ptr<CredentialsProvider> found;
    if (kind == "Environment") {
      CredentialCandidate c;
      c.id = Env("AWS_ACCESS_KEY_ID");
      c.secret = Env("AWS_SECRET_ACCESS_KEY");
      c.token = Env("AWS_SESSION_TOKEN");
      c.id_name = "AWS_ACCESS_KEY_ID";
      c.secret_name = "AWS_SECRET_ACCESS_KEY";
      c.source = "environment (AWS_ACCESS_KEY_ID)";
      WHARF_ASSIGN_OR_RETURN(found, StaticFrom(std::move(c)));
    } else if (kind == "Ec2InstanceMetadata") {
      WHARF_ASSIGN_OR_RETURN(found, Imds(profile, /*last_resort=*/false));
    } else if (kind == "EcsContainer") {
      WHARF_ASSIGN_OR_RETURN(found, Container());
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("credential_source '", kind, "' (", credential_source.source,
                       ") must be Environment, Ec2InstanceMetadata or EcsContainer"));
    }
    if (found == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "credential_source ", kind, " (", credential_source.source, ") is not available here: ",
          kind == "Environment"           ? "AWS_ACCESS_KEY_ID is not set"
          : kind == "Ec2InstanceMetadata" ? "AWS_EC2_METADATA_DISABLED is set"
                                          : "no AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or "
                                            "AWS_CONTAINER_CREDENTIALS_FULL_URI"));
    }
    return found;
  }

  // nullptr when neither container variable is set.
  absl::StatusOr<std::shared_ptr<CredentialsProvider>> Container() {
    std::string url;
    if (std::optional<std::string> relative = Env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")) {
      std::string base = options_.container_relative_host;
      while (absl::EndsWith(base, "/")) base.pop_back();
      url = absl::StrCat(base, absl::StartsWith(*relative, "/") ? "" : "/", *relative);
    } else if (std::optional<std::string> full = Env("AWS_CONTAINER_CREDENTIALS_FULL_URI")) {
      WHARF_RETURN_IF_ERROR(CheckContainerFullUri(*full));
      url = *full;
    } else {
      return nullptr;
    }
    std::string token = Env("AWS_CONTAINER_AUTHORIZATION_TOKEN").value_or("");
    if (HasLineBreakOrNul(token)) {
      return absl::InvalidArgumentError("AWS_CONTAINER_AUTHORIZATION_TOKEN contains a line break");
    }
    return std::shared_ptr<CredentialsProvider>(std::make_shared<ContainerCredentialsProvider>(
        std::move(url), std::move(token),
        Env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE").value_or(""), options_));
  }

  // A full URI must not send the container's token (or ask for credentials) over plain HTTP
  // to another machine: https, or http to a loopback address or the ECS / EKS Pod Identity
  // agents' link-local addresses, as botocore allows.
  static absl::Status CheckContainerFullUri(const std::string& uri) {
    const auto error = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("AWS_CONTAINER_CREDENTIALS_FULL_URI '", uri, "' ", why));
    };
    absl::string_view rest = uri;
    if (absl::StartsWithIgnoreCase(rest, "https://")) return absl::OkStatus();
    if (!absl::StartsWithIgnoreCase(rest, "http://")) {
      return error("must start with http:// or https://");
    }
    rest.remove_prefix(7);
    absl::string_view authority = rest.substr(0, rest.find_first_of("/?#"));
    if (absl::StrContains(authority, '@')) return error("must not contain a user name");
    std::string host;
    if (absl::StartsWith(authority, "[")) {
      host = std::string(authority.substr(1, authority.find(']') - 1));
    } else {
      host = std::string(authority.substr(0, authority.find(':')));
    }
    host = absl::AsciiStrToLower(host);
    in_addr v4;
    in6_addr v6;
    bool allowed = host == "localhost" || host == "169.254.170.2" || host == "169.254.170.23";
    if (!allowed && inet_pton(AF_INET, host.c_str(), &v4) == 1) {
      allowed = (ntohl(v4.s_addr) >> 24) == 127;
    }
    if (!allowed && inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
      in6_addr eks_agent;
      inet_pton(AF_INET6, "fd00:ec2::23", &eks_agent);
      allowed = IN6_IS_ADDR_LOOPBACK(&v6) || memcmp(&v6, &eks_agent, sizeof(v6)) == 0;
    }
    if (!allowed) {
      return error(
          "must use https, or http to a loopback address or the ECS / EKS container agent "
          "(169.254.170.2, 169.254.170.23, fd00:ec2::23)");
    }
    return absl::OkStatus();
  }

  // nullptr when instance metadata is disabled.
  absl::StatusOr<std::shared_ptr<CredentialsProvider>> Imds(absl::string_view profile,
                                                            bool last_resort) {
    if (absl::EqualsIgnoreCase(Env("AWS_EC2_METADATA_DISABLED").value_or(""), "true")) {
      return nullptr;
    }
    WHARF_RETURN_IF_ERROR(ApplyMetadataSettings(profile));
    std::string endpoint;
    if (std::optional<std::string> env = Env("AWS_EC2_METADATA_SERVICE_ENDPOINT")) {
      endpoint = *env;
    } else if (std::optional<Sourced> configured = Get(profile, "ec2_metadata_service_endpoint")) {
      endpoint = configured->value;
    } else {
      std::optional<std::string> mode = Env("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE");
      if (!mode.has_value()) {
        if (std::optional<Sourced> m = Get(profile, "ec2_metadata_service_endpoint_mode")) {
          mode = m->value;
        }
      }
      endpoint = absl::EqualsIgnoreCase(mode.value_or(""), "ipv6") ? "http://[fd00:ec2::254]"
                                                                   : "http://169.254.169.254";
    }
    if (!absl::StartsWithIgnoreCase(endpoint, "http://") &&
        !absl::StartsWithIgnoreCase(endpoint, "https://")) {
      return absl::InvalidArgumentError(absl::StrCat("instance metadata endpoint '", endpoint,
                                                     "' must start with http:// or https://"));
    }
    return std::shared_ptr<CredentialsProvider>(
        std::make_shared<ImdsCredentialsProvider>(std::move(endpoint), options_, last_resort));
  }

  const AwsSharedFile& credentials_file_;
  const AwsSharedFile& config_file_;
  AwsCredentialsOptions options_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// ProcessCredentialsProvider

ProcessCredentialsProvider::ProcessCredentialsProvider(std::string command, std::string origin,
                                                       absl::Duration timeout)
    : command_(std::move(command)), origin_(std::move(origin)), timeout_(timeout) {}

std::string ProcessCredentialsProvider::Describe() const {
  return absl::StrCat("credential_process of ", origin_);
}

absl::StatusOr<Credentials> ProcessCredentialsProvider::Fetch() {
  WHARF_ASSIGN_OR_RETURN(ProcessResult result, RunShell(command_, timeout_));
  if (!WIFEXITED(result.wait_status) || WEXITSTATUS(result.wait_status) != 0) {
    std::string how = WIFEXITED(result.wait_status)
                          ? absl::StrCat("exited with status ", WEXITSTATUS(result.wait_status))
                          : absl::StrCat("was killed by signal ", WTERMSIG(result.wait_status));
    const std::string err(absl::StripAsciiWhitespace(result.err));
    if (!err.empty()) absl::StrAppend(&how, ": ", err);
    return absl::UnauthenticatedError(absl::StrCat("the command ", how));
  }
  return ParseProcessCredentials(result.out);
}

absl::StatusOr<Credentials> ParseProcessCredentials(absl::string_view json) {
  const nlohmann::json doc = nlohmann::json::parse(json.begin(), json.end(), nullptr,
                                                   /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("the command's output is not a JSON object");
  }
  auto version = doc.find("Version");
  if (version == doc.end() || !version->is_number_integer() || version->get<int>() != 1) {
    return absl::InvalidArgumentError(
        "the command's output must have \"Version\": 1 (the only version defined)");
  }
  return ParseJsonCredentials(json, "SessionToken", "the command's output");
}

// ---------------------------------------------------------------------------------------------
// ImdsCredentialsProvider

namespace {
constexpr absl::string_view kImdsTokenPath = "/latest/api/token";
constexpr absl::string_view kImdsRolesPath = "/latest/meta-data/iam/security-credentials/";
}  // namespace

ImdsCredentialsProvider::ImdsCredentialsProvider(std::string endpoint,
                                                 AwsCredentialsOptions options, bool last_resort)
    : endpoint_(std::string(absl::StripSuffix(endpoint, "/"))),
      options_(std::move(options)),
      last_resort_(last_resort) {}

std::string ImdsCredentialsProvider::Describe() const {
  return absl::StrCat("IMDS at ", endpoint_);
}

absl::StatusOr<Credentials> ImdsCredentialsProvider::Fetch() {
  const auto send = [&](std::string method, absl::string_view path,
                        std::vector<std::pair<std::string, std::string>> headers) {
    return SendWithRetries(options_, options_.imds_attempts, [&]() {
      HttpRequest request;
      request.method = method;
      request.url = absl::StrCat(endpoint_, path);
      request.headers = headers;
      request.timeout = options_.imds_timeout;
      return request;
    });
  };
  const auto fetch = [&]() -> absl::StatusOr<Credentials> {
    // IMDSv2: a session token first; every metadata GET must carry it.
    const std::string put_step = absl::StrCat("PUT ", kImdsTokenPath);
    absl::StatusOr<HttpResponse> token =
        send("PUT", kImdsTokenPath, {{"x-aws-ec2-metadata-token-ttl-seconds", "21600"}});
    if (!token.ok()) return Annotate(token.status(), put_step);
    if (token->status != 200) return HttpError(*token, put_step);
    const std::string session(absl::StripAsciiWhitespace(token->body));
    if (session.empty() || HasLineBreakOrNul(session)) {
      return absl::DataLossError(absl::StrCat(put_step, " answered without a usable token"));
    }
    const std::vector<std::pair<std::string, std::string>> auth = {
        {"x-aws-ec2-metadata-token", session}};

    const std::string roles_step = absl::StrCat("GET ", kImdsRolesPath);
    absl::StatusOr<HttpResponse> roles = send("GET", kImdsRolesPath, auth);
    if (!roles.ok()) return Annotate(roles.status(), roles_step);
    if (roles->status == 404) {
      return HttpError(*roles, roles_step, "no IAM role is attached to the instance");
    }
    if (roles->status != 200) return HttpError(*roles, roles_step);
    const absl::string_view role = absl::StripAsciiWhitespace(
        absl::string_view(roles->body).substr(0, roles->body.find('\n')));
    if (role.empty() || role.find_first_of("/?#% ") != absl::string_view::npos) {
      return absl::DataLossError(absl::StrCat(roles_step, " answered without a role name"));
    }

    const std::string role_path = absl::StrCat(kImdsRolesPath, role);
    const std::string role_step = absl::StrCat("GET ", role_path);
    absl::StatusOr<HttpResponse> document = send("GET", role_path, auth);
    if (!document.ok()) return Annotate(document.status(), role_step);
    if (document->status != 200) return HttpError(*document, role_step);
    const nlohmann::json doc = nlohmann::json::parse(document->body, nullptr, false);
    if (doc.is_object()) {
      auto code = doc.find("Code");
      if (code != doc.end() && code->is_string() && code->get<std::string>() != "Success") {
        std::string message = absl::StrCat(role_step, ": Code ", code->get<std::string>());
        auto text = doc.find("Message");
        if (text != doc.end() && text->is_string()) {
          absl::StrAppend(&message, ": ", text->get<std::string>());
        }
        return absl::UnavailableError(message);
      }
    }
    return ParseJsonCredentials(document->body, "Token", role_step);
  };
  absl::StatusOr<Credentials> credentials = fetch();
  if (!credentials.ok() && last_resort_) {
    return absl::UnauthenticatedError(
        absl::StrCat(credentials.status().message(),
                     " (and no other AWS credentials are configured: set AWS_ACCESS_KEY_ID and "
                     "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or ~/.aws/credentials)"));
  }
  return credentials;
}

// ---------------------------------------------------------------------------------------------
// ContainerCredentialsProvider

ContainerCredentialsProvider::ContainerCredentialsProvider(std::string url,
                                                           std::string authorization_token,
                                                           std::string authorization_token_file,
                                                           AwsCredentialsOptions options)
    : url_(std::move(url)),
      authorization_token_(std::move(authorization_token)),
      authorization_token_file_(std::move(authorization_token_file)),
      options_(std::move(options)) {}

std::string ContainerCredentialsProvider::Describe() const {
  return absl::StrCat("container credentials at ", url_);
}

absl::StatusOr<Credentials> ContainerCredentialsProvider::Fetch() {
  std::string token = authorization_token_;
  if (!authorization_token_file_.empty()) {
    WHARF_ASSIGN_OR_RETURN(
        token, ReadTokenFile(authorization_token_file_, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"));
    if (HasLineBreakOrNul(token)) {
      return absl::InvalidArgumentError(absl::StrCat("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE ",
                                                     authorization_token_file_,
                                                     " holds more than one line"));
    }
  }
  absl::StatusOr<HttpResponse> response =
      SendWithRetries(options_, options_.container_attempts, [&]() {
        HttpRequest request;
        request.method = "GET";
        request.url = url_;
        request.timeout = options_.container_timeout;
        request.headers = {{"accept", "application/json"}};
        if (!token.empty()) request.headers.emplace_back("authorization", token);
        return request;
      });
  if (!response.ok()) return response.status();
  if (response->status != 200) {
    return HttpError(*response, "GET",
                     response->status == 401 || response->status == 403
                         ? "check AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE)"
                         : "");
  }
  return ParseJsonCredentials(response->body, "Token", "the answer");
}

// ---------------------------------------------------------------------------------------------
// WebIdentityCredentialsProvider

WebIdentityCredentialsProvider::WebIdentityCredentialsProvider(std::string token_file,
                                                               AssumeRoleParams role,
                                                               std::string sts_endpoint,
                                                               AwsCredentialsOptions options)
    : token_file_(std::move(token_file)),
      role_(std::move(role)),
      sts_endpoint_(std::move(sts_endpoint)),
      options_(std::move(options)) {}

std::string WebIdentityCredentialsProvider::Describe() const {
  return absl::StrCat("web identity token ", token_file_, " for role ", role_.role_arn,
                      " via STS at ", sts_endpoint_);
}

absl::StatusOr<Credentials> WebIdentityCredentialsProvider::Fetch() {
  // Re-read at every fetch: EKS rotates the projected token.
  WHARF_ASSIGN_OR_RETURN(std::string token, ReadTokenFile(token_file_, "web identity token"));
  std::vector<std::pair<std::string, std::string>> params = {
      {"RoleArn", role_.role_arn},
      {"RoleSessionName", SessionName(role_)},
      {"WebIdentityToken", std::move(token)}};
  if (role_.duration_seconds > 0) {
    params.emplace_back("DurationSeconds", absl::StrCat(role_.duration_seconds));
  }
  return CallSts("AssumeRoleWithWebIdentity", std::move(params), sts_endpoint_,
                 /*signer=*/nullptr, options_);
}

// ---------------------------------------------------------------------------------------------
// AssumeRoleCredentialsProvider

AssumeRoleCredentialsProvider::AssumeRoleCredentialsProvider(
    AssumeRoleParams role, std::shared_ptr<CredentialsProvider> source, std::string sts_endpoint,
    AwsCredentialsOptions options)
    : role_(std::move(role)),
      source_(std::move(source)),
      sts_endpoint_(std::move(sts_endpoint)),
      options_(std::move(options)) {}

std::string AssumeRoleCredentialsProvider::Describe() const {
  return absl::StrCat("role ", role_.role_arn, " via STS at ", sts_endpoint_, " with ",
                      source_->Describe());
}

absl::StatusOr<Credentials> AssumeRoleCredentialsProvider::Fetch() {
  absl::StatusOr<Credentials> source = source_->Fetch();
  if (!source.ok()) {
    return Annotate(source.status(), absl::StrCat("source credentials from ", source_->Describe()));
  }
  std::vector<std::pair<std::string, std::string>> params = {
      {"RoleArn", role_.role_arn}, {"RoleSessionName", SessionName(role_)}};
  if (!role_.external_id.empty()) params.emplace_back("ExternalId", role_.external_id);
  if (role_.duration_seconds > 0) {
    params.emplace_back("DurationSeconds", absl::StrCat(role_.duration_seconds));
  }
  return CallSts("AssumeRole", std::move(params), sts_endpoint_, &*source, options_);
}

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::string> ResolveStsEndpoint(const AwsSharedFile& config_file,
                                               absl::string_view profile,
                                               const AwsCredentialsOptions& options) {
  const auto env = [&](absl::string_view name) { return NonEmpty(options.env(name)); };
  if (std::optional<std::string> url = env("AWS_ENDPOINT_URL_STS")) {
    return NormalizeAwsEndpoint(*url, "AWS_ENDPOINT_URL_STS");
  }
  if (std::optional<std::string> url = env("AWS_ENDPOINT_URL")) {
    return NormalizeAwsEndpoint(*url, "AWS_ENDPOINT_URL");
  }
  const IniSection* section = FindConfigProfile(config_file, profile);
  const std::string profile_source = absl::StrCat("profile '", profile, "' in ", config_file.path);
  if (std::optional<std::string> services = Value(section, "services")) {
    const std::string name = absl::StrCat("services ", *services);
    if (const IniSection* services_section = FindIniSection(config_file, name)) {
      auto sts = services_section->subsections.find("sts");
      if (sts != services_section->subsections.end()) {
        auto url = sts->second.find("endpoint_url");
        if (url != sts->second.end() && !url->second.empty()) {
          return NormalizeAwsEndpoint(url->second,
                                      absl::StrCat("[", name, "] in ", config_file.path));
        }
      }
    }
  }
  if (std::optional<std::string> url = Value(section, "endpoint_url")) {
    return NormalizeAwsEndpoint(*url, profile_source);
  }
  return absl::StrCat("https://sts.", options.region, ".amazonaws.com",
                      absl::StartsWith(options.region, "cn-") ? ".cn" : "");
}

absl::StatusOr<std::shared_ptr<CredentialsProvider>> ResolveAwsCredentialsChain(
    absl::string_view profile, const AwsSharedFile& credentials_file,
    const AwsSharedFile& config_file, const AwsCredentialsOptions& options) {
  return ChainResolver(credentials_file, config_file, options).Resolve(profile);
}

}  // namespace wharf::s3
