// Transfer: the one engine that moves objects between stores (docs/design/transfer.md).
// `wharf cp`, `wharf sync`, and later the tier's import and export are calls to it.
//
// One object or every object below a prefix goes from a source store to a destination
// store (local paths are file:// stores). Within one store it asks for server-side copies.
// Across stores, a listing thread feeds the fetch engine, which keeps many requests in
// flight under the runtime's memory budget; small objects are put asynchronously as they
// arrive, and big ones move as ordered part streams (one part plan: `part_size`, doubled
// every 1,000 parts, as S3's multipart parts) pumped into a writer, as do single objects,
// standard input and standard output. So objects of any size move through a bounded budget.
// Memory stays flat in the number of objects: the listing runs at most a bounded distance
// ahead of the copies, outcomes are counters, and what the destination already holds is
// kept as 48 bytes per destination object.
//
// Every object appears at its destination complete or not at all. Keys that would land
// outside the destination ("..", absolute paths, "//") are refused. A rerun skips what the
// destination already holds (copy: same size and ETag; sync: see TransferMode).
//
// Thread-safety: Transfer() may be called from any thread; the observer is called from the
// engine's threads, concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/runtime.h"
#include "store/object_store.h"

namespace wharf {

// One include/exclude rule. Patterns match the key relative to the source prefix; `*`
// matches any run of characters ('/' included), `?` one character, `[...]` a set, as in
// `aws s3`. Every object is included unless a rule says otherwise; the last rule that
// matches decides.
struct TransferFilter {
  bool include = false;
  std::string pattern;
};
// Whether `relative_key` passes `filters`.
bool PassesFilters(const std::vector<TransferFilter>& filters, absl::string_view relative_key);
// The shard (0..count-1) of a key relative to the transfer's source prefix: FNV-1a 64 of the
// key, modulo `count`. Stable across runs, machines and versions (distributed imports rely on
// it). REQUIRES: count >= 1.
int TransferShardOf(absl::string_view relative_key, int count);

enum class TransferMode {
  // Copy everything selected; skip what the destination holds with the same size and ETag
  // (a rerun resumes).
  kCopy,
  // Copy what is missing or differs: by size and ETag between two remote stores, by size
  // and modification time when one side is local (a destination older than its source is
  // copied again; downloads set the file's time to the object's).
  kSync,
};

struct TransferOptions {
  TransferMode mode = TransferMode::kCopy;
  // The source is a prefix: every object below it. Otherwise one object.
  bool recursive = false;
  // Delete objects below the destination prefix that the source does not have (among those
  // the filters select), after a complete listing: `sync --delete`, and `tier import`, whose
  // tree drops what the source deleted.
  bool delete_extra = false;
  // With delete_extra: only the destination objects for which it returns true are deleted
  // (unset: every one). Called on the engine's threads.
  std::function<bool(const ObjectMeta&)> deletable;
  // Report what would be done (TransferObserver::OnPlanned) and do nothing.
  bool dryrun = false;
  std::vector<TransferFilter> filters;
  // Distributed transfers: only the objects whose relative key falls in shard `shard_index`
  // of `shard_count` (TransferShardOf), so `shard_count` processes with indexes 0..count-1
  // together move every object exactly once. 1: everything.
  int shard_index = 0;
  int shard_count = 1;
  // Requests in flight (0: the runtime's setting, else derived) and this transfer's cap on
  // the runtime's memory budget (0: the whole budget).
  int inflight = 0;
  uint64_t memory_budget = 0;
  // Parallel list calls for a remote store (a local tree is walked by one).
  int list_workers = 16;
  // How new objects are stored (content type, storage class, encryption).
  PutOptions put;
  // Without put.content_type: each object uploaded to a store that keeps content types gets
  // the one its key's extension names (ContentTypeOfKey; none for an unknown extension).
  bool guess_content_type = true;
  // Objects larger than this are streamed in ordered parts of `part_size`, doubled every
  // 1,000 parts (0: from the runtime's link estimate of the source).
  uint64_t stream_threshold = uint64_t{16} << 20;
  uint64_t part_size = uint64_t{8} << 20;
  std::shared_ptr<Runtime> runtime;  // null: Runtime::Default()
};

// Progress and per-object outcomes, called concurrently from the engine's threads.
class TransferObserver {
 public:
  virtual ~TransferObserver() = default;
  // Objects (and bytes) found to transfer; `final` once the listing is complete.
  virtual void OnPlanned(uint64_t /*objects*/, uint64_t /*bytes*/) {}
  virtual void OnPlanFinal() {}
  virtual void OnBytes(uint64_t /*bytes*/) {}
  virtual void OnObjectDone(const std::string& /*src_uri*/, const std::string& /*dst_uri*/) {}
  // An object is at its destination: copied (`copied`), or skipped because the destination
  // already held it with the same size and ETag. `src` is the source's listing (key, size,
  // ETag), `dst` the destination object (key, size, and the ETag its store reported; for a
  // skipped object the source's, which the destination's equals). Called after OnObjectDone,
  // possibly on a transport thread: an observer that must block hands the work on.
  virtual void OnObjectAt(const ObjectMeta& /*src*/, const ObjectMeta& /*dst*/, bool /*copied*/) {}
  // One object of a recursive transfer failed (or was refused); the transfer goes on with the
  // others. A single-object transfer returns its failure instead (reported once).
  virtual void OnError(const absl::Status& /*status*/) {}
  // Whether OnError shows each failure to the user (the CLI's lines). Where it does not, a
  // transfer's count of failures carries the first one's cause.
  virtual bool ShowsErrors() const { return false; }
  // kDryrun: an operation that would run: op is "copy", "upload", "download" or "delete".
  virtual void OnDryrun(absl::string_view /*op*/, const std::string& /*src_uri*/,
                        const std::string& /*dst_uri*/) {}
};

struct TransferSummary {
  uint64_t listed = 0;   // source objects listed (recursive) or 1
  uint64_t objects = 0;  // copied
  uint64_t bytes = 0;    // copied
  uint64_t skipped = 0;  // already at the destination
  uint64_t failed = 0;
  uint64_t deleted = 0;  // delete_extra
  absl::Duration elapsed;
};

struct TransferEndpoint {
  std::shared_ptr<ObjectStore> store;
  // The object's key, or the prefix for a recursive transfer ("" = the whole store).
  std::string key;
};

// Moves `src` to `dst`. For one object, a `dst.key` that is empty or ends in '/' receives
// the object under its own base name. OK when every selected object made it; otherwise
// the first failure's code with "N of M objects failed" (each failure also went to the
// observer). NotFound when a recursive source lists nothing.
absl::StatusOr<TransferSummary> Transfer(const TransferEndpoint& src, const TransferEndpoint& dst,
                                         const TransferOptions& options,
                                         TransferObserver* observer = nullptr);
// The same, and what it did also when it fails: *summary holds the counts (listed, copied,
// skipped, failed) whether or not the status is OK, so a caller can report a partial
// transfer (a --json summary with `failed` > 0). REQUIRES: summary != nullptr.
absl::Status TransferWithSummary(const TransferEndpoint& src, const TransferEndpoint& dst,
                                 const TransferOptions& options, TransferSummary* summary,
                                 TransferObserver* observer = nullptr);

// Streams one object into `fd` (stdout) in order, through the engine (parts in parallel).
absl::Status TransferToFd(const TransferEndpoint& src, int fd, const TransferOptions& options,
                          TransferObserver* observer = nullptr);
// Uploads everything read from `fd` (stdin) as one object, in parts, atomically at EOF.
absl::StatusOr<ObjectMeta> TransferFromFd(int fd, const TransferEndpoint& dst,
                                          const TransferOptions& options,
                                          TransferObserver* observer = nullptr);

}  // namespace wharf
