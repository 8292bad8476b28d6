#include "io/prefix_fetch.h"

#include <algorithm>
#include <utility>

namespace wharf {

PrefixFetch::PrefixFetch(std::shared_ptr<ObjectStore> store, FetchScheduler& scheduler,
                         ListOptions range, ParallelListOptions list_options, Select select,
                         size_t max_ahead)
    : batch_(scheduler.StartBatch()), max_ahead_(std::max<size_t>(1, max_ahead)) {
  // The listing and the fetches it starts belong to the caller's operation: they run with its
  // ambient token (base/cancel.h).
  lister_ = std::thread([this, store = std::move(store), range = std::move(range), list_options,
                         select = std::move(select), scope = AmbientCancel()] {
    ScopedAmbientCancel ambient(scope);
    ParallelListStats stats;
    absl::Status status = ParallelList(
        *store, range, list_options,
        [&](std::vector<ObjectMeta> page) {
          {
            absl::MutexLock lock(&mu_);
            // Back-pressure: the listing waits while too many objects are listed and not
            // yet delivered, so memory stays flat however many objects there are.
            auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
              return cancelled_ || pending_.size() < max_ahead_;
            };
            mu_.Await(absl::Condition(&room));
            if (cancelled_) return absl::CancelledError("the fetch was cancelled");
            listed_ += page.size();
          }
          // Selected outside the lock: `select` may block, and the consumer must not wait
          // for it.
          std::vector<ObjectMeta> chosen;
          for (ObjectMeta& meta : page) {
            if (!select || select(meta)) chosen.push_back(std::move(meta));
          }
          std::vector<FetchItem> items;
          items.reserve(chosen.size());
          {
            absl::MutexLock lock(&mu_);
            for (ObjectMeta& meta : chosen) {
              items.push_back({.key = meta.key, .size = meta.size, .etag = meta.etag});
              pending_.emplace(next_index_++, std::move(meta));
            }
          }
          // Indices match pending_: items are added in the same order, under one thread.
          if (!items.empty()) batch_->Add(std::move(items));
          return absl::OkStatus();
        },
        &stats);
    {
      absl::MutexLock lock(&mu_);
      listing_ = status;
      list_stats_ = stats;
      listing_done_ = true;
    }
    batch_->Close();
  });
}

PrefixFetch::~PrefixFetch() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;  // the listing stops at its next page
  }
  batch_->Cancel();
  if (lister_.joinable()) lister_.join();
}

std::optional<FetchResult> PrefixFetch::Next() {
  std::optional<FetchResult> r = batch_->Next();
  if (r) {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(r->index);
    if (it != pending_.end()) {
      last_.emplace(it->first, std::move(it->second));
      pending_.erase(it);
    }
  }
  return r;
}

ObjectMeta PrefixFetch::meta(size_t index) const {
  absl::MutexLock lock(&mu_);
  if (last_ && last_->first == index) return last_->second;
  auto it = pending_.find(index);
  return it != pending_.end() ? it->second : ObjectMeta{};
}

bool PrefixFetch::listing_done() const {
  absl::MutexLock lock(&mu_);
  return listing_done_;
}

absl::Status PrefixFetch::listing_status() const {
  absl::MutexLock lock(&mu_);
  return listing_;
}

ParallelListStats PrefixFetch::list_stats() const {
  absl::MutexLock lock(&mu_);
  return list_stats_;
}

uint64_t PrefixFetch::listed() const {
  absl::MutexLock lock(&mu_);
  return listed_;
}

}  // namespace wharf
