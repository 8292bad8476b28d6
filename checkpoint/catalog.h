// Checkpoint roots: where checkpoints live (a bucket prefix, a local directory, or a directory
// of a tier), the layout inside them, and the operations on whole checkpoints: list the
// complete ones, commit one by writing its manifest last, delete one, remove what abandoned
// saves left, and copy one between roots (export to the bucket, restore from it), manifest
// last (docs/design/checkpoint.md).
//
// Layout: `<root>/step-<N:012d>/` holds one checkpoint's files (for torch.distributed.checkpoint
// the ranks' `__<rank>_<i>.distcp` files and `.metadata`) and, written after all of them,
// `manifest.json`: step, time, metrics, world size and every file with its size and ETag. A
// checkpoint exists only once its manifest does, so a reader never sees a partial one, and a
// crash mid-save leaves the earlier checkpoints as they were. `<root>/checkpoints.json` holds
// the root's settings (where it exports to, the metric that ranks checkpoints).
//
// A root inside a tier is written through the tier's tree store: each file becomes a tier
// entry marked `local` (it exists nowhere else, so eviction never removes it) until it is
// exported; puts are durable when they complete (batched syncfs). A local directory outside
// any tier is written with an fsync per file. Every other URI is a store prefix.
//
// Thread-safety: a CheckpointRoot may be used from several threads; two processes may work on
// one root as long as they do not save the same step at once (ranks write different files).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/runtime.h"
#include "io/transfer.h"
#include "store/object_store.h"
#include "store/spec.h"
#include "tier/tier.h"

namespace wharf::checkpoint {

inline constexpr char kManifestName[] = "manifest.json";
inline constexpr char kRootConfigName[] = "checkpoints.json";

// "step-000000000042". REQUIRES: step >= 0.
std::string StepDirName(int64_t step);
// The step of a directory name "step-<digits>" (any number of digits), else nullopt.
std::optional<int64_t> ParseStepDirName(absl::string_view name);

struct ManifestFile {
  std::string path;  // relative to the step directory
  uint64_t size = 0;
  std::string etag;  // the store's ETag when committed ("" where the store has none)
};

// What manifest.json says about one committed checkpoint.
struct Manifest {
  int64_t step = 0;
  absl::Time time = absl::InfinitePast();  // when it was committed
  std::map<std::string, double> metrics;
  std::vector<ManifestFile> files;  // sorted by path; manifest.json itself not included
  uint64_t bytes = 0;               // sum of the files' sizes
  int world_size = 1;
  // How the files are laid out: "dcp" (torch.distributed.checkpoint), or "files".
  std::string layout = "dcp";
  // The caller's own JSON object (e.g. the training framework's extra fields), kept verbatim.
  std::string user_json = "{}";

  std::string ToJson() const;
  // InvalidArgument naming `what` for a document that is not a manifest of this format.
  static absl::StatusOr<Manifest> FromJson(absl::string_view json, absl::string_view what);
};

// checkpoints.json: the root's settings, written by the CheckpointManager.
struct RootConfig {
  std::string export_to;     // the URI selected checkpoints are exported to ("" none)
  std::string metric;        // the metric "best" ranks by ("" none)
  std::string mode = "min";  // "min" or "max"

  std::string ToJson() const;
  static absl::StatusOr<RootConfig> FromJson(absl::string_view json, absl::string_view what);
};

// Which checkpoint: the latest, the best by a metric, or one step.
struct Selector {
  enum class Kind { kLatest, kBest, kStep } kind = Kind::kLatest;
  int64_t step = 0;    // kStep
  std::string metric;  // kBest
  bool maximize = false;
};
// The manifest `selector` picks among `complete` (any order). NotFound naming `root_uri`
// and what was asked when none qualifies (kBest: none records the metric).
absl::StatusOr<Manifest> Select(const std::vector<Manifest>& complete, const Selector& selector,
                                absl::string_view root_uri);

class CheckpointRoot {
 public:
  // Opens the root at `uri_or_path` (a URI or a local path; see the header comment for how
  // local paths are written). Nothing is created until something is written.
  static absl::StatusOr<std::shared_ptr<CheckpointRoot>> Open(
      absl::string_view uri_or_path, const StoreOptions& options = {},
      std::shared_ptr<Runtime> runtime = Runtime::Default());

  // The root's URI with a trailing '/' ("s3://b/ckpt/", "file:///tier/ckpt/").
  const std::string& uri() const { return uri_; }
  const std::shared_ptr<ObjectStore>& store() const { return store_; }
  // The root's key prefix in store() ("" or ending in '/').
  const std::string& prefix() const { return prefix_; }
  // The enclosing tier, when the root is a directory inside one.
  const std::shared_ptr<Tier>& tier() const { return tier_; }
  // The absolute directory of a local root ("" for a remote one).
  const std::string& local_dir() const { return local_dir_; }
  bool is_local() const { return !local_dir_.empty(); }

  std::string StepPrefix(int64_t step) const;
  std::string StepUri(int64_t step) const;

  struct Listing {
    std::vector<Manifest> complete;   // by step
    std::vector<int64_t> incomplete;  // step directories without a manifest
    // Step directories whose manifest is not one (malformed, or naming another step), with
    // why: neither listed nor restorable, and never removed except by an explicit Delete.
    std::vector<std::pair<int64_t, absl::Status>> damaged;
  };
  // The checkpoints below the root (a missing root lists nothing).
  absl::StatusOr<Listing> List() const;
  // The manifest of `step`; NotFound when it has none (absent or incomplete).
  absl::StatusOr<Manifest> Read(int64_t step) const;
  // The files of `step` as they are here now (path relative to the step, size, ETag),
  // checked against its manifest: DataLoss naming the first file the manifest lists that is
  // missing or has another size. A reader pins its reads to these ETags (the manifest's are
  // those of the place it was committed in; a copy elsewhere has its own).
  absl::StatusOr<std::vector<ManifestFile>> Files(const Manifest& manifest) const;

  struct CommitOptions {
    std::map<std::string, double> metrics;
    int world_size = 1;
    std::string layout = "dcp";
    std::string user_json = "{}";
    // Files that must be there, with at least these sizes (the writer's own account): a
    // commit that misses one fails and writes no manifest.
    std::map<std::string, uint64_t> expected;
  };
  // Lists the step's files and writes its manifest: from now on the checkpoint exists.
  absl::StatusOr<Manifest> Commit(int64_t step, const CommitOptions& options) const;

  // Removes a checkpoint: its manifest first (it stops existing at once), then its files and
  // any multipart upload left below it. A step that does not exist is OK.
  absl::Status Delete(int64_t step) const;
  // Removes every trace of incomplete saves of steps < `before_step` (files, temporary files
  // of killed writers in a local root, multipart uploads). Complete checkpoints and steps at
  // or above `before_step` (saves that may be running now) are left alone. Returns how many
  // step directories (or upload sets) it removed.
  absl::StatusOr<int> RemoveAbandoned(int64_t before_step) const;
  // What killed saves left directly in the root's folder, as DCP's StorageWriter writes a
  // checkpoint (its files, no step directories): the temporary files of writers that are gone
  // (a local folder) and the multipart uploads of its files (a store). A live writer's are
  // kept (its temporary file is locked; call it before this save's files are written, as the
  // coordinator plans). Returns how many it removed.
  absl::StatusOr<int> RemoveLeftovers() const;
  // Makes room for a new save of `step`: removes its manifest and everything below it.
  absl::Status Clear(int64_t step) const { return Delete(step); }

  // checkpoints.json (defaults when absent).
  absl::StatusOr<RootConfig> ReadConfig() const;
  absl::Status WriteConfig(const RootConfig& config) const;

 private:
  CheckpointRoot() = default;
  // Every key below `prefix` (recursive).
  absl::StatusOr<std::vector<ObjectMeta>> ListKeys(const std::string& prefix) const;
  // Aborts the multipart uploads below `prefix` accepted by `pick` (by key); how many.
  absl::StatusOr<int> AbortUploads(const std::string& prefix,
                                   const std::function<bool(absl::string_view)>& pick) const;

  std::string uri_;
  std::shared_ptr<ObjectStore> store_;
  std::string prefix_;
  std::shared_ptr<Tier> tier_;
  std::string local_dir_;
};

struct CopyOptions {
  int inflight = 0;                      // 0: the runtime's setting
  uint64_t memory_budget = 0;            // 0: the whole budget
  PutOptions put;                        // upload options at the destination
  TransferObserver* observer = nullptr;  // progress
  // An export (CheckpointManager's export_to, `wharf ckpt export`): from a tier, the copied
  // files lose `local` (kept elsewhere now, eviction may remove them). Any other copy (a
  // restore into a directory) leaves the tier's copy as it is.
  bool mark_exported = false;
};
struct CopySummary {
  Manifest manifest;
  uint64_t files = 0;    // copied
  uint64_t bytes = 0;    // copied
  uint64_t skipped = 0;  // already at the destination (same size and ETag)
  uint64_t aborted_uploads = 0;
  absl::Duration elapsed;
};
// Copies the complete checkpoint `step` of `from` into `to` (the same step directory name):
// the files first (in parallel, multipart for big ones; resumable: what the destination
// holds with the same size and ETag is skipped), then a check that the destination holds
// every file of the manifest with its size, then the manifest, so the copy exists only when
// whole. With options.mark_exported, from a tier the copied files lose `local` (eviction may
// now remove them). NotFound when `from` has no complete checkpoint `step`.
absl::StatusOr<CopySummary> CopyCheckpoint(const CheckpointRoot& from, const CheckpointRoot& to,
                                           int64_t step, const CopyOptions& options = {});

}  // namespace wharf::checkpoint
