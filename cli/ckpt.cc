// wharf ckpt ls|export|restore|rm: the checkpoints of a root (checkpoint/catalog.h,
// docs/design/checkpoint.md). Only complete checkpoints (a manifest written last) are listed,
// exported or restored.
#include <sys/stat.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "checkpoint/catalog.h"
#include "cli/common.h"
#include "cli/store_flags.h"
#include "cli/verbs.h"
#include "nlohmann/json.hpp"
#include "store/uri.h"

namespace wharf::cli {
namespace {

using checkpoint::CheckpointRoot;
using checkpoint::Manifest;
using json = nlohmann::json;

absl::StatusOr<std::shared_ptr<CheckpointRoot>> OpenRoot(const std::string& uri) {
  WHARF_ASSIGN_OR_RETURN(ObjectUri parsed, ParseUriOrPath(uri));
  StoreOptions options = CliStoreOptions(parsed.scheme);
  options.cache.reset();  // a checkpoint root is read and written where it is
  return CheckpointRoot::Open(uri, options);
}

// One complete checkpoint and where it is.
struct Found {
  Manifest manifest;
  bool here = false;   // in the root given
  bool there = false;  // in the root's export destination
};

struct Candidates {
  std::shared_ptr<CheckpointRoot> root;
  std::shared_ptr<CheckpointRoot> exported;  // the root's export_to, when it has one
  checkpoint::RootConfig config;
  std::map<int64_t, Found> by_step;
  std::vector<Manifest> All() const {
    std::vector<Manifest> out;
    for (const auto& [step, f] : by_step) out.push_back(f.manifest);
    return out;
  }
};

void Warn(absl::string_view message) {
  const std::string line = absl::StrCat("wharf: ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

// One line per step directory whose manifest is not one (the others are still listed).
void WarnDamaged(const CheckpointRoot::Listing& listing) {
  for (const auto& [step, why] : listing.damaged) {
    Warn(absl::StrCat("step ", step, " is left out: ", OneLine(why.message()),
                      " (wharf ckpt rm --step ", step, " removes it)"));
  }
}

// The root's complete checkpoints, and for a local root that exports, the destination's.
absl::StatusOr<Candidates> Collect(const std::string& uri) {
  Candidates c;
  WHARF_ASSIGN_OR_RETURN(c.root, OpenRoot(uri));
  WHARF_ASSIGN_OR_RETURN(c.config, c.root->ReadConfig());
  WHARF_ASSIGN_OR_RETURN(CheckpointRoot::Listing here, c.root->List());
  WarnDamaged(here);
  // A local copy is checked against its manifest (a stat per file). An exported tier copy
  // is evictable: eviction may take some of its files and leave its manifest, so a copy
  // that lacks some is the bucket's (else damaged). In a plain folder, or a tier that does
  // not export, a file missing or cut short is damage, said in a warning.
  const bool evictable = c.root->tier() != nullptr && !c.config.export_to.empty();
  std::map<int64_t, absl::Status> partial;
  for (Manifest& m : here.complete) {
    if (c.root->is_local()) {
      if (absl::Status s = c.root->Files(m).status(); !s.ok()) {
        partial.emplace(m.step, std::move(s));
        continue;
      }
    }
    Found& f = c.by_step[m.step];
    f.manifest = std::move(m);
    f.here = true;
  }
  auto warn_partial = [&] {
    for (const auto& [step, why] : partial) {
      if (c.by_step.count(step) > 0) {  // complete in the bucket
        if (!evictable) {
          Warn(absl::StrCat("step ", step, ": the copy in ", OneLine(c.root->uri()),
                            " is damaged (", OneLine(why.message()),
                            "); the exported one is listed (wharf ckpt restore --step ", step,
                            " reads it)"));
        }
        continue;
      }
      Warn(absl::StrCat("step ", step, " is left out: ", OneLine(why.message()),
                        " (wharf ckpt rm --step ", step, " removes it)"));
    }
  };
  if (c.root->is_local() && !c.config.export_to.empty()) {
    // The tier's own checkpoints stay usable when the bucket it exports to cannot be read.
    absl::StatusOr<CheckpointRoot::Listing> there;
    auto exported = OpenRoot(c.config.export_to);
    if (exported.ok()) {
      c.exported = *std::move(exported);
      there = c.exported->List();
    } else {
      there = exported.status();
    }
    // A manifest newer than this wharf still stops the listing (see CheckpointRoot::List).
    if (absl::IsFailedPrecondition(there.status())) return there.status();
    if (!there.ok()) {
      Warn(absl::StrCat("the checkpoints exported to ", OneLine(c.config.export_to),
                        " are left out: ", OneLine(there.status().message())));
      c.exported = nullptr;
      warn_partial();
      return c;
    }
    WarnDamaged(*there);
    for (Manifest& m : there->complete) {
      Found& f = c.by_step[m.step];
      if (!f.here) f.manifest = std::move(m);
      f.there = true;
    }
  }
  warn_partial();
  return c;
}

std::string Where(const Candidates& c, const Found& f) {
  const char* here = c.root->is_local() ? "tier" : "bucket";
  if (f.here && f.there) return "both";
  return f.here ? here : "bucket";
}

absl::StatusOr<checkpoint::Selector> SelectorOf(const CkptArgs& args,
                                                const checkpoint::RootConfig& config) {
  checkpoint::Selector s;  // exactly one selector was given (checked while parsing)
  if (args.step >= 0) {
    s.kind = checkpoint::Selector::Kind::kStep;
    s.step = args.step;
  } else if (args.best) {
    s.kind = checkpoint::Selector::Kind::kBest;
    s.metric = args.metric.empty() ? config.metric : args.metric;
    // The recorded mode is the recorded metric's: another metric ranks by --mode, else "min"
    // (as CheckpointManager ranks one).
    const std::string mode = !args.mode.empty()          ? args.mode
                             : s.metric == config.metric ? config.mode
                                                         : "min";
    if (s.metric.empty()) {
      return UsageError(absl::StrCat("ckpt ", args.action,
                                     " --best: no metric (give --metric; the root records none)"));
    }
    s.maximize = mode == "max";
  }
  return s;
}

// The metrics a CheckpointManager save recorded as NaN or infinite: JSON has no such numbers,
// so it keeps them as text ("nan", "inf", "-inf") in its user data, wharf.nonfinite_metrics.
// Empty for anything else (someone else's user data included).
std::map<std::string, std::string> NonfiniteMetrics(const Manifest& m) {
  std::map<std::string, std::string> out;
  const json user = json::parse(m.user_json, nullptr, /*allow_exceptions=*/false);
  if (!user.is_object()) return out;
  auto wharf = user.find("wharf");
  if (wharf == user.end() || !wharf->is_object()) return out;
  auto extra = wharf->find("nonfinite_metrics");
  if (extra == wharf->end() || !extra->is_object()) return out;
  for (const auto& [k, v] : extra->items()) {
    if (v.is_string() && !m.metrics.contains(k)) out[k] = v.get<std::string>();
  }
  return out;
}

std::string MetricsText(const Manifest& m) {
  std::map<std::string, std::string> all = NonfiniteMetrics(m);
  for (const auto& [k, v] : m.metrics) all[k] = absl::StrFormat("%g", v);
  std::vector<std::string> parts;
  for (const auto& [k, v] : all) parts.push_back(absl::StrCat(k, "=", v));
  return absl::StrJoin(parts, " ");
}

std::string TimeText(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", t, absl::LocalTimeZone());
}

absl::Status RunCkptLs(const CkptArgs& args) {
  WHARF_ASSIGN_OR_RETURN(Candidates c, Collect(args.uri));
  if (args.json) {
    for (const auto& [step, f] : c.by_step) {
      json j;
      j["step"] = step;
      j["time"] = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", f.manifest.time, absl::UTCTimeZone());
      j["time_unix"] = absl::ToDoubleSeconds(f.manifest.time - absl::UnixEpoch());
      j["size"] = f.manifest.bytes;   // bytes of its files (the name `ls` of objects uses)
      j["bytes"] = f.manifest.bytes;  // the same, under the name of the first releases
      j["files"] = f.manifest.files.size();
      j["world_size"] = f.manifest.world_size;
      j["metrics"] = json::object();
      for (const auto& [k, v] : f.manifest.metrics) j["metrics"][k] = v;
      // Kept apart, as text: "metrics" stays numbers only (JSON has no NaN).
      const std::map<std::string, std::string> nonfinite = NonfiniteMetrics(f.manifest);
      if (!nonfinite.empty()) j["nonfinite_metrics"] = nonfinite;
      j["where"] = Where(c, f);
      j["uri"] = f.here ? c.root->StepUri(step) : c.exported->StepUri(step);
      Print(JsonLine(j));
    }
    return absl::OkStatus();
  }
  if (c.by_step.empty()) {
    Print(absl::StrCat("no complete checkpoint in ", OneLine(c.root->uri()), "\n"));
    return absl::OkStatus();
  }
  Print(absl::StrFormat("%-12s %-19s %12s  %-6s  %s\n", "STEP", "TIME", "MB", "WHERE", "METRICS"));
  for (const auto& [step, f] : c.by_step) {
    Print(absl::StrFormat("%-12d %-19s %12s  %-6s  %s\n", step, TimeText(f.manifest.time),
                          Megabytes(f.manifest.bytes), Where(c, f), MetricsText(f.manifest)));
  }
  return absl::OkStatus();
}

// export and restore: copy the selected checkpoint into the root at `to`.
absl::Status RunCkptCopy(const CkptArgs& args) {
  WHARF_RETURN_IF_ERROR(ApplyEngineArgs(args.engine, args.jobs));
  WHARF_ASSIGN_OR_RETURN(Candidates c, Collect(args.uri));
  WHARF_ASSIGN_OR_RETURN(checkpoint::Selector selector, SelectorOf(args, c.config));
  WHARF_ASSIGN_OR_RETURN(Manifest chosen, checkpoint::Select(c.All(), selector, c.root->uri()));
  const Found& found = c.by_step.at(chosen.step);
  const CheckpointRoot& from = found.here ? *c.root : *c.exported;
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<CheckpointRoot> to, OpenRoot(args.to));
  if (struct stat st;
      to->is_local() && stat(to->local_dir().c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    // Else each file's copy failed on its own, one line each.
    return absl::InvalidArgumentError(
        absl::StrCat("ckpt ", args.action, ": ", to->local_dir(), " is a file, not a directory"));
  }
  if (to->uri() == from.uri()) {
    return UsageError(
        absl::StrCat("ckpt ", args.action, ": ", to->uri(), " is where the checkpoint is"));
  }
  if (absl::StartsWith(to->uri(), from.uri())) {
    // Inside the root: its copy would become part of what later copies of the root carry.
    return UsageError(absl::StrCat("ckpt ", args.action, ": ", to->uri(), " is inside ", from.uri(),
                                   ", the checkpoints' own root"));
  }
  Progress progress(Progress::ShouldShow(args.quiet || args.json));
  ProgressObserver observer(progress);
  checkpoint::CopyOptions options;
  options.observer = &observer;
  options.mark_exported = args.action == "export";
  auto copied = checkpoint::CopyCheckpoint(from, *to, chosen.step, options);
  progress.Stop();
  if (!copied.ok()) return copied.status();
  // A destination that records no metric learns the source's (and its mode), so --best there
  // ranks as it does here.
  if (!c.config.metric.empty()) {
    absl::StatusOr<checkpoint::RootConfig> there = to->ReadConfig();
    if (there.ok() && there->metric.empty()) {
      there->metric = c.config.metric;
      there->mode = c.config.mode;
      if (absl::Status s = to->WriteConfig(*there); !s.ok()) {
        Warn(absl::StrCat("could not record the metric in ", OneLine(to->uri()), ": ",
                          OneLine(s.message())));
      }
    }
  }
  const double seconds = absl::ToDoubleSeconds(copied->elapsed);
  if (args.json) {
    json j;
    j["step"] = chosen.step;
    j["source"] = from.StepUri(chosen.step);
    j["dest"] = to->StepUri(chosen.step);
    j["files"] = chosen.files.size();
    j["bytes"] = chosen.bytes;
    j["copied"] = copied->files;
    j["copied_bytes"] = copied->bytes;
    j["skipped"] = copied->skipped;
    j["seconds"] = seconds;
    Print(JsonLine(j));
  } else if (!args.quiet) {
    Print(absl::StrFormat("%s step %d (%d files, %s MB) to %s in %.2f s (%s MB/s)\n",
                          args.action == "export" ? "exported" : "restored", chosen.step,
                          chosen.files.size(), Megabytes(chosen.bytes),
                          OneLine(to->StepUri(chosen.step)), seconds,
                          MegabytesPerSecond(copied->bytes, copied->elapsed)));
    if (copied->skipped > 0) {
      Print(absl::StrFormat("skipped %d files already there (same size and ETag)\n",
                            copied->skipped));
    }
  }
  return absl::OkStatus();
}

absl::Status RunCkptRm(const CkptArgs& args) {
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<CheckpointRoot> root, OpenRoot(args.uri));
  if (args.step < 0) return absl::InvalidArgumentError("ckpt rm: give --step N");
  auto listing = root->List();
  if (!listing.ok()) return listing.status();
  bool known = false;
  for (const Manifest& m : listing->complete) known |= m.step == args.step;
  for (int64_t s : listing->incomplete) known |= s == args.step;
  for (const auto& [s, why] : listing->damaged) known |= s == args.step;
  if (!known) {
    // A tier root that exports: the step may live only in the bucket now.
    std::string hint;
    if (auto config = root->ReadConfig(); config.ok() && !config->export_to.empty()) {
      if (auto exported = OpenRoot(config->export_to); exported.ok()) {
        if (auto there = (*exported)->List(); there.ok()) {
          for (const Manifest& m : there->complete) {
            if (m.step != args.step) continue;
            hint = absl::StrCat(" (it is exported to ", (*exported)->uri(), ": wharf ckpt rm ",
                                (*exported)->uri(), " --step ", args.step, " removes it there)");
          }
        }
      }
    }
    return absl::NotFoundError(
        absl::StrCat("ckpt rm: no checkpoint of step ", args.step, " in ", root->uri(), hint));
  }
  WHARF_RETURN_IF_ERROR(root->Delete(args.step));
  if (!args.quiet) Print(absl::StrCat("removed ", OneLine(root->StepUri(args.step)), "\n"));
  return absl::OkStatus();
}

// A step as checkpoint directories name it (step-<N:012d>): 0 <= N < 10^12, in digits.
CLI::Validator StepN() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (!text.empty() && text.size() <= 12 &&
            std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
          return "";
        }
        return absl::StrCat("a step is a whole number 0 <= N < 10^12, not '", text, "'");
      },
      "N");
}

}  // namespace

void AddCkpt(CLI::App& app, CkptArgs& args) {
  CLI::App* ckpt = app.add_subcommand(
      "ckpt",
      "Checkpoints of a root (a tier directory, a local directory or a bucket prefix): "
      "list, export, restore, remove (only complete ones: a manifest written last)");
  ckpt->require_subcommand(1);
  auto sub = [&](const std::string& name, const std::string& help) {
    CLI::App* cmd = ckpt->add_subcommand(name, help);
    cmd->callback([&args, name] { args.action = name; });
    return cmd;
  };
  auto select = [&](CLI::App* cmd) {
    // Exactly one selector: a usage error (exit 2) otherwise, found while parsing.
    cmd->callback([&args, cmd] {
      args.action = cmd->get_name();
      if ((args.step >= 0) + args.latest + args.best != 1) {
        throw CLI::ValidationError(
            absl::StrCat("ckpt ", cmd->get_name(), ": give one of --step N, --latest, --best"));
      }
    });
    auto* step = cmd->add_option("--step", args.step, "The checkpoint of step N")->check(StepN());
    auto* latest = cmd->add_flag("--latest", args.latest, "The latest complete checkpoint");
    auto* best = cmd->add_flag("--best", args.best,
                               "The best by --metric (default: the metric the root records)");
    step->excludes(latest)->excludes(best);
    latest->excludes(best);
    auto* metric = cmd->add_option("--metric", args.metric, "The metric --best ranks by");
    auto* mode =
        cmd->add_option("--mode", args.mode, "min (default) or max: which --metric value is best")
            ->check(CLI::IsMember({"min", "max"}));
    // They only rank --best: given with another selector they would be ignored in silence.
    metric->needs(best);
    mode->needs(best);
    cmd->add_flag("--json", args.json, "Print a JSON summary");
    cmd->add_flag("-q,--quiet", args.quiet, "Print nothing on success");
    cmd->add_option("--inflight,-j,--jobs", args.jobs, "Requests in flight (default: derived)");
    AddEngineFlags(cmd, args.engine, /*budget_mb_alias=*/false);
  };

  CLI::App* ls = sub("ls",
                     "The complete checkpoints of URI: step, time, size, metrics, and "
                     "where they are (tier, bucket or both: a root that exports lists "
                     "its export destination too)");
  ls->add_flag("--json", args.json,
               "One JSON object per line: step, time, time_unix, bytes, files, world_size, "
               "metrics, where, uri; and nonfinite_metrics (name: \"nan\", \"inf\" or "
               "\"-inf\") when a save recorded such values");
  ls->add_option("URI", args.uri, "The checkpoint root")->required();

  CLI::App* exp = sub("export",
                      "Copy one checkpoint to TO_URI/step-<N>/ (files in parallel, then the "
                      "manifest); from a tier, the copied files may then be evicted");
  select(exp);
  exp->add_option("URI", args.uri, "The checkpoint root")->required();
  exp->add_option("TO_URI", args.to, "The root to export to")->required();

  CLI::App* restore = sub("restore",
                          "Copy one checkpoint into DEST/step-<N>/ (a tier or local "
                          "directory, or a bucket), manifest last");
  select(restore);
  restore->add_option("URI", args.uri, "The checkpoint root")->required();
  restore->add_option("DEST", args.to, "The root to restore into")->required();

  CLI::App* rm = sub("rm", "Remove one checkpoint (its manifest first)");
  rm->add_option("--step", args.step, "The checkpoint of step N")->required()->check(StepN());
  rm->add_flag("-q,--quiet", args.quiet, "Print nothing");
  rm->add_option("URI", args.uri, "The checkpoint root")->required();
}

absl::Status RunCkpt(const CkptArgs& args) {
  if (args.action == "ls") return RunCkptLs(args);
  if (args.action == "export" || args.action == "restore") return RunCkptCopy(args);
  if (args.action == "rm") return RunCkptRm(args);
  return absl::InvalidArgumentError(absl::StrCat("ckpt: unknown action '", args.action, "'"));
}

}  // namespace wharf::cli
