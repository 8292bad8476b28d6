// TempObject: a file written privately and then published at its path in one rename, the
// way every file-backed object in wharf appears (the file:// store's puts, the tier's
// entries). Destroyed unpublished, it removes itself: a half-written object is never visible.
//
//  - The temporary file is never world-readable while it is written: created in a private
//    `temp_dir` (mode 0700, on the target's file system) with its final mode, or, when that
//    is empty, next to the target as ".wharf-tmp-<random>" (a name the file:// store never
//    lists) with mode 0600.
//  - Seal() finishes the content: the final mode (0666 & ~umask), the modification time when
//    given, the checksum computed while writing (Checksum::kMd5, the default: the MD5 ETag,
//    cached in the "user.wharf.etag" attribute so listings need not hash the file;
//    Checksum::kCrc32c: a CRC32C, ~20x cheaper, for files whose ETag comes from elsewhere,
//    such as the tier's copies of remote objects), and any attributes the caller adds; then
//    it closes.
//  - Publish() renames it over the target, creating the target's directories.
//  - A target that is a character device or a FIFO (/dev/null, /dev/stdout) is written into
//    directly, as cp does, and never renamed over or removed; a block device or a socket is
//    refused.
// Sealing and publishing are separate so a caller can make many sealed files durable at once
// (one syncfs) before publishing any of them.
//
// Thread-safety: one thread at a time per TempObject.
#pragma once

#include <sys/stat.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/file_io.h"
#include "base/hash.h"
#include "base/interrupt.h"
#include "base/md5_many.h"
#include "store/object_store.h"

namespace wharf {

// What a TempObject computes over the bytes appended (see Seal) and ChecksumOfFile recomputes.
enum class Checksum { kMd5, kCrc32c };

// Names the file:// store reserves for its temporary files.
inline constexpr absl::string_view kLocalTempPrefix = ".wharf-tmp-";
// Those created beside their target, whose writers hold a flock on them (RemoveAbandonedTemp);
// files in a private temp_dir are their owner's to collect (the tier's garbage collection).
inline constexpr absl::string_view kLockedTempPrefix = ".wharf-tmp-l";

// Removes `name`, a temporary file (kLockedTempPrefix) in the directory `dir_fd`, when the
// process that wrote it is gone: no process holds its flock (a writer holds it until it
// publishes or removes the file; the OS releases it when the writer dies, kill -9 included).
// A writer locks its file right after creating it, and makes another if a sweep took the
// first in between, so a rerun right after a kill removes what the killed run left.
// Returns whether it removed it. The file:// store calls it for each one its listings meet,
// so a rerun into a folder removes what killed runs left there.
bool RemoveAbandonedTemp(int dir_fd, const char* name);

class TempObject {
 public:
  // A temporary file for `target` (an absolute path) in `temp_dir`, or next to the target
  // when `temp_dir` is empty (its directories are created then). `temp_dir` must be private
  // (mode 0700: files in it are created with their final mode) and on the target's file
  // system; each thread creates its files in a subdirectory of it, made on first use.
  // `if_absent` (an exclusive put): a character device or FIFO at the target, which would be
  // written into in place, is AlreadyExists before anything is written (a regular file's
  // existence is Commit's to check).
  static absl::StatusOr<std::unique_ptr<TempObject>> Create(std::string target,
                                                            const std::string& temp_dir = "",
                                                            Checksum checksum = Checksum::kMd5,
                                                            bool if_absent = false);
  ~TempObject();
  TempObject(const TempObject&) = delete;
  TempObject& operator=(const TempObject&) = delete;

  absl::Status Append(absl::string_view data);
  absl::Status Append(const absl::Cord& data);
  // The MD5 of everything that will be appended, computed elsewhere (Md5Batcher hashes many
  // objects at once): Append then only writes. Only for Checksum::kMd5, before any Append.
  void SetMd5(const Md5Digest& md5) { known_md5_ = md5; }

  // Finishes the file (see above) and closes it. `before_close` may set more attributes on
  // the file descriptor; `fsync` flushes the data to disk before closing. Returns the
  // object's size, modification time and ETag (key left empty; the MD5 with Checksum::kMd5,
  // empty with kCrc32c).
  absl::StatusOr<ObjectMeta> Seal(
      std::optional<absl::Time> mtime, bool fsync = false,
      absl::FunctionRef<absl::Status(int fd, const ObjectMeta& meta)> before_close =
          [](int, const ObjectMeta&) { return absl::OkStatus(); });
  // Renames the sealed file over the target; with `sync_dir`, then fsyncs the directory.
  // FailedPrecondition when the target is a directory (other keys have it as a prefix).
  // `exclusive`: only if nothing is at the target yet (AlreadyExists otherwise), atomically
  // (renameat2 RENAME_NOREPLACE, or link + unlink where the file system lacks it).
  absl::Status Publish(bool sync_dir = false, bool exclusive = false);
  // The same, renaming it to `target` (absolute) instead: for a file whose final name is
  // known only once it is written (the tier's blocks, named by the object's ETag).
  absl::Status PublishAt(const std::string& target, bool sync_dir = false, bool exclusive = false);
  // Seal + Publish.
  absl::StatusOr<ObjectMeta> Commit(std::optional<absl::Time> mtime, bool fsync = false,
                                    bool exclusive = false);

  const std::string& path() const { return path_; }
  // The hex checksum of what was appended (8 digits for a CRC32C, 32 for an MD5); set by Seal.
  const std::string& checksum() const { return checksum_; }
  const std::string& target() const { return target_; }

 private:
  TempObject(std::string target, Checksum kind) : target_(std::move(target)), kind_(kind) {}
  // Adds appended bytes to the checksum (not to an MD5 given by SetMd5).
  void AddToChecksum(absl::string_view data);

  const std::string target_;
  std::string path_;
  int fd_ = -1;
  // Beside its target: a dup of the file held until it is published or removed, keeping the
  // flock that tells a live writer's file from one a killed process left (RemoveAbandonedTemp).
  int lock_fd_ = -1;
  bool published_ = false;
  // Registered until the file is published or removed.
  InterruptCleanup interrupt_;
  // Created with its final mode (in a private directory): Seal needs no chmod.
  bool final_mode_ = false;
  // The target is a character device or a FIFO, written directly (see Create).
  bool in_place_ = false;
  uint64_t appended_ = 0;
  const Checksum kind_;
  Md5 md5_;
  std::optional<Md5Digest> known_md5_;
  uint32_t crc32c_ = 0;
  std::string checksum_;
};

// Creates every missing directory of `dir` (absolute). A path component that is a file means
// an object already holds a prefix of the key: FailedPrecondition.
absl::Status MakeDirs(const std::string& dir);
// FailedPrecondition when a folder of `path` below `root` (both absolute, `path` inside
// `root`) is a symbolic link: a write there would land wherever the link points, outside
// `root` perhaps (a link planted in a destination or a tier). `root` itself and the last
// component of `path` may be links (a rename replaces a link at the target, never writes
// through it). A folder found plain is remembered, so a tree's files cost a lookup each.
absl::Status RefuseLinksBelow(absl::string_view root, absl::string_view path);
// The process umask, read once without changing it.
mode_t ProcessUmask();
// 16 random hex digits (per-thread generator seeded from the OS).
std::string RandomHex();

// The hex checksum of the content of the open file `fd`, as TempObject::checksum() gives it
// (read from offset 0 with pread; `size_hint` sizes the buffer, so hashing many small files
// costs no large buffer each).
absl::StatusOr<std::string> ChecksumOfFile(int fd, uint64_t size_hint, Checksum kind);
inline absl::StatusOr<std::string> Md5OfFile(int fd, uint64_t size_hint) {
  return ChecksumOfFile(fd, size_hint, Checksum::kMd5);
}
// 8 lowercase hex digits.
std::string Crc32cHex(uint32_t crc);

// The file:// store's ETag cache: the MD5 of a file's content kept in the attribute
// "user.wharf.etag" with the size, modification time and inode it belongs to. Store is best
// effort (file systems without user attributes fall back to hashing on use); the cached value
// is returned only while they still match `st`. `fd` may be -1 to read by path.
void StoreLocalEtag(int fd, const struct stat& st, absl::string_view md5_hex);
std::optional<std::string> CachedLocalEtag(int fd, const std::string& path, const struct stat& st);
// Drops the ETag cached on the open file: its content decides again (it was found damaged).
void ForgetLocalEtag(int fd);

}  // namespace wharf
