// Flags shared by the verbs that move bytes: the runtime's settings for one run, and the
// include/exclude rules in command-line order.
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/runtime.h"
#include "base/status.h"
#include "cli/common.h"
#include "cli/verbs.h"
#include "store/uri.h"

namespace wharf::cli {

void AddEngineFlags(CLI::App* cmd, EngineArgs& args, bool budget_mb_alias) {
  CLI::Option* budget =
      cmd->add_option("--memory-budget", args.memory_budget,
                      "Most bytes of data held at once (SIZE: a number with an optional K, M, G "
                      "or T suffix, powers of 1024, such as 512M or 1.5G); default: "
                      "WHARF_MEMORY_BUDGET, else 1G")
          ->check([](const std::string& v) -> std::string {
            auto size = ParseSize(v);
            if (!size.ok()) return std::string(size.status().message());
            if (*size == 0) return "the memory budget must be positive";
            return "";
          });
  if (budget_mb_alias) {
    cmd->add_option("--budget-mb", args.budget_mb, "Same as --memory-budget, in MiB")
        ->check(CLI::Range(1, 1 << 24))
        ->excludes(budget);
  }
}

absl::Status ApplyEngineArgs(const EngineArgs& args, int inflight) {
  std::optional<uint64_t> budget;
  if (!args.memory_budget.empty()) {
    absl::StatusOr<uint64_t> size = ParseSize(args.memory_budget);
    if (!size.ok()) return size.status();
    budget = *size;
  } else if (args.budget_mb > 0) {
    budget = static_cast<uint64_t>(args.budget_mb) << 20;
  }
  std::optional<int> n;
  if (inflight > 0) n = inflight;
  if (budget || n) Runtime::Configure(budget, n);
  return absl::OkStatus();
}

std::vector<TransferFilter> FiltersInOrder(int argc, const char* const* argv) {
  std::vector<TransferFilter> filters;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    for (const auto& [flag, include] : {std::pair{"--include", true}, {"--exclude", false}}) {
      const std::string with_eq = absl::StrCat(flag, "=");
      if (arg == flag && i + 1 < argc) {
        filters.push_back({include, argv[++i]});
      } else if (absl::StartsWith(arg, with_eq)) {
        filters.push_back({include, arg.substr(with_eq.size())});
      }
    }
  }
  return filters;
}

absl::StatusOr<std::vector<TransferFilter>> FiltersRelativeTo(std::vector<TransferFilter> filters,
                                                              const std::string& src) {
  if (filters.empty() || src == "-") return filters;
  WHARF_ASSIGN_OR_RETURN(ObjectUri uri, ParseUriOrPath(src));
  // The source as a folder: its URI, and for a local one its path, each ending in '/'.
  std::string as_uri = uri.ToString();
  if (!absl::EndsWith(as_uri, "/")) as_uri += '/';
  std::string as_path;
  if (uri.scheme == "file") {
    as_path = absl::StrCat("/", uri.key);
    if (!absl::EndsWith(as_path, "/")) as_path += '/';
  }
  for (TransferFilter& f : filters) {
    const bool spelled_uri = LooksLikeUri(f.pattern);
    const bool spelled_path = !as_path.empty() && absl::StartsWith(f.pattern, "/");
    if (!spelled_uri && !spelled_path) continue;
    const std::string& root = spelled_uri ? as_uri : as_path;
    if (!absl::StartsWith(f.pattern, root)) {
      return UsageError(absl::StrCat(
          f.include ? "--include " : "--exclude ", f.pattern, ": patterns are relative to ",
          as_path.empty() ? as_uri : as_path, " (the source); a pattern that spells out a ",
          spelled_uri ? "URI" : "path", " must start with it"));
    }
    f.pattern.erase(0, root.size());
  }
  return filters;
}

void AddFilterFlags(CLI::App* cmd, std::vector<std::string>& include,
                    std::vector<std::string>& exclude, const std::string& relative_to) {
  cmd->add_option("--include", include,
                  absl::StrCat("Include paths matching PATTERN (relative to ", relative_to,
                               "; '*' matches across '/'); rules apply in order, the last match "
                               "wins"))
      ->expected(1)
      ->allow_extra_args(false)  // one word per flag: the positionals after it are theirs
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--exclude", exclude, "Exclude paths matching PATTERN (see --include)")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

void AddUploadFlags(CLI::App* cmd, UploadArgs& args) {
  cmd->add_option("--content-type", args.content_type,
                  "Content-Type of uploaded objects (default: the one the file's extension names, "
                  "such as application/json for .json; the server's for other extensions)");
  cmd->add_flag("--no-guess-content-type,--no-guess-mime-type", args.no_guess_content_type,
                "Do not set a Content-Type from the extension: the server's default for all");
  cmd->add_option("--storage-class", args.storage_class,
                  "Storage class of uploaded objects (S3: STANDARD, STANDARD_IA, ...)");
  cmd->add_option("--sse", args.sse, "Server-side encryption of uploaded objects")
      ->check(CLI::IsMember({"AES256", "aws:kms"}));
  cmd->add_option("--sse-kms-key-id", args.sse_kms_key_id, "KMS key for --sse aws:kms");
}

absl::StatusOr<PutOptions> PutOptionsFrom(const UploadArgs& args) {
  if (!args.sse_kms_key_id.empty() && args.sse != "aws:kms") {
    return UsageError("--sse-kms-key-id needs --sse aws:kms");
  }
  PutOptions put;
  put.content_type = args.content_type;
  put.storage_class = args.storage_class;
  put.sse = args.sse;
  put.sse_kms_key_id = args.sse_kms_key_id;
  return put;
}

}  // namespace wharf::cli
