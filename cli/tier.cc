// wharf tier: flag parsing and output around tier/ (docs/design/tier.md). Import is a
// transfer (io/transfer.h) into the tier's tree store, export is ExportTierPath
// (tier/export.h); the other sub-verbs walk the tier.
#include "tier/tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/hash.h"
#include "base/runtime.h"
#include "base/status.h"
#include "cli/common.h"
#include "cli/store_flags.h"
#include "cli/verbs.h"
#include "io/transfer.h"
#include "store/local/temp_object.h"
#include "tier/evict.h"
#include "tier/export.h"
#include "tier/tree_store.h"

namespace wharf::cli {
namespace {

using json = nlohmann::ordered_json;

// The checksum of a file's content, hex.
absl::StatusOr<std::string> FileChecksum(const std::string& path, uint64_t size, Checksum kind) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("reading ", path));
  auto sum = ChecksumOfFile(fd, size, kind);
  close(fd);
  return sum;
}

absl::Status RunInit(const TierArgs& args) {
  TierConfig config;
  std::string path = args.path;
  if (auto existing = Tier::Find(args.path); existing.ok()) {
    // As every tier verb, init takes any path inside a tier: it sets that tier's settings
    // (tiers do not nest).
    if ((*existing)->root() != AbsolutePath(args.path)) {
      path = (*existing)->root();
      std::fprintf(stderr,
                   "wharf: tier init %s: it is inside the tier at %s, whose settings "
                   "this sets (a tier holds no other tier)\n",
                   AbsolutePath(args.path).c_str(), path.c_str());
    }
    config = (*existing)->config();  // init on a tier changes only what is given
  }
  if (!args.mode.empty()) {
    WHARF_ASSIGN_OR_RETURN(config.mode, ParseTierMode(args.mode));
  }
  if (args.ttl_seconds > 0) config.ttl = absl::Seconds(args.ttl_seconds);
  if (!args.max_size.empty()) {
    WHARF_ASSIGN_OR_RETURN(config.max_size, ParseSize(args.max_size));
  }
  if (args.min_free >= 0) config.min_free = args.min_free;
  if (!args.block_size.empty()) {
    WHARF_ASSIGN_OR_RETURN(config.block_size, ParseSize(args.block_size));
  }
  if (!args.block_threshold.empty()) {
    WHARF_ASSIGN_OR_RETURN(config.block_threshold, ParseSize(args.block_threshold));
  }
  if (args.ttl_seconds > 0 && config.mode != TierConfig::Mode::kTtl) {
    return UsageError("tier init: --ttl applies in ttl mode (give --mode ttl)");
  }
  // Settings the tier cannot take are the command line's mistake.
  if (auto checked = TierConfig::FromJson(config.ToJson(), "tier init"); !checked.ok()) {
    return UsageError(checked.status().message());
  }
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<Tier> tier, Tier::Init(path, config));
  if (args.min_free > 0) {
    if (const std::string w = MinFreeIgnoredWarning(*tier); !w.empty()) {
      std::fprintf(stderr, "wharf: %s\n", w.c_str());
    }
  }
  if (!args.quiet) {
    Print(absl::StrFormat(
        "tier %s: mode %s%s, max size %s, min free %.1f%%, blocks of %s above %s\n", tier->root(),
        TierModeName(config.mode),
        config.mode == TierConfig::Mode::kTtl
            ? absl::StrFormat(" (ttl %.10g s)", absl::ToDoubleSeconds(config.ttl))
            : "",
        config.max_size == 0 ? "unbounded" : absl::StrCat(config.max_size), config.min_free,
        absl::StrCat(config.block_size), absl::StrCat(config.block_threshold)));
  }
  return absl::OkStatus();
}

// Whether the tree already holds `object` (imported under its base name, the place a
// one-object transfer puts it) with the same size and ETag.
bool OneObjectIsCurrent(ObjectStore& tree, const ObjectMeta& object) {
  const size_t slash = object.key.rfind('/');
  const std::string name = slash == std::string::npos ? object.key : object.key.substr(slash + 1);
  absl::StatusOr<ObjectMeta> have = tree.Head(name);
  return have.ok() && !object.etag.empty() && have->size == object.size &&
         have->etag == object.etag;
}

absl::Status RunImport(const TierArgs& args) {
  if ((args.rank >= 0) != (args.world_size > 0)) {
    return UsageError("tier import: give --rank and --world-size together");
  }
  if (args.world_size > 0 && args.rank >= args.world_size) {
    return UsageError(absl::StrCat("tier import: --rank ", args.rank, " is not below --world-size ",
                                   args.world_size));
  }
  if (args.path.empty()) return Tier::FindOrCreate("").status();  // says the path is empty
  WHARF_RETURN_IF_ERROR(ApplyEngineArgs(args.engine, args.jobs));
  WHARF_ASSIGN_OR_RETURN(OpenedUri src, OpenCliUri(args.src));
  const std::string dest = AbsolutePath(args.path);
  const bool local_source = src.uri.scheme == "file";
  if (local_source && !args.path.empty()) {
    // A tree importing itself would import its own copies (and its tier's files), growing
    // on every rerun.
    const std::string from = AbsolutePath(absl::StrCat("/", src.uri.key));
    if (dest == from || absl::StartsWith(dest, from == "/" ? from : from + "/")) {
      return absl::InvalidArgumentError(
          absl::StrCat("tier import: the destination ", dest, " is inside the source ", from));
    }
  }
  // The source first: a mistyped bucket or prefix creates no tier, folder or import record.
  WHARF_ASSIGN_OR_RETURN(Target target,
                         ResolveRecursiveTarget(*src.store, src.uri.key, "tier import"));
  if (!target.is_object) {
    absl::StatusOr<bool> any = PrefixHasObjects(*src.store, target.prefix);
    if (!any.ok()) return Annotate(any.status(), "tier import");
    if (!*any) {
      return absl::NotFoundError(absl::StrCat("tier import ", src.store->Uri(target.prefix),
                                              ": no such object or prefix"));
    }
  }
  if (struct stat st; stat(dest.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tier import ", dest, ": not a directory (the imported tree is one)"));
  }
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<Tier> tier, Tier::FindOrCreate(dest));
  // What killed runs left (their temporary files) goes first.
  WHARF_ASSIGN_OR_RETURN(Tier::Garbage garbage, tier->CollectGarbage());

  TransferOptions options;
  options.mode = TransferMode::kCopy;
  options.recursive = !target.is_object;
  options.list_workers = args.list_workers;
  if (!target.is_object) {
    // What the source no longer has goes from the tree too (after a complete listing), so
    // the tree stays the source's copy: the entries this import filled for that very key
    // (the source URI it would write there), not a user's own files, not another import's
    // tree below this one (its entries name other keys), nor what the user pinned.
    options.delete_extra = true;
    options.deletable = [dest, from = src.store->Uri(target.prefix)](const ObjectMeta& m) {
      const std::string path = absl::StrCat(dest, "/", m.key);
      const std::optional<TierEntry> entry = ReadEntryAttr(path);
      return entry.has_value() && entry->source == absl::StrCat(from, m.key) && !IsPinned(path);
    };
  }
  if (local_source) {
    // A local source holding a tier (or being one): its .wharf is the tier's own state
    // (settings, records, locks, temporary files), never data, as `tier export` skips it.
    options.filters = {{false, absl::StrCat(Tier::kMetaDir, "/*")},
                       {false, absl::StrCat("*/", Tier::kMetaDir, "/*")}};
  }
  if (args.world_size > 0) {
    options.shard_index = args.rank;
    options.shard_count = args.world_size;
  }
  Progress progress(Progress::ShouldShow(args.quiet || args.json));
  // Also sums the bytes of the whole imported tree (copied and already current).
  class ImportObserver : public ProgressObserver {
   public:
    using ProgressObserver::ProgressObserver;
    void OnObjectAt(const ObjectMeta& src, const ObjectMeta& dst, bool) override {
      tree_bytes.fetch_add(src.size, std::memory_order_relaxed);
      tree_files.fetch_add(1, std::memory_order_relaxed);
      // The disk space the file takes, as the bound counts it: whole blocks.
      tree_disk_bytes.fetch_add((src.size + block - 1) / block * block, std::memory_order_relaxed);
      if (sampled.load(std::memory_order_acquire)) return;  // no lock per object
      absl::MutexLock lock(&mu);
      if (sample_key.empty()) sample_key = dst.key;
      sampled.store(true, std::memory_order_release);
    }
    // Each file's own share beyond its data blocks (an attribute block where the entry's
    // attributes do not fit in the inode: 4 KiB a file on ext4), as one imported file shows.
    uint64_t PerFileOverhead(const std::string& dir) {
      absl::MutexLock lock(&mu);
      struct stat st;
      if (sample_key.empty() || stat(absl::StrCat(dir, "/", sample_key).c_str(), &st) != 0) {
        return 0;
      }
      const uint64_t data = (uint64_t(st.st_size) + block - 1) / block * block;
      return DiskBytes(st) > data ? DiskBytes(st) - data : 0;
    }
    uint64_t block = 4096;
    std::atomic<uint64_t> tree_bytes{0};
    std::atomic<uint64_t> tree_files{0};
    std::atomic<uint64_t> tree_disk_bytes{0};
    std::atomic<bool> sampled{false};
    absl::Mutex mu;
    std::string sample_key ABSL_GUARDED_BY(mu);
  } observer(progress);
  if (struct statvfs vfs; statvfs(dest.c_str(), &vfs) == 0 && vfs.f_frsize > 0) {
    observer.block = vfs.f_frsize;
  }
  TransferSummary counts;  // also when the import fails
  absl::StatusOr<TransferSummary> summary;
  std::string source_uri;
  {
    // Puts complete once written and queued: the engine does not wait for each batch's
    // syncfs; Flush() below waits for the last batch and reports any file not published.
    const absl::Time started = absl::Now();
    TierTreeOptions tree_options;
    tree_options.complete_before_publish = true;
    tree_options.on_unpublished = [&observer](const absl::Status& s) { observer.OnError(s); };
    WHARF_ASSIGN_OR_RETURN(std::shared_ptr<TierTreeStore> tree,
                           TierTreeStore::Open(tier, dest, Runtime::Default(), tree_options));
    const std::string& key = target.is_object ? target.object.key : target.prefix;
    source_uri = src.store->Uri(key);
    absl::Status transferred;
    if (target.is_object && OneObjectIsCurrent(*tree, target.object)) {
      // Transfer copies one object unconditionally: a rerun keeps what is current.
      counts = TransferSummary{.listed = 1, .skipped = 1};
      observer.OnObjectAt(target.object, target.object, /*copied=*/false);
    } else {
      transferred = TransferWithSummary({src.store, key}, {tree, ""}, options, &counts, &observer);
    }
    absl::Status published = tree->Flush();
    // Files written but not published were counted as copied: they failed.
    const uint64_t unpublished = std::min<uint64_t>(tree->FailedToPublish(), counts.objects);
    counts.objects -= unpublished;
    counts.failed += unpublished;
    if (unpublished > 0 && (transferred.ok() || counts.failed > unpublished)) {
      // Each failure was named on its own line as it happened; one count for them all.
      const absl::Status first = transferred.ok() ? published : transferred;
      transferred = absl::Status(
          first.code(), absl::StrCat("tier import ", src.store->Uri(src.uri.key), ": ",
                                     counts.failed, " of ", counts.listed, " objects failed"));
    }
    counts.elapsed = absl::Now() - started;  // the last batch included
    if (transferred.ok()) {
      summary = counts;
    } else {
      summary = transferred;
    }
  }  // the tree store publishes what it still holds
  progress.Stop();
  // The --json summary, also of a partly failed import (its error then follows on stderr).
  auto summary_json = [&] {
    json j;
    j["source"] = source_uri;
    j["dest"] = dest;
    j["tier"] = tier->root();
    j["objects"] = counts.objects + counts.skipped + counts.failed;
    j["bytes"] = counts.bytes;
    j["fetched"] = counts.objects;
    j["skipped"] = counts.skipped;
    j["failed"] = counts.failed;
    j["deleted"] = counts.deleted;
    j["seconds"] = absl::ToDoubleSeconds(counts.elapsed);
    j["garbage_removed"] = garbage.files;
    return j;
  };
  if (!summary.ok() && args.json && counts.listed > 0) {
    json j = summary_json();
    j["error"] = OneLine(summary.status().message());
    Print(JsonLine(j));
  }
  if (!target.is_object) {
    // A run that copied or kept every object it listed makes the tree a complete listing
    // of the source (the tier answers listings from it); any other run says it is not.
    TierImport record{.source = source_uri, .dir = tier->Relative(dest)};
    if (summary.ok() && summary->failed == 0) {
      record.completed = absl::Now();
      // The files the tree holds: the listing less directory markers ("dir/"), which a
      // file tree has no place for.
      record.objects = summary->objects + summary->skipped;
    }
    if (args.world_size > 0) {
      record.rank = args.rank;
      record.world_size = args.world_size;
    }
    absl::Status recorded = tier->RecordImport(record);
    if (!summary.ok()) return summary.status();
    WHARF_RETURN_IF_ERROR(recorded);
  }
  if (!summary.ok()) return summary.status();
  // Imported files are evictable entries: a tree larger than the tier's bound cannot stay whole.
  // The bound counts disk space: many small files take whole blocks each (1,000-byte files,
  // 4 KiB apiece), so the estimate of that, not the bytes, is compared.
  const uint64_t tree_bytes = observer.tree_bytes.load();
  const uint64_t tree_disk_bytes =
      observer.tree_disk_bytes.load() + observer.tree_files.load() * observer.PerFileOverhead(dest);
  const uint64_t max_size = tier->config().max_size;
  if (max_size > 0 && tree_disk_bytes > max_size) {
    const std::string warning = absl::StrFormat(
        "wharf: tier import: the imported tree (%s MB, about %s MB of disk) is larger than the "
        "tier's max size (%s MB of disk): eviction will remove its least recently used files "
        "unless they are pinned (wharf tier pin %s) or the bound is raised (wharf tier init %s "
        "--max-size SIZE)\n",
        Megabytes(tree_bytes), Megabytes(tree_disk_bytes), Megabytes(max_size), dest, tier->root());
    std::fwrite(warning.data(), 1, warning.size(), stderr);
  }
  const double seconds = absl::ToDoubleSeconds(summary->elapsed);
  if (args.json) {
    json j = summary_json();
    j["tree_bytes"] = tree_bytes;
    j["tree_disk_bytes"] = tree_disk_bytes;  // an estimate: whole blocks, and attributes, per file
    if (args.world_size > 0) {
      j["rank"] = args.rank;
      j["world_size"] = args.world_size;
    }
    Print(JsonLine(j));
  } else if (!args.quiet) {
    Print(absl::StrFormat("imported %d of %d objects (%s MB) in %.2f s (%s MB/s) into %s\n",
                          summary->objects, summary->objects + summary->skipped,
                          Megabytes(summary->bytes), seconds,
                          MegabytesPerSecond(summary->bytes, summary->elapsed), dest));
    if (summary->skipped > 0) {
      Print(absl::StrFormat("skipped %d already current (same size and ETag)\n", summary->skipped));
    }
    if (summary->deleted > 0) {
      Print(absl::StrFormat("removed %d files whose objects the source no longer has\n",
                            summary->deleted));
    }
    if (garbage.files > 0) {
      Print(absl::StrFormat("removed %d temporary files left by %d interrupted runs\n",
                            garbage.files, garbage.owners));
    }
  }
  return absl::OkStatus();
}

absl::Status RunExport(const TierArgs& args) {
  auto put = PutOptionsFrom(args.upload);
  if (!put.ok()) return Annotate(put.status(), "tier export");
  WHARF_RETURN_IF_ERROR(ApplyEngineArgs(args.engine, args.jobs));
  const std::string path = AbsolutePath(args.path);
  auto found = Tier::Find(path);
  if (!found.ok()) return Annotate(found.status(), "tier export");
  std::shared_ptr<Tier> tier = *std::move(found);
  WHARF_ASSIGN_OR_RETURN(OpenedUri dst, OpenCliUri(args.dst));
  if (dst.uri.scheme == "file") {
    // An export into its own source would export its own copies, a level deeper each run.
    const std::string to = AbsolutePath(absl::StrCat("/", dst.uri.key));
    if (to == path || absl::StartsWith(to, path == "/" ? path : path + "/")) {
      return absl::InvalidArgumentError(
          absl::StrCat("tier export: the destination ", to, " is inside the source ", path));
    }
  }

  Progress progress(Progress::ShouldShow(args.quiet || args.json));
  ProgressObserver observer(progress);
  TierExportOptions options;
  WHARF_ASSIGN_OR_RETURN(options.filters, FiltersRelativeTo(args.filters, path));
  options.list_workers = args.list_workers;
  options.put = *std::move(put);
  options.guess_content_type = !args.upload.no_guess_content_type;
  options.on_warning = [&progress](const absl::Status& s) {
    progress.PrintLine(absl::StrCat("wharf: ", OneLine(s.message())));
  };
  TierExportSummary exported;
  const absl::Status status =
      ExportTierPath(tier, path, {dst.store, dst.uri.key}, options, &exported, &observer);
  progress.Stop();
  const TransferSummary& summary = exported.transfer;
  // The objects the filters selected (listed minus filtered out).
  const uint64_t selected = summary.objects + summary.skipped + summary.failed;
  const double seconds = absl::ToDoubleSeconds(summary.elapsed);
  // The --json summary, also of a partly failed export (its error then follows on stderr).
  auto summary_json = [&] {
    json j;
    j["source"] = path;
    j["dest"] = exported.dst_uri;
    j["tier"] = tier->root();
    j["objects"] = selected;
    j["bytes"] = summary.bytes;
    j["uploaded"] = summary.objects;
    j["skipped"] = summary.skipped;
    j["failed"] = summary.failed;
    j["seconds"] = seconds;
    j["aborted_uploads"] = exported.aborted_uploads;
    return j;
  };
  if (!status.ok()) {
    if (args.json && summary.listed > 0) {
      json j = summary_json();
      j["error"] = OneLine(status.message());
      Print(JsonLine(j));
    }
    return status;
  }
  if (args.json) {
    json j = summary_json();
    Print(JsonLine(j));
  } else if (!args.quiet) {
    Print(absl::StrFormat("exported %d of %d objects (%s MB) in %.2f s (%s MB/s) to %s\n",
                          summary.objects, selected, Megabytes(summary.bytes), seconds,
                          MegabytesPerSecond(summary.bytes, summary.elapsed),
                          OneLine(exported.dst_uri)));
    if (summary.skipped > 0) {
      Print(absl::StrFormat("skipped %d already there (same size and ETag)\n", summary.skipped));
    }
    if (exported.aborted_uploads > 0) {
      Print(absl::StrFormat("aborted %d multipart uploads that interrupted exports left\n",
                            exported.aborted_uploads));
    }
  }
  return absl::OkStatus();
}

// Whether `path` is in one of the tier's trees (outside its own folder): where a file the user
// wrote since it was filled is theirs (UsersEdit), not damage.
bool InTree(const Tier& tier, const std::string& path) {
  return !absl::StartsWith(tier.Relative(path), absl::StrCat(Tier::kMetaDir, "/"));
}

absl::Status RunStatus(const TierArgs& args) {
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<Tier> tier, Tier::Find(args.path));
  const std::string path = tier->PathIn(args.path);
  uint64_t entries = 0, bytes = 0, disk_bytes = 0, pinned = 0, local = 0, blocks = 0,
           other_files = 0, modified = 0;
  WHARF_RETURN_IF_ERROR(
      WalkTierFiles(*tier, path, [&](const std::string& p, const struct stat& st) {
        const auto entry = ReadEntryAttr(p);
        if (entry.has_value() && InTree(*tier, p) && UsersEdit(p, st, *entry)) {
          ++modified;  // the user's own file now (also among other_files)
          ++other_files;
          return;
        }
        if (!IsCompleteEntry(entry, st)) {
          ++other_files;
          return;
        }
        ++entries;
        bytes += st.st_size;
        disk_bytes += DiskBytes(st);
        if (IsPinned(p)) ++pinned;
        if (entry->local) ++local;
        if (entry->block) ++blocks;
      }));
  WHARF_ASSIGN_OR_RETURN(std::vector<TierImport> imports, tier->Imports());
  const TierConfig& c = tier->config();
  struct statvfs vfs;
  const bool have_fs = statvfs(tier->root().c_str(), &vfs) == 0 && vfs.f_blocks > 0;
  const uint64_t fs_size = have_fs ? uint64_t{vfs.f_blocks} * vfs.f_frsize : 0;
  const uint64_t fs_free = have_fs ? uint64_t{vfs.f_bavail} * vfs.f_frsize : 0;
  if (args.json) {
    json j;
    j["tier"] = tier->root();
    j["path"] = path;
    j["mode"] = TierModeName(c.mode);
    j["ttl_seconds"] = absl::ToDoubleSeconds(c.ttl);
    j["entries"] = entries;
    j["bytes"] = bytes;
    j["disk_bytes"] = disk_bytes;  // what max_size bounds (allocated blocks)
    j["pinned"] = pinned;
    j["local"] = local;
    j["blocks"] = blocks;
    j["other_files"] = other_files;
    j["modified"] = modified;  // files the user wrote since they were filled (among other_files)
    j["max_size"] = c.max_size;
    j["min_free"] = c.min_free;
    j["fs_size"] = fs_size;
    j["fs_free"] = fs_free;
    json imp = json::array();
    for (const TierImport& i : imports) {
      json one = {{"source", i.source}, {"dir", i.dir}, {"complete", i.complete()}};
      if (i.complete()) one["objects"] = i.objects;
      imp.push_back(std::move(one));
    }
    j["imports"] = imp;
    const Tier::Stats stats = tier->ReadStats();
    j["hits"] = stats.hits;
    j["misses"] = stats.misses;
    j["fills"] = stats.fills;
    j["fill_bytes"] = stats.fill_bytes;
    Print(JsonLine(j));
    return absl::OkStatus();
  }
  Print(absl::StrFormat("tier      %s (mode %s)\n", tier->root(), TierModeName(c.mode)));
  if (path != tier->root()) Print(absl::StrFormat("path      %s\n", path));
  Print(absl::StrFormat(
      "entries   %d (%s MB, %s MB on disk), %d pinned, %d only here (not exported)\n", entries,
      Megabytes(bytes), Megabytes(disk_bytes), pinned, local));
  if (blocks > 0) Print(absl::StrFormat("blocks    %d of them blocks of big objects\n", blocks));
  if (other_files > 0) {
    Print(absl::StrFormat(
        "other     %d files that are not entries%s\n", other_files,
        modified == 0 ? ""
                      : absl::StrCat(" (", modified, " of them entries the user wrote since)")));
  }
  Print(absl::StrFormat(
      "bound     %s, keep %.1f%% free\n",
      c.max_size == 0 ? "no size bound" : absl::StrCat(Megabytes(c.max_size), " MB"), c.min_free));
  if (have_fs) {
    Print(
        absl::StrFormat("disk      %s MB free of %s MB\n", Megabytes(fs_free), Megabytes(fs_size)));
  }
  const Tier::Stats stats = tier->ReadStats();
  Print(absl::StrFormat("reads     %d hits, %d misses; %d objects (%s MB) filled\n", stats.hits,
                        stats.misses, stats.fills, Megabytes(stats.fill_bytes)));
  for (const TierImport& i : imports) {
    Print(absl::StrFormat(
        "import    %s -> %s (%s)\n", OneLine(i.source), i.dir.empty() ? "." : i.dir,
        i.complete() ? absl::StrCat("complete: ", i.objects, " objects") : "incomplete"));
  }
  return absl::OkStatus();
}

absl::Status RunGc(const TierArgs& args) {
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<Tier> tier, Tier::Find(args.path));
  WHARF_ASSIGN_OR_RETURN(Tier::Garbage garbage, tier->CollectGarbage());
  WHARF_ASSIGN_OR_RETURN(uint64_t folded, tier->FoldStats());
  WHARF_ASSIGN_OR_RETURN(uint64_t old_blocks, CollectOldBlockVersions(*tier));
  WHARF_ASSIGN_OR_RETURN(uint64_t orphans, CollectOrphans(*tier));
  if (args.json) {
    Print(JsonLine({{"tier", tier->root()},
                    {"owners", garbage.owners},
                    {"files", garbage.files},
                    {"stats_folded", folded},
                    {"old_blocks", old_blocks},
                    {"orphans", orphans}}));
  } else if (!args.quiet) {
    Print(absl::StrFormat("removed %d temporary files of %d finished or killed processes\n",
                          garbage.files, garbage.owners));
    if (orphans > 0) {
      Print(absl::StrFormat(
          "removed %d files of the read-through area that were not complete entries\n", orphans));
    }
    if (folded > 0) {
      Print(absl::StrFormat("folded the read counters of %d finished processes into one file\n",
                            folded));
    }
    if (old_blocks > 0) {
      Print(absl::StrFormat("removed %d blocks of old versions of big objects\n", old_blocks));
    }
  }
  return absl::OkStatus();
}

// Fetches the entry at `path` again from its source (through the same verified, published
// path as an import), or removes a read-through copy; returns what it did, for the report.
absl::StatusOr<std::string> Repair(const std::shared_ptr<Tier>& tier, const std::string& path,
                                   const TierEntry& entry) {
  if (entry.source.empty()) {
    return absl::DataLossError("the data exists only in the tier (never exported)");
  }
  // A read-through copy: gone, it is filled again by the next read.
  if (absl::StartsWith(tier->Relative(path), absl::StrCat(Tier::kMetaDir, "/objects/"))) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "removing");
    return std::string("removed (the next read fills it again)");
  }
  WHARF_ASSIGN_OR_RETURN(OpenedUri src, OpenCliUri(entry.source));
  const size_t slash = path.rfind('/');
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<TierTreeStore> tree,
                         TierTreeStore::Open(tier, path.substr(0, slash), Runtime::Default()));
  // The fresh copy replaces the damaged file by a rename, so a repair that fails (the source
  // unreachable or gone) leaves the file as it was; a pin carries over to the new file.
  const bool pinned = IsPinned(path);
  {
    TransferOptions options;
    options.mode = TransferMode::kCopy;
    WHARF_RETURN_IF_ERROR(
        Transfer({src.store, src.uri.key}, {tree, path.substr(slash + 1)}, options).status());
  }
  tree.reset();  // publishes the new file
  if (pinned) WHARF_RETURN_IF_ERROR(SetPinned(path, true));
  return absl::StrCat("fetched again from ", entry.source);
}

// Marks the entry of the file at `path` damaged, so that reads through the tier fetch the
// object from its source until a repair or a fill replaces the file; drops the file store's
// cached ETag, so that readers of the tree look at the content again. Through a descriptor,
// and only while the file still carries the entry verify read (a fill or repair that replaced
// it meanwhile is not marked). False when the attribute could not be written.
bool MarkDamaged(const std::string& path, const TierEntry& seen) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::optional<TierEntry> now = ReadEntryAttr(fd);
  bool marked = false;
  if (now.has_value() && now->size == seen.size && now->md5 == seen.md5 &&
      now->crc32c == seen.crc32c) {
    now->damaged = true;
    marked = WriteEntryAttr(fd, *now).ok();
    ForgetLocalEtag(fd);
  }
  close(fd);
  return marked;
}

absl::Status RunVerify(const TierArgs& args) {
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<Tier> tier, Tier::Find(args.path));
  uint64_t checked = 0, damaged = 0, repaired = 0, modified = 0;
  // One line per damaged entry: on stdout, or on stderr under --json (stdout is one object).
  auto report = [&args](const std::string& line) {
    if (args.json) {
      std::fwrite(line.data(), 1, line.size(), stderr);
    } else {
      Print(line);
    }
  };
  absl::Status walk = WalkTierFiles(
      *tier, tier->PathIn(args.path), [&](const std::string& p, const struct stat& st) {
        const auto entry = ReadEntryAttr(p);
        if (!entry.has_value()) return;  // not an entry: a file of its own
        ++checked;
        std::string problem;
        if (entry->size != static_cast<uint64_t>(st.st_size)) {
          problem = absl::StrCat("size ", st.st_size, ", the entry says ", entry->size);
        } else {
          const bool md5 = !entry->md5.empty();
          const std::string& want = md5 ? entry->md5 : entry->crc32c;
          auto sum = FileChecksum(p, st.st_size, md5 ? Checksum::kMd5 : Checksum::kCrc32c);
          if (!sum.ok()) {
            problem = std::string(sum.status().message());
          } else if (*sum != want) {
            problem =
                absl::StrCat("content ", md5 ? "MD5 " : "CRC32C ", *sum, ", the entry says ", want);
          }
        }
        if (problem.empty()) return;
        // Written since it was filled (its mtime is not the one sealed): most likely a user's
        // edit rather than damage below the file system. Either way the entry no longer holds
        // its source's data, so it counts as damage and --repair fetches the source again;
        // the line says which, so an edit is not replaced unknowingly (eviction, which runs
        // unasked, never removes such a file: UsersEdit).
        const bool users_edit = InTree(*tier, p) && WrittenSinceSealed(*entry, st);
        if (users_edit) {
          ++modified;
          problem = absl::StrCat("written since it was filled (", problem, ")");
        }
        ++damaged;
        if (args.repair) {
          absl::StatusOr<std::string> fixed = Repair(tier, p, *entry);
          if (fixed.ok()) {
            ++repaired;
            report(
                absl::StrCat("repaired ", OneLine(p), " (", problem, "): ", OneLine(*fixed), "\n"));
            return;
          }
          problem = absl::StrCat(problem, "; repair failed: ", fixed.status().message());
        }
        // Damage (not a user's edit, which reads already tell by its time): reads through
        // the tier stop serving the file.
        if (!users_edit && !entry->source.empty() && MarkDamaged(p, *entry)) {
          problem = absl::StrCat(problem, "; reads through the tier fetch it from ", entry->source,
                                 " until it is repaired");
        }
        report(absl::StrCat("damaged ", OneLine(p), ": ", OneLine(problem), "\n"));
      });
  WHARF_RETURN_IF_ERROR(walk);
  const uint64_t remaining = damaged - repaired;
  if (args.json) {
    Print(JsonLine({{"checked", checked},
                    {"damaged", damaged},
                    {"modified", modified},
                    {"repaired", repaired},
                    {"remaining", remaining}}));
  } else if (!args.quiet) {
    Print(absl::StrFormat(
        "verified %d entries: %d damaged%s, %d repaired\n", checked, damaged,
        modified == 0 ? "" : absl::StrCat(" (", modified, " of them written since their fill)"),
        repaired));
  }
  if (remaining > 0) {
    return absl::DataLossError(absl::StrCat("tier verify ", AbsolutePath(args.path), ": ",
                                            remaining, " damaged entries remain",
                                            args.repair ? "" : " (repair them with --repair)"));
  }
  return absl::OkStatus();
}

absl::Status RunEvict(const TierArgs& args) {
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<Tier> tier, Tier::Find(args.path));
  uint64_t target = 0;  // without --to: every evictable entry below PATH
  if (!args.to.empty()) {
    WHARF_ASSIGN_OR_RETURN(target, ParseSize(args.to));
  }
  const std::string path = tier->PathIn(args.path);
  WHARF_ASSIGN_OR_RETURN(EvictResult r, EvictTo(*tier, path, target));
  // What stays: entries that could not go (pinned, only here, being read) may hold the path
  // above the target; said, so that a script does not take the space for freed.
  const uint64_t remaining = r.disk_bytes - std::min(r.disk_bytes, r.evicted_disk_bytes);
  const bool target_met = remaining <= target;
  if (!args.to.empty() && !target_met) {
    const std::string warning = absl::StrFormat(
        "wharf: tier evict --to %s: the entries below %s still take %s MB of disk: %d pinned, "
        "%d only here (not exported), %d in use cannot go (wharf tier unpin PATH releases "
        "pinned ones)\n",
        args.to, path, Megabytes(remaining), r.kept_pinned, r.kept_local, r.kept_busy);
    std::fwrite(warning.data(), 1, warning.size(), stderr);
  }
  if (args.json) {
    json j = {{"entries", r.entries},
              {"bytes", r.bytes},
              {"disk_bytes", r.disk_bytes},
              {"evicted", r.evicted},
              {"evicted_bytes", r.evicted_bytes},
              {"evicted_disk_bytes", r.evicted_disk_bytes},
              {"kept_pinned", r.kept_pinned},
              {"kept_local", r.kept_local},
              {"kept_busy", r.kept_busy},
              {"kept_modified", r.kept_modified},
              {"remaining_disk_bytes", remaining}};
    if (!args.to.empty()) j["target_met"] = target_met;
    Print(JsonLine(j));
  } else if (!args.quiet) {
    Print(absl::StrFormat(
        "evicted %d of %d entries (%s of %s MB); kept %d pinned, %d only here, %d in use%s\n",
        r.evicted, r.entries, Megabytes(r.evicted_bytes), Megabytes(r.bytes), r.kept_pinned,
        r.kept_local, r.kept_busy,
        r.kept_modified == 0
            ? ""
            : absl::StrCat(", ", r.kept_modified, " files the user wrote since they were filled")));
  }
  return absl::OkStatus();
}

absl::Status RunPin(const TierArgs& args, bool pin) {
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<Tier> tier, Tier::Find(args.path));
  uint64_t changed = 0, already = 0;
  absl::Status first;
  WHARF_RETURN_IF_ERROR(WalkTierFiles(
      *tier, tier->PathIn(args.path), [&](const std::string& p, const struct stat& st) {
        const auto entry = ReadEntryAttr(p);
        if (!IsCompleteEntry(entry, st)) return;
        const bool as_asked = IsPinned(p) == pin;
        absl::Status s = as_asked ? absl::OkStatus() : SetPinned(p, pin);
        // A block: its object's .blocks directory too, so blocks filled later are pinned as
        // well.
        if (s.ok() && entry->block) {
          const std::string dir = p.substr(0, p.rfind('/'));
          s = SetPinned(dir.substr(0, dir.rfind('/')), pin);
        }
        if (s.ok()) {
          ++(as_asked ? already : changed);
        } else if (first.ok()) {
          first = s;
        }
      }));
  WHARF_RETURN_IF_ERROR(first);
  if (!args.quiet) {
    const char* done = pin ? "pinned" : "unpinned";
    Print(already == 0
              ? absl::StrFormat("%s %d entries\n", done, changed)
              : absl::StrFormat("%s %d entries (%d already %s)\n", done, changed, already, done));
  }
  return absl::OkStatus();
}

}  // namespace

void AddTier(CLI::App& app, TierArgs& args) {
  CLI::App* tier = app.add_subcommand(
      "tier", "Manage a tier: a directory on fast storage in front of the bucket");
  tier->require_subcommand(1);
  auto sub = [&](const char* name, const char* help) {
    CLI::App* cmd = tier->add_subcommand(name, help);
    cmd->parse_complete_callback([&args, name] { args.action = name; });
    return cmd;
  };

  // A SIZE given empty ("--to ''", a script's unset variable) is an error, not "unset".
  const CLI::Validator size_check(
      [](std::string& v) -> std::string {
        if (v.empty()) return "is empty (give a SIZE such as 500G)";
        auto parsed = ParseSize(v);
        return parsed.ok() ? "" : std::string(parsed.status().message());
      },
      "SIZE");
  CLI::App* init = sub("init", "Make TIER_DIR a tier, or change its settings");
  init->add_option(
          "--mode", args.mode,
          "immutable: entries never go stale (training data); ttl: revalidate with the "
          "source after --ttl (a new tier's default: immutable; a given tier keeps what it "
          "has unless given)")
      ->check(CLI::IsMember({"immutable", "ttl"}));
  init->add_option("--ttl", args.ttl_seconds,
                   "Seconds an entry stays fresh in ttl mode (default 3600)")
      ->check(CLI::Validator(
          [](std::string& v) {
            // At most 100 years: what tier.json stores as a number (inf is not JSON).
            double d = 0;
            return absl::SimpleAtod(v, &d) && d > 0 && d <= 100.0 * 365 * 86400
                       ? ""
                       : "must be a positive number of seconds, at most 100 years";
          },
          "SECONDS"));
  init->add_option("--max-size", args.max_size,
                   "Disk space the tier's entries may take (e.g. 500G; their allocated blocks, "
                   "not only their bytes; 0: unbounded, a new tier's default)")
      ->check(size_check);
  init->add_option(
          "--min-free", args.min_free,
          "Percent of the file system to keep free (default 5; ignored, with a warning, where the "
          "file system reports no capacity)")
      ->check(CLI::Range(0.0, 99.0));
  init->add_option("--block-size", args.block_size,
                   "Objects above --block-threshold are read through the tier in blocks of this "
                   "size (default 8M; at least 64K)")
      ->check(size_check);
  init->add_option("--block-threshold", args.block_threshold,
                   "Objects larger than this are cached in blocks, so a ranged read fetches and "
                   "keeps only its blocks (default 64M; at least --block-size)")
      ->check(size_check);
  init->add_flag("-q,--quiet", args.quiet, "Print nothing");
  init->add_option("TIER_DIR", args.path, "The tier's directory")->required();

  CLI::App* import = sub("import", "Copy every object below SRC_URI into DEST_DIR in a tier");
  import
      ->add_option("--rank", args.rank,
                   "With --world-size: import only this share of the keys (W importers on W "
                   "nodes together import everything once)")
      ->check(CLI::Range(0, 1 << 20));
  import->add_option("--world-size", args.world_size, "Number of importers sharing the work")
      ->check(CLI::Range(1, 1 << 20));
  import
      ->add_option("-j,--jobs,--inflight", args.jobs,
                   "Requests in flight; default: sized from the store's measured latency")
      ->check(CLI::Range(1, 65536));
  AddEngineFlags(import, args.engine, /*budget_mb_alias=*/false);
  import->add_option("--list-workers", args.list_workers, "Parallel listing workers")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  import->add_flag("--json", args.json,
                   "Print a JSON summary: source, dest, tier, objects, bytes, fetched, "
                   "skipped, failed, deleted (gone from the source), garbage_removed, seconds, "
                   "tree_bytes");
  import->add_flag("-q,--quiet", args.quiet,
                   "No progress line and no summary (warnings still go to stderr)");
  import->add_option("SRC_URI", args.src, "The source prefix (s3://, gs://, file://)")->required();
  import
      ->add_option("DEST_DIR", args.path,
                   "Where the objects appear as files (inside a tier, or it becomes one)")
      ->required();
  import->footer(
      "Each object becomes DEST_DIR/<key relative to SRC_URI>, verified (size, and the MD5\n"
      "where the ETag is one) and published by rename, in batches made durable with one\n"
      "syncfs. A rerun fetches only what is missing or changed (by ETag), removes the files\n"
      "of objects the source deleted (not your own files there, nor pinned ones) and the\n"
      "temporary files of interrupted runs. Warns when the imported tree alone is larger\n"
      "than the tier's max size (its files are evictable unless pinned), and when nothing\n"
      "has moved for WHARF_STALL_WARN_SECONDS (default 60; a full CephFS blocks writes).");

  CLI::App* exp = sub("export", "Upload the files below TIER_PATH to DST_URI");
  exp->add_option("-j,--jobs,--inflight", args.jobs,
                  "Requests in flight (objects, or parts of big ones); default: sized from the "
                  "store's measured latency")
      ->check(CLI::Range(1, 65536));
  AddEngineFlags(exp, args.engine, /*budget_mb_alias=*/false);
  exp->add_option("--list-workers", args.list_workers, "Parallel listing workers")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  AddFilterFlags(exp, args.include, args.exclude, "TIER_PATH");
  AddUploadFlags(exp, args.upload);
  exp->add_flag("--json", args.json,
                "Print a JSON summary: source, dest, tier, objects, bytes, uploaded, "
                "skipped, failed, aborted_uploads, seconds");
  exp->add_flag("-q,--quiet", args.quiet, "No progress line and no summary");
  exp->add_option("TIER_PATH", args.path, "A file or directory inside a tier")->required();
  exp->add_option("DST_URI", args.dst, "The destination prefix (s3://, gs://, file://)")
      ->required();
  exp->footer(
      "Each file TIER_PATH/REL becomes DST_URI/REL (the tier's own .wharf folder is never\n"
      "exported), big ones as parallel multipart uploads with each part's MD5 checked; a\n"
      "failed upload is aborted. A rerun uploads only what is missing or changed (same size\n"
      "and ETag are skipped) and first aborts the multipart uploads that killed exports\n"
      "left for the keys it writes. Exported entries are no longer `local`, so eviction may\n"
      "remove them.");

  CLI::App* status = sub("status", "Entries, bytes and settings of the tier holding PATH");
  status->add_flag("--json", args.json, "Print one JSON object");
  status->add_option("PATH", args.path, "A path inside a tier")->required();

  CLI::App* gc = sub("gc",
                     "Remove temporary files that finished or killed processes left, blocks "
                     "of old versions of big objects and orphans of the read-through area "
                     "(files there that are not complete entries), and fold dead processes' "
                     "read counters into one file");
  gc->add_flag("--json", args.json, "Print one JSON object");
  gc->add_flag("-q,--quiet", args.quiet, "Print nothing");
  gc->add_option("TIER_DIR", args.path, "A path inside a tier")->required();

  CLI::App* verify =
      sub("verify", "Check entries below PATH against their recorded size and checksum");
  verify->add_flag("--repair", args.repair, "Fetch damaged entries again from their source");
  verify->add_flag("--json", args.json, "Print one JSON object");
  verify->add_flag("-q,--quiet", args.quiet, "Print only damaged entries");
  verify->add_option("PATH", args.path, "A path inside a tier")->required();
  verify->footer(
      "Exits 1 while damaged entries remain. A file written since its fill (its mtime changed)\n"
      "to other bytes is reported as such, and --repair replaces it with the source's bytes too:\n"
      "copy or export an edit you keep first (eviction never removes such a file). Other\n"
      "damage is marked on the entry: reads through the tier fetch the object from its source\n"
      "until --repair (or a fill) replaces the file.");

  CLI::App* evict = sub("evict", "Evict entries below PATH, least recently used first");
  evict
      ->add_option("--to", args.to,
                   "Evict until the entries below PATH take at most SIZE of disk (e.g. 100G); "
                   "default: evict every evictable entry")
      ->check(size_check);
  evict->add_flag("--json", args.json, "Print one JSON object");
  evict->add_flag("-q,--quiet", args.quiet, "Print nothing");
  evict->add_option("PATH", args.path, "A path inside a tier (the tier's directory with --to)")
      ->required();
  evict->footer(
      "Never evicts an entry being read, a pinned entry, or data that exists only in the tier\n"
      "(written to it and not exported). Reads through the tier evict by themselves when the\n"
      "tier goes over --max-size or under --min-free (tier init).");

  CLI::App* pin = sub("pin", "Keep the entries below PATH from eviction");
  pin->add_flag("-q,--quiet", args.quiet, "Print nothing");
  pin->add_option("PATH", args.path, "A path inside a tier")->required();
  CLI::App* unpin = sub("unpin", "Let the entries below PATH be evicted again");
  unpin->add_flag("-q,--quiet", args.quiet, "Print nothing");
  unpin->add_option("PATH", args.path, "A path inside a tier")->required();
}

absl::Status RunTier(const TierArgs& args) {
  if (args.action == "init") return RunInit(args);
  if (args.action == "import") return RunImport(args);
  if (args.action == "export") return RunExport(args);
  if (args.action == "status") return RunStatus(args);
  if (args.action == "gc") return RunGc(args);
  if (args.action == "verify") return RunVerify(args);
  if (args.action == "evict") return RunEvict(args);
  if (args.action == "pin") return RunPin(args, true);
  if (args.action == "unpin") return RunPin(args, false);
  return absl::InvalidArgumentError(absl::StrCat("tier: unknown action '", args.action, "'"));
}

}  // namespace wharf::cli
