#include "base/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

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

absl::Status WriteFileAtomically(const std::string& path, absl::string_view data) {
  const std::string tmp = absl::StrCat(path, ".tmp-", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", tmp));
  absl::Status written = WriteAll(fd, data);
  if (close(fd) != 0 && written.ok()) written = ErrnoToStatus(errno, absl::StrCat("close ", tmp));
  if (written.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    written = ErrnoToStatus(errno, absl::StrCat("rename to ", path));
  }
  if (!written.ok()) unlink(tmp.c_str());
  return written;
}

}  // namespace wharf
