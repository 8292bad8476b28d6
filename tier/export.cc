// Exporting a tier path: a transfer from the tier's tree store, the sweep of leftover
// uploads before it, and the marks after each object (docs/design/tier.md).
#include "tier/export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "base/bounded_worker.h"
#include "base/status.h"
#include "io/multipart_etag.h"
#include "store/keys.h"
#include "tier/tree_store.h"

namespace wharf {
namespace {

// The export's observer: forwards every callback to the caller's observer (progress), and
// each exported entry loses `local` (its data now exists elsewhere, so eviction may remove
// it). An entry with no source also takes the exported object's URI and ETag as its
// provenance, so it lists with the destination's ETag and a rerun skips it even when that
// ETag is a multipart one (no MD5). The attribute is written on a thread of its own, not on
// the transport thread that reports a put, except when kMaxPendingMarks marks are waiting
// already (then that thread writes it).
class ExportMarker : public TransferObserver {
 public:
  ExportMarker(std::string dir, std::shared_ptr<ObjectStore> dst, TransferObserver* next,
               std::function<void(const absl::Status&)> on_warning)
      : dir_(std::move(dir)),
        dst_(std::move(dst)),
        next_(next),
        on_warning_(std::move(on_warning)) {}
  ExportMarker(const ExportMarker&) = delete;
  ExportMarker& operator=(const ExportMarker&) = delete;

  void OnPlanned(uint64_t objects, uint64_t bytes) override {
    if (next_ != nullptr) next_->OnPlanned(objects, bytes);
  }
  void OnPlanFinal() override {
    if (next_ != nullptr) next_->OnPlanFinal();
  }
  void OnBytes(uint64_t bytes) override {
    if (next_ != nullptr) next_->OnBytes(bytes);
  }
  void OnObjectDone(const std::string& src_uri, const std::string& dst_uri) override {
    if (next_ != nullptr) next_->OnObjectDone(src_uri, dst_uri);
  }
  void OnError(const absl::Status& status) override {
    if (next_ != nullptr) next_->OnError(status);
  }
  bool ShowsErrors() const override { return next_ != nullptr && next_->ShowsErrors(); }
  void OnDryrun(absl::string_view op, const std::string& src_uri,
                const std::string& dst_uri) override {
    if (next_ != nullptr) next_->OnDryrun(op, src_uri, dst_uri);
  }

  void OnObjectAt(const ObjectMeta& src, const ObjectMeta& dst, bool copied) override {
    if (next_ != nullptr) next_->OnObjectAt(src, dst, copied);
    marker_->Run([this, src, dst] {
      absl::Status s = MarkExported(absl::StrCat(dir_, "/", src.key), src, dst);
      if (s.ok()) return;
      if (on_warning_) on_warning_(s);
      absl::MutexLock lock(&mu_);
      if (unmarked_++ == 0) first_ = s;
    });
  }

  // Waits for the attributes still being written; the first failure, if any. Call once,
  // after the transfer.
  absl::Status Finish() {
    marker_.reset();  // runs what is queued, then joins
    absl::MutexLock lock(&mu_);
    if (unmarked_ == 0) return absl::OkStatus();
    return absl::Status(
        first_.code(),
        absl::StrCat(unmarked_, " exported entries still say local (", first_.message(), ")"));
  }

 private:
  // Clears `local` on the entry at `path` if it still holds what was exported (a file
  // replaced since it was listed keeps its flag: its new content is not at the destination).
  absl::Status MarkExported(const std::string& path, const ObjectMeta& src, const ObjectMeta& dst) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::OkStatus();  // gone since: nothing to mark
    std::optional<TierEntry> entry = ReadEntryAttr(fd);
    struct stat st;
    absl::Status s;
    if (fstat(fd, &st) == 0 && IsCompleteEntry(entry, st) && entry->local &&
        entry->size == src.size && EntryEtag(*entry) == src.etag) {
      entry->local = false;
      if (entry->source.empty()) {
        entry->source = dst_->Uri(dst.key);
        entry->etag = dst.etag;
      }
      s = Annotate(WriteEntryAttr(fd, *entry), absl::StrCat("marking ", path, " exported"));
    }
    close(fd);
    return s;
  }

  const std::string dir_;
  const std::shared_ptr<ObjectStore> dst_;
  TransferObserver* const next_;  // may be null
  const std::function<void(const absl::Status&)> on_warning_;
  absl::Mutex mu_;
  uint64_t unmarked_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_ ABSL_GUARDED_BY(mu_);
  // One thread: attribute writes are small, and on a shared file system each is a metadata
  // round trip that should not hold up the transfer's threads. Bounded: marks come as fast
  // as the listing finds objects already exported (a rerun over millions of files) or
  // uploads finish, faster than a shared file system takes attribute writes; beyond
  // kMaxPendingMarks waiting, the thread that reports an object marks it itself, so the
  // queue's memory stays bounded (a few hundred bytes a mark) and the export slows to the
  // rate of its marks instead. Last: joined first.
  static constexpr size_t kMaxPendingMarks = 4096;
  std::unique_ptr<BoundedWorker> marker_ = std::make_unique<BoundedWorker>(kMaxPendingMarks);
};

// Aborts the multipart uploads that killed exports left below the destination (a process
// killed with -9 cannot abort its own; failures abort theirs, io/transfer.h). Only uploads
// of keys this export writes: `ours(key)` true for a key it would write. Listed before
// this run starts any upload, so every one of them was initiated before the run; an export
// of the same keys running elsewhere at the same time would lose its uploads (and fail),
// which we prefer to leaving parts behind that the bucket's owner pays for. Stores without
// multipart uploads have nothing to sweep.
absl::StatusOr<uint64_t> AbortLeftoverUploads(ObjectStore& dst, const std::string& prefix,
                                              const std::function<bool(absl::string_view)>& ours) {
  absl::StatusOr<std::vector<PendingUpload>> uploads = dst.ListUploads(prefix);
  if (absl::IsUnimplemented(uploads.status())) return 0;
  if (!uploads.ok()) return uploads.status();
  uint64_t aborted = 0;
  for (const PendingUpload& u : *uploads) {
    if (!ours(u.key)) continue;
    WHARF_RETURN_IF_ERROR(dst.AbortUpload(u.key, u.upload_id));
    ++aborted;
  }
  return aborted;
}

// Whether the tree's file `name` holds the bytes of `have`, an object of its size uploaded in
// parts (its multipart ETag reproduced from the file: io/multipart_etag.h).
bool SameInParts(ObjectStore& tree, const std::string& name, const ObjectMeta& have,
                 const TransferOptions& transfer) {
  absl::StatusOr<bool> same =
      MultipartEtagMatches(tree, name, have.size, have.etag, transfer.part_size);
  return same.ok() && *same;
}

}  // namespace

absl::StatusOr<TierExportSummary> ExportTierPath(std::shared_ptr<Tier> tier,
                                                 const std::string& path,
                                                 const TransferEndpoint& dst,
                                                 const TierExportOptions& options,
                                                 TransferObserver* observer) {
  TierExportSummary summary;
  WHARF_RETURN_IF_ERROR(ExportTierPath(std::move(tier), path, dst, options, &summary, observer));
  return summary;
}

absl::Status ExportTierPath(std::shared_ptr<Tier> tier, const std::string& path,
                            const TransferEndpoint& dst, const TierExportOptions& options,
                            TierExportSummary* out, TransferObserver* observer) {
  *out = TierExportSummary{.dst_uri = dst.store->Uri(dst.key)};
  // Normalized: `dir` is compared with the tier root and joined with relative keys.
  const std::string target = tier->PathIn(path);
  if (target != tier->root() && !absl::StartsWith(target, absl::StrCat(tier->root(), "/"))) {
    return absl::InvalidArgumentError(
        absl::StrCat("tier export ", target, ": not inside the tier ", tier->root()));
  }
  struct stat st;
  if (stat(target.c_str(), &st) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("tier export ", target));
  }
  const bool one_file = S_ISREG(st.st_mode);
  const std::string dir = one_file ? target.substr(0, target.rfind('/')) : target;
  std::shared_ptr<Runtime> runtime = options.runtime ? options.runtime : Runtime::Default();

  TransferOptions transfer;
  // kCopy: skip what the destination holds with the same size and ETag. A tier entry lists
  // with its source's ETag, or (data written to the tier) the MD5 of its content until it is
  // exported, and then the exported object's ETag (ExportMarker): so the comparison is by
  // content, multipart uploads included, and a changed file (a new entry) is uploaded again.
  // kSync's size-and-mtime rule would trust clocks and skip a file rewritten in the second
  // of its upload.
  transfer.mode = TransferMode::kCopy;
  transfer.recursive = !one_file;
  transfer.delete_extra = options.delete_extra && !one_file;
  transfer.filters = options.filters;
  transfer.list_workers = options.list_workers;
  transfer.put = options.put;
  transfer.guess_content_type = options.guess_content_type;
  transfer.inflight = options.inflight;
  transfer.memory_budget = options.memory_budget;
  transfer.runtime = runtime;

  // What killed runs left: first their uploads of the keys this run writes.
  std::string dst_prefix;
  std::function<bool(absl::string_view)> ours;
  if (one_file) {
    const std::string name = target.substr(dir.size() + 1);
    dst_prefix = dst.key.empty() || dst.key.back() == '/' ? JoinKey(dst.key, name) : dst.key;
    ours = [&](absl::string_view key) {
      return key == dst_prefix && PassesFilters(transfer.filters, name);
    };
  } else {
    dst_prefix = AsPrefix(dst.key);
    const bool at_root = dir == tier->root();
    ours = [&](absl::string_view key) {
      absl::string_view rel = key;
      if (!absl::ConsumePrefix(&rel, dst_prefix) || !IsSafeRelativeKey(rel)) return false;
      if (at_root &&
          (rel == Tier::kMetaDir || absl::StartsWith(rel, absl::StrCat(Tier::kMetaDir, "/")))) {
        return false;
      }
      struct stat fst;
      const std::string file = absl::StrCat(dir, "/", rel);
      return PassesFilters(transfer.filters, rel) && lstat(file.c_str(), &fst) == 0 &&
             S_ISREG(fst.st_mode);
    };
  }
  absl::StatusOr<uint64_t> aborted = AbortLeftoverUploads(*dst.store, dst_prefix, ours);
  if (!aborted.ok()) return Annotate(aborted.status(), absl::StrCat("tier export ", target));
  out->aborted_uploads = *aborted;

  ExportMarker marker(dir, dst.store, observer, options.on_warning);
  TransferSummary& summary = out->transfer;
  absl::Status transferred;
  {
    TierTreeOptions tree_options;
    tree_options.plain_file_etags = true;  // so a rerun skips the user's files already there
    WHARF_ASSIGN_OR_RETURN(std::shared_ptr<TierTreeStore> tree,
                           TierTreeStore::Open(tier, dir, runtime, tree_options));
    if (one_file) {
      const std::string name = target.substr(dir.size() + 1);
      // kCopy checks the destination only for prefixes: the same check for the one file.
      absl::StatusOr<ObjectMeta> mine = tree->Head(name);
      absl::StatusOr<ObjectMeta> have = dst.store->Head(dst_prefix);
      if (!PassesFilters(transfer.filters, name)) {
        summary = TransferSummary{.listed = 1};
      } else if (mine.ok() && have.ok() && !mine->etag.empty() && mine->size == have->size &&
                 (mine->etag == have->etag || SameInParts(*tree, name, *have, transfer))) {
        summary = TransferSummary{.listed = 1, .skipped = 1};
        marker.OnObjectAt(*mine, *have, /*copied=*/false);
      } else {
        transferred =
            TransferWithSummary({tree, name}, {dst.store, dst_prefix}, transfer, &summary, &marker);
      }
    } else {
      transferred =
          TransferWithSummary({tree, ""}, {dst.store, dst.key}, transfer, &summary, &marker);
      // A folder that exists and holds no file exports nothing, successfully (a NotFound
      // from the destination, a missing bucket, stays an error).
      if (absl::IsNotFound(transferred) && summary.listed == 0) {
        ListOptions top;
        top.delimiter = "/";  // the folder's first level is enough to tell
        absl::StatusOr<ListPage> page = tree->ListAll(top);
        if (page.ok() && page->objects.empty() && page->common_prefixes.empty()) {
          transferred = absl::OkStatus();
        }
      }
    }
  }
  absl::Status marked = marker.Finish();
  WHARF_RETURN_IF_ERROR(transferred);
  return marked;
}

}  // namespace wharf
