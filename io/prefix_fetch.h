// PrefixFetch: reads every object below a prefix, with the listing and the reads
// overlapped: a work-stealing parallel listing (parallel_list.h) runs on its own thread and
// feeds an open FetchScheduler batch page by page, while the caller consumes results.
// A `select` callback decides, per listed object, whether to fetch it (bulk copy uses it to
// skip objects the destination already holds, and to refuse unsafe keys).
//
// Thread-safety: one consumer thread calls Next()/Finish(); `select` runs on the listing
// thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "io/fetch_scheduler.h"
#include "io/parallel_list.h"

namespace wharf {

class PrefixFetch {
 public:
  // true: fetch this object; false: leave it (the callback may record why).
  using Select = std::function<bool(const ObjectMeta&)>;

  PrefixFetch(std::shared_ptr<ObjectStore> store, FetchScheduler& scheduler, ListOptions range,
              ParallelListOptions list_options, Select select);
  ~PrefixFetch();  // cancels and joins the listing thread
  PrefixFetch(const PrefixFetch&) = delete;
  PrefixFetch& operator=(const PrefixFetch&) = delete;

  // The next fetched object (completion order); nullopt when everything selected was
  // delivered. `meta(result.index)` is its listing entry.
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
  std::vector<ObjectMeta> selected_ ABSL_GUARDED_BY(mu_);  // by batch index
  absl::Status listing_ ABSL_GUARDED_BY(mu_);
  ParallelListStats list_stats_ ABSL_GUARDED_BY(mu_);
  uint64_t listed_ ABSL_GUARDED_BY(mu_) = 0;
  bool listing_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::thread lister_;
};

}  // namespace wharf
