// wharf tier: flag parsing and output around tier/ (docs/design/tier.md). Import is a
// transfer (io/transfer.h) into the tier's tree store; the other sub-verbs walk the tier.
#include "tier/tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/hash.h"
#include "base/runtime.h"
#include "base/status.h"
#include "cli/common.h"
#include "cli/store_flags.h"
#include "cli/verbs.h"
#include "io/transfer.h"
#include "store/keys.h"
#include "tier/evict.h"
#include "tier/tree_store.h"

namespace wharf::cli {
namespace {

using json = nlohmann::ordered_json;

// The MD5 of a file's content, hex.
absl::StatusOr<std::string> FileMd5(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("reading ", path));
  Md5 md5;
  std::string buf(1 << 20, '\0');
  absl::Status status;
  while (true) {
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = ErrnoToStatus(errno, absl::StrCat("reading ", path));
      break;
    }
    if (n == 0) break;
    md5.Update(absl::string_view(buf.data(), n));
  }
  close(fd);
  if (!status.ok()) return status;
  return HexLower(md5.Finish());
}

absl::Status RunInit(const TierArgs& args) {
  TierConfig config;
  if (auto existing = Tier::Find(args.path);
      existing.ok() && (*existing)->root() == AbsolutePath(args.path)) {
    config = (*existing)->config();  // init on a tier changes only what is given
  }
  if (!args.mode.empty()) {
    WHARF_ASSIGN_OR_RETURN(config.mode, ParseTierMode(args.mode));
  }
  if (args.ttl_seconds > 0) config.ttl = absl::Seconds(args.ttl_seconds);
  if (!args.max_size.empty()) {
    WHARF_ASSIGN_OR_RETURN(config.max_size, ParseSize(args.max_size));
  }
  if (args.min_free >= 0) config.min_free = args.min_free;
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<Tier> tier, Tier::Init(args.path, config));
  if (!args.quiet) {
    Print(absl::StrFormat("tier %s: mode %s%s, max size %s, min free %.1f%%\n", tier->root(),
                          TierModeName(config.mode),
                          config.mode == TierConfig::Mode::kTtl
                              ? absl::StrFormat(" (ttl %.0f s)", absl::ToDoubleSeconds(config.ttl))
                              : "",
                          config.max_size == 0 ? "unbounded" : absl::StrCat(config.max_size),
                          config.min_free));
  }
  return absl::OkStatus();
}

absl::Status RunImport(const TierArgs& args) {
  if ((args.rank >= 0) != (args.world_size > 0)) {
    return absl::InvalidArgumentError("tier import: give --rank and --world-size together");
  }
  if (args.world_size > 0 && args.rank >= args.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("tier import: --rank ", args.rank,
                                                   " is not below --world-size ", args.world_size));
  }
  WHARF_RETURN_IF_ERROR(ApplyEngineArgs(args.engine, args.jobs));
  WHARF_ASSIGN_OR_RETURN(OpenedUri src, OpenCliUri(args.src));
  const std::string dest = AbsolutePath(args.path);
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<Tier> tier, Tier::FindOrCreate(dest));
  // What killed runs left (their temporary files) goes first.
  WHARF_ASSIGN_OR_RETURN(Tier::Garbage garbage, tier->CollectGarbage());

  WHARF_ASSIGN_OR_RETURN(Target target, ResolveTarget(*src.store, src.uri.key));
  TransferOptions options;
  options.mode = TransferMode::kCopy;
  options.recursive = !target.is_object;
  options.list_workers = args.list_workers;
  if (args.world_size > 0) {
    options.shard_index = args.rank;
    options.shard_count = args.world_size;
  }
  Progress progress(Progress::ShouldShow(args.quiet || args.json));
  ProgressObserver observer(progress);
  absl::StatusOr<TransferSummary> summary;
  std::string source_uri;
  {
    WHARF_ASSIGN_OR_RETURN(std::shared_ptr<TierTreeStore> tree,
                           TierTreeStore::Open(tier, dest, Runtime::Default()));
    if (target.is_object) {
      source_uri = src.store->Uri(target.object.key);
      summary = Transfer({src.store, target.object.key}, {tree, ""}, options, &observer);
    } else {
      source_uri = src.store->Uri(target.prefix);
      summary = Transfer({src.store, target.prefix}, {tree, ""}, options, &observer);
    }
  }  // the tree store publishes what it still holds
  progress.Stop();
  if (!summary.ok()) return summary.status();
  if (!target.is_object) {
    WHARF_RETURN_IF_ERROR(tier->RecordImport({source_uri, tier->Relative(dest)}));
  }
  const double seconds = absl::ToDoubleSeconds(summary->elapsed);
  if (args.json) {
    json j;
    j["source"] = source_uri;
    j["dest"] = dest;
    j["tier"] = tier->root();
    j["objects"] = summary->listed;
    j["bytes"] = summary->bytes;
    j["fetched"] = summary->objects;
    j["skipped"] = summary->skipped;
    j["failed"] = summary->failed;
    j["seconds"] = seconds;
    j["garbage_removed"] = garbage.files;
    if (args.world_size > 0) {
      j["rank"] = args.rank;
      j["world_size"] = args.world_size;
    }
    Print(JsonLine(j));
  } else if (!args.quiet) {
    Print(absl::StrFormat("imported %d of %d objects (%s MB) in %.2f s (%s MB/s) into %s\n",
                          summary->objects, summary->listed, Megabytes(summary->bytes), seconds,
                          MegabytesPerSecond(summary->bytes, summary->elapsed), dest));
    if (summary->skipped > 0) {
      Print(absl::StrFormat("skipped %d already current (same size and ETag)\n", summary->skipped));
    }
    if (garbage.files > 0) {
      Print(absl::StrFormat("removed %d temporary files left by %d interrupted runs\n",
                            garbage.files, garbage.owners));
    }
  }
  return absl::OkStatus();
}

absl::Status RunStatus(const TierArgs& args) {
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<Tier> tier, Tier::Find(args.path));
  const std::string path = AbsolutePath(args.path);
  uint64_t entries = 0, bytes = 0, pinned = 0, local = 0, other_files = 0;
  WHARF_RETURN_IF_ERROR(
      WalkTierFiles(*tier, path, [&](const std::string& p, const struct stat& st) {
        const auto entry = ReadEntryAttr(p);
        if (!IsCompleteEntry(entry, st)) {
          ++other_files;
          return;
        }
        ++entries;
        bytes += st.st_size;
        if (IsPinned(p)) ++pinned;
        if (entry->local) ++local;
      }));
  WHARF_ASSIGN_OR_RETURN(std::vector<TierImport> imports, tier->Imports());
  const TierConfig& c = tier->config();
  struct statvfs vfs;
  const bool have_fs = statvfs(tier->root().c_str(), &vfs) == 0 && vfs.f_blocks > 0;
  const uint64_t fs_size = have_fs ? uint64_t{vfs.f_blocks} * vfs.f_frsize : 0;
  const uint64_t fs_free = have_fs ? uint64_t{vfs.f_bavail} * vfs.f_frsize : 0;
  if (args.json) {
    json j;
    j["tier"] = tier->root();
    j["path"] = path;
    j["mode"] = TierModeName(c.mode);
    j["ttl_seconds"] = absl::ToDoubleSeconds(c.ttl);
    j["entries"] = entries;
    j["bytes"] = bytes;
    j["pinned"] = pinned;
    j["local"] = local;
    j["other_files"] = other_files;
    j["max_size"] = c.max_size;
    j["min_free"] = c.min_free;
    j["fs_size"] = fs_size;
    j["fs_free"] = fs_free;
    json imp = json::array();
    for (const TierImport& i : imports) imp.push_back({{"source", i.source}, {"dir", i.dir}});
    j["imports"] = imp;
    const Tier::Stats stats = tier->ReadStats();
    j["hits"] = stats.hits;
    j["misses"] = stats.misses;
    j["fills"] = stats.fills;
    j["fill_bytes"] = stats.fill_bytes;
    Print(JsonLine(j));
    return absl::OkStatus();
  }
  Print(absl::StrFormat("tier      %s (mode %s)\n", tier->root(), TierModeName(c.mode)));
  if (path != tier->root()) Print(absl::StrFormat("path      %s\n", path));
  Print(absl::StrFormat("entries   %d (%s MB), %d pinned, %d only here (not exported)\n", entries,
                        Megabytes(bytes), pinned, local));
  if (other_files > 0)
    Print(absl::StrFormat("other     %d files that are not entries\n", other_files));
  Print(absl::StrFormat(
      "bound     %s, keep %.1f%% free\n",
      c.max_size == 0 ? "no size bound" : absl::StrCat(Megabytes(c.max_size), " MB"), c.min_free));
  if (have_fs) {
    Print(
        absl::StrFormat("disk      %s MB free of %s MB\n", Megabytes(fs_free), Megabytes(fs_size)));
  }
  const Tier::Stats stats = tier->ReadStats();
  Print(absl::StrFormat("reads     %d hits, %d misses; %d objects (%s MB) filled\n", stats.hits,
                        stats.misses, stats.fills, Megabytes(stats.fill_bytes)));
  for (const TierImport& i : imports) {
    Print(absl::StrFormat("import    %s -> %s\n", OneLine(i.source), i.dir.empty() ? "." : i.dir));
  }
  return absl::OkStatus();
}

absl::Status RunGc(const TierArgs& args) {
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<Tier> tier, Tier::Find(args.path));
  WHARF_ASSIGN_OR_RETURN(Tier::Garbage garbage, tier->CollectGarbage());
  if (args.json) {
    Print(JsonLine({{"tier", tier->root()}, {"owners", garbage.owners}, {"files", garbage.files}}));
  } else if (!args.quiet) {
    Print(absl::StrFormat("removed %d temporary files of %d finished or killed processes\n",
                          garbage.files, garbage.owners));
  }
  return absl::OkStatus();
}

// Fetches the entry at `path` again from its source (through the same verified, published
// path as an import).
absl::Status Repair(const std::shared_ptr<Tier>& tier, const std::string& path,
                    const TierEntry& entry) {
  if (entry.source.empty()) {
    return absl::DataLossError("the data exists only in the tier (never exported)");
  }
  // A read-through copy: gone, it is filled again by the next read.
  if (absl::StartsWith(tier->Relative(path), absl::StrCat(Tier::kMetaDir, "/objects/"))) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "removing");
    return absl::OkStatus();
  }
  WHARF_ASSIGN_OR_RETURN(OpenedUri src, OpenCliUri(entry.source));
  const size_t slash = path.rfind('/');
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<TierTreeStore> tree,
                         TierTreeStore::Open(tier, path.substr(0, slash), Runtime::Default()));
  if (unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "removing");
  return Transfer({src.store, src.uri.key}, {tree, path.substr(slash + 1)}, TransferOptions{})
      .status();
}

absl::Status RunVerify(const TierArgs& args) {
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<Tier> tier, Tier::Find(args.path));
  uint64_t checked = 0, damaged = 0, repaired = 0;
  absl::Status walk = WalkTierFiles(
      *tier, AbsolutePath(args.path), [&](const std::string& p, const struct stat& st) {
        const auto entry = ReadEntryAttr(p);
        if (!entry.has_value()) return;  // not an entry: a file of its own
        ++checked;
        std::string problem;
        if (entry->size != static_cast<uint64_t>(st.st_size)) {
          problem = absl::StrCat("size ", st.st_size, ", the entry says ", entry->size);
        } else {
          auto md5 = FileMd5(p);
          if (!md5.ok()) {
            problem = std::string(md5.status().message());
          } else if (*md5 != entry->md5) {
            problem = absl::StrCat("content MD5 ", *md5, ", the entry says ", entry->md5);
          }
        }
        if (problem.empty()) return;
        ++damaged;
        if (args.repair) {
          absl::Status fixed = Repair(tier, p, *entry);
          if (fixed.ok()) {
            ++repaired;
            Print(absl::StrCat("repaired ", OneLine(p), " (", problem, ")\n"));
            return;
          }
          problem = absl::StrCat(problem, "; repair failed: ", fixed.message());
        }
        Print(absl::StrCat("damaged ", OneLine(p), ": ", OneLine(problem), "\n"));
      });
  WHARF_RETURN_IF_ERROR(walk);
  const uint64_t remaining = damaged - repaired;
  if (args.json) {
    Print(JsonLine({{"checked", checked},
                    {"damaged", damaged},
                    {"repaired", repaired},
                    {"remaining", remaining}}));
  } else if (!args.quiet) {
    Print(absl::StrFormat("verified %d entries: %d damaged, %d repaired\n", checked, damaged,
                          repaired));
  }
  if (remaining > 0) {
    return absl::DataLossError(absl::StrCat("tier verify ", AbsolutePath(args.path), ": ",
                                            remaining, " damaged entries remain",
                                            args.repair ? "" : " (repair them with --repair)"));
  }
  return absl::OkStatus();
}

absl::Status RunEvict(const TierArgs& args) {
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<Tier> tier, Tier::Find(args.path));
  uint64_t target = 0;  // without --to: every evictable entry below PATH
  if (!args.to.empty()) {
    WHARF_ASSIGN_OR_RETURN(target, ParseSize(args.to));
  }
  WHARF_ASSIGN_OR_RETURN(EvictResult r, EvictTo(*tier, AbsolutePath(args.path), target));
  if (args.json) {
    Print(JsonLine({{"entries", r.entries},
                    {"bytes", r.bytes},
                    {"evicted", r.evicted},
                    {"evicted_bytes", r.evicted_bytes},
                    {"kept_pinned", r.kept_pinned},
                    {"kept_local", r.kept_local},
                    {"kept_busy", r.kept_busy}}));
  } else if (!args.quiet) {
    Print(absl::StrFormat(
        "evicted %d of %d entries (%s of %s MB); kept %d pinned, %d only here, %d in use\n",
        r.evicted, r.entries, Megabytes(r.evicted_bytes), Megabytes(r.bytes), r.kept_pinned,
        r.kept_local, r.kept_busy));
  }
  return absl::OkStatus();
}

absl::Status RunPin(const TierArgs& args, bool pin) {
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<Tier> tier, Tier::Find(args.path));
  uint64_t changed = 0;
  absl::Status first;
  WHARF_RETURN_IF_ERROR(WalkTierFiles(*tier, AbsolutePath(args.path),
                                      [&](const std::string& p, const struct stat& st) {
                                        if (!IsCompleteEntry(ReadEntryAttr(p), st)) return;
                                        absl::Status s = SetPinned(p, pin);
                                        if (s.ok()) {
                                          ++changed;
                                        } else if (first.ok()) {
                                          first = s;
                                        }
                                      }));
  WHARF_RETURN_IF_ERROR(first);
  if (!args.quiet) Print(absl::StrFormat("%s %d entries\n", pin ? "pinned" : "unpinned", changed));
  return absl::OkStatus();
}

}  // namespace

void AddTier(CLI::App& app, TierArgs& args) {
  CLI::App* tier = app.add_subcommand(
      "tier", "Manage a tier: a directory on fast storage in front of the bucket");
  tier->require_subcommand(1);
  auto sub = [&](const char* name, const char* help) {
    CLI::App* cmd = tier->add_subcommand(name, help);
    cmd->parse_complete_callback([&args, name] { args.action = name; });
    return cmd;
  };

  CLI::App* init = sub("init", "Make TIER_DIR a tier, or change its settings");
  init->add_option("--mode", args.mode,
                   "immutable: entries never go stale (training data); ttl: revalidate with the "
                   "source after --ttl")
      ->check(CLI::IsMember({"immutable", "ttl"}));
  init->add_option("--ttl", args.ttl_seconds, "Seconds an entry stays fresh in ttl mode")
      ->check(CLI::PositiveNumber);
  init->add_option("--max-size", args.max_size, "Bytes the tier may hold (e.g. 500G)");
  init->add_option("--min-free", args.min_free, "Percent of the file system to keep free")
      ->check(CLI::Range(0.0, 99.0));
  init->add_flag("-q,--quiet", args.quiet, "Print nothing");
  init->add_option("TIER_DIR", args.path, "The tier's directory")->required();

  CLI::App* import = sub("import", "Copy every object below SRC_URI into DEST_DIR in a tier");
  import
      ->add_option("--rank", args.rank,
                   "With --world-size: import only this share of the keys (W importers on W "
                   "nodes together import everything once)")
      ->check(CLI::NonNegativeNumber);
  import->add_option("--world-size", args.world_size, "Number of importers sharing the work")
      ->check(CLI::PositiveNumber);
  import
      ->add_option("-j,--jobs,--inflight", args.jobs,
                   "Requests in flight; default: sized from the store's measured latency")
      ->check(CLI::Range(1, 65536));
  AddEngineFlags(import, args.engine, /*budget_mb_alias=*/false);
  import->add_option("--list-workers", args.list_workers, "Parallel listing workers")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  import->add_flag("--json", args.json,
                   "Print a JSON summary: objects, bytes, fetched, skipped, failed, seconds");
  import->add_flag("-q,--quiet", args.quiet, "No progress line and no summary");
  import->add_option("SRC_URI", args.src, "The source prefix (s3://, gs://, file://)")->required();
  import
      ->add_option("DEST_DIR", args.path,
                   "Where the objects appear as files (inside a tier, or it becomes one)")
      ->required();
  import->footer(
      "Each object becomes DEST_DIR/<key relative to SRC_URI>, verified (size, and the MD5\n"
      "where the ETag is one) and published by rename, in batches made durable with one\n"
      "syncfs. A rerun fetches only what is missing or changed (by ETag) and removes the\n"
      "temporary files of interrupted runs.");

  CLI::App* status = sub("status", "Entries, bytes and settings of the tier holding PATH");
  status->add_flag("--json", args.json, "Print one JSON object");
  status->add_option("PATH", args.path, "A path inside a tier")->required();

  CLI::App* gc = sub("gc", "Remove temporary files that finished or killed processes left");
  gc->add_flag("--json", args.json, "Print one JSON object");
  gc->add_flag("-q,--quiet", args.quiet, "Print nothing");
  gc->add_option("TIER_DIR", args.path, "A path inside a tier")->required();

  CLI::App* verify = sub("verify", "Check entries below PATH against their recorded size and MD5");
  verify->add_flag("--repair", args.repair, "Fetch damaged entries again from their source");
  verify->add_flag("--json", args.json, "Print one JSON object");
  verify->add_flag("-q,--quiet", args.quiet, "Print only damaged entries");
  verify->add_option("PATH", args.path, "A path inside a tier")->required();
  verify->footer("Exits 1 while damaged entries remain.");

  CLI::App* evict = sub("evict", "Evict entries below PATH, least recently used first");
  evict->add_option("--to", args.to,
                    "Evict until the entries below PATH hold at most SIZE (e.g. 100G); "
                    "default: evict every evictable entry");
  evict->add_flag("--json", args.json, "Print one JSON object");
  evict->add_flag("-q,--quiet", args.quiet, "Print nothing");
  evict->add_option("PATH", args.path, "A path inside a tier (the tier's directory with --to)")
      ->required();
  evict->footer(
      "Never evicts an entry being read, a pinned entry, or data that exists only in the tier\n"
      "(written to it and not exported). Reads through the tier evict by themselves when the\n"
      "tier goes over --max-size or under --min-free (tier init).");

  CLI::App* pin = sub("pin", "Keep the entries below PATH from eviction");
  pin->add_flag("-q,--quiet", args.quiet, "Print nothing");
  pin->add_option("PATH", args.path, "A path inside a tier")->required();
  CLI::App* unpin = sub("unpin", "Let the entries below PATH be evicted again");
  unpin->add_flag("-q,--quiet", args.quiet, "Print nothing");
  unpin->add_option("PATH", args.path, "A path inside a tier")->required();
}

absl::Status RunTier(const TierArgs& args) {
  if (args.action == "init") return RunInit(args);
  if (args.action == "import") return RunImport(args);
  if (args.action == "status") return RunStatus(args);
  if (args.action == "gc") return RunGc(args);
  if (args.action == "verify") return RunVerify(args);
  if (args.action == "evict") return RunEvict(args);
  if (args.action == "pin") return RunPin(args, true);
  if (args.action == "unpin") return RunPin(args, false);
  return absl::InvalidArgumentError(absl::StrCat("tier: unknown action '", args.action, "'"));
}

}  // namespace wharf::cli
