// The index file: a SampleIndex's compact columns in one file, mapped read-only and shared by
// every process of a node that uses the same index. See docs/design/dataset.md, "Index".
//
// Layout (little-endian; every section starts at a multiple of 8 bytes, zero padding):
//
//   header        128 bytes: magic "WHARFIDX", u32 version (1), u32 flags (bit 0: ETags
//                 present), u64 count N, u64 key bytes K, u64 ETag bytes E, the 16-byte MD5
//                 fingerprint (SampleIndex::Fingerprint), zeros, and at 124 the CRC32C of
//                 bytes [0, 124)
//   keys          K bytes: the keys, concatenated
//   etags         E bytes: the ETags, concatenated (E = 0 without ETags)
//   key offsets   N + 1 u64: key i is keys[offset[i], offset[i + 1]); offset[0] = 0,
//                 offset[N] = K
//   sizes         N u64: the object sizes; kUnknownSize (2^64 - 1) when unknown
//   etag offsets  N + 1 u64, as key offsets; only with ETags (flag bit 0)
//
// Every section's place follows from the header, so the file size is known from it: a
// truncated or extended file is refused before anything else is read. Keys come first so that
// a builder streams them straight into the file; the fixed-width columns, collected in
// temporary files beside it, follow.
//
// Thread-safety: functions of their arguments; Columns are immutable.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace wharf::internal_index {

inline constexpr char kMagic[8] = {'W', 'H', 'A', 'R', 'F', 'I', 'D', 'X'};
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr uint64_t kHeaderSize = 128;
inline constexpr uint64_t kUnknownSize = ~uint64_t{0};
inline constexpr uint32_t kFlagEtags = 1;
// Index files carry this suffix (also what the cache's cleanup removes).
inline constexpr char kFileSuffix[] = ".widx";

struct Header {
  uint64_t count = 0;
  uint64_t key_bytes = 0;
  uint64_t etag_bytes = 0;
  bool has_etags = false;
  std::array<uint8_t, 16> fingerprint{};
};

// Where each section starts, and the file's size.
struct Layout {
  uint64_t keys = 0, etags = 0, key_offsets = 0, sizes = 0, etag_offsets = 0, file_size = 0;
};
Layout LayoutOf(const Header& h);

std::string EncodeHeader(const Header& h);

inline uint64_t Load64(const char* p) {
  uint64_t v;
  __builtin_memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}
inline void Store64(char* p, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  __builtin_memcpy(p, &v, 8);
}

// The columns of an index, wherever their bytes live (a mapping, a string, vectors); the
// subclass owns them. Pointers are into little-endian sections as laid out above.
struct Columns {
  virtual ~Columns() = default;
  uint64_t count = 0;
  const char* keys = nullptr;
  uint64_t key_bytes = 0;
  const char* etags = nullptr;
  uint64_t etag_bytes = 0;
  const char* key_offsets = nullptr;   // count + 1
  const char* sizes = nullptr;         // count
  const char* etag_offsets = nullptr;  // count + 1, or nullptr: no ETags
  std::array<uint8_t, 16> fingerprint{};
  std::string path;         // the mapped file, or empty
  uint64_t heap_bytes = 0;  // this process's heap the columns hold
};

// Checks an index file image (O(1): header, CRC, layout against `size`, the first and last
// offsets) and fills `columns`' pointers into it. Errors are InvalidArgument naming `what`.
absl::Status BindImage(const char* data, uint64_t size, absl::string_view what, Columns& columns);

// Maps the index file at `path` (MAP_SHARED, read-only) and binds it.
absl::StatusOr<std::shared_ptr<const Columns>> MapFile(const std::string& path);

// Creates `dir` and its missing parents (new ones mode 0700). Errors name `dir`.
absl::Status MakeDirs(const std::string& dir);

// A hex digest naming a cache entry, of the length-prefixed `parts`.
std::string CacheDigest(std::initializer_list<absl::string_view> parts);

// Holds an exclusive flock(2) on `path` (created if missing) until destroyed: one process
// builds a cache entry while the others wait, then find it built.
class FileLock {
 public:
  static absl::StatusOr<FileLock> Acquire(const std::string& path);
  FileLock(FileLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileLock& operator=(FileLock&&) = delete;
  FileLock(const FileLock&) = delete;
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

// Whether `name` is one of the cache's files: "m-", "l-" or "r-", 16 hex digits, "-" (index
// files, their lock files, temporaries of builds that did not finish).
bool IsCacheFileName(absl::string_view name);

// Removes the cache files of `dir` (IsCacheFileName) not modified for `max_age_seconds`,
// except those whose names start with `keep`: superseded manifest versions and listings, and
// datasets no longer used. Opening an index file refreshes its modification time, so a file
// in use is not removed. Other files in `dir` are left alone. Best effort.
void RemoveStale(const std::string& dir, absl::string_view keep, int64_t max_age_seconds);

}  // namespace wharf::internal_index
