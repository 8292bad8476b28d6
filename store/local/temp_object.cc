#include "store/local/temp_object.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <ctime>
#include <fstream>
#include <memory>
#include <random>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/crc32c.h"
#include "base/status.h"

namespace wharf {
namespace {

constexpr char kEtagXattr[] = "user.wharf.etag";

// The size, mtime and inode a cached ETag belongs to. The inode tells a file replaced by
// rename (a new file under the name, as tools that copy atomically and keep times make) from
// the one that was hashed, even with the same size and mtime; a file rewritten in place with
// both kept is beyond what metadata can tell (tier verify reads the content).
std::string EtagStamp(const struct stat& st) {
  return absl::StrCat(st.st_size, " ", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, " ", st.st_ino);
}

// `temp_dir`/<n>, n the calling thread's number modulo kTempSubdirs.
constexpr int kTempSubdirs = 16;
std::string TempSubdir(const std::string& temp_dir) {
  static std::atomic<int> next_thread{0};
  thread_local const int slot = next_thread.fetch_add(1, std::memory_order_relaxed) % kTempSubdirs;
  return absl::StrCat(temp_dir, "/", slot);
}

}  // namespace

mode_t ProcessUmask() {
  static const mode_t mask = [] {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
      if (absl::StartsWith(line, "Umask:")) {
        return static_cast<mode_t>(std::stoul(line.substr(6), nullptr, 8));
      }
    }
    return static_cast<mode_t>(022);
  }();
  return mask;
}

std::string RandomHex() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrCat(absl::Hex(rng(), absl::kZeroPad16));
}

void StoreLocalEtag(int fd, const struct stat& st, absl::string_view md5_hex) {
  std::string value = absl::StrCat(md5_hex, " ", EtagStamp(st));
  (void)fsetxattr(fd, kEtagXattr, value.data(), value.size(), 0);
}

void ForgetLocalEtag(int fd) { (void)fremovexattr(fd, kEtagXattr); }

std::optional<std::string> CachedLocalEtag(int fd, const std::string& path, const struct stat& st) {
  char buf[128];
  ssize_t n = fd >= 0 ? fgetxattr(fd, kEtagXattr, buf, sizeof(buf))
                      : getxattr(path.c_str(), kEtagXattr, buf, sizeof(buf));
  if (n <= 33) return std::nullopt;
  absl::string_view value(buf, n);
  if (value.substr(33) != EtagStamp(st)) return std::nullopt;
  return std::string(value.substr(0, 32));
}

std::string Crc32cHex(uint32_t crc) { return absl::StrCat(absl::Hex(crc, absl::kZeroPad8)); }

absl::StatusOr<std::string> ChecksumOfFile(int fd, uint64_t size_hint, Checksum kind) {
  Md5 md5;
  uint32_t crc = 0;
  // One byte more than the size sees the end in one read.
  const size_t buf_size =
      static_cast<size_t>(std::clamp<uint64_t>(size_hint + 1, 4096, uint64_t{1} << 20));
  std::unique_ptr<char[]> buf(new char[buf_size]);
  off_t off = 0;
  while (true) {
    const ssize_t n = pread(fd, buf.get(), buf_size, off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "hashing");
    if (n == 0) break;
    if (kind == Checksum::kMd5) {
      md5.Update(absl::string_view(buf.get(), n));
    } else {
      crc = Crc32cExtend(crc, buf.get(), n);
    }
    off += n;
  }
  return kind == Checksum::kMd5 ? HexLower(md5.Finish()) : Crc32cHex(crc);
}

// Creates every missing directory of `dir` (absolute). A path component that is a file means
// an object already holds a prefix of the key: FailedPrecondition.
absl::Status MakeDirs(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("'", dir, "' is an object, so it cannot also be a prefix of other keys"));
  }
  const size_t slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    WHARF_RETURN_IF_ERROR(MakeDirs(dir.substr(0, slash)));
  }
  if (mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST) {
    if (errno == ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat("a parent of '", dir, "' is an object, so it cannot be a prefix"));
    }
    return ErrnoToStatus(errno, absl::StrCat("mkdir ", dir));
  }
  return absl::OkStatus();
}

namespace {

absl::Mutex plain_dirs_mu(absl::kConstInit);
// Folders found to be no link (their own last component), by absolute path.
absl::flat_hash_set<std::string>* plain_dirs ABSL_GUARDED_BY(plain_dirs_mu) = nullptr;

}  // namespace

absl::Status RefuseLinksBelow(absl::string_view root, absl::string_view path) {
  while (root.size() > 1 && absl::EndsWith(root, "/")) root.remove_suffix(1);
  if (!absl::StartsWith(path, root) || path.size() <= root.size() + 1) return absl::OkStatus();
  const size_t last = path.rfind('/');
  {
    // The parent known plain: so were its folders below root when it was entered (shortest
    // first, below). One lookup for every file of a folder after its first.
    absl::MutexLock lock(&plain_dirs_mu);
    if (plain_dirs != nullptr && plain_dirs->contains(path.substr(0, last))) {
      return absl::OkStatus();
    }
  }
  // Each folder from the first below root to the target's parent, shortest first.
  for (size_t end = path.find('/', root.size() + 1); end != absl::string_view::npos && end <= last;
       end = path.find('/', end + 1)) {
    const absl::string_view dir_view = path.substr(0, end);
    {
      absl::MutexLock lock(&plain_dirs_mu);
      if (plain_dirs != nullptr && plain_dirs->contains(dir_view)) continue;
    }
    const std::string dir(dir_view);
    struct stat st;
    if (lstat(dir.c_str(), &st) != 0) break;  // missing: the rest is created as folders
    if (S_ISLNK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", dir,
                       "' is a symbolic link: wharf writes no file through one (it may lead "
                       "outside '",
                       root, "'); replace it with a folder, or write to where it points"));
    }
    absl::MutexLock lock(&plain_dirs_mu);
    if (plain_dirs == nullptr) plain_dirs = new absl::flat_hash_set<std::string>;  // never freed
    if (plain_dirs->size() >= 100000) plain_dirs->clear();  // bounded; a miss costs one lstat
    plain_dirs->insert(dir);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TempObject>> TempObject::Create(std::string target,
                                                               const std::string& temp_dir,
                                                               Checksum checksum, bool if_absent) {
  auto temp = std::unique_ptr<TempObject>(new TempObject(std::move(target), checksum));
  const std::string& t = temp->target_;
  const bool beside = temp_dir.empty();
  if (beside) {
    // A character device or a FIFO (/dev/null; /dev/stdout, a link in /dev to a pipe) is
    // written into, as cp does: a file renamed over it would replace the device itself (for
    // root, /dev/null of the whole machine). Nothing is created, renamed or removed then.
    // Links are followed only in /dev and /proc: a user's link elsewhere is replaced as any
    // file is, and a regular file in /dev/shm too.
    struct stat st, link_st;
    const bool system_path = absl::StartsWith(t, "/dev/") || absl::StartsWith(t, "/proc/");
    const bool is_link = lstat(t.c_str(), &link_st) == 0 && S_ISLNK(link_st.st_mode);
    const bool exists = (!is_link || system_path) && stat(t.c_str(), &st) == 0;
    const bool system_link = exists && is_link && S_ISREG(st.st_mode);
    if (system_link) {
      // Written through a new description at offset 0, it would interleave with what the
      // process itself writes there (a summary line on stdout); renamed over, the link in
      // /dev would be replaced. Refused, naming the way that works.
      return absl::FailedPreconditionError(absl::StrCat(
          t, " is a link to a regular file: name that file, or use `wharf cat URI > FILE`"));
    }
    if (exists && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))) {
      if (if_absent) {
        return absl::AlreadyExistsError(
            absl::StrCat(t, " exists (a ", S_ISCHR(st.st_mode) ? "character device" : "FIFO", ")"));
      }
      temp->in_place_ = true;
      temp->path_ = t;
      // Not blocked for good by a FIFO that nobody reads: it gets a few seconds to be opened.
      for (int waited_ms = 0;; waited_ms += 20) {
        temp->fd_ = open(t.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
        if (temp->fd_ >= 0 || errno != ENXIO) break;
        if (waited_ms >= 5000) {
          return absl::FailedPreconditionError(absl::StrCat(t, " is a FIFO that nobody reads"));
        }
        usleep(20000);
      }
      if (temp->fd_ < 0) return ErrnoToStatus(errno, absl::StrCat("opening ", t));
      fcntl(temp->fd_, F_SETFL, fcntl(temp->fd_, F_GETFL) & ~O_NONBLOCK);
      return temp;
    }
    if (exists && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(t, " is ", S_ISBLK(st.st_mode) ? "a block device" : "a socket",
                       ": wharf writes files, character devices and FIFOs only"));
    }
  }
  // In a private directory each thread creates its files in a subdirectory of its own:
  // creating a file holds its directory's lock while the file system allocates the inode,
  // and threads creating in one directory spin on that lock (perf of an import on ext4 without
  // a journal right after a mass delete, when each allocation scans past the freed inodes: a
  // fifth of its CPU).
  const std::string dir = beside ? t.substr(0, t.rfind('/')) : TempSubdir(temp_dir);
  // Beside its target a file is private (0600) until Seal gives it its final mode; in a
  // private directory (0700) it is created with that mode (one metadata operation less: on
  // CephFS each is a round trip to the metadata server).
  temp->final_mode_ = !beside;
  // From before the file exists until its cleanup is registered (base/interrupt.h).
  InterruptCreation creation;
  if (!creation.ok()) return absl::CancelledError("interrupted: no new file is written");
  // A concurrent delete may prune the directory between MakeDirs and open: retry.
  for (int attempt = 0;; ++attempt) {
    if (beside) WHARF_RETURN_IF_ERROR(MakeDirs(dir.empty() ? "/" : dir));
    temp->path_ =
        absl::StrCat(dir, "/", beside ? kLockedTempPrefix : kLocalTempPrefix, RandomHex());
    temp->fd_ =
        open(temp->path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, beside ? 0600 : 0666);
    if (temp->fd_ >= 0) {
      // Beside the target (where no tier's garbage collection looks), the lock tells this
      // live file from an abandoned one (RemoveAbandonedTemp). A dup holds it past Seal's
      // close: a flock belongs to the open file, not to one descriptor.
      if (beside) {
        if (flock(temp->fd_, LOCK_EX | LOCK_NB) == 0) {
          // A sweep may have taken the file in the moment between its creation and the
          // lock, and removed it: then it is not at its name any more, and another is made.
          struct stat by_fd, by_path;
          if (fstat(temp->fd_, &by_fd) != 0 || stat(temp->path_.c_str(), &by_path) != 0 ||
              by_fd.st_ino != by_path.st_ino || by_fd.st_dev != by_path.st_dev) {
            close(std::exchange(temp->fd_, -1));
            continue;
          }
          temp->lock_fd_ = fcntl(temp->fd_, F_DUPFD_CLOEXEC, 0);
        } else if (errno == EWOULDBLOCK) {
          close(std::exchange(temp->fd_, -1));  // a sweep holds it, and removes it
          continue;
        }
        // Else the file system has no flock (ENOLCK): no sweep can take the file either.
      }
      // An interrupted CLI run removes it on its way out (base/interrupt.h).
      temp->interrupt_ = InterruptCleanup([path = temp->path_] { unlink(path.c_str()); });
      return temp;
    }
    if (errno == ENOENT && !beside && attempt == 0) {
      // The thread's subdirectory is made on its first file (private: mode 0700).
      if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
        return ErrnoToStatus(errno, absl::StrCat("creating ", dir));
      }
      continue;
    }
    if (errno != ENOENT || !beside || attempt == 3) {
      return ErrnoToStatus(errno, "creating temporary file");
    }
  }
}

TempObject::~TempObject() {
  if (fd_ >= 0) close(fd_);
  if (!published_ && !in_place_ && !path_.empty()) unlink(path_.c_str());
  if (lock_fd_ >= 0) close(lock_fd_);  // after the unlink: never a removable file of ours
}

bool RemoveAbandonedTemp(int dir_fd, const char* name) {
  if (!absl::StartsWith(name, kLockedTempPrefix)) return false;  // not one with a lock
  const int fd = openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  struct stat st;
  bool removed = false;
  // No age: a writer that finds its new file taken before it locked it makes another
  // (TempObject::Create), so one without a lock is never a live writer's.
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0) {
    removed = unlinkat(dir_fd, name, 0) == 0;
  }
  close(fd);
  return removed;
}

void TempObject::AddToChecksum(absl::string_view data) {
  if (kind_ == Checksum::kCrc32c) {
    crc32c_ = Crc32cExtend(crc32c_, data.data(), data.size());
  } else if (!known_md5_) {
    md5_.Update(data);
  }
}

absl::Status TempObject::Append(absl::string_view data) {
  AddToChecksum(data);
  appended_ += data.size();
  return WriteAll(fd_, data);
}

absl::Status TempObject::Append(const absl::Cord& data) {
  for (absl::string_view chunk : data.Chunks()) AddToChecksum(chunk);
  appended_ += data.size();
  return WriteAll(fd_, data);
}

absl::StatusOr<ObjectMeta> TempObject::Seal(
    std::optional<absl::Time> mtime, bool fsync,
    absl::FunctionRef<absl::Status(int fd, const ObjectMeta& meta)> before_close) {
  if (fd_ < 0) return absl::FailedPreconditionError("sealing a temporary file twice");
  if (in_place_) {  // a device or FIFO: its mode, times and attributes are not the object's
    ObjectMeta meta;
    meta.size = appended_;
    meta.mtime = absl::Now();
    checksum_ = kind_ == Checksum::kMd5 ? HexLower(known_md5_ ? *known_md5_ : md5_.Finish())
                                        : Crc32cHex(crc32c_);
    if (kind_ == Checksum::kMd5) meta.etag = checksum_;
    const int fd = std::exchange(fd_, -1);
    if (close(fd) != 0) return ErrnoToStatus(errno, "close");
    return meta;
  }
  if (!final_mode_ && fchmod(fd_, 0666 & ~ProcessUmask()) != 0) {
    return ErrnoToStatus(errno, "chmod");
  }
  if (mtime.has_value()) {
    // atime stays as it is; only the modification time is the object's.
    const struct timespec times[2] = {{0, UTIME_OMIT}, absl::ToTimespec(*mtime)};
    if (futimens(fd_, times) != 0) return ErrnoToStatus(errno, "setting mtime");
  }
  if (fsync && ::fsync(fd_) != 0) return ErrnoToStatus(errno, "fsync");
  struct stat st;
  if (fstat(fd_, &st) != 0) return ErrnoToStatus(errno, "stat");
  ObjectMeta meta;
  meta.size = st.st_size;
  meta.mtime = absl::TimeFromTimespec(st.st_mtim);
  if (kind_ == Checksum::kMd5) {
    checksum_ = meta.etag = HexLower(known_md5_ ? *known_md5_ : md5_.Finish());
    StoreLocalEtag(fd_, st, meta.etag);
  } else {
    checksum_ = Crc32cHex(crc32c_);
  }
  WHARF_RETURN_IF_ERROR(before_close(fd_, meta));
  const int fd = fd_;
  fd_ = -1;
  if (close(fd) != 0) return ErrnoToStatus(errno, "close");
  return meta;
}

absl::Status TempObject::Publish(bool sync_dir, bool exclusive) {
  return PublishAt(target_, sync_dir, exclusive);
}

namespace {
// rename(2), or with `exclusive` a rename that fails with EEXIST when the target exists.
// Returns 0 or an errno.
int RenameFile(const std::string& from, const std::string& to, bool exclusive) {
  if (!exclusive) return rename(from.c_str(), to.c_str()) == 0 ? 0 : errno;
  if (renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return errno;
  // A file system without RENAME_NOREPLACE (some FUSE ones): a hard link is created only
  // where no name is, atomically too.
  if (link(from.c_str(), to.c_str()) != 0) return errno;
  unlink(from.c_str());
  return 0;
}
}  // namespace

absl::Status TempObject::PublishAt(const std::string& target, bool sync_dir, bool exclusive) {
  if (in_place_) {  // written already, into the device itself
    if (exclusive) return absl::AlreadyExistsError("the object already exists (exclusive create)");
    published_ = true;
    return absl::OkStatus();
  }
  const size_t slash = target.rfind('/');
  const std::string dir = slash == 0 ? "/" : target.substr(0, slash);
  if (int err = RenameFile(path_, target, exclusive); err != 0) {
    if (err == ENOENT || err == ENOTDIR) {
      // The target's directory is missing (a temp_dir elsewhere), or a file holds a part of
      // its path (MakeDirs names it).
      WHARF_RETURN_IF_ERROR(MakeDirs(dir));
      err = RenameFile(path_, target, exclusive);
    }
    struct stat st;
    if (exclusive && err == EEXIST && !(stat(target.c_str(), &st) == 0 && S_ISDIR(st.st_mode))) {
      return absl::AlreadyExistsError("the object already exists (exclusive create)");
    }
    if (err == EISDIR || err == ENOTEMPTY || err == EEXIST) {
      return absl::FailedPreconditionError(
          "other keys have this key as their prefix, so it cannot also be an object");
    }
    if (err != 0) return ErrnoToStatus(err, "rename");
  }
  published_ = true;
  interrupt_.Reset();
  if (lock_fd_ >= 0) {
    close(lock_fd_);
    lock_fd_ = -1;
  }
  if (sync_dir) {
    int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      fsync(dfd);
      close(dfd);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ObjectMeta> TempObject::Commit(std::optional<absl::Time> mtime, bool fsync,
                                              bool exclusive) {
  WHARF_ASSIGN_OR_RETURN(ObjectMeta meta, Seal(mtime, fsync));
  WHARF_RETURN_IF_ERROR(Publish(/*sync_dir=*/fsync, exclusive));
  return meta;
}

}  // namespace wharf
