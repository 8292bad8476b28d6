// wharf: the command line of the data plane. main() owns what is global to a run: the app and
// its flags, dispatch to one verb, and the exit code:
//   0  success (also when the reader of stdout went away, as in `wharf cat x | head`);
//   1  an operation failed: one line "wharf: <message>" on stderr;
//   2  a usage error: the parser's message and a pointer to --help on stderr;
//   128 + N  interrupted by signal N (SIGINT 130, SIGTERM 143, SIGHUP 129), after aborting the
//      uploads and removing the temporary files in progress.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"
#include "base/interrupt.h"
#include "base/log.h"
#include "base/metrics_export.h"
#include "base/profiler.h"
#include "base/runtime.h"
#include "base/status.h"
#include "cli/common.h"
#include "cli/store_flags.h"
#include "cli/verbs.h"
#include "store/registry.h"
#include "tier/tier_store.h"

namespace wharf::cli {
namespace {

constexpr char kVersion[] = "wharf 0.1.0";
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
constexpr int kExitSkipped = 2;  // as `aws s3`: skipped sources, the rest done

void PrintError(absl::string_view message) {
  const std::string line = absl::StrCat("wharf: ", OneLine(message), "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

// The verb a usage error is about: the subcommands the parser had entered, outermost first
// ("tier import").
std::string VerbOf(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (!sub->parsed()) continue;
    const std::string inner = VerbOf(*sub);
    return inner.empty() ? sub->get_name() : absl::StrCat(sub->get_name(), " ", inner);
  }
  return "";
}

// The parsed verb group whose verb is missing or unknown (`wharf tier bogus`, `wharf bogus`):
// "unknown verb 'bogus' ..." naming the verbs it has, instead of CLI11's "A subcommand is
// required" or "argument was not expected"; "a verb is required ..." for `wharf tier`. ""
// when the error is another one.
std::string UnknownVerbMessage(const CLI::App& app, const CLI::ParseError& error) {
  const CLI::App* group = &app;
  for (bool deeper = true; deeper;) {
    deeper = false;
    for (const CLI::App* sub : group->get_subcommands({})) {
      if (sub->parsed()) {
        group = sub;
        deeper = true;
        break;
      }
    }
  }
  std::vector<std::string> verbs;
  for (const CLI::App* sub : group->get_subcommands({})) verbs.push_back(sub->get_name());
  if (verbs.empty()) return "";
  std::string word;
  for (const std::string& arg : app.remaining(/*recurse=*/true)) {
    if (!arg.empty() && arg[0] != '-') {
      word = arg;
      break;
    }
  }
  const std::string has =
      absl::StrCat(group == &app ? "wharf" : absl::StrCat("wharf ", VerbOf(app)),
                   " has: ", absl::StrJoin(verbs, ", "));
  if (!word.empty()) return absl::StrCat("unknown verb '", word, "' (", has, ")");
  if (dynamic_cast<const CLI::RequiredError*>(&error) != nullptr &&
      absl::StrContains(error.what(), "subcommand")) {
    return absl::StrCat("a verb is required (", has, ")");
  }
  return "";
}

// --metrics FILE: the runtime's metrics as JSON (base/metrics_export.h), written whole or
// not at all (a temp file beside it, renamed).
absl::Status WriteMetricsFile(const std::string& path) {
  return Annotate(WriteFileAtomically(path, MetricPointsToJson(Runtime::Default()->MetricPoints(),
                                                               static_cast<int64_t>(getpid()))),
                  "--metrics");
}

int Main(int argc, char** argv) {
  // First, before any thread starts: Ctrl-C, SIGTERM and SIGHUP abort the uploads and remove
  // the temporary files in progress, then exit with 128 + the signal (base/interrupt.h).
  HandleInterrupts("wharf");
  RegisterTierCache(StoreRegistry::Global());  // --cache and WHARF_CACHE
  // A closed stdout then fails writes with EPIPE, which the verbs take as "stop quietly",
  // instead of killing the process halfway through a copy's bookkeeping.
  std::signal(SIGPIPE, SIG_IGN);

  CLI::App app(
      "wharf: move data between object stores (s3://, gs://, file:// and local paths) and "
      "the machines that train on it.",
      "wharf");
  app.set_version_flag("--version", kVersion, "Print the version and exit");
  app.require_subcommand(0, 1);
  // Global flags, accepted before or after the verb; they set what the stores read.
  StoreFlags store_flags;
  AddStoreFlags(app, store_flags);
  std::string metrics_file;
  app.add_option("--metrics", metrics_file,
                 "At the end of the run (success or failure) write the run's metrics as JSON "
                 "to FILE (docs/design/metrics.md); stdout stays the verb's")
      ->type_name("FILE");
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose,
               "Log one line per store request to stderr (operation, URI, status, bytes, "
               "attempts, request id, time); same as WHARF_LOG=debug");
  app.fallthrough();

  LsArgs ls;
  StatArgs stat;
  CatArgs cat;
  CpArgs cp;
  CpArgs sync;
  RmArgs rm;
  CleanupArgs cleanup;
  DemoArgs demo;
  FetchArgs fetch;
  TierArgs tier;
  CkptArgs ckpt;
  AddLs(app, ls);
  AddStat(app, stat);
  AddCat(app, cat);
  AddCp(app, cp);
  AddSync(app, sync);
  AddRm(app, rm);
  AddCleanup(app, cleanup);
  AddFetch(app, fetch);
  AddDemo(app, demo);
  AddTier(app, tier);
  AddCkpt(app, ckpt);
  // Each verb's help names the global flags too (they work after the verb as well).
  const std::string globals =
      "Global flags (before or after the verb; see 'wharf --help'):\n"
      "  --cache TIER_DIR   read s3://, gs://, file:// URIs through a tier (WHARF_CACHE: remote)\n"
      "  --endpoint-url URL, --region REGION, --aws-profile NAME, --no-sign-request\n"
      "  --metrics FILE, -v/--verbose";
  std::function<void(CLI::App*)> add_globals = [&](CLI::App* verb) {
    const std::string own = verb->get_footer();
    verb->footer(own.empty() ? globals : absl::StrCat(own, "\n\n", globals));
    for (CLI::App* sub : verb->get_subcommands({})) add_globals(sub);
  };
  for (CLI::App* verb : app.get_subcommands({})) add_globals(verb);
  // After the verbs, which would otherwise inherit it.
  app.footer("Run 'wharf VERB --help' for the flags of a verb.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const std::string verb = VerbOf(app);
    std::string unknown = UnknownVerbMessage(app, e);
    // `wharf --profile fetch URI`: before the verb, --profile is the AWS profile's flag, so
    // the verb went to it as a value.
    const auto subs = app.get_subcommands({});
    if (!unknown.empty() && std::any_of(subs.begin(), subs.end(), [&](const CLI::App* sub) {
          return sub->get_name() == store_flags.profile;
        })) {
      absl::StrAppend(&unknown, "; '", store_flags.profile,
                      "' was taken as the AWS profile: before the verb, --profile names one "
                      "(the profiler's --profile goes after the verb: wharf fetch --profile URI)");
    }
    // `wharf cat --profile URI`: after a verb other than fetch, --profile is still the AWS
    // profile's flag, so the URI went to it as a value.
    // `wharf ls --bogus`: CLI11 checks required arguments before extras, so an unknown
    // flag would be reported as "URI is required"; name the flag instead.
    if (unknown.empty()) {
      for (const std::string& arg : app.remaining(/*recurse=*/true)) {
        if (arg.size() > 1 && arg[0] == '-') {
          unknown = absl::StrCat("unknown flag '", arg.substr(0, arg.find('=')), "'");
          break;
        }
      }
    }
    std::string message = unknown.empty() ? e.what() : unknown;
    if (unknown.empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr &&
        absl::StrContains(store_flags.profile, "://")) {
      absl::StrAppend(&message, "; '", store_flags.profile,
                      "' was taken as the AWS profile: --profile names one (the profiler is "
                      "`wharf fetch --profile URI`, or WHARF_PROFILE=1 for any verb)");
    }
    PrintError(message);
    std::fprintf(stderr, "Run 'wharf %s--help' for usage.\n",
                 verb.empty() ? "" : (verb + " ").c_str());
    return kExitUsage;
  }

  if (app.get_subcommands().empty()) {
    std::cerr << app.help();
    return kExitUsage;
  }
  const std::string verb = app.get_subcommands().front()->get_name();
  if (verbose) SetLogLevel(LogLevel::kDebug);
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], "s3://")) store_flags.names_s3 = true;
  }
  if (absl::Status s = SetStoreFlags(store_flags); !s.ok()) {
    PrintError(s.message());
    return kExitUsage;
  }
  // A report file that cannot be written is said before the run, not after a long transfer
  // that then fails for its report: "" when `path` can be written.
  auto unwritable = [](const std::string& path) -> std::string {
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "."
                            : slash == 0               ? "/"
                                                       : path.substr(0, slash);
    if (access(dir.c_str(), W_OK | X_OK) != 0) {
      return absl::StrCat("cannot write in ", dir, " (", std::strerror(errno), ")");
    }
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return "is a directory";
    return "";
  };
  if (!metrics_file.empty()) {
    if (const std::string why = unwritable(metrics_file); !why.empty()) {
      PrintError(absl::StrCat("--metrics ", metrics_file, ": ", why));
      return kExitUsage;
    }
  }
  const std::vector<TransferFilter> filters = FiltersInOrder(argc, argv);
  cp.filters = sync.filters = rm.filters = tier.filters = filters;

  const bool profile = (verb == "fetch" && fetch.profile) || ProfileRequestedByEnvironment();
  if (profile) {
    const std::string trace = DefaultProfileTracePath();
    if (const std::string why = unwritable(trace); !why.empty()) {
      PrintError(absl::StrCat("the profiler's trace ", trace, " (WHARF_PROFILE_TRACE): ", why));
      return kExitUsage;
    }
    (void)Profiler::Get().Start();
  }

  absl::Status status;
  try {
    if (verb == "ls") {
      status = RunLs(ls);
    } else if (verb == "stat") {
      status = RunStat(stat);
    } else if (verb == "cat") {
      status = RunCat(cat);
    } else if (verb == "cp") {
      status = RunCp(cp);
    } else if (verb == "sync") {
      status = RunCp(sync);
    } else if (verb == "rm") {
      status = RunRm(rm);
    } else if (verb == "cleanup") {
      status = RunCleanup(cleanup);
    } else if (verb == "fetch") {
      status = RunFetch(fetch);
    } else if (verb == "demo") {
      status = RunDemo(demo);
    } else if (verb == "tier") {
      status = RunTier(tier);
    } else if (verb == "ckpt") {
      status = RunCkpt(ckpt);
    } else {
      status = absl::InternalError(absl::StrCat("verb '", verb, "' has no implementation"));
    }
  } catch (const std::exception& e) {
    // The library reports errors as values; this is the edge's last line of defence
    // (std::bad_alloc, a throwing third-party parser).
    status = absl::InternalError(absl::StrCat(verb, ": ", e.what()));
  }
  WaitIfInterrupted();  // the signal thread exits with 128 + the signal
  if (status.ok()) status = FlushStdout();
  if (!metrics_file.empty()) {
    absl::Status written = WriteMetricsFile(metrics_file);
    if (status.ok()) status = written;
  }
  if (profile) {
    // On stderr, like the logs: stdout stays the verb's.
    const ProfileReport report = Profiler::Get().Stop();
    const std::string trace = DefaultProfileTracePath();
    const absl::Status written = Profiler::Get().WriteTrace(trace);
    const std::string text =
        absl::StrCat(report.Table(), written.ok() ? absl::StrCat("trace: ", trace, "\n") : "");
    std::fwrite(text.data(), 1, text.size(), stderr);
    // A trace that was asked for and not written fails the run, as --metrics does.
    if (status.ok()) status = written;
  }
  if (StdoutBroken()) return 0;
  if (IsUsageError(status)) {
    PrintError(status.message());
    const std::string verb_path = VerbOf(app);
    std::fprintf(stderr, "Run 'wharf %s--help' for usage.\n",
                 verb_path.empty() ? "" : (verb_path + " ").c_str());
    return kExitUsage;
  }
  if (IsSkippedError(status)) {
    PrintError(status.message());
    return kExitSkipped;
  }
  if (!status.ok()) {
    PrintError(status.message());
    return kExitFailure;
  }
  return 0;
}

}  // namespace
}  // namespace wharf::cli

int main(int argc, char** argv) { return wharf::cli::Main(argc, argv); }
