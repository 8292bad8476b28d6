// The verbs of the `wharf` command line, one file each (convention 12: edges are thin).
//
// For each verb, AddXxx(app, args) registers the subcommand, its flags and its help on `app`,
// binding them to `args`; after parsing, main() calls RunXxx(args). RunXxx returns a Status
// whose message names the operation and the URI; main() prints it as one line and exits 1.
// Usage errors are caught earlier, by CLI11 validators, and exit 2.
//
// The verbs speak only the ObjectStore interface (store/object_store.h) and open stores
// through the registry (store/registry.h), so they work for every scheme it knows.
// Thread-safety: each RunXxx is called once, from main().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "io/transfer.h"

namespace CLI {
class App;
}  // namespace CLI

namespace wharf::cli {

// The runtime settings of one run, on every verb that moves bytes (base/runtime.h):
// --memory-budget SIZE and --inflight N (aliases: --budget-mb M, -j/--jobs N).
struct EngineArgs {
  std::string memory_budget;  // empty: WHARF_MEMORY_BUDGET, else 1 GiB
  int budget_mb = 0;          // alias; 0: unset
};
// Registers --memory-budget (and, where `budget_mb_alias`, --budget-mb, which excludes it)
// on `cmd`. Each verb registers its own --inflight (alias -j/--jobs).
void AddEngineFlags(CLI::App* cmd, EngineArgs& args, bool budget_mb_alias);
// Applies the settings to the process's runtime. `inflight` 0 leaves it as it is.
absl::Status ApplyEngineArgs(const EngineArgs& args, int inflight);

// The include/exclude rules of a command line, in the order given (the last match wins):
// CLI11 collects each option separately, so main() scans argv for their order.
std::vector<TransferFilter> FiltersInOrder(int argc, const char* const* argv);

// The rules with patterns that spell out the source made relative to it, as `aws s3` reads
// them: for a local source an absolute path below it ("/data/src/logs/*" for SRC /data/src),
// for any source its URI ("s3://b/p/logs/*" for SRC s3://b/p). Such a pattern that is not
// below the source could match nothing: a usage error (exit 2) naming it, where it would have
// been ignored.
absl::StatusOr<std::vector<TransferFilter>> FiltersRelativeTo(std::vector<TransferFilter> filters,
                                                              const std::string& src);

// --include/--exclude on `cmd`: patterns on paths relative to `relative_to` ("SRC",
// "TIER_PATH"), in order, the last match wins (FiltersInOrder reads their order from argv).
void AddFilterFlags(CLI::App* cmd, std::vector<std::string>& include,
                    std::vector<std::string>& exclude, const std::string& relative_to);

// The upload options of every verb that uploads (cp, sync, tier export).
struct UploadArgs {
  std::string content_type, storage_class, sse, sse_kms_key_id;
  bool no_guess_content_type = false;
};
void AddUploadFlags(CLI::App* cmd, UploadArgs& args);
// Their PutOptions; InvalidArgument for --sse-kms-key-id without --sse aws:kms.
absl::StatusOr<PutOptions> PutOptionsFrom(const UploadArgs& args);

// wharf ls [-r] [--json] [--parallel N] URI
struct LsArgs {
  std::string uri;
  bool recursive = false;
  bool json = false;
  int parallel = 0;  // with -r: list with N work-stealing workers (0: sequential)
};
void AddLs(CLI::App& app, LsArgs& args);
absl::Status RunLs(const LsArgs& args);

// wharf stat [--json] URI
struct StatArgs {
  std::string uri;
  bool json = false;
};
void AddStat(CLI::App& app, StatArgs& args);
absl::Status RunStat(const StatArgs& args);

// wharf cat [--range START-END] [--inflight N] [--memory-budget SIZE] URI
struct CatArgs {
  std::string uri;
  std::string range;  // validated by ParseRange at parse time; empty: the whole object
  int inflight = 0;
  EngineArgs engine;
};
void AddCat(CLI::App& app, CatArgs& args);
absl::Status RunCat(const CatArgs& args);

// wharf cp [-r] [--inflight N] [--memory-budget SIZE] [--quiet] [--dryrun]
//          [--include P] [--exclude P] [upload options] SRC DST      (SRC or DST may be -)
// wharf sync [--delete] [same flags] SRC DST
struct CpArgs {
  std::string src;
  std::string dst;
  bool recursive = false;
  int jobs = 0;  // --inflight (alias -j/--jobs); 0: the runtime's setting
  int list_workers = 16;
  bool quiet = false;
  bool dryrun = false;
  bool sync = false;                          // the sync verb
  bool delete_extra = false;                  // sync --delete
  std::vector<std::string> include, exclude;  // for --help; the order comes from `filters`
  std::vector<TransferFilter> filters;
  UploadArgs upload;
  EngineArgs engine;
};
void AddCp(CLI::App& app, CpArgs& args);
void AddSync(CLI::App& app, CpArgs& args);
absl::Status RunCp(const CpArgs& args);

// wharf rm [-r] [--quiet] [--dryrun] [--include P] [--exclude P] URI
struct RmArgs {
  std::string uri;
  bool recursive = false;
  bool quiet = false;
  bool dryrun = false;
  std::vector<std::string> include, exclude;
  std::vector<TransferFilter> filters;
};
void AddRm(CLI::App& app, RmArgs& args);
absl::Status RunRm(const RmArgs& args);

// wharf cleanup [--older-than AGE] [--dryrun] [--json] [-q] URI
struct CleanupArgs {
  std::string uri;
  std::string older_than = "24h";
  bool dryrun = false;
  bool json = false;
  bool quiet = false;
};
void AddCleanup(CLI::App& app, CleanupArgs& args);
absl::Status RunCleanup(const CleanupArgs& args);

// wharf fetch [-r] [--json] [--inflight N] [--memory-budget SIZE] [--part-size-mb P]
//             [--list-workers N] URI
struct FetchArgs {
  std::string uri;
  bool recursive = false;
  bool json = false;
  int inflight = 0;
  EngineArgs engine;  // --memory-budget, --budget-mb
  int part_size_mb = 8;
  int list_workers = 16;
  bool profile = false;  // --profile: the profiler around the fetch (cli/main.cc runs it)
};
void AddFetch(CLI::App& app, FetchArgs& args);
absl::Status RunFetch(const FetchArgs& args);

// wharf demo [--dir DIR] [--objects N] [--size BYTES] [--inflight N] [--memory-budget SIZE]
struct DemoArgs {
  std::string dir = ".wharf/demo";
  int objects = 3000;
  uint64_t size = 100 * 1024;
  int jobs = 64;  // --inflight (alias -j/--jobs): the demo's own puts and gets in flight
  EngineArgs engine;
  std::string tier = ".wharf/demo-tier";  // --tier DIR: imported into, then read from
  bool no_tier = false;                   // --no-tier: skip the tier phases
};
void AddDemo(CLI::App& app, DemoArgs& args);
absl::Status RunDemo(const DemoArgs& args);

// wharf tier init|import|export|status|gc|verify|pin|unpin ... (docs/design/tier.md)
struct TierArgs {
  std::string action;  // the sub-verb given
  std::string path;    // TIER_DIR, DEST_DIR, TIER_PATH or PATH
  std::string src;     // import: SRC_URI
  std::string dst;     // export: DST_URI
  // export: --include/--exclude (the order comes from `filters`) and the upload options
  std::vector<std::string> include, exclude;
  std::vector<TransferFilter> filters;
  UploadArgs upload;
  // init
  std::string mode;             // "immutable" or "ttl"; empty: keep (or the default)
  double ttl_seconds = 0;       // 0: keep (or the default)
  std::string max_size;         // SIZE; empty: keep (or no bound)
  double min_free = -1;         // percent; -1: keep (or the default)
  std::string block_size;       // SIZE; empty: keep (or the default)
  std::string block_threshold;  // SIZE; empty: keep (or the default)
  // import (rank, world_size), import and export (the rest)
  int rank = -1;
  int world_size = 0;
  int jobs = 0;
  int list_workers = 16;
  EngineArgs engine;
  // import, status, verify
  bool json = false;
  bool quiet = false;
  // verify
  bool repair = false;
  // evict
  std::string to;  // --to SIZE; empty: everything evictable
};
void AddTier(CLI::App& app, TierArgs& args);
absl::Status RunTier(const TierArgs& args);

// wharf ckpt ls|export|restore|rm ... (docs/design/checkpoint.md)
struct CkptArgs {
  std::string action;  // ls, export, restore, rm
  std::string uri;     // the checkpoint root
  std::string to;      // export: TO_URI; restore: DEST
  int64_t step = -1;   // --step N; -1: not given
  bool latest = false;
  bool best = false;
  std::string metric;  // --best ranks by it (default: the root's)
  std::string mode;    // min | max (default: the root's)
  bool json = false;
  bool quiet = false;
  int jobs = 0;
  EngineArgs engine;
};
void AddCkpt(CLI::App& app, CkptArgs& args);
absl::Status RunCkpt(const CkptArgs& args);

}  // namespace wharf::cli
