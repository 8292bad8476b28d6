#include "checkpoint/catalog.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "io/get_all.h"
#include "nlohmann/json.hpp"
#include "store/keys.h"
#include "store/local/local_store.h"
#include "store/local/temp_object.h"
#include "store/registry.h"
#include "store/uri.h"
#include "tier/export.h"
#include "tier/tree_store.h"

namespace wharf::checkpoint {

using json = nlohmann::json;

namespace {

constexpr int kManifestVersion = 1;
constexpr char kManifestFormat[] = "wharf-checkpoint";

std::string Iso8601(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", t, absl::UTCTimeZone());
}

// The JSON text of a caller's object, or InvalidArgument.
absl::StatusOr<json> ParseObject(absl::string_view text, absl::string_view what) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a JSON object"));
  }
  return j;
}

}  // namespace

std::string StepDirName(int64_t step) { return absl::StrFormat("step-%012d", step); }

std::optional<int64_t> ParseStepDirName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "step-") || name.empty() || name.size() > 18) {
    return std::nullopt;
  }
  for (char c : name) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(name, &step)) return std::nullopt;
  return step;
}

std::string Manifest::ToJson() const {
  json j;
  j["format"] = kManifestFormat;
  j["version"] = kManifestVersion;
  j["step"] = step;
  j["time"] = Iso8601(time);
  j["time_unix"] = absl::ToDoubleSeconds(time - absl::UnixEpoch());
  j["layout"] = layout;
  j["world_size"] = world_size;
  j["metrics"] = json::object();
  for (const auto& [name, value] : metrics) j["metrics"][name] = value;
  j["bytes"] = bytes;
  json list = json::array();
  for (const ManifestFile& f : files) {
    list.push_back({{"path", f.path}, {"size", f.size}, {"etag", f.etag}});
  }
  j["files"] = std::move(list);
  auto user = ParseObject(user_json, "user");
  j["user"] = user.ok() ? *user : json::object();
  return j.dump(1);
}

absl::StatusOr<Manifest> Manifest::FromJson(absl::string_view text, absl::string_view what) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": not a wharf checkpoint manifest (", why, ")"));
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (!j.contains("format") || j["format"] != kManifestFormat) {
    return bad("format is not wharf-checkpoint");
  }
  if (!j.contains("version") || !j["version"].is_number_integer()) return bad("no version");
  if (j["version"].get<int>() > kManifestVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": manifest version ", j["version"].get<int>(), " is newer than this wharf (",
        kManifestVersion, "); upgrade wharf to read it"));
  }
  Manifest m;
  try {
    m.step = j.at("step").get<int64_t>();
    m.time = absl::UnixEpoch() + absl::Seconds(j.at("time_unix").get<double>());
    m.layout = j.value("layout", "dcp");
    m.world_size = j.value("world_size", 1);
    if (j.contains("metrics")) {
      for (const auto& [name, value] : j["metrics"].items()) {
        if (value.is_number()) m.metrics[name] = value.get<double>();
      }
    }
    m.bytes = j.value("bytes", uint64_t{0});
    for (const json& f : j.at("files")) {
      m.files.push_back(ManifestFile{f.at("path").get<std::string>(), f.at("size").get<uint64_t>(),
                                     f.value("etag", "")});
    }
    m.user_json = j.contains("user") && j["user"].is_object() ? j["user"].dump() : "{}";
  } catch (const json::exception& e) {
    return bad(e.what());
  }
  return m;
}

std::string RootConfig::ToJson() const {
  json j;
  j["export_to"] = export_to;
  j["metric"] = metric;
  j["mode"] = mode;
  return j.dump(1);
}

absl::StatusOr<RootConfig> RootConfig::FromJson(absl::string_view text, absl::string_view what) {
  WHARF_ASSIGN_OR_RETURN(json j, ParseObject(text, what));
  RootConfig c;
  c.export_to = j.value("export_to", "");
  c.metric = j.value("metric", "");
  c.mode = j.value("mode", "min");
  if (c.mode != "min" && c.mode != "max") {
    return absl::InvalidArgumentError(absl::StrCat(what, ": mode must be min or max"));
  }
  return c;
}

absl::StatusOr<Manifest> Select(const std::vector<Manifest>& complete, const Selector& selector,
                                absl::string_view root_uri) {
  const Manifest* best = nullptr;
  for (const Manifest& m : complete) {
    switch (selector.kind) {
      case Selector::Kind::kLatest:
        if (best == nullptr || m.step > best->step) best = &m;
        break;
      case Selector::Kind::kStep:
        if (m.step == selector.step) best = &m;
        break;
      case Selector::Kind::kBest: {
        auto it = m.metrics.find(selector.metric);
        if (it == m.metrics.end()) break;
        if (best == nullptr) {
          best = &m;
          break;
        }
        const double have = best->metrics.at(selector.metric);
        const bool better = selector.maximize ? it->second > have : it->second < have;
        if (better || (it->second == have && m.step > best->step)) best = &m;
        break;
      }
    }
  }
  if (best != nullptr) return *best;
  switch (selector.kind) {
    case Selector::Kind::kStep:
      return absl::NotFoundError(
          absl::StrCat("no complete checkpoint of step ", selector.step, " in ", root_uri));
    case Selector::Kind::kBest:
      // Manifests keep finite values only (NaN and infinity rank nowhere).
      return absl::NotFoundError(absl::StrCat("no complete checkpoint in ", root_uri,
                                              " records a finite value of the metric '",
                                              selector.metric, "'"));
    default:
      return absl::NotFoundError(absl::StrCat("no complete checkpoint in ", root_uri));
  }
}

absl::StatusOr<std::shared_ptr<CheckpointRoot>> CheckpointRoot::Open(
    absl::string_view uri_or_path, const StoreOptions& options, std::shared_ptr<Runtime> runtime) {
  WHARF_ASSIGN_OR_RETURN(ObjectUri parsed, ParseUriOrPath(uri_or_path));
  std::shared_ptr<CheckpointRoot> root(new CheckpointRoot());
  if (parsed.scheme == "file" && !options.cache.has_value()) {
    std::string dir = "/" + std::string(absl::StripSuffix(parsed.key, "/"));
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    if (dir == "/") {
      return absl::InvalidArgumentError("a checkpoint root cannot be the file system root");
    }
    // A file where the root should be: every verb would report "no checkpoint" for it.
    struct stat st;
    const int stat_rc = ::stat(dir.c_str(), &st);
    if (stat_rc == 0 && !S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint root file://", dir, " is a file, not a directory of checkpoints"));
    }
    if (stat_rc != 0 && errno == ENOTDIR) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint root file://", dir, " is below a file, not a directory of checkpoints"));
    }
    root->local_dir_ = dir;
    root->uri_ = absl::StrCat("file://", dir, "/");
    auto tier = Tier::Find(dir);
    if (tier.ok()) {
      root->tier_ = *tier;
      // The tier's root itself is a root too: its step-N directories sit beside whatever
      // else the tier holds (imported trees, .wharf), which a root never touches.
      const std::string rel = root->tier_->Relative(dir);
      // The tree store of the whole tier (its .wharf hidden), the root as a prefix: opening
      // a root creates nothing. Checkpoint files are written at disk speed: a CRC32C per
      // file, not an MD5 (the MD5 was two thirds of a save's CPU); their ETags are their own.
      TierTreeOptions tree_options;
      tree_options.written_checksum = Checksum::kCrc32c;
      WHARF_ASSIGN_OR_RETURN(
          std::shared_ptr<TierTreeStore> tree,
          TierTreeStore::Open(root->tier_, root->tier_->root(), runtime, tree_options));
      root->store_ = std::move(tree);
      root->prefix_ = AsPrefix(rel);
    } else if (absl::IsNotFound(tier.status())) {
      // A plain directory: the file store at /, each file and directory fsynced before it is
      // published (a checkpoint must survive a crash once its manifest says it exists).
      LocalStoreOptions local;
      local.fsync = true;
      WHARF_ASSIGN_OR_RETURN(std::unique_ptr<LocalStore> store,
                             LocalStore::Open("/", runtime, local));
      LocalStore::KeepDirectory(dir);  // removing the last checkpoint keeps the root
      root->store_ = std::move(store);
      root->prefix_ = AsPrefix(dir.substr(1));
    } else {
      return tier.status();
    }
    return root;
  }
  WHARF_ASSIGN_OR_RETURN(OpenedUri opened, OpenUri(uri_or_path, options, runtime));
  root->store_ = std::move(opened.store);
  root->prefix_ = opened.uri.key.empty() ? "" : AsPrefix(opened.uri.key);
  root->uri_ = root->store_->Uri(root->prefix_);
  return root;
}

std::string CheckpointRoot::StepPrefix(int64_t step) const {
  return absl::StrCat(prefix_, StepDirName(step), "/");
}

std::string CheckpointRoot::StepUri(int64_t step) const {
  return absl::StrCat(uri_, StepDirName(step), "/");
}

absl::StatusOr<std::vector<ObjectMeta>> CheckpointRoot::ListKeys(const std::string& prefix) const {
  ListOptions lo;
  lo.prefix = prefix;
  auto page = store_->ListAll(lo);
  if (absl::IsNotFound(page.status()) && is_local()) return std::vector<ObjectMeta>{};
  if (!page.ok()) return page.status();
  return std::move(page->objects);
}

namespace {

// Whether a file below `dir` is a tier entry copied from below an import's source prefix:
// imported data. A checkpoint's own files have no source until exported, and then (or once
// restored into the tier) their source is the export destination, not an import's.
bool HoldsImportedEntry(const std::string& dir, const std::vector<TierImport>& imports) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code ignored;
    if (!it->is_regular_file(ignored)) continue;
    std::optional<TierEntry> entry = ReadEntryAttr(it->path().string());
    if (!entry.has_value() || entry->source.empty()) continue;
    for (const TierImport& import : imports) {
      if (absl::StartsWith(entry->source, import.source)) return true;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<CheckpointRoot::Listing> CheckpointRoot::List() const {
  Listing out;
  ListOptions lo;
  lo.prefix = prefix_;
  lo.delimiter = "/";
  auto page = store_->ListAll(lo);
  if (!page.ok()) {
    if (absl::IsNotFound(page.status()) && is_local()) return out;  // no directory yet
    return Annotate(page.status(), absl::StrCat("listing checkpoints in ", uri_));
  }
  std::vector<int64_t> steps;
  for (const std::string& p : page->common_prefixes) {
    absl::string_view name = p;
    absl::ConsumePrefix(&name, prefix_);
    absl::ConsumeSuffix(&name, "/");
    if (auto step = ParseStepDirName(name)) steps.push_back(*step);
  }
  if (is_local()) {
    // A step directory holding only a killed writer's temporary files (which the store's
    // listing hides) is an incomplete save too: else nothing would ever remove it.
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(local_dir_, ec)) {
      std::error_code ignored;
      if (!e.is_directory(ignored)) continue;
      if (auto step = ParseStepDirName(e.path().filename().string())) steps.push_back(*step);
    }
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  // The manifests, read concurrently (one round trip each on a bucket).
  class StringSink : public ReadSink {
   public:
    absl::Status Append(absl::string_view chunk) override {
      if (text.size() + chunk.size() > (uint64_t{64} << 20)) {
        return absl::ResourceExhaustedError("manifest larger than 64 MiB");
      }
      text.append(chunk.data(), chunk.size());
      return absl::OkStatus();
    }
    std::string text;
  };
  std::vector<StringSink> sinks(steps.size());
  std::vector<GetRequest> gets(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    gets[i].key = StepPrefix(steps[i]) + kManifestName;
    gets[i].sink = &sinks[i];
  }
  GetAllOptions get_options;
  get_options.max_in_flight = 32;
  get_options.stop_at_first_error = false;  // a missing manifest is an incomplete save
  const GetAllResult got = GetAll(*store_, std::move(gets), get_options);
  std::optional<std::vector<TierImport>> imports;  // read when a tier's step needs them
  for (size_t i = 0; i < steps.size(); ++i) {
    const absl::Status status = got.results[i].status();
    if (absl::IsNotFound(status)) {
      // In a tier, a step directory holding a copy of a source object (an import wrote it)
      // is data that merely has a step's name, not a save: never listed, never removed.
      if (tier_ != nullptr && !imports.has_value()) {
        auto read = tier_->Imports();
        if (!read.ok()) {
          return Annotate(read.status(), absl::StrCat("listing checkpoints in ", uri_));
        }
        imports = *std::move(read);
      }
      if (tier_ == nullptr ||
          !HoldsImportedEntry(absl::StrCat(local_dir_, "/", StepDirName(steps[i])), *imports)) {
        out.incomplete.push_back(steps[i]);
      }
      continue;
    }
    const std::string what = StepUri(steps[i]) + kManifestName;
    if (absl::IsResourceExhausted(status)) {  // larger than any manifest: not one
      out.damaged.emplace_back(steps[i], Annotate(status, what));
      continue;
    }
    if (!status.ok()) return Annotate(status, "reading " + what);
    auto m = Manifest::FromJson(sinks[i].text, what);
    // A manifest newer than this wharf stops the listing: skipping it could make an older
    // checkpoint "latest".
    if (absl::IsFailedPrecondition(m.status())) return m.status();
    if (!m.ok()) {
      out.damaged.emplace_back(steps[i], m.status());
      continue;
    }
    if (m->step != steps[i]) {
      out.damaged.emplace_back(
          steps[i], absl::DataLossError(absl::StrCat(what, ": says step ", m->step,
                                                     " in the directory of step ", steps[i])));
      continue;
    }
    out.complete.push_back(*std::move(m));
  }
  return out;
}

absl::StatusOr<Manifest> CheckpointRoot::Read(int64_t step) const {
  const std::string key = StepPrefix(step) + kManifestName;
  auto text = store_->Read(key);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat("no complete checkpoint of step ", step, " in ", uri_,
                                            " (", kManifestName,
                                            " missing: the save is incomplete or never ran)"));
  }
  if (!text.ok()) return text.status();
  return Manifest::FromJson(*text, store_->Uri(key));
}

absl::StatusOr<std::vector<ManifestFile>> CheckpointRoot::Files(const Manifest& manifest) const {
  const std::string dir = StepPrefix(manifest.step);
  WHARF_ASSIGN_OR_RETURN(std::vector<ObjectMeta> objects, ListKeys(dir));
  std::map<std::string, ManifestFile> here;
  for (const ObjectMeta& o : objects) {
    absl::string_view rel = o.key;
    absl::ConsumePrefix(&rel, dir);
    here[std::string(rel)] = ManifestFile{std::string(rel), o.size, o.etag};
  }
  std::vector<ManifestFile> out;
  for (const ManifestFile& f : manifest.files) {
    auto it = here.find(f.path);
    if (it == here.end() || it->second.size != f.size) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint ", StepUri(manifest.step), " is damaged: ", f.path,
          it == here.end()
              ? " is missing"
              : absl::StrCat(" has ", it->second.size, " bytes, its manifest says ", f.size)));
    }
    out.push_back(it->second);
  }
  return out;
}

absl::StatusOr<Manifest> CheckpointRoot::Commit(int64_t step, const CommitOptions& options) const {
  const std::string dir = StepPrefix(step);
  WHARF_ASSIGN_OR_RETURN(std::vector<ObjectMeta> objects, ListKeys(dir));
  Manifest m;
  m.step = step;
  m.metrics = options.metrics;
  m.world_size = options.world_size;
  m.layout = options.layout;
  m.user_json = options.user_json;
  WHARF_RETURN_IF_ERROR(ParseObject(m.user_json, "checkpoint user data").status());
  std::map<std::string, uint64_t> have;
  for (const ObjectMeta& o : objects) {
    absl::string_view rel = o.key;
    absl::ConsumePrefix(&rel, dir);
    if (rel == kManifestName) continue;
    m.files.push_back(ManifestFile{std::string(rel), o.size, o.etag});
    m.bytes += o.size;
    have[std::string(rel)] = o.size;
  }
  for (const auto& [path, size] : options.expected) {
    auto it = have.find(path);
    if (it == have.end()) {
      return absl::DataLossError(absl::StrCat("committing ", StepUri(step), ": ", path,
                                              " is missing; the checkpoint is not committed"));
    }
    if (it->second < size) {
      return absl::DataLossError(absl::StrCat("committing ", StepUri(step), ": ", path, " has ",
                                              it->second, " bytes, ", size,
                                              " were written; the checkpoint is not committed"));
    }
  }
  if (m.files.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("committing ", StepUri(step), ": the directory holds no file"));
  }
  std::sort(m.files.begin(), m.files.end(),
            [](const ManifestFile& a, const ManifestFile& b) { return a.path < b.path; });
  m.time = absl::Now();
  WHARF_RETURN_IF_ERROR(store_->Put(dir + kManifestName, absl::Cord(m.ToJson())).status());
  return m;
}

absl::StatusOr<int> CheckpointRoot::AbortUploads(
    const std::string& prefix, const std::function<bool(absl::string_view)>& pick) const {
  auto uploads = store_->ListUploads(prefix);
  if (absl::IsUnimplemented(uploads.status())) return 0;
  if (!uploads.ok()) return uploads.status();
  int aborted = 0;
  for (const PendingUpload& u : *uploads) {
    if (!pick(u.key)) continue;
    WHARF_RETURN_IF_ERROR(store_->AbortUpload(u.key, u.upload_id));
    ++aborted;
  }
  return aborted;
}

absl::Status CheckpointRoot::Delete(int64_t step) const {
  const std::string dir = StepPrefix(step);
  const std::string what = absl::StrCat("removing checkpoint ", StepUri(step));
  // The manifest first: from here on the checkpoint does not exist, whatever happens next.
  absl::Status s = store_->Delete(dir + kManifestName);
  if (!s.ok() && !absl::IsNotFound(s)) return Annotate(s, what);
  if (is_local()) {
    // Files, and the temporary files a killed writer left (never listed by the store).
    std::error_code ec;
    std::filesystem::remove_all(absl::StrCat(local_dir_, "/", StepDirName(step)), ec);
    if (ec) return ErrnoToStatus(ec.value(), what);
    return absl::OkStatus();
  }
  auto objects = ListKeys(dir);
  if (!objects.ok()) return Annotate(objects.status(), what);
  std::vector<std::string> keys;
  for (const ObjectMeta& o : *objects) keys.push_back(o.key);
  if (!keys.empty()) WHARF_RETURN_IF_ERROR(Annotate(store_->DeleteMany(std::move(keys)), what));
  auto aborted = AbortUploads(dir, [](absl::string_view) { return true; });
  if (!aborted.ok()) return Annotate(aborted.status(), what);
  return absl::OkStatus();
}

absl::StatusOr<int> CheckpointRoot::RemoveAbandoned(int64_t before_step) const {
  WHARF_ASSIGN_OR_RETURN(Listing listing, List());
  std::set<int64_t> complete;
  for (const Manifest& m : listing.complete) complete.insert(m.step);
  std::set<int64_t> removed;
  for (int64_t step : listing.incomplete) {
    if (step >= before_step) continue;
    WHARF_RETURN_IF_ERROR(Delete(step));
    removed.insert(step);
  }
  // Uploads of saves killed before any of their files completed (no directory listed).
  auto aborted = AbortUploads(prefix_, [&](absl::string_view key) {
    absl::string_view rel = key;
    if (!absl::ConsumePrefix(&rel, prefix_)) return false;
    const size_t slash = rel.find('/');
    if (slash == absl::string_view::npos) return false;
    auto step = ParseStepDirName(rel.substr(0, slash));
    if (!step || *step >= before_step || complete.count(*step) > 0) return false;
    removed.insert(*step);
    return true;
  });
  if (!aborted.ok()) return aborted.status();
  return static_cast<int>(removed.size());
}

absl::StatusOr<int> CheckpointRoot::RemoveLeftovers() const {
  int removed = 0;
  if (!local_dir_.empty()) {
    if (DIR* dir = opendir(local_dir_.c_str()); dir != nullptr) {
      std::vector<std::string> temps;
      while (const dirent* e = readdir(dir)) {
        if (absl::StartsWith(e->d_name, kLockedTempPrefix)) temps.emplace_back(e->d_name);
      }
      for (const std::string& name : temps)
        removed += RemoveAbandonedTemp(dirfd(dir), name.c_str());
      closedir(dir);
    }
  }
  // The files' uploads: keys directly below the folder (a step directory's are
  // RemoveAbandoned's, which knows which saves may still run).
  auto aborted = AbortUploads(prefix_, [&](absl::string_view key) {
    absl::string_view rel = key;
    return absl::ConsumePrefix(&rel, prefix_) && !absl::StrContains(rel, '/');
  });
  if (!aborted.ok()) return aborted.status();
  return removed + *aborted;
}

absl::StatusOr<RootConfig> CheckpointRoot::ReadConfig() const {
  const std::string key = prefix_ + kRootConfigName;
  auto text = store_->Read(key);
  if (absl::IsNotFound(text.status())) return RootConfig{};
  if (!text.ok()) return text.status();
  return RootConfig::FromJson(*text, store_->Uri(key));
}

absl::Status CheckpointRoot::WriteConfig(const RootConfig& config) const {
  return store_->Put(prefix_ + kRootConfigName, absl::Cord(config.ToJson())).status();
}

absl::StatusOr<CopySummary> CopyCheckpoint(const CheckpointRoot& from, const CheckpointRoot& to,
                                           int64_t step, const CopyOptions& options) {
  const absl::Time start = absl::Now();
  WHARF_ASSIGN_OR_RETURN(Manifest manifest, from.Read(step));
  CopySummary summary;
  summary.manifest = manifest;
  const std::string what =
      absl::StrCat("copying checkpoint ", from.StepUri(step), " to ", to.StepUri(step));
  const std::vector<TransferFilter> no_manifest = {{false, kManifestName}};
  const std::string dst_dir = to.StepPrefix(step);
  // A source missing a file of its manifest (or holding one of another size) is named as
  // such before anything is copied, not found out as a damaged copy at the destination.
  if (absl::Status s = from.Files(manifest).status(); !s.ok()) {
    return Annotate(s, absl::StrCat(what, " (nothing copied)"));
  }

  // A checkpoint of this step already at the destination (an earlier save or export) that is
  // not this one stops existing before any of its files is replaced: a copy that dies halfway
  // must not leave its manifest over a mix of two checkpoints' files (same-sized files pass
  // every check). The same checkpoint again (the same manifest) keeps it: its files are those.
  if (auto there = to.Read(step);
      there.ok() ? there->ToJson() != manifest.ToJson() : !absl::IsNotFound(there.status())) {
    absl::Status removed = to.store()->Delete(dst_dir + kManifestName);
    if (!removed.ok() && !absl::IsNotFound(removed)) {
      return Annotate(removed, absl::StrCat(what, " (removing the step's other manifest there)"));
    }
  }

  if (from.tier() != nullptr && options.mark_exported) {
    // An export: the tier's own path, so the exported entries lose `local`.
    TierExportOptions eo;
    eo.filters = no_manifest;
    eo.delete_extra = true;  // the step's files are the manifest's: no other checkpoint's
    eo.put = options.put;
    eo.inflight = options.inflight;
    eo.memory_budget = options.memory_budget;
    const std::string dir = absl::StrCat(from.local_dir(), "/", StepDirName(step));
    auto exported = ExportTierPath(from.tier(), dir, {to.store(), dst_dir}, eo, options.observer);
    if (!exported.ok()) return Annotate(exported.status(), what);
    summary.files = exported->transfer.objects;
    summary.bytes = exported->transfer.bytes;
    summary.skipped = exported->transfer.skipped;
    summary.aborted_uploads = exported->aborted_uploads;
  } else {
    TransferOptions to_opts;
    to_opts.recursive = true;
    to_opts.filters = no_manifest;
    to_opts.delete_extra = true;
    to_opts.put = options.put;
    to_opts.inflight = options.inflight;
    to_opts.memory_budget = options.memory_budget;
    auto copied = Transfer({from.store(), from.StepPrefix(step)}, {to.store(), dst_dir}, to_opts,
                           options.observer);
    if (!copied.ok()) return Annotate(copied.status(), what);
    summary.files = copied->objects;
    summary.bytes = copied->bytes;
    summary.skipped = copied->skipped;
  }

  // Every file of the manifest, whole, before the manifest that makes the copy exist.
  if (absl::Status s = to.Files(manifest).status(); !s.ok()) {
    return Annotate(s, absl::StrCat(what, " (after the copy; the copy is not committed)"));
  }
  const std::string manifest_key = from.StepPrefix(step) + kManifestName;
  if (from.tier() != nullptr && options.mark_exported) {
    TierExportOptions eo;
    eo.put = options.put;
    auto exported = ExportTierPath(
        from.tier(), absl::StrCat(from.local_dir(), "/", StepDirName(step), "/", kManifestName),
        {to.store(), dst_dir + kManifestName}, eo);
    if (!exported.ok()) return Annotate(exported.status(), what);
  } else {
    auto text = from.store()->Read(manifest_key);
    if (!text.ok()) return Annotate(text.status(), what);
    PutOptions put = options.put;
    put.source_uri = from.store()->Uri(manifest_key);
    auto head = from.store()->Head(manifest_key);
    if (head.ok()) put.source_etag = head->etag;
    WHARF_RETURN_IF_ERROR(
        Annotate(to.store()->Put(dst_dir + kManifestName, absl::Cord(*text), put).status(), what));
  }
  summary.elapsed = absl::Now() - start;
  return summary;
}

}  // namespace wharf::checkpoint
