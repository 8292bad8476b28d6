// ReadRanges: many byte ranges of a store's objects read by parallel ranged GETs straight into
// the caller's memory. The reader under checkpoint loads (checkpoint/io.h) and model loading
// (serve/model_loader.h).
//
// Ranges are sorted by object and offset; neighbours closer than `coalesce_gap` share one
// ranged GET whose bytes are scattered into their destinations (the gap is discarded), and a
// range longer than `max_request_bytes` is split into parallel GETs into consecutive parts of
// its destination (the part size the store's measured latency and bandwidth suggest, unless
// set). Every GET may carry If-Match (the ETag the caller recorded), so an object overwritten
// under a read fails instead of mixing versions. `on_range_done` reports each range as soon as
// all its bytes have landed, so a caller can hand it on while the rest is still in flight.
//
// Memory: no buffer is allocated for the bytes moved; the caller's memory is the buffer (a
// coalesced GET is copied piece by piece from the transport's chunks into the destinations).
// The runtime's budget is therefore not charged (as ObjectReader::ReadDirect).
//
// Thread-safety: may be called concurrently from any thread; blocks its caller until every
// request it started has ended (never returning while a request could still touch the
// caller's memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/cancel.h"
#include "base/runtime.h"
#include "store/object_store.h"

namespace wharf {

// One byte range of an object, delivered into dst[0, length).
struct RangeToRead {
  std::string key;
  uint64_t offset = 0;
  uint64_t length = 0;
  char* dst = nullptr;  // REQUIRES: valid for `length` bytes until ReadRanges returns
  std::string etag;     // If-Match when non-empty
};

struct ReadRangesOptions {
  // Ranges of one object whose gap is at most this many bytes share one GET.
  uint64_t coalesce_gap = uint64_t{256} << 10;
  // Longest GET; a longer range is split into parallel GETs. 0: the store's link estimate
  // (LinkEstimator::PartSize(), 8 MiB before any measurement).
  uint64_t max_request_bytes = 0;
  // GETs in flight at once. 0: the runtime's inflight setting if set, else 64.
  int max_in_flight = 0;
  std::shared_ptr<Runtime> runtime;  // null: Runtime::Default()
  // Called once per range (its index in the call's `ranges`) when all its bytes are in its
  // destination; an empty range is done at once. Runs on a transport thread: it must be
  // short and must not block. Not called for ranges of GETs that failed.
  std::function<void(size_t)> on_range_done;
  // When cancelled, requests not sent are not sent and those in flight are aborted; the
  // call then fails with CancelledError.
  CancelToken cancel;
};

struct ReadRangesStats {
  uint64_t ranges = 0;
  uint64_t requests = 0;       // GETs issued
  uint64_t bytes = 0;          // bytes delivered into the destinations
  uint64_t bytes_fetched = 0;  // bytes the GETs carried (gaps included)
};

// Reads every range. On failure: the first error, after every GET has ended (the
// destinations then hold partial data).
absl::StatusOr<ReadRangesStats> ReadRanges(ObjectStore& store, std::vector<RangeToRead> ranges,
                                           const ReadRangesOptions& options = {});

}  // namespace wharf
