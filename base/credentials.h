// Credentials, where they come from, and the cache that keeps them fresh.
//
// A request signer (SigV4 for s3:// and gs:// XML, a bearer-token signer for token-based APIs)
// never reads credentials from a source itself: it asks a CredentialsCache, which wraps one
// CredentialsProvider (static keys, instance metadata, a web identity token exchanged at STS, a
// credential_process, ...). The cache hands out what it holds while it is valid, refreshes it
// in the background shortly before it expires (so requests never wait for a refresh once the
// first fetch is done), and lets every caller that needs credentials while none are valid
// share one fetch. Fetches block (network, a subprocess), so they run on a blocking pool, never
// on an event loop; callbacks of GetAsync may run inline (when the cached credentials are
// valid) or on a pool thread.
//
// Secrets never appear in Describe(), in error messages or in logs.
//
// Thread-safety: CredentialsCache is thread-safe. Providers are called by one cache, one
// Fetch() at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/thread_pool.h"

namespace wharf {

// What a signer needs. AWS-style keys (SigV4: key id, secret, optional session token) or an
// OAuth2 bearer token; `expiration` is InfiniteFuture for credentials that do not expire.
struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;
  std::string bearer_token;
  absl::Time expiration = absl::InfiniteFuture();

  // True when there is nothing to sign with: requests are then sent unsigned (anonymous).
  bool empty() const {
    return access_key_id.empty() && secret_access_key.empty() && bearer_token.empty();
  }
};

class CredentialsProvider {
 public:
  virtual ~CredentialsProvider() = default;
  // Fetches credentials from the source. May block. Errors name the source (Describe()) and
  // the cause, never a secret: e.g. "instance metadata (IMDSv2) at http://169.254.169.254:
  // no IAM role attached (GET .../security-credentials/ answered 404)".
  virtual absl::StatusOr<Credentials> Fetch() = 0;
  // Where the credentials come from, for messages and error hints, e.g.
  // "environment (AWS_ACCESS_KEY_ID)", "profile 'dev' in /root/.aws/credentials",
  // "web identity token /var/run/secrets/token for role arn:aws:iam::1:role/r".
  virtual std::string Describe() const = 0;
};

// A provider that always returns the same credentials (static keys, tests).
class StaticCredentialsProvider : public CredentialsProvider {
 public:
  StaticCredentialsProvider(Credentials credentials, std::string source)
      : credentials_(std::move(credentials)), source_(std::move(source)) {}
  absl::StatusOr<Credentials> Fetch() override { return credentials_; }
  std::string Describe() const override { return source_; }

 private:
  const Credentials credentials_;
  const std::string source_;
};

struct CredentialsCacheOptions {
  // Credentials expiring within this much time are refreshed in the background while still
  // handed out; expired ones are never handed out (callers wait for a fresh fetch).
  absl::Duration refresh_before = absl::Minutes(5);
};

class CredentialsCache {
 public:
  using Done = absl::AnyInvocable<void(absl::StatusOr<Credentials>) &&>;

  // REQUIRES: provider != nullptr; `pool` outlives the cache (the runtime's blocking pool).
  CredentialsCache(std::unique_ptr<CredentialsProvider> provider, ThreadPool* pool,
                   CredentialsCacheOptions options = {});
  ~CredentialsCache();
  CredentialsCache(const CredentialsCache&) = delete;
  CredentialsCache& operator=(const CredentialsCache&) = delete;

  // Calls `done` with valid credentials: inline when the cached ones are valid, otherwise
  // from the pool once a fetch (shared with other callers) completes. A failed fetch is
  // reported to the callers waiting for it; the next call tries again.
  void GetAsync(Done done);
  // The blocking form. REQUIRES: not called on the pool's own threads.
  absl::StatusOr<Credentials> Get();
  // Drops the cached credentials (e.g. after the server said they expired): the next call
  // fetches.
  void Invalidate();

  std::string Describe() const { return source_; }
  // Fetches made so far (tests and metrics).
  int fetches() const;

 private:
  void StartFetchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunFetch();

  const std::unique_ptr<CredentialsProvider> provider_;
  const std::string source_;
  ThreadPool* const pool_;
  const CredentialsCacheOptions options_;

  mutable absl::Mutex mu_;
  bool have_ ABSL_GUARDED_BY(mu_) = false;
  Credentials cached_ ABSL_GUARDED_BY(mu_);
  bool fetching_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Done> waiters_ ABSL_GUARDED_BY(mu_);
  int fetches_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // fetch closures scheduled and not finished
};

}  // namespace wharf
