#include "dataset/index_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "base/hash.h"
#include "base/status.h"

namespace wharf::internal_index {
namespace {

constexpr uint64_t kCrcOffset = 124;

uint64_t Pad8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

uint32_t Load32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}
void Store32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// A file mapping, unmapped when the last SampleIndex sharing it goes.
struct MappedColumns : Columns {
  ~MappedColumns() override {
    if (base != nullptr) munmap(base, length);
  }
  void* base = nullptr;
  size_t length = 0;
};

}  // namespace

Layout LayoutOf(const Header& h) {
  Layout l;
  l.keys = kHeaderSize;
  l.etags = l.keys + Pad8(h.key_bytes);
  l.key_offsets = l.etags + Pad8(h.etag_bytes);
  l.sizes = l.key_offsets + 8 * (h.count + 1);
  l.etag_offsets = l.sizes + 8 * h.count;
  l.file_size = l.etag_offsets + (h.has_etags ? 8 * (h.count + 1) : 0);
  return l;
}

std::string EncodeHeader(const Header& h) {
  std::string out(kHeaderSize, '\0');
  char* p = out.data();
  std::memcpy(p, kMagic, sizeof(kMagic));
  Store32(p + 8, kFormatVersion);
  Store32(p + 12, h.has_etags ? kFlagEtags : 0);
  Store64(p + 16, h.count);
  Store64(p + 24, h.key_bytes);
  Store64(p + 32, h.etag_bytes);
  std::memcpy(p + 40, h.fingerprint.data(), h.fingerprint.size());
  Store32(p + kCrcOffset, Crc32c(absl::string_view(p, kCrcOffset)));
  return out;
}

absl::Status BindImage(const char* data, uint64_t size, absl::string_view what, Columns& columns) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
  };
  if (size < sizeof(kMagic) || std::memcmp(data, kMagic, sizeof(kMagic)) != 0) {
    return bad("not a wharf index file (no WHARFIDX header)");
  }
  if (size < kHeaderSize) {
    return bad(absl::StrCat("truncated: ", size, " bytes, shorter than the header"));
  }
  const uint32_t version = Load32(data + 8);
  if (version != kFormatVersion) {
    return bad(absl::StrCat("index file format version ", version,
                            " is not supported (this build reads version ", kFormatVersion,
                            "); delete the file to rebuild it"));
  }
  if (Load32(data + kCrcOffset) != Crc32c(absl::string_view(data, kCrcOffset))) {
    return bad("corrupt header (checksum mismatch)");
  }
  const uint32_t flags = Load32(data + 12);
  if ((flags & ~kFlagEtags) != 0) return bad(absl::StrCat("unknown flags ", flags));
  Header h;
  h.count = Load64(data + 16);
  h.key_bytes = Load64(data + 24);
  h.etag_bytes = Load64(data + 32);
  h.has_etags = (flags & kFlagEtags) != 0;
  std::memcpy(h.fingerprint.data(), data + 40, h.fingerprint.size());
  // Bounded before the layout arithmetic, so it cannot overflow.
  if (h.count > size / 8 || h.key_bytes > size || h.etag_bytes > size) {
    return bad(absl::StrCat("truncated: ", size, " bytes cannot hold the ", h.count,
                            " entries the header announces"));
  }
  if (!h.has_etags && h.etag_bytes != 0) return bad("ETag bytes without ETag offsets");
  const Layout l = LayoutOf(h);
  if (l.file_size != size) {
    return bad(absl::StrCat(size < l.file_size ? "truncated" : "trailing bytes", ": ", size,
                            " bytes, the header describes ", l.file_size, " (", h.count,
                            " entries)"));
  }
  columns.count = h.count;
  columns.keys = data + l.keys;
  columns.key_bytes = h.key_bytes;
  columns.key_offsets = data + l.key_offsets;
  columns.sizes = data + l.sizes;
  columns.fingerprint = h.fingerprint;
  if (Load64(columns.key_offsets) != 0 ||
      Load64(columns.key_offsets + 8 * h.count) != h.key_bytes) {
    return bad("corrupt key offsets (the first must be 0, the last the key bytes)");
  }
  if (h.has_etags) {
    columns.etags = data + l.etags;
    columns.etag_bytes = h.etag_bytes;
    columns.etag_offsets = data + l.etag_offsets;
    if (Load64(columns.etag_offsets) != 0 ||
        Load64(columns.etag_offsets + 8 * h.count) != h.etag_bytes) {
      return bad("corrupt ETag offsets (the first must be 0, the last the ETag bytes)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Columns>> MapFile(const std::string& path) {
  const std::string what = absl::StrCat("index file ", path);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening ", what));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoToStatus(err, absl::StrCat("opening ", what));
  }
  // Last use, for the cache's cleanup of superseded files (RemoveStale). Best effort: a
  // read-only cache is fine.
  futimens(fd, nullptr);
  auto columns = std::make_shared<MappedColumns>();
  columns->path = path;
  columns->length = static_cast<size_t>(st.st_size);
  if (columns->length > 0) {
    void* base = mmap(nullptr, columns->length, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      const int err = errno;
      close(fd);
      return ErrnoToStatus(err, absl::StrCat("mapping ", what));
    }
    columns->base = base;
  }
  close(fd);  // the mapping keeps the file
  static const char kEmpty[1] = {0};
  const char* data = columns->base ? static_cast<const char*>(columns->base) : kEmpty;
  if (absl::Status s = BindImage(data, columns->length, what, *columns); !s.ok()) return s;
  return std::shared_ptr<const Columns>(std::move(columns));
}

absl::Status MakeDirs(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("index cache: empty directory");
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string part = dir.substr(0, pos);
    if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, absl::StrCat("creating index cache directory ", part));
    }
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("index cache ", dir, " is not a directory"));
  }
  return absl::OkStatus();
}

std::string CacheDigest(std::initializer_list<absl::string_view> parts) {
  Md5 md5;
  for (absl::string_view p : parts) {
    char len[8];
    Store64(len, p.size());
    md5.Update(absl::string_view(len, 8));
    md5.Update(p);
  }
  return HexLower(md5.Finish());
}

absl::StatusOr<FileLock> FileLock::Acquire(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("creating lock file ", path));
  while (flock(fd, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    close(fd);
    return ErrnoToStatus(err, absl::StrCat("locking ", path));
  }
  return FileLock(fd);
}

FileLock::~FileLock() {
  if (fd_ >= 0) close(fd_);  // releases the lock
}

bool IsCacheFileName(absl::string_view name) {
  // m-: a manifest's index, l-: a listing's, r-: a shard record index (MapDataset.from_shards,
  // written by wharf/torch/_shards.py).
  if (!absl::StartsWith(name, "m-") && !absl::StartsWith(name, "l-") &&
      !absl::StartsWith(name, "r-")) {
    return false;
  }
  if (name.size() < 19 || name[18] != '-') return false;
  for (char c : name.substr(2, 16)) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

void RemoveStale(const std::string& dir, absl::string_view keep, int64_t max_age_seconds) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  const time_t now = time(nullptr);
  std::vector<std::string> stale;
  while (dirent* e = readdir(d)) {
    const absl::string_view name = e->d_name;
    if (!IsCacheFileName(name) || absl::StartsWith(name, keep)) continue;
    const std::string path = absl::StrCat(dir, "/", name);
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        now - st.st_mtime > max_age_seconds) {
      stale.push_back(path);
    }
  }
  closedir(d);
  for (const std::string& path : stale) unlink(path.c_str());
}

}  // namespace wharf::internal_index
