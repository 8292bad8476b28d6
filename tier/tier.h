// Tier: a directory on a fast (possibly shared) file system that wharf manages in front of a
// bucket (docs/design/tier.md). This header is the tier's on-disk model:
//  - where a tier is (the nearest directory holding `.wharf/tier.json`) and its settings;
//  - entries: data files whose attribute "user.wharf.entry" says what they are a copy of
//    (TierEntry); the attribute travels with the file through the rename that publishes it,
//    so data and metadata are committed together;
//  - each process's temporary directory, owned through an flock the OS releases when the
//    process dies (also on other nodes of a shared file system), and the garbage collection
//    that removes what dead owners left.
// Nothing here lives only in one process: every fact is in the tier's files.
//
// Thread-safety: a Tier is thread-safe. The free functions are safe to call concurrently.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace wharf {

// A tier's settings, kept in <tier>/.wharf/tier.json (defaults when the file is absent).
struct TierConfig {
  enum class Mode {
    kImmutable,  // an entry is valid forever (training data that never changes)
    kTtl,        // an entry older than `ttl` is revalidated with its source
  };
  Mode mode = Mode::kImmutable;
  absl::Duration ttl = absl::Hours(1);
  uint64_t max_size = 0;  // bytes the tier may hold; 0: no bound but min_free
  double min_free = 5;    // percent of the file system kept free
  // Objects larger than block_threshold are cached by the read-through decorator in blocks
  // of block_size bytes, each an entry of its own (docs/design/tier.md, "Blocks").
  // block_size is at least kMinBlockSize (tests use small blocks; 8-16 MiB in production)
  // and block_threshold at least block_size.
  uint64_t block_size = uint64_t{8} << 20;
  uint64_t block_threshold = uint64_t{64} << 20;
  static constexpr uint64_t kMinBlockSize = uint64_t{64} << 10;
  static constexpr uint64_t kMaxBlockSize = uint64_t{1} << 30;

  std::string ToJson() const;
  // InvalidArgument naming `what` and the field on a malformed document or value.
  static absl::StatusOr<TierConfig> FromJson(absl::string_view json, absl::string_view what);
};
const char* TierModeName(TierConfig::Mode mode);
absl::StatusOr<TierConfig::Mode> ParseTierMode(absl::string_view name);

// What an entry's attribute says.
struct TierEntry {
  std::string source;  // the source object's URI ("" for data written to the tier itself)
  std::string etag;    // the source's ETag or generation when it was copied
  uint64_t size = 0;   // bytes of the data file
  // The data file's checksum, what `verify` recomputes: the hex MD5 (entries written by
  // puts: imports check it against an MD5 ETag, and data written to the tier lists with it)
  // or, for copies the read-through decorator filled, the hex CRC32C (cheaper; their ETag is
  // the source's). At least one is set.
  std::string md5;
  std::string crc32c;
  absl::Time filled = absl::InfinitePast();
  bool local = false;  // the data exists nowhere else (not exported yet): never evicted
  // The data file's modification time as it was sealed (entries of trees: imports and data
  // written to the tier; InfinitePast for read-through copies, and for entries sealed before
  // it was recorded). A file whose mtime is another was written since (WrittenSinceSealed).
  absl::Time mtime = absl::InfinitePast();
  // A block of a big object (TierStore): the data file holds bytes [block_offset,
  // block_offset + size) of a source object of object_size bytes; source and etag are the
  // object's. Not a block: both 0 and `block` false.
  bool block = false;
  uint64_t block_offset = 0;
  uint64_t object_size = 0;
  // `tier verify` found the file's content is not the entry's (damage below the file system,
  // not a user's edit): reads through the tier fetch the object from its source instead,
  // until `tier verify --repair` (or a fill) replaces the file.
  bool damaged = false;

  std::string ToJson() const;
  static std::optional<TierEntry> FromJson(absl::string_view json);
};

inline constexpr char kTierEntryXattr[] = "user.wharf.entry";

// The blocks of a big object whose read-through copy would be at P live below
// P + kTierBlocksSuffix, one directory per version of the object, named
// TierBlockVersionDir(etag) (a hash: ETags may hold any character), each block named by its
// index. A pin on the P.blocks directory pins the blocks filled into it later.
inline constexpr char kTierBlocksSuffix[] = ".blocks";
std::string TierBlockVersionDir(absl::string_view etag);
inline constexpr char kTierPinXattr[] = "user.wharf.pin";

// The entry attribute of an open file or a path, nullopt when there is none or it does not
// parse. It does not compare sizes: IsCompleteEntry does.
std::optional<TierEntry> ReadEntryAttr(int fd);
std::optional<TierEntry> ReadEntryAttr(const std::string& path);
// A complete entry: the attribute parses and its size is the file's.
bool IsCompleteEntry(const std::optional<TierEntry>& entry, const struct stat& st);
// Whether the file (`st`) was written since its entry was sealed: its modification time is not
// the one the entry recorded (false when the entry recorded none). Such a file whose size or
// content is no longer the entry's is the user's (UsersEdit, tier/tree_store.h).
bool WrittenSinceSealed(const TierEntry& entry, const struct stat& st);
absl::Status WriteEntryAttr(int fd, const TierEntry& entry);
absl::Status WriteEntryAttr(const std::string& path, const TierEntry& entry);
bool IsPinned(const std::string& path);
// Whether a relative path (a key below a tree, or a read-through copy's path) holds a
// ".wharf/tier.json" pair of segments: written, it would make its folder a tier of its own
// inside the tier (Tier::Find would stop there, and walks skip it).
bool MakesATier(absl::string_view rel);
absl::Status SetPinned(const std::string& path, bool pinned);

// One import: a source prefix whose objects are files below `dir` (relative to the tier).
struct TierImport {
  std::string source;  // URI of the source prefix
  std::string dir;     // tier-relative directory ("" for the tier's root)
  // Set when a run (or, for `--rank/--world-size` runs, one run of every rank) listed the
  // whole source and copied or kept every object it listed: the tree then held `objects`
  // entries, the complete listing of the source at `completed` (the oldest such run).
  absl::Time completed = absl::InfinitePast();
  uint64_t objects = 0;
  // The run that wrote a record (RecordImport); Imports() merges ranks into one import.
  int rank = -1;
  int world_size = 0;
  bool complete() const { return completed != absl::InfinitePast(); }
};

class Tier : public std::enable_shared_from_this<Tier> {
 public:
  // The tier's own folder inside its root.
  static constexpr absl::string_view kMetaDir = ".wharf";

  // The tier enclosing `path` (a file or directory, existing or not): the nearest ancestor
  // holding .wharf/tier.json. NotFound naming `path` when there is none.
  static absl::StatusOr<std::shared_ptr<Tier>> Find(const std::string& path);
  // Whether `dir` is a tier's root (holds .wharf/tier.json).
  static bool IsRoot(const std::string& dir);
  // Find(), or else `dir` becomes a tier with the default settings (`*created` says which).
  static absl::StatusOr<std::shared_ptr<Tier>> FindOrCreate(const std::string& dir,
                                                            bool* created = nullptr);
  // Makes `dir` a tier with `config`, or sets the config of the tier rooted there.
  // FailedPrecondition when the file system has no user extended attributes (the tier keeps
  // its entries' metadata in them), when `dir` is inside another tier, or when a new tier's
  // `dir` holds one below it (found by a walk of up to 20,000 directories).
  static absl::StatusOr<std::shared_ptr<Tier>> Init(const std::string& dir,
                                                    const TierConfig& config);
  ~Tier();
  Tier(const Tier&) = delete;
  Tier& operator=(const Tier&) = delete;

  const std::string& root() const { return root_; }
  const TierConfig& config() const { return config_; }
  std::string MetaPath(absl::string_view rel) const;
  // `path` (absolute, inside the tier) relative to the root; "" for the root itself.
  std::string Relative(const std::string& path) const;
  // `path` as it lies in the tier: absolute, with a link into the tier resolved (a link to a
  // folder inside it, as Find takes it); root() + "/" + Relative(path).
  std::string PathIn(const std::string& path) const;

  // This process's temporary directory, created on first use (again after a fork), owned
  // while the process lives. Files written there are published by rename. Creating it
  // first removes what dead owners left (CollectGarbage).
  absl::StatusOr<std::string> TempDir();

  struct Garbage {
    uint64_t owners = 0;  // dead owners' directories removed
    uint64_t files = 0;   // files in them
  };
  // Removes the temporary directories of owners that are gone (their lock can be taken).
  absl::StatusOr<Garbage> CollectGarbage();

  // Flushes the tier's file system (syncfs): everything written so far is on disk.
  absl::Status SyncFs();

  // Read-through counters. Each owner (process) adds its own to one small file,
  // stats/<owner>.json, rewritten with its running totals (when its cache store closes).
  // ReadStats sums every file; FoldStats (`tier gc`) folds the files of dead owners into
  // stats/folded.json, so the folder does not grow by one file per process forever. Both
  // hold .wharf/locks/stats (readers shared, folds exclusive), so a status running beside a
  // fold, or two folds, count each file once; and a fold killed between writing folded.json
  // and removing the files it folded leaves them listed there as folded, so they are never
  // counted twice (the next fold removes them).
  struct Stats {
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t fills = 0;
    uint64_t fill_bytes = 0;
  };
  absl::Status AddStats(const Stats& stats);
  Stats ReadStats() const;
  // Folds the counters of dead owners (their owner lock can be taken, or is gone); returns
  // how many owners' files it folded.
  absl::StatusOr<uint64_t> FoldStats();

  // The disk space the tier's entries took after the last eviction pass over the whole tier
  // (a hint: processes filled or removed entries since), nullopt when no pass recorded it.
  std::optional<uint64_t> LastUsage() const;
  absl::Status RecordUsage(uint64_t bytes) const;
  // Adds `bytes` (filled by a process since its last pass, or since it started) to the
  // recorded usage, if any: so processes that exit before their fills put the tier over its
  // bound (one `wharf cat` each) leave the next one a hint that counts them. Read, add and
  // write under the usage lock, as RecordUsage.
  absl::Status AddUsage(uint64_t bytes) const;

  // Records that the objects below `source` are files below `dir` (tier-relative), and lists
  // the imports: one per source and directory, complete when an unsharded run completed, or
  // one run of each of the W ranks of a sharded import did (objects summed). A record
  // replaces the same run's earlier one (an incomplete rerun makes the import incomplete);
  // an unsharded record replaces the sharded ones and the other way round.
  absl::Status RecordImport(const TierImport& import);
  absl::StatusOr<std::vector<TierImport>> Imports() const;
  // Where the listing of a complete import is kept once a reader has walked its tree
  // (TierStore): beside the import's records, named as they are.
  std::string ImportListingPath(const TierImport& import) const;

  // What exit does for this process's tiers (an atexit handler): their temporary
  // directories removed. Idempotent; see TierStore::AtExit.
  static void ReleaseAllAtExit();

 private:
  Tier(std::string root, TierConfig config);
  static absl::StatusOr<std::shared_ptr<Tier>> Open(const std::string& root);
  // The stats lock taken with flock `operation` (waits); -1 when it cannot be had.
  int LockStats(int operation) const { return LockFile(kStatsLockFile, operation); }
  // .wharf/locks/<name> taken with flock `operation` (waits); -1 when it cannot be had.
  int LockFile(const char* name, int operation) const;
  static constexpr char kStatsLockFile[] = "stats";
  static constexpr char kUsageLockFile[] = "usage";
  // Removes this process's temporary directory and releases its lock.
  void ReleaseTempDirLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string root_;  // absolute, no trailing '/'
  const TierConfig config_;

  absl::Mutex mu_;
  std::string temp_dir_ ABSL_GUARDED_BY(mu_);
  int temp_lock_fd_ ABSL_GUARDED_BY(mu_) = -1;
  int temp_owner_pid_ ABSL_GUARDED_BY(mu_) = 0;
  bool exiting_ ABSL_GUARDED_BY(mu_) = false;  // released at exit: no new directory
  // What AddStats wrote to stats/<stats_owner_>.json so far.
  std::string stats_owner_ ABSL_GUARDED_BY(mu_);
  Stats stats_written_ ABSL_GUARDED_BY(mu_);
};

// The absolute, normalized form of `path` ('.' and '..' resolved lexically, no trailing '/').
std::string AbsolutePath(const std::string& path);

}  // namespace wharf
