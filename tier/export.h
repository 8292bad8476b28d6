// Exporting a tier path to a store (docs/design/tier.md, "Import and export"): the transfer
// engine from a TierTreeStore on the path to the destination, resumed by content, after
// aborting the multipart uploads that killed exports left for the same keys; each exported
// entry loses `local` (eviction may then remove it). `wharf tier export` and checkpoints
// (a directory of the tier copied to a bucket) call it.
//
// Thread-safety: ExportTierPath may be called from any thread; exports of the same keys
// running at the same time abort each other's uploads (see ExportTierPath). The observer and
// `on_warning` are called from the engine's and the export's threads, concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/runtime.h"
#include "io/transfer.h"
#include "store/object_store.h"
#include "tier/tier.h"

namespace wharf {

struct TierExportOptions {
  // As TransferOptions::filters, matched against each file's path relative to the exported
  // directory (for one file, its name).
  std::vector<TransferFilter> filters;
  // Parallel list calls for the destination (a tier directory is walked by one).
  int list_workers = 16;
  // How the exported objects are stored (content type, storage class, encryption), and
  // whether an object without put.content_type gets its extension's (as TransferOptions).
  PutOptions put;
  bool guess_content_type = true;
  // Requests in flight (0: the runtime's setting) and the export's cap on the runtime's
  // memory budget (0: the whole budget).
  int inflight = 0;
  uint64_t memory_budget = 0;
  std::shared_ptr<Runtime> runtime;  // null: Runtime::Default()
  // Called with each entry that could not be marked exported (it still says `local`), as it
  // happens; the returned status counts them. May be empty.
  std::function<void(const absl::Status&)> on_warning;
  // Exporting a directory: also delete the objects below the destination prefix that the
  // directory does not have (among those the filters select), as TransferOptions::delete_extra.
  bool delete_extra = false;
};

struct TierExportSummary {
  // listed (1 for one file), objects and bytes uploaded, skipped (already there: same size
  // and ETag), failed, elapsed. Objects the filters selected: objects + skipped + failed.
  TransferSummary transfer;
  // Multipart uploads of the exported keys that earlier (killed) exports left, aborted.
  uint64_t aborted_uploads = 0;
  // The destination's URI as given: dst.store->Uri(dst.key) (the object, or the prefix it
  // went below).
  std::string dst_uri;
};

// Exports the file or directory `path` (inside `tier`; made absolute) to `dst`: each file REL
// below the directory becomes dst.key joined with REL (the tier's `.wharf` is never listed);
// one file goes to dst.key, or below it under its own name when dst.key is empty or ends in
// '/'. Steps:
//  1. Aborts the in-progress multipart uploads below the destination whose key this export
//     writes (a file below `path` the filters select): a process killed with -9 cannot abort
//     its own. They are listed before this export starts any upload, so each was initiated
//     before it; an export of the same keys running elsewhere at that moment loses its
//     uploads and fails. Uploads of other keys are left alone. Stores without multipart
//     uploads have nothing to abort.
//  2. Transfers with TransferMode::kCopy: what the destination holds with the same size and
//     ETag is skipped (an entry lists with its source's ETag, or, for data written to the
//     tier, the MD5 of its content).
//  3. Marks each object copied or skipped: its entry loses `local` and, when it has no
//     source, takes the exported object's URI and ETag as its provenance (so a rerun skips
//     it even when that ETag is a multipart one). Only an entry that still holds what was
//     listed is marked. Waits for the marks before returning.
// `observer` (may be null) receives the transfer's callbacks (progress, failures) besides
// the marking. Errors: the transfer's ("N of M objects failed", each failure also went to
// the observer); then, when marks failed, the first failure's code with "N exported entries
// still say local (FIRST'S MESSAGE)" (each also went to options.on_warning).
// InvalidArgument for a path outside the tier or inside its own folder; errors name `path`.
absl::StatusOr<TierExportSummary> ExportTierPath(std::shared_ptr<Tier> tier,
                                                 const std::string& path,
                                                 const TransferEndpoint& dst,
                                                 const TierExportOptions& options,
                                                 TransferObserver* observer = nullptr);
// The same, and what it did also when it fails: *summary holds the counts of the transfer
// (and the aborted uploads) whether or not the status is OK. REQUIRES: summary != nullptr.
absl::Status ExportTierPath(std::shared_ptr<Tier> tier, const std::string& path,
                            const TransferEndpoint& dst, const TierExportOptions& options,
                            TierExportSummary* summary, TransferObserver* observer = nullptr);

}  // namespace wharf
