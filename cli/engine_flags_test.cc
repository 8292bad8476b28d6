// The runtime flags of the verbs that move bytes: --memory-budget SIZE and --inflight N on
// cat, cp, sync, fetch and demo, the aliases kept from before the runtime (--budget-mb,
// -j/--jobs), the SIZE parser, and that parsed flags reach the process's runtime.
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "base/runtime.h"
#include "cli/verbs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wharf::cli {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Every verb's arguments, registered on one app as main() does.
struct Verbs {
  CLI::App app{"wharf"};
  CatArgs cat;
  CpArgs cp, sync;
  FetchArgs fetch;
  DemoArgs demo;
  Verbs() {
    app.require_subcommand(1);
    AddCat(app, cat);
    AddCp(app, cp);
    AddSync(app, sync);
    AddFetch(app, fetch);
    AddDemo(app, demo);
  }
  // Parses `line` (without the program name); throws CLI11's errors.
  void Parse(std::vector<std::string> line) {
    std::reverse(line.begin(), line.end());  // CLI11 takes the arguments reversed
    app.parse(line);
  }
  // The verb's engine settings and in-flight count after parsing.
  std::pair<const EngineArgs*, int> Of(const std::string& verb) const {
    if (verb == "cat") return {&cat.engine, cat.inflight};
    if (verb == "cp") return {&cp.engine, cp.jobs};
    if (verb == "sync") return {&sync.engine, sync.jobs};
    if (verb == "fetch") return {&fetch.engine, fetch.inflight};
    return {&demo.engine, demo.jobs};
  }
};

std::vector<std::string> Operands(const std::string& verb) {
  if (verb == "cp" || verb == "sync") return {"/tmp/a", "/tmp/b"};
  if (verb == "demo") return {};
  return {"/tmp/a"};
}

const std::vector<std::string> kVerbs = {"cat", "cp", "sync", "fetch", "demo"};

TEST(ParseSizeTest, SuffixesArePowersOf1024) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("0"), 0u);
  EXPECT_EQ(*ParseSize("1K"), 1024u);
  EXPECT_EQ(*ParseSize("256M"), 256 * kMiB);
  EXPECT_EQ(*ParseSize("2G"), 2048 * kMiB);
  EXPECT_EQ(*ParseSize("1T"), uint64_t{1} << 40);
  EXPECT_EQ(*ParseSize("64m"), 64 * kMiB);
  EXPECT_EQ(*ParseSize("64MiB"), 64 * kMiB);
  EXPECT_EQ(*ParseSize("64MB"), 64 * kMiB);
  EXPECT_EQ(*ParseSize(" 8 K "), 8192u);
  EXPECT_EQ(*ParseSize("1.5G"), 1536 * kMiB);
  EXPECT_EQ(*ParseSize("0.5GiB"), 512 * kMiB);
  EXPECT_EQ(*ParseSize("1.001K"), 1025u);  // rounded down
}

TEST(ParseSizeTest, BadInputIsOneClearError) {
  for (const char* bad : {"", "M", "abc", "-1", "1.5", "1.G", "1e3", "12X", "1P", "1GG"}) {
    absl::StatusOr<uint64_t> size = ParseSize(bad);
    ASSERT_FALSE(size.ok()) << bad;
    EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(size.status().message(), HasSubstr(absl::StrCat("invalid size '", bad, "'")));
    EXPECT_THAT(size.status().message(), HasSubstr("K, M, G or T")) << bad;
  }
  auto huge = ParseSize("99999999999T");
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(huge.status().message(), HasSubstr("too large"));
}

TEST(EngineFlagsTest, EveryVerbTakesMemoryBudgetAndInflight) {
  for (const std::string& verb : kVerbs) {
    Verbs v;
    std::vector<std::string> line = {verb, "--memory-budget", "256M", "--inflight", "8"};
    for (const auto& o : Operands(verb)) line.push_back(o);
    ASSERT_NO_THROW(v.Parse(line)) << verb;
    auto [engine, inflight] = v.Of(verb);
    EXPECT_EQ(engine->memory_budget, "256M") << verb;
    EXPECT_EQ(inflight, 8) << verb;
  }
}

TEST(EngineFlagsTest, TheOldSpellingsStayAliases) {
  for (const std::string& verb : kVerbs) {
    for (const char* jobs : {"-j", "--jobs"}) {
      Verbs v;
      std::vector<std::string> line = {verb, jobs, "12", "--budget-mb", "64"};
      for (const auto& o : Operands(verb)) line.push_back(o);
      ASSERT_NO_THROW(v.Parse(line)) << verb << " " << jobs;
      auto [engine, inflight] = v.Of(verb);
      EXPECT_EQ(engine->budget_mb, 64) << verb;
      EXPECT_EQ(inflight, 12) << verb << " " << jobs;
    }
  }
}

TEST(EngineFlagsTest, ABadSizeOrBothBudgetSpellingsAreUsageErrors) {
  for (const std::string& verb : kVerbs) {
    {
      Verbs v;
      std::vector<std::string> line = {verb, "--memory-budget", "12X"};
      for (const auto& o : Operands(verb)) line.push_back(o);
      try {
        v.Parse(line);
        ADD_FAILURE() << verb << ": 12X accepted";
      } catch (const CLI::ValidationError& e) {
        EXPECT_THAT(e.what(), HasSubstr("--memory-budget")) << verb;
        EXPECT_THAT(e.what(), HasSubstr("invalid size '12X'")) << verb;
      }
    }
    {
      Verbs v;
      std::vector<std::string> line = {verb, "--memory-budget", "0"};
      for (const auto& o : Operands(verb)) line.push_back(o);
      EXPECT_THROW(v.Parse(line), CLI::ValidationError) << verb;
    }
    {
      Verbs v;
      std::vector<std::string> line = {verb, "--memory-budget", "1G", "--budget-mb", "64"};
      for (const auto& o : Operands(verb)) line.push_back(o);
      EXPECT_THROW(v.Parse(line), CLI::ExcludesError) << verb;
    }
  }
}

// Last: it changes the process's runtime.
TEST(EngineFlagsTest, ParsedFlagsConfigureTheRuntime) {
  std::shared_ptr<Runtime> rt = Runtime::Default();
  ASSERT_TRUE(ApplyEngineArgs(EngineArgs{.memory_budget = "48M"}, 0).ok());
  EXPECT_EQ(rt->budget().limit(), 48 * kMiB);
  ASSERT_TRUE(ApplyEngineArgs(EngineArgs{.budget_mb = 20}, 7).ok());
  EXPECT_EQ(rt->budget().limit(), 20 * kMiB);
  EXPECT_EQ(rt->inflight(), 7);
  // Nothing given: nothing changes.
  ASSERT_TRUE(ApplyEngineArgs(EngineArgs{}, 0).ok());
  EXPECT_EQ(rt->budget().limit(), 20 * kMiB);
  EXPECT_EQ(rt->inflight(), 7);
  EXPECT_FALSE(ApplyEngineArgs(EngineArgs{.memory_budget = "lots"}, 0).ok());
}

}  // namespace
}  // namespace wharf::cli
