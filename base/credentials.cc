#include "base/credentials.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/cancel.h"
#include "base/status.h"

namespace wharf {

CredentialsCache::CredentialsCache(std::unique_ptr<CredentialsProvider> provider, ThreadPool* pool,
                                   CredentialsCacheOptions options)
    : provider_(std::move(provider)),
      source_(provider_->Describe()),
      pool_(pool),
      options_(options) {}

CredentialsCache::~CredentialsCache() {
  // A background refresh holds `this`: wait for it.
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* running) { return *running == 0; }, &running_));
}

void CredentialsCache::GetAsync(Done done) {
  Credentials ready;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (have_ && now < cached_.expiration) {
      // Valid: hand it out; refresh ahead of expiry in the background.
      if (now >= cached_.expiration - options_.refresh_before && !fetching_) StartFetchLocked();
      ready = cached_;
    } else {
      // The fetch is shared, so it runs with no ambient token (base/cancel.h); each waiter
      // is called back with its own.
      if (const CancelToken& scope = AmbientCancel()) {
        done = [scope, done = std::move(done)](absl::StatusOr<Credentials> c) mutable {
          ScopedAmbientCancel ambient(std::move(scope));
          std::move(done)(std::move(c));
        };
      }
      waiters_.push_back(std::move(done));
      if (!fetching_) StartFetchLocked();
      return;
    }
  }
  std::move(done)(std::move(ready));
}

absl::StatusOr<Credentials> CredentialsCache::Get() {
  absl::Notification notified;
  absl::StatusOr<Credentials> result;
  GetAsync([&](absl::StatusOr<Credentials> c) {
    result = std::move(c);
    notified.Notify();
  });
  notified.WaitForNotification();
  return result;
}

void CredentialsCache::Invalidate() {
  absl::MutexLock lock(&mu_);
  have_ = false;
}

int CredentialsCache::fetches() const {
  absl::MutexLock lock(&mu_);
  return fetches_;
}

void CredentialsCache::StartFetchLocked() {
  fetching_ = true;
  ++running_;
  ScopedAmbientCancel shared(nullptr);  // a fetch shared by every caller: not one's to cancel
  pool_->Schedule([this] { RunFetch(); });
}

void CredentialsCache::RunFetch() {
  absl::StatusOr<Credentials> fetched = provider_->Fetch();
  if (!fetched.ok()) {
    fetched = Annotate(fetched.status(), absl::StrCat("credentials from ", source_));
  }
  std::vector<Done> waiters;
  {
    absl::MutexLock lock(&mu_);
    ++fetches_;
    fetching_ = false;
    if (fetched.ok()) {
      cached_ = *fetched;
      have_ = true;
    }
    waiters.swap(waiters_);
  }
  for (Done& waiter : waiters) std::move(waiter)(fetched);
  absl::MutexLock lock(&mu_);
  --running_;
}

}  // namespace wharf
