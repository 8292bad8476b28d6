// GetAll: many GETs of one store, at most N in flight, waited for together. The loop under
// every "read these ranges in parallel into these buffers" of the engine: ObjectReader's
// direct reads, checkpoint loads (checkpoint/io.h), the manifests of a checkpoint listing.
//
// Each request goes through GetAsync as given (its buffer or sink, If-Match, cancel token).
// A request with a range of known length that delivers fewer bytes fails with DataLoss naming
// the object and the range (the object changed or is shorter than the caller knew); a
// not-modified answer delivers nothing and is not a short read.
//
// Thread-safety: may be called from any thread; blocks until every request it started has
// ended (the buffers and sinks are never touched after it returns). The state the
// completions touch is shared with them, so a completion that is still unwinding when the
// caller returns touches nothing the caller owned.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "store/object_store.h"

namespace wharf {

struct GetAllOptions {
  int max_in_flight = 16;  // at least 1
  // After the first failure no further request starts (those get CancelledError); false:
  // every request runs and each result says how it went.
  bool stop_at_first_error = true;
  // A range that the object's end cuts short is not an error (probing a prefix of an object
  // of unknown size: GetResult::bytes says how many bytes came).
  bool allow_short_reads = false;
  // Called once per started request (its index) as it ends, on the completing thread, before
  // GetAll can return: it must be short and must not block.
  std::function<void(size_t, const absl::StatusOr<GetResult>&)> on_done;
};

struct GetAllResult {
  // One per request, in order; CancelledError for those never started.
  std::vector<absl::StatusOr<GetResult>> results;
  size_t started = 0;  // requests sent
  uint64_t bytes = 0;  // bytes the successful ones delivered
  absl::Status error;  // the first failure (a real one before the cancellations it caused)
};

GetAllResult GetAll(ObjectStore& store, std::vector<GetRequest> requests,
                    const GetAllOptions& options = {});

}  // namespace wharf
