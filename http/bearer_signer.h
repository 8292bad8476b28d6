// Bearer-token signing for token-based HTTP APIs (the GCS JSON API, OAuth2 services): each
// request carries "Authorization: Bearer <token>", the token being Credentials::bearer_token.
//
// It is the counterpart of SigV4 (store/s3/sigv4.h) and shares its plumbing: the token comes
// from a CredentialsCache over a CredentialsProvider (base/credentials.h), which hands it out
// while valid and refreshes it in the background before it expires, so a backend only plugs in
// a provider (a metadata server, a service-account exchange, a static token). It lives in
// http/ so any store backend can use it without depending on another backend.
//
// Secrets: the token never appears in Describe(), in an error message or in a log line; errors
// name the credentials' source instead.
//
// Thread-safety: SignBearer is pure. BearerTokenSigner is thread-safe; `done` runs inline when
// the cached token is valid, otherwise on the cache's blocking pool once a fetch completes
// (never on the caller's thread after it returned, never blocking a transport thread).
#pragma once

#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/credentials.h"
#include "http/transport.h"

namespace wharf {

// Sets the request's "authorization" header (replacing any) to "Bearer <token>".
// InvalidArgument, naming `source` and never the token, when the credentials hold no bearer
// token or it has a byte outside visible ASCII (a space, CR, LF, NUL would corrupt the header).
absl::Status SignBearer(const Credentials& credentials, absl::string_view source,
                        HttpRequest& request);

class BearerTokenSigner {
 public:
  using Done = absl::AnyInvocable<void(absl::StatusOr<HttpRequest>) &&>;

  // REQUIRES: cache != nullptr. The cache may be shared with other signers of the same source
  // (Runtime::Shared), so one refresh serves them all.
  explicit BearerTokenSigner(std::shared_ptr<CredentialsCache> cache);
  BearerTokenSigner(const BearerTokenSigner&) = delete;
  BearerTokenSigner& operator=(const BearerTokenSigner&) = delete;

  // Calls `done` with `request` signed by a valid token, or with the error of the fetch
  // (annotated with the source) or of SignBearer.
  void SignAsync(HttpRequest request, Done done);
  // The server refused the token (401, an expired or revoked token): the next SignAsync
  // fetches a fresh one.
  void Invalidate() { cache_->Invalidate(); }
  // "bearer token from <source>", e.g. "bearer token from GCE metadata server".
  std::string Describe() const;

 private:
  const std::shared_ptr<CredentialsCache> cache_;
};

}  // namespace wharf
