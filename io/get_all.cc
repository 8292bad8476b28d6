#include "io/get_all.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace wharf {

GetAllResult GetAll(ObjectStore& store, std::vector<GetRequest> requests,
                    const GetAllOptions& options) {
  struct Shared {
    absl::Mutex mu;
    int max_in_flight = 1;
    int in_flight ABSL_GUARDED_BY(mu) = 0;
    bool failed ABSL_GUARDED_BY(mu) = false;
    std::vector<std::optional<absl::StatusOr<GetResult>>> results ABSL_GUARDED_BY(mu);
  };
  auto shared = std::make_shared<Shared>();
  shared->max_in_flight = std::max(1, options.max_in_flight);
  {
    absl::MutexLock lock(&shared->mu);
    shared->results.resize(requests.size());
  }
  const bool stop = options.stop_at_first_error;
  for (size_t i = 0; i < requests.size(); ++i) {
    {
      absl::MutexLock lock(&shared->mu);
      AwaitInterruptibly(shared->mu, absl::Condition(
                                         +[](Shared* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
                                           return s->in_flight < s->max_in_flight;
                                         },
                                         shared.get()));
      if (stop && shared->failed) break;
      ++shared->in_flight;
    }
    GetRequest& request = requests[i];
    std::optional<uint64_t> expected;
    if (!request.range.suffix && request.range.length.has_value() && !options.allow_short_reads) {
      expected = request.range.length;
    }
    const uint64_t offset = request.range.offset;
    std::string uri = store.Uri(request.key);  // before the request is moved
    // `on_done` is the caller's, who waits below for this completion before returning.
    const auto* on_done = options.on_done ? &options.on_done : nullptr;
    store.GetAsync(std::move(request), [shared, i, expected, offset, on_done,
                                        uri = std::move(uri)](absl::StatusOr<GetResult> result) {
      if (result.ok() && !result->not_modified && expected.has_value() &&
          result->bytes != *expected) {
        result = absl::DataLossError(absl::StrCat(
            "get ", uri, " bytes [", offset, ", ", offset + *expected, "): short read of ",
            result->bytes,
            " bytes (the object is shorter than expected: truncated, or changed while reading)"));
      }
      if (on_done != nullptr) (*on_done)(i, result);
      absl::MutexLock lock(&shared->mu);
      if (!result.ok()) shared->failed = true;
      shared->results[i] = std::move(result);
      --shared->in_flight;
    });
  }
  absl::MutexLock lock(&shared->mu);
  AwaitInterruptibly(shared->mu, absl::Condition(
                                     +[](Shared* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
                                       return s->in_flight == 0;
                                     },
                                     shared.get()));
  GetAllResult out;
  out.results.reserve(shared->results.size());
  for (size_t i = 0; i < shared->results.size(); ++i) {
    if (!shared->results[i].has_value()) {
      out.results.push_back(absl::CancelledError(absl::StrCat(
          "get ", store.Uri(requests[i].key), ": not started (an earlier read failed)")));
      continue;
    }
    absl::StatusOr<GetResult>& r = *shared->results[i];
    ++out.started;
    if (r.ok()) {
      out.bytes += r->bytes;
    } else if (out.error.ok() || (absl::IsCancelled(out.error) && !absl::IsCancelled(r.status()))) {
      out.error = r.status();
    }
    out.results.push_back(std::move(r));
  }
  return out;
}

}  // namespace wharf
