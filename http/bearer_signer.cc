#include "http/bearer_signer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace wharf {

absl::Status SignBearer(const Credentials& credentials, absl::string_view source,
                        HttpRequest& request) {
  const std::string& token = credentials.bearer_token;
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("credentials from ", source, " hold no bearer token"));
  }
  // RFC 6750's b64token is a subset of this; any visible ASCII keeps the header intact.
  if (!std::all_of(token.begin(), token.end(), [](char c) { return c > ' ' && c < 0x7f; })) {
    return absl::InvalidArgumentError(absl::StrCat("the bearer token from ", source,
                                                   " has a byte not allowed in an HTTP header"));
  }
  auto& headers = request.headers;
  headers.erase(std::remove_if(
                    headers.begin(), headers.end(),
                    [](const auto& h) { return absl::EqualsIgnoreCase(h.first, "authorization"); }),
                headers.end());
  headers.emplace_back("authorization", absl::StrCat("Bearer ", token));
  return absl::OkStatus();
}

BearerTokenSigner::BearerTokenSigner(std::shared_ptr<CredentialsCache> cache)
    : cache_(std::move(cache)) {}

void BearerTokenSigner::SignAsync(HttpRequest request, Done done) {
  // Holds the cache, not `this`: a fetch may complete after the signer is gone.
  cache_->GetAsync([cache = cache_, request = std::move(request),
                    done = std::move(done)](absl::StatusOr<Credentials> credentials) mutable {
    // The cache already annotated a failed fetch with the source.
    if (!credentials.ok()) return std::move(done)(credentials.status());
    absl::Status signed_ok = SignBearer(*credentials, cache->Describe(), request);
    if (!signed_ok.ok()) return std::move(done)(signed_ok);
    std::move(done)(std::move(request));
  });
}

std::string BearerTokenSigner::Describe() const {
  return absl::StrCat("bearer token from ", cache_->Describe());
}

}  // namespace wharf
