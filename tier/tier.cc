#include "tier/tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

// Writes `content` to `path` atomically and durably (temporary file, fsync, rename).
absl::Status WriteSmallFile(const std::string& path, absl::string_view content,
                            const std::string& temp_dir) {
  WHARF_ASSIGN_OR_RETURN(auto temp, TempObject::Create(path, temp_dir));
  WHARF_RETURN_IF_ERROR(temp->Append(content));
  return temp->Commit(std::nullopt, /*fsync=*/true).status();
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

// The JSON objects of the *.json files in `dir` (none when it does not exist); files that
// vanish or do not parse are skipped (a concurrent writer publishes by rename).
absl::StatusOr<std::vector<json>> ReadJsonFiles(const std::string& dir) {
  std::vector<json> out;
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
    if (j.is_object()) out.push_back(std::move(j));
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
  j["md5"] = md5;
  j["filled"] = filled == absl::InfinitePast() ? 0.0 : absl::ToUnixMicros(filled) / 1e6;
  j["local"] = local;
  if (block) {
    j["block_offset"] = block_offset;
    j["object_size"] = object_size;
  }
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
    e.md5 = j.at("md5").get<std::string>();
    e.filled = absl::FromUnixMicros(static_cast<int64_t>(j.at("filled").get<double>() * 1e6));
    e.local = j.value("local", false);
    if (j.contains("block_offset")) {
      e.block = true;
      e.block_offset = j.at("block_offset").get<uint64_t>();
      e.object_size = j.at("object_size").get<uint64_t>();
    }
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

Tier::Tier(std::string root, TierConfig config) : root_(std::move(root)), config_(config) {}

Tier::~Tier() {
  absl::MutexLock lock(&mu_);
  if (temp_lock_fd_ < 0) return;
  if (temp_owner_pid_ == getpid()) {
    // Our temporary files are gone with their writers by now; remove the directory and
    // then its lock (the order garbage collection relies on).
    uint64_t files = 0;
    RemoveTree(temp_dir_, files);
    unlink(absl::StrCat(temp_dir_, ".lock").c_str());
  }
  close(temp_lock_fd_);
}

std::string Tier::MetaPath(absl::string_view rel) const {
  return rel.empty() ? absl::StrCat(root_, "/", kMetaDir)
                     : absl::StrCat(root_, "/", kMetaDir, "/", rel);
}

std::string Tier::Relative(const std::string& path) const {
  const std::string abs = AbsolutePath(path);
  if (abs == root_) return "";
  const std::string prefix = root_ == "/" ? "/" : root_ + "/";
  return absl::StartsWith(abs, prefix) ? abs.substr(prefix.size()) : abs;
}

absl::StatusOr<std::shared_ptr<Tier>> Tier::Open(const std::string& root) {
  const std::string config_path = absl::StrCat(root, "/", kMetaDir, "/", kConfigFile);
  TierConfig config;
  if (Exists(config_path)) {
    WHARF_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(config_path));
    WHARF_ASSIGN_OR_RETURN(config, TierConfig::FromJson(text, config_path));
  }
  return std::shared_ptr<Tier>(new Tier(root, config));
}

absl::StatusOr<std::shared_ptr<Tier>> Tier::Find(const std::string& path) {
  std::string dir = AbsolutePath(path);
  while (true) {
    if (Exists(absl::StrCat(dir, "/", kMetaDir, "/", kConfigFile))) return Open(dir);
    if (dir == "/") break;
    const size_t slash = dir.rfind('/');
    dir = slash == 0 ? "/" : dir.substr(0, slash);
  }
  return absl::NotFoundError(
      absl::StrCat(path,
                   " is in no tier (no enclosing directory has .wharf/tier.json; create one with "
                   "`wharf tier init DIR`)"));
}

absl::StatusOr<std::shared_ptr<Tier>> Tier::FindOrCreate(const std::string& dir) {
  auto found = Find(dir);
  if (found.ok() || found.status().code() != absl::StatusCode::kNotFound) return found;
  return Init(dir, TierConfig{});
}

absl::StatusOr<std::shared_ptr<Tier>> Tier::Init(const std::string& dir, const TierConfig& config) {
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
  if (temp_owner_pid_ == pid) return temp_dir_;
  if (temp_lock_fd_ >= 0) close(temp_lock_fd_);  // the parent's, inherited across fork
  temp_lock_fd_ = -1;
  const std::string temp_root = MetaPath(kTempDir);
  WHARF_RETURN_IF_ERROR(MakeDirs(temp_root));
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

absl::Status Tier::AddStats(const Stats& stats) {
  const std::string dir = MetaPath("stats");
  WHARF_RETURN_IF_ERROR(MakeDirs(dir));
  WHARF_ASSIGN_OR_RETURN(std::string temp_dir, TempDir());
  json j;
  j["hits"] = stats.hits;
  j["misses"] = stats.misses;
  j["fills"] = stats.fills;
  j["fill_bytes"] = stats.fill_bytes;
  return WriteSmallFile(
      absl::StrCat(dir, "/", HostName(), "-", getpid(), "-", RandomHex(), ".json"), j.dump() + "\n",
      temp_dir);
}

Tier::Stats Tier::ReadStats() const {
  Stats total;
  auto docs = ReadJsonFiles(MetaPath("stats"));
  if (!docs.ok()) return total;
  for (const json& j : *docs) {
    total.hits += j.value("hits", uint64_t{0});
    total.misses += j.value("misses", uint64_t{0});
    total.fills += j.value("fills", uint64_t{0});
    total.fill_bytes += j.value("fill_bytes", uint64_t{0});
  }
  return total;
}

absl::Status Tier::RecordImport(const TierImport& import) {
  json j;
  j["source"] = import.source;
  j["dir"] = import.dir;
  const std::string dir = MetaPath(kImportsDir);
  WHARF_RETURN_IF_ERROR(MakeDirs(dir));
  WHARF_ASSIGN_OR_RETURN(std::string temp_dir, TempDir());
  const std::string name = Md5Hex(absl::StrCat(import.source, "\n", import.dir)).substr(0, 20);
  return WriteSmallFile(absl::StrCat(dir, "/", name, ".json"), j.dump() + "\n", temp_dir);
}

absl::StatusOr<std::vector<TierImport>> Tier::Imports() const {
  std::vector<TierImport> out;
  WHARF_ASSIGN_OR_RETURN(std::vector<json> docs, ReadJsonFiles(MetaPath(kImportsDir)));
  for (const json& j : docs) {
    if (!j.contains("source") || !j["source"].is_string()) continue;
    out.push_back({j["source"].get<std::string>(), j.value("dir", std::string())});
  }
  return out;
}

}  // namespace wharf
