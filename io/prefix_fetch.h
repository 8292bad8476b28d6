// PrefixFetch: reads every object below a prefix, with the listing and the reads
// overlapped: a work-stealing parallel listing (parallel_list.h) runs on its own thread and
// feeds an open FetchScheduler batch page by page, while the caller consumes results.
// A `select` callback decides, per listed object, whether to fetch it (bulk copy uses it to
// skip objects the destination already holds, and to refuse unsafe keys).
//
// Thread-safety: one consumer thread calls Next()/Finish(); `select` runs on the listing
// thread, outside PrefixFetch's lock, so it may block (e.g. wait for room on workers of its
// own) without stopping the consumer.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "io/fetch_scheduler.h"
#include "io/parallel_list.h"

namespace wharf {

class PrefixFetch {
 public:
  // true: fetch this object; false: leave it (the callback may record why).
  using Select = std::function<bool(const ObjectMeta&)>;

  // The listing stays at most `max_ahead` selected objects ahead of the results taken (it
  // waits before selecting from its next page), so memory stays flat in the number of
  // objects: `max_ahead` listing entries, plus the listing's own pages in flight.
  PrefixFetch(std::shared_ptr<ObjectStore> store, FetchScheduler& scheduler, ListOptions range,
              ParallelListOptions list_options, Select select, size_t max_ahead = kMaxAhead);
  ~PrefixFetch();  // cancels and joins the listing thread
  static constexpr size_t kMaxAhead = 16384;
  PrefixFetch(const PrefixFetch&) = delete;
  PrefixFetch& operator=(const PrefixFetch&) = delete;

  // The next fetched object (completion order); nullopt when everything selected was
  // delivered. `meta(result.index)` is its listing entry (valid until the next call).
  std::optional<FetchResult> Next();
  ObjectMeta meta(size_t index) const;

  // True once the listing has finished (everything selected has been added).
  bool listing_done() const;
  // After Next() returned nullopt: the listing's own status, and its statistics.
  absl::Status listing_status() const;
  ParallelListStats list_stats() const;
  uint64_t listed() const;
  FetchStats fetch_stats() const { return batch_->stats(); }

 private:
  std::unique_ptr<FetchScheduler::Batch> batch_;
  mutable absl::Mutex mu_;
  // Listing entries of items added and not yet delivered, by batch index, and the one
  // delivered last: memory stays flat in the number of objects.
  absl::flat_hash_map<size_t, ObjectMeta> pending_ ABSL_GUARDED_BY(mu_);
  std::optional<std::pair<size_t, ObjectMeta>> last_ ABSL_GUARDED_BY(mu_);
  size_t next_index_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status listing_ ABSL_GUARDED_BY(mu_);
  ParallelListStats list_stats_ ABSL_GUARDED_BY(mu_);
  uint64_t listed_ ABSL_GUARDED_BY(mu_) = 0;
  bool listing_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  const size_t max_ahead_;
  std::thread lister_;
};

}  // namespace wharf
