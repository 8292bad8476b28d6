#include "tier/evict.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <limits>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "store/local/temp_object.h"
#include "tier/tree_store.h"

namespace wharf {
namespace {

constexpr absl::Duration kTouchEvery = absl::Minutes(1);

struct Candidate {
  std::string path;
  uint64_t size;
  uint64_t disk_bytes;
  absl::Time last_access;
  bool pinned;
  bool local;
  bool in_tree;  // outside the tier's own folder: a user's edit there is theirs (UsersEdit)
};

absl::Time ReadAtime(int fd, const std::string& path) {
  char buf[32];
  const ssize_t n = fd >= 0 ? fgetxattr(fd, kTierAtimeXattr, buf, sizeof(buf) - 1)
                            : getxattr(path.c_str(), kTierAtimeXattr, buf, sizeof(buf) - 1);
  int64_t seconds = 0;
  if (n <= 0 || !absl::SimpleAtoi(absl::string_view(buf, n), &seconds)) {
    return absl::InfinitePast();
  }
  return absl::FromUnixSeconds(seconds);
}

}  // namespace

namespace {
absl::Status WalkFiles(const Tier& tier, const std::string& path,
                       const std::function<void(const std::string&, const struct stat&)>& fn);

bool IsDir(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Names in `dir` other than "." and ".." (none when it cannot be read).
std::vector<std::string> DirNames(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (struct dirent* e = readdir(d)) {
      const absl::string_view name = e->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
    }
    closedir(d);
  }
  return names;
}
}  // namespace

absl::Status WalkTierFiles(const Tier& tier, const std::string& path,
                           const std::function<void(const std::string&, const struct stat&)>& fn) {
  // An object's path covers its blocks (which a directory walk reaches on its own).
  const std::string blocks = absl::StrCat(path, kTierBlocksSuffix);
  struct stat st;
  const bool exists = lstat(path.c_str(), &st) == 0;
  const bool with_blocks = (!exists || !S_ISDIR(st.st_mode)) && IsDir(blocks);
  if (exists) WHARF_RETURN_IF_ERROR(WalkFiles(tier, path, fn));
  if (with_blocks) return WalkFiles(tier, blocks, fn);
  if (!exists) return ErrnoToStatus(ENOENT, path);
  return absl::OkStatus();
}

namespace {
absl::Status WalkFiles(const Tier& tier, const std::string& path,
                       const std::function<void(const std::string&, const struct stat&)>& fn) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, path);
  if (S_ISREG(st.st_mode)) {
    fn(path, st);
    return absl::OkStatus();
  }
  if (!S_ISDIR(st.st_mode)) return absl::OkStatus();
  // The tier's own folder: only its read-through area holds entries.
  const std::string meta = tier.MetaPath("");
  if (path == meta) {
    const std::string objects = tier.MetaPath("objects");
    if (lstat(objects.c_str(), &st) != 0) return absl::OkStatus();
    return WalkFiles(tier, objects, fn);
  }
  // Another tier below this one (made before `init` refused that): its files are its own.
  if (path != tier.root() && Tier::IsRoot(path)) return absl::OkStatus();
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) {
    if (errno == ENOENT) return absl::OkStatus();  // removed meanwhile
    return ErrnoToStatus(errno, absl::StrCat("reading ", path));
  }
  std::vector<std::string> names;
  while (struct dirent* e = readdir(dir)) {
    const absl::string_view name = e->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  closedir(dir);
  for (const std::string& name : names) {
    absl::Status s = WalkFiles(tier, absl::StrCat(path, "/", name), fn);
    if (!s.ok() && !absl::IsNotFound(s)) return s;  // a file removed meanwhile is fine
  }
  return absl::OkStatus();
}
}  // namespace

namespace {
enum class Removal { kGone, kBusy, kKept, kRemoved };

// Removes the file at `path` unless a reader holds it (readers hold a shared flock while they
// read: what is in use stays, for a later pass or gc), the name no longer leads to the file
// opened (replaced meanwhile: the new file was not the one looked at), or `removable` says
// the file as it is now must stay.
Removal RemoveUnlessRead(
    const std::string& path, absl::FunctionRef<bool(const struct stat&)> removable =
                                 [](const struct stat&) { return true; }) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Removal::kGone;
  Removal result = Removal::kKept;
  struct stat by_fd, by_path;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    result = Removal::kBusy;
  } else if (fstat(fd, &by_fd) == 0 && stat(path.c_str(), &by_path) == 0 &&
             by_fd.st_ino == by_path.st_ino && by_fd.st_dev == by_path.st_dev &&
             removable(by_path) && unlink(path.c_str()) == 0) {
    result = Removal::kRemoved;
  }
  close(fd);
  return result;
}
}  // namespace

uint64_t RemoveBlockVersions(const std::string& blocks_dir, const std::string& keep) {
  uint64_t removed = 0;
  for (const std::string& version : DirNames(blocks_dir)) {
    if (version == keep) continue;
    const std::string dir = absl::StrCat(blocks_dir, "/", version);
    for (const std::string& name : DirNames(dir)) {
      // Pinned or not: a pin is on the object (its .blocks directory pins the blocks filled
      // later), and a superseded version's blocks are never read as the object again.
      const std::string path = absl::StrCat(dir, "/", name);
      if (RemoveUnlessRead(path) == Removal::kRemoved) ++removed;
    }
    rmdir(dir.c_str());  // when empty
  }
  return removed;
}

absl::StatusOr<uint64_t> CollectOldBlockVersions(const Tier& tier) {
  uint64_t removed = 0;
  const std::string objects = tier.MetaPath("objects");
  if (!IsDir(objects)) return removed;
  std::vector<std::string> stack = {objects};
  while (!stack.empty()) {
    const std::string dir = std::move(stack.back());
    stack.pop_back();
    for (const std::string& name : DirNames(dir)) {
      const std::string path = absl::StrCat(dir, "/", name);
      if (!IsDir(path)) continue;
      if (!absl::EndsWith(name, kTierBlocksSuffix)) {
        stack.push_back(path);
        continue;
      }
      // The newest version (latest fill among its blocks) stays.
      std::string newest;
      absl::Time newest_filled = absl::InfinitePast();
      for (const std::string& version : DirNames(path)) {
        for (const std::string& block : DirNames(absl::StrCat(path, "/", version))) {
          const auto entry = ReadEntryAttr(absl::StrCat(path, "/", version, "/", block));
          if (entry.has_value() && entry->filled > newest_filled) {
            newest = version;
            newest_filled = entry->filled;
          }
        }
      }
      removed += RemoveBlockVersions(path, newest);
      rmdir(path.c_str());  // when no block is left
    }
  }
  return removed;
}

absl::StatusOr<uint64_t> CollectOrphans(const Tier& tier) {
  const std::string objects = tier.MetaPath("objects");
  if (!IsDir(objects)) return uint64_t{0};
  std::vector<std::string> orphans;
  WHARF_RETURN_IF_ERROR(
      WalkTierFiles(tier, objects, [&](const std::string& path, const struct stat& st) {
        if (!IsCompleteEntry(ReadEntryAttr(path), st) && !IsPinned(path)) orphans.push_back(path);
      }));
  uint64_t removed = 0;
  for (const std::string& path : orphans) {
    // Still no entry once locked (a fill renames complete entries only, but over this name).
    const Removal r = RemoveUnlessRead(
        path, [&](const struct stat& st) { return !IsCompleteEntry(ReadEntryAttr(path), st); });
    if (r == Removal::kRemoved) ++removed;
  }
  return removed;
}

absl::Time LastAccess(const std::string& path, const TierEntry& entry) {
  return std::max(entry.filled, ReadAtime(-1, path));
}

void TouchEntry(int fd, const TierEntry& entry) {
  const absl::Time now = absl::Now();
  // The fill time first: a fresh entry costs no attribute read on the hot path.
  if (now - entry.filled < kTouchEvery || now - ReadAtime(fd, "") < kTouchEvery) return;
  const std::string value = absl::StrCat(absl::ToUnixSeconds(now));
  // Best effort: a reader without write permission leaves the entry's order as it was.
  (void)fsetxattr(fd, kTierAtimeXattr, value.data(), value.size(), 0);
}

absl::StatusOr<EvictResult> EvictTo(const Tier& tier, const std::string& path,
                                    uint64_t target_bytes, bool wait) {
  return EvictTo(
      tier, path, [target_bytes](uint64_t) { return target_bytes; }, wait);
}

absl::StatusOr<EvictResult> EvictToBounds(const Tier& tier, bool wait, std::string* warning) {
  auto result = EvictTo(
      tier, tier.root(),
      [&](uint64_t entry_bytes) { return EvictionTarget(tier, entry_bytes, warning); }, wait);
  // What the whole tier holds now: the next process starts from it instead of a walk.
  if (result.ok() && result->ran)
    (void)tier.RecordUsage(result->disk_bytes - result->evicted_disk_bytes);
  return result;
}

absl::StatusOr<EvictResult> EvictTo(const Tier& tier, const std::string& path,
                                    const std::function<uint64_t(uint64_t entry_bytes)>& target_of,
                                    bool wait) {
  EvictResult result;
  WHARF_RETURN_IF_ERROR(MakeDirs(tier.MetaPath("locks")));
  const std::string lock_path = tier.MetaPath("locks/evict");
  const int lock = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0) return ErrnoToStatus(errno, absl::StrCat("opening ", lock_path));
  if (flock(lock, LOCK_EX | (wait ? 0 : LOCK_NB)) != 0) {
    close(lock);
    result.ran = false;
    return result;
  }
  std::vector<Candidate> candidates;
  absl::Status walked = WalkTierFiles(tier, path, [&](const std::string& p, const struct stat& st) {
    const auto entry = ReadEntryAttr(p);
    if (!entry.has_value()) return;
    const bool in_tree = !absl::StartsWith(tier.Relative(p), absl::StrCat(Tier::kMetaDir, "/"));
    if (in_tree && UsersEdit(p, st, *entry)) {
      ++result.kept_modified;  // the user's own file now, as one without an entry
      return;
    }
    if (!IsCompleteEntry(entry, st)) return;
    ++result.entries;
    result.bytes += st.st_size;
    const uint64_t disk = DiskBytes(st);
    result.disk_bytes += disk;
    candidates.push_back({p, static_cast<uint64_t>(st.st_size), disk, LastAccess(p, *entry),
                          IsPinned(p), entry->local, in_tree});
  });
  if (!walked.ok()) {
    close(lock);
    return walked;
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) { return a.last_access < b.last_access; });
  const uint64_t target_bytes = target_of(result.disk_bytes);
  uint64_t left = result.disk_bytes;
  for (const Candidate& c : candidates) {
    if (left <= target_bytes) break;
    if (c.pinned) {
      ++result.kept_pinned;
      continue;
    }
    if (c.local) {
      ++result.kept_local;
      continue;
    }
    // Written by the user since the walk looked: theirs now (checked again under the lock).
    bool edited = false;
    const auto unedited = [&](const struct stat& st) {
      const auto entry = ReadEntryAttr(c.path);
      edited = c.in_tree && entry.has_value() && UsersEdit(c.path, st, *entry);
      return !edited;
    };
    switch (RemoveUnlessRead(c.path, unedited)) {
      case Removal::kGone:  // removed meanwhile
        left -= c.disk_bytes;
        break;
      case Removal::kBusy:
        ++result.kept_busy;
        break;
      case Removal::kRemoved:
        ++result.evicted;
        result.evicted_bytes += c.size;
        result.evicted_disk_bytes += c.disk_bytes;
        left -= c.disk_bytes;
        break;
      case Removal::kKept:
        if (edited) ++result.kept_modified;
        break;
    }
  }
  close(lock);
  return result;
}

namespace {
std::string NoCapacityWarning(const Tier& tier) {
  return absl::StrFormat(
      "tier %s: the file system reports no capacity, so its min free space (%g%%, set with "
      "`wharf tier init --min-free`) is ignored; --max-size bounds it",
      tier.root(), tier.config().min_free);
}
}  // namespace

std::string MinFreeIgnoredWarning(const Tier& tier) {
  struct statvfs vfs;
  if (tier.config().min_free > 0 && statvfs(tier.root().c_str(), &vfs) == 0 && vfs.f_blocks == 0) {
    return NoCapacityWarning(tier);
  }
  return "";
}

uint64_t EvictionTarget(const Tier& tier, uint64_t entry_bytes, std::string* warning) {
  const TierConfig& c = tier.config();
  uint64_t target = std::numeric_limits<uint64_t>::max();
  if (c.max_size > 0) target = c.max_size / 10 * 9;
  struct statvfs vfs;
  if (c.min_free > 0 && statvfs(tier.root().c_str(), &vfs) == 0) {
    if (vfs.f_blocks == 0) {
      static std::atomic<bool> warned{false};
      if (warning != nullptr && !warned.exchange(true)) {
        *warning = NoCapacityWarning(tier);
      }
    } else {
      const double total = static_cast<double>(vfs.f_blocks) * vfs.f_frsize;
      const double free = static_cast<double>(vfs.f_bavail) * vfs.f_frsize;
      // Free min_free percent, and one percent more so passes stay rare.
      const double want = total * (c.min_free + 1) / 100;
      if (free < total * c.min_free / 100) {
        const double lack = want - free;
        target = std::min<uint64_t>(
            target, lack >= entry_bytes ? 0 : entry_bytes - static_cast<uint64_t>(lack));
      }
    }
  }
  return target == std::numeric_limits<uint64_t>::max() ? entry_bytes : target;
}

std::optional<int64_t> FreeAboveMinFree(const Tier& tier) {
  const TierConfig& c = tier.config();
  struct statvfs vfs;
  if (c.min_free <= 0 || statvfs(tier.root().c_str(), &vfs) != 0 || vfs.f_blocks == 0) {
    return std::nullopt;
  }
  const double above =
      static_cast<double>(vfs.f_bavail) - static_cast<double>(vfs.f_blocks) * c.min_free / 100;
  return static_cast<int64_t>(above * static_cast<double>(vfs.f_frsize));
}

}  // namespace wharf
