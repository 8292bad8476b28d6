// Walking a tier's entries and evicting them (docs/design/tier.md, "Readers and eviction").
//
// An eviction pass removes the least recently used entries below a path until what is left
// there totals at most a target. It never removes:
//  - an entry being read: readers hold a shared flock on the data file while they read
//    (TierStore does), and the pass takes the exclusive lock without waiting, skipping the
//    entries it cannot lock;
//  - a pinned entry (`tier pin`);
//  - a `local` entry: data written to the tier that exists nowhere else (a checkpoint not
//    yet exported);
//  - a file of a tree (outside `.wharf/`) that the user wrote since it was sealed, to other
//    bytes (UsersEdit, tier/tree_store.h): the user's own file now, counted as none of the
//    entries.
// Last access is the entry attribute's fill time or the `user.wharf.atime` attribute readers
// refresh (at most once a minute per entry), whichever is later. One pass at a time per tier:
// passes hold `.wharf/locks/evict` (an flock the OS releases if the process dies).
//
// Thread-safety: the functions may be called concurrently from any thread and process.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tier/tier.h"

namespace wharf {

inline constexpr char kTierAtimeXattr[] = "user.wharf.atime";

// Calls `fn(path, st)` for every regular file below `path` (or `path` itself when it is a
// file) that may be an entry: the tier's own folder is skipped except its read-through area.
// A path naming a big object's read-through copy (whether or not a whole copy exists) also
// covers its blocks (`path.blocks/...`), so pin, evict, verify and status of an object's
// path include its blocks.
absl::Status WalkTierFiles(const Tier& tier, const std::string& path,
                           const std::function<void(const std::string&, const struct stat&)>& fn);

// The entry's last access: max(filled, the atime attribute).
absl::Time LastAccess(const std::string& path, const TierEntry& entry);
// Records an access to the entry open as `fd` when the recorded one is older than a minute.
void TouchEntry(int fd, const TierEntry& entry);

// Removes the blocks below `blocks_dir` (an object's `.blocks` directory) of every version
// other than `keep` (a TierBlockVersionDir name; empty: every version) that nobody is reading,
// pinned ones too (the pin follows the object: its .blocks directory pins the new version's
// blocks), and the version directories left empty. Returns the blocks removed.
uint64_t RemoveBlockVersions(const std::string& blocks_dir, const std::string& keep);

// Garbage among blocks: in every `.blocks` directory below the tier's read-through area,
// the versions other than the newest (by fill time); see RemoveBlockVersions. Returns the
// blocks removed.
absl::StatusOr<uint64_t> CollectOldBlockVersions(const Tier& tier);

// Orphans in the read-through area: files below `.wharf/objects` that are not complete
// entries (no entry attribute, one that does not parse, or a size that disagrees with it).
// Fills publish only complete entries (a temporary file is given its attribute, then
// renamed), so such a file is damage or something put there by hand; every copy there can be
// fetched again, so it goes, unless it is being read or pinned. Returns the files removed.
absl::StatusOr<uint64_t> CollectOrphans(const Tier& tier);

// The disk space a file takes: its allocated blocks (st_blocks), which include the file
// system's rounding and an attribute block where the entry's attributes do not fit in the
// inode (ext4 with 256-byte inodes: a 4 KiB object takes 8 KiB). What a tier's bounds count.
inline uint64_t DiskBytes(const struct stat& st) { return uint64_t(st.st_blocks) * 512; }
// The disk space a new entry of `size` bytes is estimated to take until the next pass
// measures it: its size rounded up to 4 KiB blocks.
inline uint64_t EstimatedDiskBytes(uint64_t size) { return (size + 4095) / 4096 * 4096; }

struct EvictResult {
  uint64_t entries = 0;     // complete entries found below the path
  uint64_t bytes = 0;       // their size
  uint64_t disk_bytes = 0;  // the disk space they take (DiskBytes): what targets count
  uint64_t evicted = 0;
  uint64_t evicted_bytes = 0;       // the evicted entries' size
  uint64_t evicted_disk_bytes = 0;  // and the disk space they took
  uint64_t kept_pinned = 0;
  uint64_t kept_local = 0;
  uint64_t kept_busy = 0;      // being read
  uint64_t kept_modified = 0;  // files of trees the user wrote since they were sealed
  bool ran = true;             // false: another pass held the tier's eviction lock (wait = false)
};

// Evicts least recently used entries below `path` until they take at most `target_bytes` of
// disk (DiskBytes) there.
// `wait`: wait for a pass in progress instead of returning with ran = false.
absl::StatusOr<EvictResult> EvictTo(const Tier& tier, const std::string& path,
                                    uint64_t target_bytes, bool wait = true);
// The same with the target computed from the disk space the entries below `path` take.
absl::StatusOr<EvictResult> EvictTo(const Tier& tier, const std::string& path,
                                    const std::function<uint64_t(uint64_t entry_bytes)>& target_of,
                                    bool wait);
// One pass over the whole tier down to its bounds (EvictionTarget); `warning` as there.
absl::StatusOr<EvictResult> EvictToBounds(const Tier& tier, bool wait, std::string* warning);

// What the tier's bounds ask to keep, given what its entries hold now: the lower of 90% of
// max_size (when set) and what keeps min_free percent of the file system free. `warning` is
// set (once per process) when the file system reports no capacity and min_free is ignored.
uint64_t EvictionTarget(const Tier& tier, uint64_t entry_bytes, std::string* warning);
// The warning that min_free is ignored when the tier keeps some free space but its file system
// reports no capacity (statfs: 0 blocks, as CephFS without a manager), else "".
std::string MinFreeIgnoredWarning(const Tier& tier);
// Bytes the tier's file system has free above its min_free (negative: below it); nullopt
// when min_free is 0 or the file system reports no capacity.
std::optional<int64_t> FreeAboveMinFree(const Tier& tier);

}  // namespace wharf
