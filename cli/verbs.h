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

#include "absl/status/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace wharf::cli {

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

// wharf cat [--range START-END] URI
struct CatArgs {
  std::string uri;
  std::string range;  // validated by ParseRange at parse time; empty: the whole object
};
void AddCat(CLI::App& app, CatArgs& args);
absl::Status RunCat(const CatArgs& args);

// wharf cp [-r] [--jobs N] [--quiet] SRC DST
struct CpArgs {
  std::string src;
  std::string dst;
  bool recursive = false;
  int jobs = 256;
  int list_workers = 16;
  bool quiet = false;
};
void AddCp(CLI::App& app, CpArgs& args);
absl::Status RunCp(const CpArgs& args);

// wharf rm [-r] [--quiet] URI
struct RmArgs {
  std::string uri;
  bool recursive = false;
  bool quiet = false;
};
void AddRm(CLI::App& app, RmArgs& args);
absl::Status RunRm(const RmArgs& args);

// wharf fetch [-r] [--json] [--inflight N] [--budget-mb M] [--part-size-mb P] [--list-workers N] URI
struct FetchArgs {
  std::string uri;
  bool recursive = false;
  bool json = false;
  int inflight = 0;
  int budget_mb = 1024;
  int part_size_mb = 8;
  int list_workers = 16;
};
void AddFetch(CLI::App& app, FetchArgs& args);
absl::Status RunFetch(const FetchArgs& args);

// wharf demo [--dir DIR] [--objects N] [--size BYTES] [--jobs N]
struct DemoArgs {
  std::string dir = ".wharf/demo";
  int objects = 3000;
  uint64_t size = 100 * 1024;
  int jobs = 64;
};
void AddDemo(CLI::App& app, DemoArgs& args);
absl::Status RunDemo(const DemoArgs& args);

}  // namespace wharf::cli
