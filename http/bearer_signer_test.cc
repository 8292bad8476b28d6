#include "http/bearer_signer.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wharf {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

constexpr char kSource[] = "test token service";

// Hands out "secret-token-<n>" on the n-th fetch, each valid for `lifetime`; fails when told.
class CountingTokenProvider : public CredentialsProvider {
 public:
  explicit CountingTokenProvider(absl::Duration lifetime) : lifetime_(lifetime) {}
  absl::StatusOr<Credentials> Fetch() override {
    const int n = ++fetches_;
    if (fail_) {
      return absl::UnavailableError("token endpoint answered 503");
    }
    Credentials c;
    c.bearer_token = absl::StrCat("secret-token-", n);
    c.expiration = absl::Now() + lifetime_;
    return c;
  }
  std::string Describe() const override { return kSource; }
  void set_fail(bool fail) { fail_ = fail; }

 private:
  const absl::Duration lifetime_;
  std::atomic<int> fetches_{0};
  std::atomic<bool> fail_{false};
};

absl::StatusOr<HttpRequest> SignAndWait(BearerTokenSigner& signer, HttpRequest request) {
  absl::Notification done;
  std::optional<absl::StatusOr<HttpRequest>> result;
  signer.SignAsync(std::move(request), [&](absl::StatusOr<HttpRequest> r) {
    result.emplace(std::move(r));
    done.Notify();
  });
  done.WaitForNotification();
  return *std::move(result);
}

std::string AuthorizationOf(const HttpRequest& request) {
  std::string value;
  for (const auto& [name, v] : request.headers) {
    if (absl::EqualsIgnoreCase(name, "authorization")) value = v;
  }
  return value;
}

HttpRequest Get() {
  HttpRequest request;
  request.url = "https://storage.googleapis.com/storage/v1/b/bucket/o/key?alt=media";
  request.headers = {{"Authorization", "Bearer stale"}, {"x-goog-user-project", "p"}};
  return request;
}

TEST(SignBearerTest, SetsOneAuthorizationHeaderAndKeepsTheOthers) {
  Credentials c;
  c.bearer_token = "ya29.a0Af-_~+/x==";
  HttpRequest request = Get();
  ASSERT_TRUE(SignBearer(c, kSource, request).ok());
  EXPECT_THAT(request.headers,
              testing::ElementsAre(Pair("x-goog-user-project", "p"),
                                   Pair("authorization", "Bearer ya29.a0Af-_~+/x==")));
}

TEST(SignBearerTest, RefusesMissingOrHeaderBreakingTokensWithoutQuotingThem) {
  HttpRequest request = Get();
  Credentials keys_only;
  keys_only.access_key_id = "AKID";
  keys_only.secret_access_key = "sigv4-secret";
  absl::Status missing = SignBearer(keys_only, kSource, request);
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.message(), HasSubstr(kSource));
  EXPECT_THAT(missing.message(), Not(HasSubstr("sigv4-secret")));
  for (const std::string& token : std::vector<std::string>{
           "secret\r\nX-Injected: 1", std::string("sec\0ret", 7), "secret with space"}) {
    Credentials c;
    c.bearer_token = token;
    absl::Status bad = SignBearer(c, kSource, request);
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(bad.message(), HasSubstr(kSource));
    EXPECT_THAT(bad.message(), Not(HasSubstr("secret")));
  }
  EXPECT_EQ(AuthorizationOf(request), "Bearer stale");  // untouched on failure
}

class BearerTokenSignerTest : public testing::Test {
 protected:
  ThreadPool pool_{2};
};

TEST_F(BearerTokenSignerTest, RefreshesBeforeExpiryWhileHandingOutTheValidToken) {
  // Valid for two minutes, inside the five-minute refresh window: the second request is
  // signed with the first token at once and starts a background refresh.
  auto provider = std::make_unique<CountingTokenProvider>(absl::Minutes(2));
  auto cache = std::make_shared<CredentialsCache>(std::move(provider), &pool_);
  BearerTokenSigner signer(cache);

  auto first = SignAndWait(signer, Get());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(AuthorizationOf(*first), "Bearer secret-token-1");
  auto second = SignAndWait(signer, Get());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(AuthorizationOf(*second), "Bearer secret-token-1");
  for (int i = 0; i < 500 && cache->fetches() < 2; ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(cache->fetches(), 2);
  auto third = SignAndWait(signer, Get());
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(AuthorizationOf(*third), "Bearer secret-token-2");
  EXPECT_EQ(signer.Describe(), absl::StrCat("bearer token from ", kSource));
}

TEST_F(BearerTokenSignerTest, ALongLivedTokenIsFetchedOnceAndInvalidateFetchesAgain) {
  auto cache = std::make_shared<CredentialsCache>(
      std::make_unique<CountingTokenProvider>(absl::Hours(1)), &pool_);
  BearerTokenSigner signer(cache);
  for (int i = 0; i < 5; ++i) {
    auto signed_request = SignAndWait(signer, Get());
    ASSERT_TRUE(signed_request.ok()) << signed_request.status();
    EXPECT_EQ(AuthorizationOf(*signed_request), "Bearer secret-token-1");
  }
  EXPECT_EQ(cache->fetches(), 1);
  signer.Invalidate();  // as after a 401
  auto fresh = SignAndWait(signer, Get());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(AuthorizationOf(*fresh), "Bearer secret-token-2");
  EXPECT_EQ(cache->fetches(), 2);
}

TEST_F(BearerTokenSignerTest, FetchFailuresNameTheSourceAndNeverATokenAndTheNextCallRetries) {
  auto provider = std::make_unique<CountingTokenProvider>(absl::Hours(1));
  CountingTokenProvider* raw = provider.get();
  auto cache = std::make_shared<CredentialsCache>(std::move(provider), &pool_);
  BearerTokenSigner signer(cache);
  ASSERT_TRUE(SignAndWait(signer, Get()).ok());
  signer.Invalidate();
  raw->set_fail(true);
  auto failed = SignAndWait(signer, Get());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(failed.status().message(), HasSubstr(kSource));
  EXPECT_THAT(failed.status().message(), HasSubstr("503"));
  EXPECT_THAT(failed.status().message(), Not(HasSubstr("secret-token")));
  EXPECT_THAT(signer.Describe(), Not(HasSubstr("secret-token")));
  raw->set_fail(false);
  auto recovered = SignAndWait(signer, Get());
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(AuthorizationOf(*recovered), "Bearer secret-token-3");
}

}  // namespace
}  // namespace wharf
