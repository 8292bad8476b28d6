#include "store/local/local_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/status.h"
#include "store/local/temp_object.h"

namespace wharf {
namespace {

constexpr absl::string_view kTempPrefix = kLocalTempPrefix;
// A tier's metadata folder and the file that makes a folder a tier (tier/tier.h: Tier::kMetaDir
// and its config file; the store layer sits below the tier's).
constexpr absl::string_view kTierMetaDir = ".wharf";
constexpr absl::string_view kTierConfig = "tier.json";
constexpr size_t kChunk = 1 << 20;
// The most one pread into a caller's buffer reads, so a cancel is seen within this many bytes
// (large enough that the extra syscalls cost nothing measurable).
constexpr size_t kBufferChunk = 8 << 20;

bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n;  // continuation bytes that follow
    if (c < 0x80) {
      n = 0;
    } else if ((c >> 5) == 0x6) {
      n = 1;
    } else if ((c >> 4) == 0xe) {
      n = 2;
    } else if ((c >> 3) == 0x1e) {
      n = 3;
    } else {
      return false;
    }
    if (i + n >= s.size() && n > 0) return false;
    for (size_t k = 1; k <= n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    }
    i += n + 1;
  }
  return true;
}

absl::Time MtimeOf(const struct stat& st) { return absl::TimeFromTimespec(st.st_mtim); }

// ETag of an existing file: the cached attribute, else the MD5 of its content.
absl::StatusOr<std::string> EtagOf(const std::string& path, int fd_or_minus1,
                                   const struct stat& st) {
  if (auto cached = CachedLocalEtag(fd_or_minus1, path, st)) return *cached;
  int fd = fd_or_minus1 >= 0 ? fd_or_minus1 : open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "hashing");
  // Sized to the file, not a zero-filled chunk: a listing of many small files hashes each
  // one, and a 1 MiB buffer per file showed in RSS.
  absl::StatusOr<std::string> md5 = Md5OfFile(fd, st.st_size);
  absl::Status status = md5.status();
  std::string hex = md5.ok() ? *std::move(md5) : "";
  if (status.ok()) {
    struct stat now;
    if (fstat(fd, &now) == 0 && now.st_size == st.st_size &&
        now.st_mtim.tv_sec == st.st_mtim.tv_sec && now.st_mtim.tv_nsec == st.st_mtim.tv_nsec) {
      StoreLocalEtag(fd, st, hex);
    }
  }
  if (fd_or_minus1 < 0) close(fd);
  if (!status.ok()) return status;
  return hex;
}

// The process runtime's count of entries listings left out (LocalStore::SkippedEntries).
Counter* SkippedCounter() {
  return Runtime::Default()->metrics().GetCounter(
      "wharf_local_list_skipped_total",
      "Entries of local folders that listings left out (links to nothing or looping, FIFOs, "
      "sockets, devices, names not UTF-8), each with a warning");
}

// A put's bytes against the MD5 their source's metadata gave (PutOptions::source_md5), before
// the file is renamed into place: `md5` is what the file store computed while writing.
absl::Status CheckSourceMd5(const PutOptions& options, absl::string_view md5) {
  if (options.source_md5.empty() || md5.empty() ||
      absl::EqualsIgnoreCase(options.source_md5, md5)) {
    return absl::OkStatus();
  }
  return SourceMismatchError(
      absl::StrCat("the content's MD5 ", md5, " is not the source's ", options.source_md5,
                   options.source_uri.empty() ? "" : absl::StrCat(" (", options.source_uri, ")"),
                   ": damaged on the way; nothing written"));
}

// Seal, check against the source's MD5, publish.
absl::StatusOr<ObjectMeta> CommitChecked(TempObject& temp, const PutOptions& options, bool fsync) {
  WHARF_ASSIGN_OR_RETURN(ObjectMeta meta,
                         temp.Seal(options.mtime, fsync, [&](int, const ObjectMeta& m) {
                           return CheckSourceMd5(options, m.etag);
                         }));
  WHARF_RETURN_IF_ERROR(temp.Publish(/*sync_dir=*/fsync, options.if_absent));
  return meta;
}

class LocalWriter : public ObjectWriter {
 public:
  LocalWriter(std::unique_ptr<TempObject> temp, std::string key, std::string uri,
              PutOptions options, bool fsync)
      : temp_(std::move(temp)),
        key_(std::move(key)),
        uri_(std::move(uri)),
        options_(std::move(options)),
        fsync_(fsync) {}

  absl::Status Write(absl::Cord data) override {
    if (!temp_) return absl::FailedPreconditionError(absl::StrCat("write ", uri_, ": closed"));
    auto s = temp_->Append(data);
    if (!s.ok()) temp_.reset();
    return Annotate(s, absl::StrCat("write ", uri_));
  }

  absl::StatusOr<ObjectMeta> Close() override {
    if (!temp_) return absl::FailedPreconditionError(absl::StrCat("close ", uri_, ": closed"));
    auto meta = CommitChecked(*temp_, options_, fsync_);
    temp_.reset();
    if (!meta.ok()) return Annotate(meta.status(), absl::StrCat("put ", uri_));
    meta->key = key_;
    return meta;
  }

  void Abort() override { temp_.reset(); }

 private:
  std::unique_ptr<TempObject> temp_;
  const std::string key_;
  const std::string uri_;
  const PutOptions options_;
  const bool fsync_;
};

// Lists a tree in S3 order (see ListPage in object_store.h). Within one directory, entries
// are sorted by name with '/' appended to directory names: then a depth-first walk yields
// keys in byte-wise order, since every key below directory "d" starts with "d/".
class Lister {
 public:
  Lister(const std::string& root, const ListOptions& options, absl::string_view continuation)
      : root_(root), options_(options), lower_(options.start_after) {
    // The token names the last entry returned: "k<key>" or "p<common prefix>".
    if (continuation.size() > 1) {
      std::string last(continuation.substr(1));
      if (continuation[0] == 'p') skip_prefix_ = last;
      if (last > lower_) lower_ = std::move(last);
    }
  }

  absl::StatusOr<ListPage> Run() {
    const size_t slash = options_.prefix.rfind('/');
    const std::string start_dir =
        slash == std::string::npos ? "" : options_.prefix.substr(0, slash + 1);
    auto walked = Walk(start_dir);
    if (!walked.ok()) return walked.status();
    if (truncated_) {
      page_.continuation = last_was_prefix_ ? absl::StrCat("p", page_.common_prefixes.back())
                                            : absl::StrCat("k", page_.objects.back().key);
    }
    return std::move(page_);
  }

 private:
  enum class Next { kContinue, kStop };
  struct Entry {
    std::string sort_name;  // name, plus '/' for directories
    bool is_dir;
  };

  // One warning line for an entry the listing leaves out (a dangling link: ENOENT; a link
  // to a directory above it: ELOOP).
  static void SkipWarning(const std::string& dir, absl::string_view name, int err) {
    SkippedCounter()->Add();
    std::string path;  // dir/name without the doubled slashes of root "/" and "d/" keys
    for (char c : absl::StrCat(dir, "/", name)) {
      if (c != '/' || path.empty() || path.back() != '/') path += c;
    }
    LogLine(LogLevel::kWarning,
            absl::StrCat("skipping ", path, ": ",
                         err == ENOENT  ? "a symbolic link to nothing"
                         : err == ELOOP ? "a symbolic link to a directory it is in (it would loop)"
                         : err == 0     ? "not a file or a folder (a FIFO, socket or device)"
                         : err == EILSEQ
                             ? "the name is not UTF-8 (object keys are; rename it to list it)"
                             : strerror(err)));
  }

  // Whether `dir`/`name`, a link to a directory, leads to `dir` itself or a directory above
  // it (with every link resolved).
  static bool LinksToAncestor(const std::string& dir, absl::string_view name) {
    char real_dir[PATH_MAX], real_target[PATH_MAX];
    if (realpath(dir.c_str(), real_dir) == nullptr) return false;
    if (realpath(absl::StrCat(dir, "/", name).c_str(), real_target) == nullptr) return false;
    const absl::string_view d = real_dir, t = real_target;
    return d == t || t == "/" || (absl::StartsWith(d, t) && d[t.size()] == '/');
  }

  absl::StatusOr<std::vector<Entry>> ReadDir(const std::string& rel_dir) {
    const std::string path = absl::StrCat(root_, "/", rel_dir);
    std::vector<Entry> entries;
    DIR* dir = opendir(path.c_str());
    if (dir == nullptr) {
      if (errno == ENOENT || errno == ENOTDIR) return entries;
      return ErrnoToStatus(errno, absl::StrCat("list ", path));
    }
    while (struct dirent* e = readdir(dir)) {
      absl::string_view name = e->d_name;
      if (name == "." || name == "..") continue;
      if (absl::StartsWith(name, kTempPrefix)) {
        // A killed writer's, beside its target: never an object. (Those in a tier's private
        // temporary folders are the tier's garbage collection's.)
        if (absl::StartsWith(name, kLockedTempPrefix)) RemoveAbandonedTemp(dirfd(dir), e->d_name);
        continue;
      }
      // A tier's own folder (its settings, entries' records, cached objects): never objects,
      // so no listing copies it, syncs it away, or feeds it to a dataset as samples.
      if (name == kTierMetaDir &&
          faccessat(dirfd(dir), absl::StrCat(name, "/", kTierConfig).c_str(), F_OK, 0) == 0) {
        continue;
      }
      if (!IsValidUtf8(name)) {  // never a key: a get, a copy or a delete of it would fail
        SkipWarning(path, name, EILSEQ);
        continue;
      }
      bool is_dir = e->d_type == DT_DIR;
      bool is_file = e->d_type == DT_REG;
      if (e->d_type == DT_UNKNOWN || e->d_type == DT_LNK) {
        struct stat st;
        if (fstatat(dirfd(dir), e->d_name, &st, 0) != 0) {  // a dangling link, or a race
          if (errno != ENOENT || e->d_type == DT_LNK) SkipWarning(path, name, errno);
          continue;
        }
        is_dir = S_ISDIR(st.st_mode);
        is_file = S_ISREG(st.st_mode);
        // Links are followed, but not into a directory the walk is already inside: that one
        // would be walked again below itself, without end.
        if (is_dir && e->d_type == DT_LNK && LinksToAncestor(path, name)) {
          SkipWarning(path, name, ELOOP);
          continue;
        }
      }
      if (!is_dir && !is_file) {  // sockets, fifos, devices are not objects
        SkipWarning(path, name, 0);
        continue;
      }
      entries.push_back({is_dir ? absl::StrCat(name, "/") : std::string(name), is_dir});
    }
    closedir(dir);
    std::sort(entries.begin(), entries.end(),
              [](const Entry& a, const Entry& b) { return a.sort_name < b.sort_name; });
    return entries;
  }

  // Where `full` (a key, or a directory key ending in '/') stands against the bounds.
  enum class Place { kBefore, kInside, kAfter };
  Place Locate(const std::string& full, bool is_dir) const {
    const std::string& prefix = options_.prefix;
    if (!absl::StartsWith(full, prefix) && !(is_dir && absl::StartsWith(prefix, full))) {
      return full < prefix ? Place::kBefore : Place::kAfter;
    }
    if (!options_.end_before.empty() && full >= options_.end_before) return Place::kAfter;
    if (is_dir) {
      // Everything below is <= lower_ unless lower_ points into this directory.
      if (full < lower_ && !absl::StartsWith(lower_, full)) return Place::kBefore;
    } else if (full <= lower_) {
      return Place::kBefore;
    }
    if (!skip_prefix_.empty() && absl::StartsWith(full, skip_prefix_)) return Place::kBefore;
    return Place::kInside;
  }

  // The common prefix `full` rolls up into under the delimiter, or "" if none.
  std::string CommonPrefixOf(const std::string& full) const {
    if (options_.delimiter.empty() || full.size() < options_.prefix.size()) return "";
    const size_t pos = full.find(options_.delimiter, options_.prefix.size());
    if (pos == std::string::npos) return "";
    return full.substr(0, pos + options_.delimiter.size());
  }

  // True when directory `rel_dir` holds at least one key inside the bounds.
  absl::StatusOr<bool> HasKeyInside(const std::string& rel_dir) {
    WHARF_ASSIGN_OR_RETURN(auto entries, ReadDir(rel_dir));
    for (const Entry& e : entries) {
      const std::string full = rel_dir + e.sort_name;
      Place place = Locate(full, e.is_dir);
      if (place == Place::kAfter) return false;
      if (place == Place::kBefore) continue;
      if (!e.is_dir) return true;
      WHARF_ASSIGN_OR_RETURN(bool found, HasKeyInside(full));
      if (found) return true;
    }
    return false;
  }

  // Adds one entry to the page; kStop once the page is full and one more entry exists.
  Next Emit(ObjectMeta* object, const std::string* prefix) {
    if (static_cast<int>(page_.objects.size() + page_.common_prefixes.size()) >=
        std::max(1, options_.page_size)) {
      truncated_ = true;
      return Next::kStop;
    }
    if (object != nullptr) {
      page_.objects.push_back(std::move(*object));
      last_was_prefix_ = false;
    } else {
      page_.common_prefixes.push_back(*prefix);
      last_was_prefix_ = true;
      last_prefix_ = *prefix;
    }
    return Next::kContinue;
  }

  absl::StatusOr<Next> Walk(const std::string& rel_dir) {
    WHARF_ASSIGN_OR_RETURN(auto entries, ReadDir(rel_dir));
    for (const Entry& e : entries) {
      const std::string full = rel_dir + e.sort_name;
      const Place place = Locate(full, e.is_dir);
      if (place == Place::kAfter) return Next::kStop;
      if (place == Place::kBefore) continue;
      if (std::string cp = CommonPrefixOf(full); !cp.empty()) {
        if (cp == last_prefix_) continue;  // equal prefixes are adjacent in key order
        if (e.is_dir) {
          WHARF_ASSIGN_OR_RETURN(bool any, HasKeyInside(full));
          if (!any) continue;
        }
        if (Emit(nullptr, &cp) == Next::kStop) return Next::kStop;
        continue;
      }
      if (e.is_dir) {
        WHARF_ASSIGN_OR_RETURN(Next next, Walk(full));
        if (next == Next::kStop) return Next::kStop;
        continue;
      }
      const std::string path = absl::StrCat(root_, "/", full);
      struct stat st;
      if (stat(path.c_str(), &st) != 0) continue;  // deleted since readdir
      ObjectMeta meta;
      meta.key = full;
      meta.size = st.st_size;
      meta.mtime = MtimeOf(st);
      WHARF_ASSIGN_OR_RETURN(meta.etag, EtagOf(path, -1, st));
      if (Emit(&meta, nullptr) == Next::kStop) return Next::kStop;
    }
    return Next::kContinue;
  }

  const std::string& root_;
  const ListOptions& options_;
  std::string lower_;        // exclusive lower bound on keys
  std::string skip_prefix_;  // a common prefix already returned on an earlier page
  std::string last_prefix_;
  bool last_was_prefix_ = false;
  bool truncated_ = false;
  ListPage page_;
};

}  // namespace

absl::Status LocalStore::ValidateKey(absl::string_view key) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("invalid key '", key, "': ", why));
  };
  if (key.empty()) return bad("empty");
  if (key.find('\0') != absl::string_view::npos) return bad("contains a NUL byte");
  if (key.front() == '/') return bad("starts with '/' (keys are relative to the store root)");
  if (key.back() == '/') return bad("ends with '/' (file:// keys name files, not directories)");
  if (!IsValidUtf8(key)) return bad("not valid UTF-8");
  for (absl::string_view part : absl::StrSplit(key, '/')) {
    if (part.empty()) return bad("contains an empty path component ('//')");
    if (part == "." || part == "..") return bad("contains a '.' or '..' component");
    if (part.size() > 255) return bad("a path component is longer than 255 bytes");
    if (absl::StartsWith(part, kTempPrefix)) return bad("'.wharf-tmp-' names are reserved");
  }
  return absl::OkStatus();
}

absl::Status LocalStore::CheckWriteTarget(const std::string& key) const {
  WHARF_RETURN_IF_ERROR(ValidateKey(key));
  // A tier's own folder (listings never show it): a copy into the tier, or a bucket's keys
  // named so, must not overwrite its settings or records. Cheap in the common case: no
  // '.wharf' component, no file system call.
  if (absl::StrContains(key, kTierMetaDir)) {
    std::string dir = root_ == "/" ? "" : root_;
    for (absl::string_view part : absl::StrSplit(key, '/')) {
      const std::string parent = dir;
      absl::StrAppend(&dir, "/", part);
      if (part == kTierMetaDir && access(absl::StrCat(dir, "/", kTierConfig).c_str(), F_OK) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", dir, "' is the own folder of the tier at '", parent,
                         "': wharf never writes keys into it"));
      }
    }
  }
  return RefuseLinksBelow(root_, PathOf(key));
}

absl::StatusOr<std::unique_ptr<LocalStore>> LocalStore::Open(std::string root,
                                                             std::shared_ptr<Runtime> runtime,
                                                             LocalStoreOptions options) {
  if (root.empty() || root.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("local store root '", root, "' must be an absolute path"));
  }
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  WHARF_RETURN_IF_ERROR(Annotate(MakeDirs(root), absl::StrCat("open file://", root)));
  return std::unique_ptr<LocalStore>(new LocalStore(std::move(root), std::move(runtime), options));
}

LocalStore::LocalStore(std::string root, std::shared_ptr<Runtime> runtime,
                       LocalStoreOptions options)
    : root_(std::move(root)),
      runtime_(std::move(runtime)),
      options_(options),
      md5_batcher_(
          runtime_->Shared<Md5Batcher>("", [] { return std::make_shared<Md5Batcher>(); })) {}

std::string LocalStore::Uri(absl::string_view key) const {
  return root_ == "/" ? absl::StrCat("file:///", key) : absl::StrCat("file://", root_, "/", key);
}

std::string LocalStore::PathOf(absl::string_view key) const {
  return root_ == "/" ? absl::StrCat("/", key) : absl::StrCat(root_, "/", key);
}

const Capabilities& LocalStore::capabilities() const {
  static const Capabilities caps = [] {
    Capabilities c;
    c.native_end_before = true;
    c.nested_keys_conflict = true;
    c.trailing_slash_keys = false;
    c.max_page_size = 100000;
    c.put_options = true;
    return c;
  }();
  return caps;
}

absl::StatusOr<ListPage> LocalStore::List(const ListOptions& options,
                                          const std::string& continuation) {
  const std::string root = root_ == "/" ? "" : root_;
  auto page = Lister(root, options, continuation).Run();
  if (!page.ok()) return Annotate(page.status(), absl::StrCat("list ", Uri(options.prefix)));
  return page;
}

namespace {

// What a path that is not a regular file is, for the NotFound a get or head of it returns
// (objects are files; a directory is a prefix).
absl::Status NotAnObject(absl::string_view op, const struct stat& st) {
  return absl::NotFoundError(absl::StrCat(op, S_ISDIR(st.st_mode)
                                                  ? ": no such object (a directory, not a file)"
                                                  : ": no such object (not a regular file)"));
}

// A file of /proc says it is empty and is not: copied by its size, it would arrive as an
// empty object. Refused instead (checked only for files that report size 0).
absl::Status RefuseProcFile(absl::string_view op, const char* path, const struct stat& st) {
  constexpr long kProcSuperMagic = 0x9fa0;
  struct statfs fs;
  if (st.st_size != 0 || statfs(path, &fs) != 0 || fs.f_type != kProcSuperMagic) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat(op, ": a /proc file, whose size the kernel does not report (read it with cat)"));
}

}  // namespace

absl::StatusOr<ObjectMeta> LocalStore::Head(const std::string& key) {
  const std::string op = absl::StrCat("head ", Uri(key));
  WHARF_RETURN_IF_ERROR(Annotate(ValidateKey(key), op));
  const std::string path = PathOf(key);
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, op);
  if (!S_ISREG(st.st_mode)) return NotAnObject(op, st);
  WHARF_RETURN_IF_ERROR(RefuseProcFile(op, path.c_str(), st));
  ObjectMeta meta;
  meta.key = key;
  meta.size = st.st_size;
  meta.mtime = MtimeOf(st);
  auto etag = EtagOf(path, -1, st);
  if (!etag.ok()) return Annotate(etag.status(), op);
  meta.etag = *std::move(etag);
  return meta;
}

absl::StatusOr<GetResult> LocalStore::Get(const GetRequest& request) {
  const std::string op = absl::StrCat("get ", Uri(request.key));
  WHARF_RETURN_IF_ERROR(Annotate(ValidateKey(request.key), op));
  if ((request.sink == nullptr) == (request.buffer.data() == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": set exactly one of buffer and sink"));
  }
  if (IsCancelled(request.cancel)) return absl::CancelledError(absl::StrCat(op, ": cancelled"));
  const std::string path = PathOf(request.key);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(op, ": no such object"));
    }
    return ErrnoToStatus(errno, op);
  }
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoToStatus(errno, op);
  if (!S_ISREG(st.st_mode)) return NotAnObject(op, st);
  WHARF_RETURN_IF_ERROR(RefuseProcFile(op, path.c_str(), st));
  GetResult result;
  result.meta.key = request.key;
  result.meta.size = st.st_size;
  result.meta.mtime = MtimeOf(st);
  auto etag = EtagOf(path, fd, st);
  if (!etag.ok()) return Annotate(etag.status(), op);
  result.meta.etag = *std::move(etag);
  if (!request.if_match.empty() && request.if_match != result.meta.etag) {
    return absl::FailedPreconditionError(absl::StrCat(
        op, ": object changed (etag ", result.meta.etag, ", expected ", request.if_match, ")"));
  }
  if (!request.if_none_match.empty() && request.if_none_match == result.meta.etag) {
    result.not_modified = true;  // as S3's 304: before the range, nothing delivered
    return result;
  }
  auto range = request.range.Resolve(st.st_size);
  if (!range.ok()) return Annotate(range.status(), op);
  auto [begin, end] = *range;
  result.offset = begin;
  if (request.buffer.data() != nullptr && request.buffer.size() < end - begin) {
    return absl::OutOfRangeError(absl::StrCat(op, ": buffer of ", request.buffer.size(),
                                              " bytes is smaller than the ", end - begin,
                                              "-byte range"));
  }
  std::string chunk;
  if (request.sink != nullptr) chunk.resize(std::min<uint64_t>(kChunk, end - begin));
  uint64_t pos = begin;
  while (pos < end) {
    // Between chunks (a sink's, or kBufferChunk into a buffer): a cancel stops the read.
    if (IsCancelled(request.cancel)) return absl::CancelledError(absl::StrCat(op, ": cancelled"));
    char* dst = request.sink != nullptr ? chunk.data() : request.buffer.data() + (pos - begin);
    const size_t want = request.sink != nullptr ? std::min<uint64_t>(chunk.size(), end - pos)
                                                : std::min<uint64_t>(kBufferChunk, end - pos);
    const ssize_t n = pread(fd, dst, want, pos);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, op);
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat(op, ": file shrank while reading (", pos, " of ", end, " bytes)"));
    }
    if (request.sink != nullptr) {
      WHARF_RETURN_IF_ERROR(Annotate(request.sink->Append(absl::string_view(dst, n)), op));
    }
    pos += n;
  }
  result.bytes = end - begin;
  return result;
}

absl::StatusOr<ObjectMeta> LocalStore::Put(const std::string& key, absl::Cord data) {
  return Put(key, std::move(data), PutOptions{});
}

absl::StatusOr<ObjectMeta> LocalStore::Put(const std::string& key, absl::Cord data,
                                           const PutOptions& put_options) {
  return Put(key, std::move(data), put_options, nullptr);
}

absl::StatusOr<ObjectMeta> LocalStore::Put(const std::string& key, absl::Cord data,
                                           const PutOptions& put_options, const Md5Digest* md5) {
  const std::string op = absl::StrCat("put ", Uri(key));
  WHARF_RETURN_IF_ERROR(Annotate(CheckWriteTarget(key), op));
  WHARF_RETURN_IF_ERROR(Annotate(ValidatePutOptions(put_options), op));
  auto temp = TempObject::Create(PathOf(key), "", Checksum::kMd5, put_options.if_absent);
  if (!temp.ok()) return Annotate(temp.status(), op);
  if (md5 != nullptr) (*temp)->SetMd5(*md5);
  WHARF_RETURN_IF_ERROR(Annotate((*temp)->Append(data), op));
  auto meta = CommitChecked(**temp, put_options, options_.fsync);
  if (!meta.ok()) return Annotate(meta.status(), op);
  meta->key = key;
  return meta;
}

absl::StatusOr<std::unique_ptr<ObjectWriter>> LocalStore::NewWriter(std::string key) {
  return NewWriter(std::move(key), PutOptions{});
}

absl::StatusOr<std::unique_ptr<ObjectWriter>> LocalStore::NewWriter(std::string key,
                                                                    const PutOptions& put_options) {
  const std::string uri = Uri(key);
  WHARF_RETURN_IF_ERROR(Annotate(CheckWriteTarget(key), absl::StrCat("put ", uri)));
  WHARF_RETURN_IF_ERROR(Annotate(ValidatePutOptions(put_options), absl::StrCat("put ", uri)));
  auto temp = TempObject::Create(PathOf(key), "", Checksum::kMd5, put_options.if_absent);
  if (!temp.ok()) return Annotate(temp.status(), absl::StrCat("put ", uri));
  return std::make_unique<LocalWriter>(*std::move(temp), std::move(key), uri, put_options,
                                       options_.fsync);
}

namespace {

absl::Mutex kept_mu(absl::kConstInit);
// The kept directories and every directory above them: what pruning never removes.
absl::flat_hash_set<std::string>* kept_dirs ABSL_GUARDED_BY(kept_mu) = nullptr;

bool IsKept(const std::string& dir) {
  absl::MutexLock lock(&kept_mu);
  return kept_dirs != nullptr && kept_dirs->contains(dir);
}

}  // namespace

uint64_t LocalStore::SkippedEntries() { return SkippedCounter()->value(); }

void LocalStore::KeepDirectory(absl::string_view path) {
  std::string dir(path);
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  absl::MutexLock lock(&kept_mu);
  if (kept_dirs == nullptr) kept_dirs = new absl::flat_hash_set<std::string>;  // never freed
  // Up to the first one already there: its ancestors are too.
  while (!dir.empty() && kept_dirs->insert(dir).second && dir != "/") {
    const size_t slash = dir.rfind('/');
    if (slash == std::string::npos) break;  // not absolute: nothing above it here
    dir.resize(std::max<size_t>(1, slash));
  }
}

void LocalStore::PruneEmptyParents(absl::string_view key) const {
  std::string path = PathOf(key);
  while (true) {
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos || slash <= root_.size()) return;
    path.resize(slash);
    if (IsKept(path)) return;
    if (rmdir(path.c_str()) != 0) return;  // not empty (or raced with a put): stop
  }
}

absl::Status LocalStore::Delete(const std::string& key) {
  const std::string op = absl::StrCat("delete ", Uri(key));
  WHARF_RETURN_IF_ERROR(Annotate(ValidateKey(key), op));
  // The folders below the root are walked without following links: a listing follows a link
  // to a folder (as a copy's source should), but a delete through one would remove files
  // outside the root (rm -r and sync --delete of a folder holding a link to another).
  // A link as the key's last part is removed itself, never its target.
  const std::vector<absl::string_view> parts = absl::StrSplit(key, '/');
  int dir = open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return absl::OkStatus();
    return ErrnoToStatus(errno, op);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const std::string name(parts[i]);
    const int next = openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    const int err = errno;
    struct stat st;
    // A link gives ENOTDIR (ELOOP on some systems) with O_DIRECTORY | O_NOFOLLOW.
    const bool link = next < 0 && fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                      S_ISLNK(st.st_mode);
    close(dir);
    if (next < 0) {
      if (!link && (err == ENOENT || err == ENOTDIR)) return absl::OkStatus();  // none there
      if (link || err == ELOOP) {
        return absl::FailedPreconditionError(absl::StrCat(
            op, ": not deleted: ", PathOf(absl::StrJoin(parts.begin(), parts.begin() + i + 1, "/")),
            " is a symbolic link, and wharf never deletes through one (delete the link itself "
            "to drop it)"));
      }
      return ErrnoToStatus(err, op);
    }
    dir = next;
  }
  const int rc = unlinkat(dir, std::string(parts.back()).c_str(), 0);
  const int err = errno;
  close(dir);
  if (rc != 0) {
    // Deleting a missing object succeeds, as on S3; a directory is not an object either.
    if (err == ENOENT || err == ENOTDIR || err == EISDIR) return absl::OkStatus();
    return ErrnoToStatus(err, op);
  }
  PruneEmptyParents(key);
  return absl::OkStatus();
}

absl::Status LocalStore::DeleteMany(std::vector<std::string> keys) {
  absl::Status first;
  int failed = 0;
  for (const auto& key : keys) {
    absl::Status s = Delete(key);
    if (!s.ok() && failed++ == 0) first = s;
  }
  if (failed > 1) return Annotate(first, absl::StrCat(failed, " of ", keys.size(), " failed"));
  return first;
}

absl::StatusOr<ObjectMeta> LocalStore::Copy(const std::string& src_key,
                                            const std::string& dst_key) {
  const std::string op = absl::StrCat("copy ", Uri(src_key), " to ", Uri(dst_key));
  WHARF_RETURN_IF_ERROR(Annotate(CheckWriteTarget(dst_key), op));
  auto temp = TempObject::Create(PathOf(dst_key));
  if (!temp.ok()) return Annotate(temp.status(), op);
  // Stream through the temp object so the copy is atomic and its ETag computed.
  class TempSink : public ReadSink {
   public:
    explicit TempSink(TempObject* temp) : temp_(temp) {}
    absl::Status Append(absl::string_view chunk) override { return temp_->Append(chunk); }

   private:
    TempObject* temp_;
  } sink(temp->get());
  GetRequest request;
  request.key = src_key;
  request.sink = &sink;
  auto got = Get(request);
  if (!got.ok()) return Annotate(got.status(), "copy");
  auto meta = (*temp)->Commit(std::nullopt, options_.fsync);
  if (!meta.ok()) return Annotate(meta.status(), op);
  meta->key = dst_key;
  return meta;
}

// Asynchronous forms: the work is blocking syscalls, so it runs on the blocking pool.
void LocalStore::ListAsync(ListOptions options, std::string continuation, Callback<ListPage> done) {
  runtime_->blocking_pool().Schedule(
      [this, options = std::move(options), continuation = std::move(continuation),
       done = std::move(done)]() mutable { std::move(done)(List(options, continuation)); });
}

void LocalStore::HeadAsync(std::string key, Callback<ObjectMeta> done) {
  runtime_->blocking_pool().Schedule(
      [this, key = std::move(key), done = std::move(done)]() mutable {
        std::move(done)(Head(key));
      });
}

void LocalStore::GetAsync(GetRequest request, Callback<GetResult> done) {
  runtime_->blocking_pool().Schedule(
      [this, request = std::move(request), done = std::move(done)]() mutable {
        std::move(done)(Get(request));
      });
}

void LocalStore::PutAsync(std::string key, absl::Cord data, Callback<ObjectMeta> done) {
  PutAsync(std::move(key), std::move(data), PutOptions{}, std::move(done));
}

void LocalStore::PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                          Callback<ObjectMeta> done) {
  if (data.size() <= md5_batcher_->max_message()) {
    // A stream of puts (a download of many objects): their MD5 ETags are computed many at a
    // time, then each file is written on the blocking pool.
    md5_batcher_->Hash(std::move(data), runtime_->blocking_pool(),
                       [this, key = std::move(key), options, done = std::move(done)](
                           absl::Cord data, const Md5Digest& md5) mutable {
                         std::move(done)(Put(key, std::move(data), options, &md5));
                       });
    return;
  }
  runtime_->blocking_pool().Schedule(
      [this, key = std::move(key), data = std::move(data), options,
       done = std::move(done)]() mutable { std::move(done)(Put(key, std::move(data), options)); });
}

void LocalStore::DeleteAsync(std::string key, StatusCallback done) {
  runtime_->blocking_pool().Schedule(
      [this, key = std::move(key), done = std::move(done)]() mutable {
        std::move(done)(Delete(key));
      });
}

void LocalStore::DeleteManyAsync(std::vector<std::string> keys, StatusCallback done) {
  runtime_->blocking_pool().Schedule(
      [this, keys = std::move(keys), done = std::move(done)]() mutable {
        std::move(done)(DeleteMany(std::move(keys)));
      });
}

void LocalStore::CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) {
  runtime_->blocking_pool().Schedule(
      [this, src_key = std::move(src_key), dst_key = std::move(dst_key),
       done = std::move(done)]() mutable { std::move(done)(Copy(src_key, dst_key)); });
}

}  // namespace wharf
