#include "tier/tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/fork.h"
#include "base/hash.h"
#include "base/status.h"
#include "nlohmann/json.hpp"
#include "store/local/temp_object.h"
#include "store/uri.h"

namespace wharf {
namespace {

using json = nlohmann::ordered_json;

constexpr char kConfigFile[] = "tier.json";
constexpr char kTempDir[] = "tmp";
constexpr char kImportsDir[] = "imports";
constexpr char kStatsDir[] = "stats";
// stats/folded.json: the counters of dead owners (owners' names always hold a '-').
constexpr char kFoldedStats[] = "folded";
constexpr char kProbeXattr[] = "user.wharf.probe";

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoToStatus(errno, absl::StrCat("reading ", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Writes `content` to `path` atomically (temporary file, rename), durably unless `sync` is
// false. An empty `temp_dir` writes the temporary file beside `path`.
absl::Status WriteSmallFile(const std::string& path, absl::string_view content,
                            const std::string& temp_dir, bool sync = true) {
  WHARF_ASSIGN_OR_RETURN(auto temp, TempObject::Create(path, temp_dir));
  WHARF_RETURN_IF_ERROR(temp->Append(content));
  return temp->Commit(std::nullopt, sync).status();
}

// Removes `path` and everything below it; counts the files removed.
void RemoveTree(const std::string& path, uint64_t& files) {
  if (DIR* dir = opendir(path.c_str())) {
    while (struct dirent* e = readdir(dir)) {
      const absl::string_view name = e->d_name;
      if (name == "." || name == "..") continue;
      const std::string child = absl::StrCat(path, "/", name);
      struct stat st;
      if (lstat(child.c_str(), &st) != 0) continue;
      if (S_ISDIR(st.st_mode)) {
        RemoveTree(child, files);
      } else if (unlink(child.c_str()) == 0) {
        ++files;
      }
    }
    closedir(dir);
  }
  rmdir(path.c_str());
}

// The names (without ".json") and JSON objects of the *.json files in `dir` (none when it
// does not exist); files that vanish or do not parse are skipped (a concurrent writer
// publishes by rename).
absl::StatusOr<std::vector<std::pair<std::string, json>>> ReadJsonFiles(const std::string& dir) {
  std::vector<std::pair<std::string, json>> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return out;
    return ErrnoToStatus(errno, absl::StrCat("reading ", dir));
  }
  std::vector<std::string> names;
  while (struct dirent* e = readdir(d)) {
    if (absl::EndsWith(e->d_name, ".json")) names.emplace_back(e->d_name);
  }
  closedir(d);
  for (const std::string& name : names) {
    auto text = ReadSmallFile(absl::StrCat(dir, "/", name));
    if (!text.ok()) continue;
    json j = json::parse(*text, nullptr, false);
    if (j.is_object()) out.emplace_back(name.substr(0, name.size() - 5), std::move(j));
  }
  return out;
}

std::string HostName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "host";
  std::string h(host);
  for (char& c : h) {
    if (c == '/' || c == '-') c = '_';
  }
  return h;
}

}  // namespace

std::string AbsolutePath(const std::string& path) {
  auto absolute = AbsoluteLocalPath(path);
  std::string out = absolute.ok() ? *std::move(absolute) : path;
  if (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

// `path` (absolute) with the symbolic links of its longest existing ancestor resolved, the
// rest kept as written; `path` itself when nothing resolves.
std::string ResolvedPath(const std::string& path) {
  std::string head = path;
  std::string tail;
  while (true) {
    char real[PATH_MAX];
    if (realpath(head.c_str(), real) != nullptr) {
      std::string out = real;
      if (!tail.empty()) out = absl::StrCat(out == "/" ? "" : out, tail);
      return out;
    }
    const size_t slash = head.rfind('/');
    if (slash == std::string::npos || head == "/") return path;
    tail = absl::StrCat(head.substr(slash), tail);
    head = slash == 0 ? "/" : head.substr(0, slash);
  }
}

// ---- TierConfig ----

const char* TierModeName(TierConfig::Mode mode) {
  return mode == TierConfig::Mode::kTtl ? "ttl" : "immutable";
}

absl::StatusOr<TierConfig::Mode> ParseTierMode(absl::string_view name) {
  if (name == "immutable") return TierConfig::Mode::kImmutable;
  if (name == "ttl") return TierConfig::Mode::kTtl;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tier mode '", name, "' (expected immutable or ttl)"));
}

std::string TierConfig::ToJson() const {
  json j;
  j["version"] = 1;
  j["mode"] = TierModeName(mode);
  j["ttl_seconds"] = absl::ToDoubleSeconds(ttl);
  j["max_size"] = max_size;
  j["min_free_percent"] = min_free;
  j["block_size"] = block_size;
  j["block_threshold"] = block_threshold;
  return j.dump(2) + "\n";
}

absl::StatusOr<TierConfig> TierConfig::FromJson(absl::string_view text, absl::string_view what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
  };
  if (!j.is_object()) return bad("not a JSON object");
  if (j.value("version", 0) != 1) {
    return bad(absl::StrCat("unsupported version ", j.value("version", 0), " (expected 1)"));
  }
  TierConfig c;
  try {
    auto mode = ParseTierMode(j.value("mode", std::string("immutable")));
    if (!mode.ok()) return bad(mode.status().message());
    c.mode = *mode;
    const double ttl = j.value("ttl_seconds", absl::ToDoubleSeconds(c.ttl));
    if (!(ttl > 0) || !std::isfinite(ttl)) return bad("ttl_seconds must be positive");
    c.ttl = absl::Seconds(ttl);
    c.max_size = j.value("max_size", c.max_size);
    c.min_free = j.value("min_free_percent", c.min_free);
    if (!(c.min_free >= 0 && c.min_free < 100)) return bad("min_free_percent must be in [0, 100)");
    c.block_size = j.value("block_size", c.block_size);
    c.block_threshold = j.value("block_threshold", c.block_threshold);
    if (c.block_size < kMinBlockSize || c.block_size > kMaxBlockSize) {
      return bad(
          absl::StrCat("block_size must be in [", kMinBlockSize, ", ", kMaxBlockSize, "] bytes"));
    }
    if (c.block_threshold < c.block_size) return bad("block_threshold must be >= block_size");
  } catch (const json::exception& e) {
    return bad(absl::StrCat("malformed field: ", e.what()));
  }
  return c;
}

// ---- TierEntry ----

std::string TierBlockVersionDir(absl::string_view etag) { return Md5Hex(etag).substr(0, 16); }

std::string TierEntry::ToJson() const {
  json j;
  j["v"] = 1;
  j["source"] = source;
  j["etag"] = etag;
  j["size"] = size;
  if (!md5.empty()) j["md5"] = md5;
  if (!crc32c.empty()) j["crc32c"] = crc32c;
  j["filled"] = filled == absl::InfinitePast() ? 0.0 : absl::ToUnixMicros(filled) / 1e6;
  j["local"] = local;
  if (mtime != absl::InfinitePast()) j["mtime_ns"] = absl::ToUnixNanos(mtime);
  if (block) {
    j["block_offset"] = block_offset;
    j["object_size"] = object_size;
  }
  if (damaged) j["damaged"] = true;
  return j.dump();
}

std::optional<TierEntry> TierEntry::FromJson(absl::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("v", 0) != 1) return std::nullopt;
  try {
    TierEntry e;
    e.source = j.at("source").get<std::string>();
    e.etag = j.at("etag").get<std::string>();
    e.size = j.at("size").get<uint64_t>();
    e.md5 = j.value("md5", std::string());
    e.crc32c = j.value("crc32c", std::string());
    if (e.md5.empty() && e.crc32c.empty()) return std::nullopt;
    e.filled = absl::FromUnixMicros(static_cast<int64_t>(j.at("filled").get<double>() * 1e6));
    e.local = j.value("local", false);
    if (j.contains("mtime_ns")) e.mtime = absl::FromUnixNanos(j.at("mtime_ns").get<int64_t>());
    if (j.contains("block_offset")) {
      e.block = true;
      e.block_offset = j.at("block_offset").get<uint64_t>();
      e.object_size = j.at("object_size").get<uint64_t>();
    }
    e.damaged = j.value("damaged", false);
    return e;
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

namespace {
std::optional<TierEntry> ParseAttr(const char* buf, ssize_t n) {
  if (n <= 0) return std::nullopt;
  return TierEntry::FromJson(absl::string_view(buf, n));
}
}  // namespace

std::optional<TierEntry> ReadEntryAttr(int fd) {
  char buf[4096];
  return ParseAttr(buf, fgetxattr(fd, kTierEntryXattr, buf, sizeof(buf)));
}

std::optional<TierEntry> ReadEntryAttr(const std::string& path) {
  char buf[4096];
  return ParseAttr(buf, getxattr(path.c_str(), kTierEntryXattr, buf, sizeof(buf)));
}

bool IsCompleteEntry(const std::optional<TierEntry>& entry, const struct stat& st) {
  return entry.has_value() && S_ISREG(st.st_mode) &&
         entry->size == static_cast<uint64_t>(st.st_size);
}

bool WrittenSinceSealed(const TierEntry& entry, const struct stat& st) {
  return entry.mtime != absl::InfinitePast() && absl::TimeFromTimespec(st.st_mtim) != entry.mtime;
}

absl::Status WriteEntryAttr(int fd, const TierEntry& entry) {
  const std::string value = entry.ToJson();
  if (fsetxattr(fd, kTierEntryXattr, value.data(), value.size(), 0) != 0) {
    return ErrnoToStatus(errno, "setting the tier entry attribute");
  }
  return absl::OkStatus();
}

absl::Status WriteEntryAttr(const std::string& path, const TierEntry& entry) {
  const std::string value = entry.ToJson();
  if (setxattr(path.c_str(), kTierEntryXattr, value.data(), value.size(), 0) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("setting the tier entry attribute of ", path));
  }
  return absl::OkStatus();
}

bool MakesATier(absl::string_view rel) {
  bool after_meta = false;
  for (absl::string_view part : absl::StrSplit(rel, '/')) {
    if (after_meta && part == kConfigFile) return true;
    after_meta = part == Tier::kMetaDir;
  }
  return false;
}

bool IsPinned(const std::string& path) {
  char c;
  return getxattr(path.c_str(), kTierPinXattr, &c, 1) >= 0;
}

absl::Status SetPinned(const std::string& path, bool pinned) {
  if (pinned) {
    if (setxattr(path.c_str(), kTierPinXattr, "1", 1, 0) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("pinning ", path));
    }
  } else if (removexattr(path.c_str(), kTierPinXattr) != 0 && errno != ENODATA) {
    return ErrnoToStatus(errno, absl::StrCat("unpinning ", path));
  }
  return absl::OkStatus();
}

// ---- Tier ----

// The process's Tier objects, so that their temporary directories are removed at exit even
// when a Tier's last reference is dropped on a pool thread that exit() does not wait for
// (a clean run leaves nothing in tmp/). Tiers are destroyed and released at exit under this
// lock, so the exit handler never sees a destroyed one.
namespace {
absl::Mutex tiers_mu;
std::vector<Tier*>* live_tiers ABSL_GUARDED_BY(tiers_mu) = nullptr;
}  // namespace

Tier::Tier(std::string root, TierConfig config) : root_(std::move(root)), config_(config) {
  // Registered before any cache store registers its own exit handler (a store needs a Tier),
  // so it runs after them: the stores' counters are written while the directory exists.
  static const bool registered = [] {
    ReleaseAcrossFork(&tiers_mu);  // a Tier may be destroyed on a pool thread during fork()
    return std::atexit(&Tier::ReleaseAllAtExit) == 0;
  }();
  (void)registered;
  absl::MutexLock lock(&tiers_mu);
  if (live_tiers == nullptr) live_tiers = new std::vector<Tier*>;
  live_tiers->push_back(this);
}

Tier::~Tier() {
  absl::MutexLock live(&tiers_mu);
  if (live_tiers != nullptr) std::erase(*live_tiers, this);
  absl::MutexLock lock(&mu_);
  ReleaseTempDirLocked();
}

void Tier::ReleaseAllAtExit() {
  absl::MutexLock live(&tiers_mu);
  if (live_tiers == nullptr) return;
  for (Tier* tier : *live_tiers) {
    absl::MutexLock lock(&tier->mu_);
    tier->ReleaseTempDirLocked();
    tier->exiting_ = true;
  }
}

void Tier::ReleaseTempDirLocked() {
  if (temp_lock_fd_ < 0) return;
  if (temp_owner_pid_ == getpid()) {
    // Our temporary files are gone with their writers by now (or, at exit, orphaned with
    // them); remove the directory and then its lock (the order garbage collection relies on).
    uint64_t files = 0;
    RemoveTree(temp_dir_, files);
    unlink(absl::StrCat(temp_dir_, ".lock").c_str());
  }
  close(temp_lock_fd_);
  temp_lock_fd_ = -1;
}

std::string Tier::MetaPath(absl::string_view rel) const {
  return rel.empty() ? absl::StrCat(root_, "/", kMetaDir)
                     : absl::StrCat(root_, "/", kMetaDir, "/", rel);
}

std::string Tier::Relative(const std::string& path) const {
  std::string abs = AbsolutePath(path);
  const std::string prefix = root_ == "/" ? "/" : root_ + "/";
  // A path that reaches the tier through a symbolic link is taken where it leads (Find).
  if (abs != root_ && !absl::StartsWith(abs, prefix)) abs = ResolvedPath(abs);
  if (abs == root_) return "";
  return absl::StartsWith(abs, prefix) ? abs.substr(prefix.size()) : abs;
}

std::string Tier::PathIn(const std::string& path) const {
  const std::string rel = Relative(path);
  if (!rel.empty() && rel.front() == '/') return rel;  // not inside: as it is
  return rel.empty() ? root_ : absl::StrCat(root_ == "/" ? "" : root_, "/", rel);
}

absl::StatusOr<std::shared_ptr<Tier>> Tier::Open(const std::string& root) {
  const std::string config_path = absl::StrCat(root, "/", kMetaDir, "/", kConfigFile);
  TierConfig config;
  if (Exists(config_path)) {
    WHARF_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(config_path));
    WHARF_ASSIGN_OR_RETURN(config, TierConfig::FromJson(text, config_path));
  }
  {
    // One Tier per root and process while one is alive (with the settings just read), so
    // a process has one temporary directory in a tier however many stores it opens there.
    absl::MutexLock live(&tiers_mu);
    if (live_tiers != nullptr) {
      const std::string settings = config.ToJson();
      for (Tier* tier : *live_tiers) {
        if (tier->root_ != root || tier->config_.ToJson() != settings) continue;
        if (std::shared_ptr<Tier> shared = tier->weak_from_this().lock()) return shared;
      }
    }
  }
  return std::shared_ptr<Tier>(new Tier(root, config));
}

namespace {
// An empty path names no directory (a script's unset variable): refused, where it would
// otherwise resolve to nothing and walk up forever.
absl::Status RequirePath(const std::string& path) {
  if (!path.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError("the tier path is empty (give a directory)");
}
}  // namespace

absl::StatusOr<std::shared_ptr<Tier>> Tier::Find(const std::string& path) {
  WHARF_RETURN_IF_ERROR(RequirePath(path));
  // The directories above the path as written (a link to a tier's root names that tier),
  // then, when none is a tier's, above the path the links lead to (a link to a folder
  // inside a tier is inside it: without this, `--cache LINK` made a tier within the tier).
  const std::string written = AbsolutePath(path);
  const std::string resolved = ResolvedPath(written);
  for (const std::string* start : {&written, &resolved}) {
    if (start == &resolved && resolved == written) break;
    std::string dir = *start;
    while (true) {
      if (IsRoot(dir)) return Open(dir);
      const size_t slash = dir.rfind('/');
      if (dir == "/" || slash == std::string::npos) break;
      dir = slash == 0 ? "/" : dir.substr(0, slash);
    }
  }
  return absl::NotFoundError(
      absl::StrCat(path,
                   " is in no tier (no enclosing directory has .wharf/tier.json; create one with "
                   "`wharf tier init DIR`)"));
}

bool Tier::IsRoot(const std::string& dir) {
  return Exists(absl::StrCat(dir, "/", kMetaDir, "/", kConfigFile));
}

namespace {
// The first tier root strictly below `root`, walking directories breadth first; nullopt when
// there is none or the walk stopped after `max_dirs` directories (a best-effort check for
// `init` over a large existing tree).
std::optional<std::string> TierBelow(const std::string& root, size_t max_dirs = 20000) {
  std::deque<std::string> todo = {root};
  size_t visited = 0;
  while (!todo.empty() && visited++ < max_dirs) {
    const std::string dir = std::move(todo.front());
    todo.pop_front();
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) continue;
    std::vector<std::string> subdirs;
    while (struct dirent* e = readdir(d)) {
      const absl::string_view name = e->d_name;
      if (name == "." || name == ".." || name == Tier::kMetaDir) continue;
      const std::string path = absl::StrCat(dir, "/", name);
      struct stat st;
      const bool is_dir =
          e->d_type == DT_DIR ||
          (e->d_type == DT_UNKNOWN && lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode));
      if (is_dir) subdirs.push_back(path);
    }
    closedir(d);
    for (std::string& sub : subdirs) {
      if (Tier::IsRoot(sub)) return sub;
      todo.push_back(std::move(sub));
    }
  }
  return std::nullopt;
}
}  // namespace

absl::StatusOr<std::shared_ptr<Tier>> Tier::FindOrCreate(const std::string& dir, bool* created) {
  if (created != nullptr) *created = false;
  auto found = Find(dir);
  if (found.ok() || found.status().code() != absl::StatusCode::kNotFound) return found;
  auto made = Init(dir, TierConfig{});
  if (created != nullptr) *created = made.ok();
  return made;
}

absl::StatusOr<std::shared_ptr<Tier>> Tier::Init(const std::string& dir, const TierConfig& config) {
  WHARF_RETURN_IF_ERROR(RequirePath(dir));
  const std::string root = AbsolutePath(dir);
  // The checks a tier.json read back gets (e.g. block sizes) apply to what init writes.
  if (auto checked = TierConfig::FromJson(config.ToJson(), absl::StrCat("tier init ", root));
      !checked.ok()) {
    return checked.status();
  }
  if (auto enclosing = Find(root); enclosing.ok() && (*enclosing)->root() != root) {
    return absl::FailedPreconditionError(
        absl::StrCat("tier init ", root, ": it is inside the tier at ", (*enclosing)->root()));
  }
  if (!IsRoot(root)) {
    // A tier holding another would evict, count and export the other's files as its own.
    if (std::optional<std::string> below = TierBelow(root)) {
      return absl::FailedPreconditionError(
          absl::StrCat("tier init ", root, ": the tier at ", *below,
                       " is inside it (a tier holds no other tier: use that one, or a "
                       "directory beside it)"));
    }
  }
  if (struct stat st; stat(root.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("tier init ", root, ": not a directory (a tier is a directory)"));
  }
  const std::string temp_root = absl::StrCat(root, "/", kMetaDir, "/", kTempDir);
  WHARF_RETURN_IF_ERROR(Annotate(MakeDirs(temp_root), absl::StrCat("tier init ", root)));
  auto tier = std::shared_ptr<Tier>(new Tier(root, config));
  auto temp = tier->TempDir();
  if (!temp.ok()) return Annotate(temp.status(), absl::StrCat("tier init ", root));
  // The entries' metadata lives in extended attributes: refuse a file system without them.
  {
    const std::string probe = absl::StrCat(*temp, "/probe");
    const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("tier init ", root, ": creating a file"));
    const int rc = fsetxattr(fd, kProbeXattr, "1", 1, 0);
    const int err = errno;
    close(fd);
    unlink(probe.c_str());
    if (rc != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tier init ", root, ": the file system does not support user extended attributes (",
          strerror(err), "), which a tier keeps its entries' metadata in"));
    }
  }
  WHARF_RETURN_IF_ERROR(Annotate(
      WriteSmallFile(absl::StrCat(root, "/", kMetaDir, "/", kConfigFile), config.ToJson(), *temp),
      absl::StrCat("tier init ", root)));
  return tier;
}

absl::StatusOr<std::string> Tier::TempDir() {
  absl::MutexLock lock(&mu_);
  const int pid = getpid();
  if (exiting_) {
    return absl::FailedPreconditionError(
        absl::StrCat("tier ", root_, ": no temporary directory while the process exits"));
  }
  if (temp_owner_pid_ == pid) return temp_dir_;
  if (temp_lock_fd_ >= 0) close(temp_lock_fd_);  // the parent's, inherited across fork
  temp_lock_fd_ = -1;
  const std::string temp_root = MetaPath(kTempDir);
  WHARF_RETURN_IF_ERROR(MakeDirs(temp_root));
  // What killed processes left goes before this one adds its own: every process that writes
  // to the tier (import, fills, export marks) cleans up after the dead, so their temporary
  // files do not stay until someone runs `tier gc`. Best effort: a failure leaves them for
  // the next one.
  (void)CollectGarbage();
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::string name = absl::StrCat(HostName(), "-", pid, "-", RandomHex());
    const std::string lock_path = absl::StrCat(temp_root, "/", name, ".lock");
    const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("creating ", lock_path));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      close(fd);
      continue;
    }
    // A collector may have taken the fresh file's lock and removed it before ours: then the
    // lock we hold names no file, and we start again.
    struct stat by_fd, by_path;
    if (fstat(fd, &by_fd) != 0 || stat(lock_path.c_str(), &by_path) != 0 ||
        by_fd.st_ino != by_path.st_ino || by_fd.st_dev != by_path.st_dev) {
      close(fd);
      continue;
    }
    const std::string dir = absl::StrCat(temp_root, "/", name);
    if (mkdir(dir.c_str(), 0700) != 0) {
      const int err = errno;
      unlink(lock_path.c_str());
      close(fd);
      return ErrnoToStatus(err, absl::StrCat("creating ", dir));
    }
    temp_dir_ = dir;
    temp_lock_fd_ = fd;
    temp_owner_pid_ = pid;
    return temp_dir_;
  }
  return absl::UnavailableError(absl::StrCat("could not own a temporary directory in ", temp_root));
}

absl::StatusOr<Tier::Garbage> Tier::CollectGarbage() {
  Garbage garbage;
  const std::string temp_root = MetaPath(kTempDir);
  std::vector<std::string> names;
  if (DIR* dir = opendir(temp_root.c_str())) {
    while (struct dirent* e = readdir(dir)) names.emplace_back(e->d_name);
    closedir(dir);
  } else if (errno == ENOENT) {
    return garbage;
  } else {
    return ErrnoToStatus(errno, absl::StrCat("reading ", temp_root));
  }
  for (const std::string& name : names) {
    if (name == "." || name == "..") continue;
    const std::string path = absl::StrCat(temp_root, "/", name);
    if (absl::EndsWith(name, ".lock")) {
      const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) continue;  // removed meanwhile
      // Taken: its owner is gone (the OS released the lock when it died). Held: alive.
      if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        const std::string owner_dir = path.substr(0, path.size() - 5);
        if (Exists(owner_dir)) {
          RemoveTree(owner_dir, garbage.files);
          ++garbage.owners;
        }
        unlink(path.c_str());  // after the directory, so a directory never lacks its lock
      }
      close(fd);
      continue;
    }
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) continue;
    // A directory whose lock file is gone has no owner; a stray file is garbage too.
    if (S_ISDIR(st.st_mode)) {
      if (!Exists(path + ".lock")) {
        RemoveTree(path, garbage.files);
        ++garbage.owners;
      }
    } else if (unlink(path.c_str()) == 0) {
      ++garbage.files;
    }
  }
  return garbage;
}

absl::Status Tier::SyncFs() {
  const int fd = open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening ", root_));
  const int rc = syncfs(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) return ErrnoToStatus(err, absl::StrCat("syncfs ", root_));
  return absl::OkStatus();
}

namespace {

json StatsJson(const Tier::Stats& s) {
  json j;
  j["hits"] = s.hits;
  j["misses"] = s.misses;
  j["fills"] = s.fills;
  j["fill_bytes"] = s.fill_bytes;
  return j;
}

void AddTo(Tier::Stats& total, const json& j) {
  total.hits += j.value("hits", uint64_t{0});
  total.misses += j.value("misses", uint64_t{0});
  total.fills += j.value("fills", uint64_t{0});
  total.fill_bytes += j.value("fill_bytes", uint64_t{0});
}

// The owners whose counters folded.json already holds (their files may still be there, when
// a fold was killed before it removed them).
absl::flat_hash_set<std::string> FoldedOwners(const json& folded) {
  absl::flat_hash_set<std::string> owners;
  if (auto it = folded.find("owners"); it != folded.end() && it->is_array()) {
    for (const json& o : *it) {
      if (o.is_string()) owners.insert(o.get<std::string>());
    }
  }
  return owners;
}

// True when `owner` is dead: its lock file is gone, or its lock can be taken (the OS
// released it with the process).
bool OwnerIsGone(const std::string& temp_root, const std::string& owner) {
  const std::string lock_path = absl::StrCat(temp_root, "/", owner, ".lock");
  const int fd = open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  const bool gone = flock(fd, LOCK_EX | LOCK_NB) == 0;
  close(fd);
  return gone;
}

}  // namespace

int Tier::LockFile(const char* name, int operation) const {
  if (MakeDirs(MetaPath("locks")).ok()) {
    const int fd =
        open(MetaPath(absl::StrCat("locks/", name)).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0 && flock(fd, operation) == 0) return fd;
    if (fd >= 0) close(fd);
  }
  return -1;
}

absl::Status Tier::AddStats(const Stats& stats) {
  const std::string dir = MetaPath(kStatsDir);
  WHARF_RETURN_IF_ERROR(MakeDirs(dir));
  WHARF_ASSIGN_OR_RETURN(std::string temp_dir, TempDir());
  const std::string owner = temp_dir.substr(temp_dir.rfind('/') + 1);
  absl::MutexLock lock(&mu_);
  if (owner != stats_owner_) {  // the first counters of this owner (or of a forked child)
    stats_owner_ = owner;
    stats_written_ = Stats{};
  }
  Stats total = stats_written_;
  total.hits += stats.hits;
  total.misses += stats.misses;
  total.fills += stats.fills;
  total.fill_bytes += stats.fill_bytes;
  // Not synced: counters are best effort, and a live reader rewrites them up to ~100 times a
  // second (an fsync each cost a tight loop of tier hits 5% of its rate).
  WHARF_RETURN_IF_ERROR(WriteSmallFile(absl::StrCat(dir, "/", owner, ".json"),
                                       StatsJson(total).dump() + "\n", temp_dir,
                                       /*sync=*/false));
  stats_written_ = total;
  return absl::OkStatus();
}

Tier::Stats Tier::ReadStats() const {
  Stats total;
  const int lock = LockStats(LOCK_SH);  // no fold moves counters while we add them up
  auto docs = ReadJsonFiles(MetaPath(kStatsDir));
  if (docs.ok()) {
    absl::flat_hash_set<std::string> folded;
    for (const auto& [name, j] : *docs) {
      if (name != kFoldedStats) continue;
      AddTo(total, j);
      folded = FoldedOwners(j);
    }
    for (const auto& [name, j] : *docs) {
      if (name != kFoldedStats && !folded.contains(name)) AddTo(total, j);
    }
  }
  if (lock >= 0) close(lock);
  return total;
}

absl::StatusOr<uint64_t> Tier::FoldStats() {
  const std::string dir = MetaPath(kStatsDir);
  const int lock = LockStats(LOCK_EX);
  if (lock < 0) return ErrnoToStatus(errno, absl::StrCat("locking ", MetaPath("locks/stats")));
  auto docs = ReadJsonFiles(dir);
  if (!docs.ok()) {
    close(lock);
    return docs.status();
  }
  Stats total;
  absl::flat_hash_set<std::string> folded;
  for (const auto& [name, j] : *docs) {
    if (name != kFoldedStats) continue;
    AddTo(total, j);
    folded = FoldedOwners(j);
  }
  const std::string temp_root = MetaPath(kTempDir);
  std::vector<std::string> now_folded;
  for (const auto& [name, j] : *docs) {
    if (name == kFoldedStats) continue;
    if (folded.contains(name)) {  // counted already: a killed fold left it
      unlink(absl::StrCat(dir, "/", name, ".json").c_str());
    } else if (OwnerIsGone(temp_root, name)) {
      AddTo(total, j);
      now_folded.push_back(name);
    }
  }
  absl::Status s;
  if (!now_folded.empty()) {
    // First the totals with the names they hold, durably; then the files. Killed between
    // the two, the files are listed as folded and not counted again.
    json j = StatsJson(total);
    j["owners"] = now_folded;
    auto temp_dir = TempDir();
    s = temp_dir.ok() ? WriteSmallFile(absl::StrCat(dir, "/", kFoldedStats, ".json"),
                                       j.dump() + "\n", *temp_dir)
                      : temp_dir.status();
    if (s.ok()) {
      for (const std::string& name : now_folded) {
        unlink(absl::StrCat(dir, "/", name, ".json").c_str());
      }
    }
  }
  close(lock);
  if (!s.ok()) return Annotate(s, absl::StrCat("folding the counters in ", dir));
  return now_folded.size();
}

std::optional<uint64_t> Tier::LastUsage() const {
  auto text = ReadSmallFile(MetaPath("usage.json"));
  if (!text.ok()) return std::nullopt;
  json j = json::parse(*text, nullptr, false);
  if (!j.is_object() || !j.contains("bytes") || !j["bytes"].is_number_unsigned()) {
    return std::nullopt;
  }
  return j["bytes"].get<uint64_t>();
}

namespace {
absl::Status WriteUsage(const std::string& path, uint64_t bytes) {
  json j;
  j["bytes"] = bytes;
  j["time"] = absl::ToUnixSeconds(absl::Now());
  // Not synced: a hint that a crash may lose (the next pass writes it again).
  return WriteSmallFile(path, j.dump() + "\n", "", /*sync=*/false);
}
}  // namespace

absl::Status Tier::RecordUsage(uint64_t bytes) const {
  const int lock = LockFile(kUsageLockFile, LOCK_EX);
  absl::Status s = WriteUsage(MetaPath("usage.json"), bytes);
  if (lock >= 0) close(lock);
  return s;
}

absl::Status Tier::AddUsage(uint64_t bytes) const {
  const int lock = LockFile(kUsageLockFile, LOCK_EX);
  absl::Status s;
  // No record: no pass has measured the tier, and the first fill of the next process that
  // has a size bound runs one (TierStore::MaybeEvict).
  if (std::optional<uint64_t> last = LastUsage()) {
    s = WriteUsage(MetaPath("usage.json"), *last + bytes);
  }
  if (lock >= 0) close(lock);
  return s;
}

namespace {
std::string ImportBase(const TierImport& import) {
  return Md5Hex(absl::StrCat(import.source, "\n", import.dir)).substr(0, 20);
}
}  // namespace

std::string Tier::ImportListingPath(const TierImport& import) const {
  return MetaPath(absl::StrCat(kImportsDir, "/", ImportBase(import), ".listing"));
}

absl::Status Tier::RecordImport(const TierImport& import) {
  json j;
  j["source"] = import.source;
  j["dir"] = import.dir;
  if (import.complete()) {
    j["completed"] = absl::ToUnixMicros(import.completed) / 1e6;
    j["objects"] = import.objects;
  }
  const bool sharded = import.world_size > 0;
  if (sharded) {
    j["rank"] = import.rank;
    j["world_size"] = import.world_size;
  }
  const std::string dir = MetaPath(kImportsDir);
  WHARF_RETURN_IF_ERROR(MakeDirs(dir));
  WHARF_ASSIGN_OR_RETURN(std::string temp_dir, TempDir());
  // <hash of source and dir>.json for an unsharded run, <hash>-<rank>of<W>.json for a rank's.
  const std::string base = ImportBase(import);
  const std::string name =
      sharded ? absl::StrCat(base, "-", import.rank, "of", import.world_size) : base;
  WHARF_RETURN_IF_ERROR(
      WriteSmallFile(absl::StrCat(dir, "/", name, ".json"), j.dump() + "\n", temp_dir));
  // The other kind's records (and other world sizes') describe an older layout of the tree.
  if (DIR* d = opendir(dir.c_str())) {
    std::vector<std::string> stale;
    while (struct dirent* e = readdir(d)) {
      const absl::string_view file = e->d_name;
      if (!absl::StartsWith(file, base) || !absl::EndsWith(file, ".json")) continue;
      const bool same =
          sharded ? absl::StartsWith(file, absl::StrCat(base, "-")) &&
                        absl::EndsWith(file, absl::StrCat("of", import.world_size, ".json"))
                  : file == absl::StrCat(base, ".json");
      if (!same) stale.push_back(absl::StrCat(dir, "/", file));
    }
    closedir(d);
    for (const std::string& path : stale) unlink(path.c_str());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TierImport>> Tier::Imports() const {
  WHARF_ASSIGN_OR_RETURN(auto docs, ReadJsonFiles(MetaPath(kImportsDir)));
  struct Runs {
    TierImport merged;
    std::set<int> ranks;  // complete ranks of a sharded import
    bool any_incomplete = false;
  };
  std::map<std::pair<std::string, std::string>, Runs> by_tree;
  for (const auto& [name, j] : docs) {
    if (!j.contains("source") || !j["source"].is_string()) continue;
    TierImport run;
    run.source = j["source"].get<std::string>();
    run.dir = j.value("dir", std::string());
    run.rank = j.value("rank", -1);
    run.world_size = j.value("world_size", 0);
    if (j.contains("completed") && j["completed"].is_number()) {
      run.completed =
          absl::FromUnixMicros(static_cast<int64_t>(j["completed"].get<double>() * 1e6));
      run.objects = j.value("objects", uint64_t{0});
    }
    Runs& runs = by_tree[{run.source, run.dir}];
    TierImport& m = runs.merged;
    if (m.source.empty()) {
      m.source = run.source;
      m.dir = run.dir;
      m.world_size = run.world_size;
      m.completed = absl::InfiniteFuture();
    }
    if (!run.complete() || run.world_size != m.world_size) {
      runs.any_incomplete = true;
      continue;
    }
    if (run.world_size > 0 &&
        (run.rank < 0 || run.rank >= run.world_size || !runs.ranks.insert(run.rank).second)) {
      continue;
    }
    m.objects += run.objects;
    m.completed = std::min(m.completed, run.completed);
  }
  std::vector<TierImport> out;
  for (auto& [tree, runs] : by_tree) {
    TierImport& m = runs.merged;
    const bool complete = !runs.any_incomplete &&
                          (m.world_size > 0 ? static_cast<int>(runs.ranks.size()) == m.world_size
                                            : m.completed != absl::InfiniteFuture());
    if (!complete) {
      m.completed = absl::InfinitePast();
      m.objects = 0;
    }
    m.rank = -1;
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace wharf
