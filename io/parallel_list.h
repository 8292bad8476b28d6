// Parallel listing by work stealing (the Dataflux algorithm, over ObjectStore::ListAsync).
//
// A flat listing of a key range is split among up to `workers` concurrent list calls:
// worker 0 starts with the whole range, the others idle. A worker lists its range page by
// page (start_after = the last key it saw, end_before = its upper bound). After each full
// page, if some worker is idle, it splits its remaining range, keeps the lower part and
// hands the upper part to the idle worker (internal::SplitKey: the midpoint key, or nearer
// when the upper bound is loose); the range that runs to the listing's end fans out to up
// to internal::kSplitsPerPage idle workers at once, in ranges of about 1, 2, 4, 8... pages.
// The listing ends when every worker is idle. Splits are exact (no key is lost or listed
// twice): see docs/design/listing.md. Every split costs at most one extra call, so the
// calls are at most full pages + splits + 1 (measured: ~2x a sequential listing over 50
// pages, 16 calls for 10 pages; a fan-out past the last key costs a few empty pages).
//
// Workers are not threads: each is a chain of ListAsync calls whose callbacks (on the
// store's threads) never block; they only update shared state under one mutex and issue
// the next call. Pages are handed to the caller's `on_page` on the calling thread.
//
// Thread-safety: the functions are thread-safe; concurrent listings share nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "store/object_store.h"

namespace wharf {

struct ParallelListOptions {
  // The most list calls in flight at once: each worker keeps one, so a listing of many
  // pages runs up to this many times faster than a sequential one (at ~2x the calls over
  // many pages).
  int workers = 16;
  // Entries per list call. 1000 is S3's maximum; backends clamp larger values.
  int page_size = 1000;
  // Pages received but not yet handed to `on_page`. When this many are waiting, workers
  // pause after their current call until the caller catches up, so memory stays near
  // max_pending_pages * page_size objects however slow `on_page` is.
  int max_pending_pages = 64;
};

struct ParallelListStats {
  int64_t list_calls = 0;  // ListAsync (or List) calls made
  int64_t splits = 0;      // ranges handed to an idle worker
  int64_t objects = 0;     // objects handed to on_page
  int peak_in_flight = 0;  // the most list calls outstanding at once
  absl::Duration wall = absl::ZeroDuration();
};

// Receives one page of objects: never empty, keys ascending within the page, but pages
// arrive in no particular order. An error stops the listing and is returned by it.
using ListPageFn = absl::FunctionRef<absl::Status(std::vector<ObjectMeta> page)>;

// Lists every object in `range` (its prefix, start_after and end_before; page_size is
// ignored in favour of options.page_size) with work stealing, calling `on_page` for each
// page on the calling thread, one page at a time. Blocks until the listing is complete, an
// error occurs or `on_page` fails. Flat listings only: a non-empty range.delimiter is
// InvalidArgument (common prefixes cannot be split between workers without duplicates).
// The first error stops new calls, waits for those in flight and is returned, annotated
// with the key range that failed. `stats`, when given, is filled in either way.
// REQUIRES: options.workers >= 1, options.page_size >= 1, options.max_pending_pages >= 1.
absl::Status ParallelList(ObjectStore& store, const ListOptions& range,
                          const ParallelListOptions& options, ListPageFn on_page,
                          ParallelListStats* stats = nullptr);

// ParallelList collecting every object, sorted by key (byte-wise, the store's order).
absl::StatusOr<std::vector<ObjectMeta>> ParallelListAll(ObjectStore& store,
                                                        const ListOptions& range,
                                                        const ParallelListOptions& options = {},
                                                        ParallelListStats* stats = nullptr);

// The baseline: the same listing with one call at a time (continuation tokens), pages in
// key order. options.workers and max_pending_pages are ignored.
absl::Status SequentialList(ObjectStore& store, const ListOptions& range,
                            const ParallelListOptions& options, ListPageFn on_page,
                            ParallelListStats* stats = nullptr);

namespace internal {

// The most ranges one full page hands to idle workers: a range that runs to the listing's
// end fans out to up to this many, a bounded one splits in two (docs/design/listing.md).
inline constexpr int kSplitsPerPage = 4;

// A key strictly between `lower` and `upper` in byte-wise order (`upper` empty: no upper
// bound), close to halfway when the strings are read as base-256 fractions after their
// common prefix; nullopt only when no string lies strictly between, i.e. when
// upper == lower + '\0'. Arbitrary bytes; the result may be invalid UTF-8 or hold NULs.
// REQUIRES: upper.empty() || lower < upper.
std::optional<std::string> MidpointKey(absl::string_view lower, absl::string_view upper);

// Like MidpointKey, but over the code points of valid UTF-8 strings: the result is valid
// UTF-8 made only of code points of `lower`, `upper` and `alphabet` (the digits, in code
// point order; more digits seen in real keys give more even splits), so it can be sent to
// a store that accepts only UTF-8 keys. nullopt when `lower` or `upper` is not valid UTF-8
// or no such string lies strictly between them.
// REQUIRES: upper.empty() || lower < upper.
std::optional<std::string> Utf8MidpointKey(absl::string_view lower, absl::string_view upper,
                                           absl::Span<const char32_t> alphabet = {});

// The split point ParallelList uses for a worker's remaining range (lower, upper) after a
// full page that held every key in (listed_from, lower]: a key strictly between lower and
// upper, the smaller of their midpoint and lower + stride * (lower - listed_from), the
// point `stride` more pages of the same density would reach. The midpoint alone lies far
// past the keys when the upper bound is loose (no bound, or keys sharing a long prefix),
// and halving towards them would waste one split per character of that prefix. From UTF-8
// `lower` the result is UTF-8 built as by Utf8MidpointKey (a store may refuse other
// start_after values); otherwise bytes, as by MidpointKey. nullopt: do not split.
std::optional<std::string> SplitKey(absl::string_view listed_from, absl::string_view lower,
                                    absl::string_view upper, uint64_t stride,
                                    absl::Span<const char32_t> alphabet = {});

// The least string greater than every string starting with `prefix`: the prefix with
// trailing 0xff bytes dropped and its last byte incremented; "" (no bound) when there is
// none (an empty prefix or one of only 0xff bytes).
std::string PrefixSuccessor(absl::string_view prefix);

}  // namespace internal
}  // namespace wharf
