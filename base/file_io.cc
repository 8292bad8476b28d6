#include "base/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace wharf {

absl::Status WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "write");
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const absl::Cord& data) {
  if (auto flat = data.TryFlat(); flat.has_value()) return WriteAll(fd, *flat);
  constexpr int kMaxIov = 64;
  struct iovec iov[kMaxIov];
  auto it = data.chunk_begin();
  const auto end = data.chunk_end();
  while (it != end) {
    int n = 0;
    for (; n < kMaxIov && it != end; ++it) {
      const absl::string_view chunk = *it;
      if (!chunk.empty()) iov[n++] = {const_cast<char*>(chunk.data()), chunk.size()};
    }
    size_t want = 0;
    for (int i = 0; i < n; ++i) want += iov[i].iov_len;
    ssize_t got = writev(fd, iov, n);
    if (got < 0 && errno == EINTR) got = 0;
    if (got < 0) return ErrnoToStatus(errno, "write");
    if (static_cast<size_t>(got) == want) continue;
    // A short write (or EINTR): finish this group one chunk at a time.
    size_t skip = static_cast<size_t>(got);
    for (int i = 0; i < n; ++i) {
      absl::string_view part(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
      if (skip >= part.size()) {
        skip -= part.size();
        continue;
      }
      part.remove_prefix(skip);
      skip = 0;
      WHARF_RETURN_IF_ERROR(WriteAll(fd, part));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view data) {
  // A name no one can guess, created new (O_EXCL) and never through a link planted at it:
  // the folder may be shared (./wharf-trace-PID.json in /tmp, a metrics file).
  std::string tmp;
  int fd = -1;
  std::random_device random;
  for (int attempt = 0; fd < 0 && attempt < 8; ++attempt) {
    tmp = absl::StrCat(path, ".tmp-", getpid(), "-", absl::Hex(random(), absl::kZeroPad8),
                       absl::Hex(random(), absl::kZeroPad8));
    fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", tmp));
  absl::Status written = WriteAll(fd, data);
  if (close(fd) != 0 && written.ok()) written = ErrnoToStatus(errno, absl::StrCat("close ", tmp));
  if (written.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    written = ErrnoToStatus(errno, absl::StrCat("rename to ", path));
  }
  if (!written.ok()) unlink(tmp.c_str());
  return written;
}

bool ReadFile(const std::string& path, std::string* out) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[65536];
  out->clear();
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return true;
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path, absl::string_view what,
                                             uint64_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return wharf::ErrnoToStatus(errno, what);
  std::string content;
  char buffer[8192];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return wharf::ErrnoToStatus(err, what);
    }
    if (n == 0) break;
    content.append(buffer, static_cast<size_t>(n));
    if (content.size() > max_bytes) {
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat(what, ": larger than ", max_bytes, " bytes"));
    }
  }
  close(fd);
  return content;
}

std::vector<std::string> ListFiles(const std::string& dir, absl::string_view suffix) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = readdir(d)) {
    const absl::string_view name = e->d_name;
    if (name.size() > suffix.size() && absl::EndsWith(name, suffix)) {
      out.push_back(absl::StrCat(dir, "/", name));
    }
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace wharf
