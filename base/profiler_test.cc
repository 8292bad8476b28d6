// The profiler: stage sums, the verdict on constructed numbers, the spool a worker writes
// and its parent merges, and a trace in Chrome's event format.
#include "base/profiler.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file_io.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace wharf {
namespace {

using S = ProfileStage;

ProfileReport Report(double wall, double cpu, int cores) {
  ProfileReport r;
  r.wall_seconds = wall;
  r.cpu_seconds = cpu;
  r.cores = cores;
  return r;
}

void Set(ProfileReport& r, S s, double seconds, uint64_t count = 1, uint64_t bytes = 0) {
  r.stages[static_cast<int>(s)] = {seconds, count, bytes};
}

TEST(ProfileVerdict, ASlowConsumerIsTheBottleneck) {
  ProfileReport r = Report(10, 1, 2);
  Set(r, S::kConsumerWait, 0.5, 100);
  Set(r, S::kStep, 9.5, 100);
  Set(r, S::kFirstByte, 20, 1000);  // requests were slow, but nobody waited for them
  r.Decide();
  EXPECT_EQ(r.verdict, "consumer") << r.reason;
}

TEST(ProfileVerdict, AConsumerThatWaitsIsNotTheBottleneck) {
  ProfileReport r = Report(10, 1, 2);
  Set(r, S::kConsumerWait, 8, 100);
  Set(r, S::kStep, 2, 100);
  Set(r, S::kIoWait, 7.5, 100);
  Set(r, S::kFirstByte, 300, 1000);
  Set(r, S::kTransfer, 10, 1000, 1 << 20);
  r.Decide();
  EXPECT_EQ(r.verdict, "store-latency") << r.reason;
}

TEST(ProfileVerdict, TransferTimeOverFirstByteTimeIsBandwidth) {
  ProfileReport r = Report(10, 1, 2);
  Set(r, S::kIoWait, 9, 10);
  Set(r, S::kFirstByte, 2, 100);
  Set(r, S::kTransfer, 60, 100, uint64_t{1} << 30);
  r.Decide();
  EXPECT_EQ(r.verdict, "bandwidth") << r.reason;
}

TEST(ProfileVerdict, ATransformBusierThanTheWaitForBytesIsClientCpu) {
  ProfileReport r = Report(10, 5, 2);
  Set(r, S::kTransform, 8, 1000);
  Set(r, S::kIoWait, 1, 10);
  Set(r, S::kFirstByte, 5, 100);
  r.Decide();
  EXPECT_EQ(r.verdict, "client-cpu") << r.reason;
}

TEST(ProfileVerdict, ParsingBusierThanTheRestIsParse) {
  ProfileReport r = Report(10, 5, 2);
  Set(r, S::kParse, 6, 1000);
  Set(r, S::kTransform, 1, 1000);
  Set(r, S::kIoWait, 2, 10);
  r.Decide();
  EXPECT_EQ(r.verdict, "parse") << r.reason;
}

TEST(ProfileVerdict, ASaturatedProcessIsClientCpu) {
  ProfileReport r = Report(10, 19, 2);
  Set(r, S::kIoWait, 9, 10);
  Set(r, S::kFirstByte, 50, 100);
  r.Decide();
  EXPECT_EQ(r.verdict, "client-cpu") << r.reason;
}

TEST(ProfileVerdict, NoRequestsAndNoComputeIsStoreLatency) {
  ProfileReport r = Report(1, 0.1, 2);
  r.Decide();
  EXPECT_EQ(r.verdict, "store-latency");
  EXPECT_NE(r.Table().find("verdict: store-latency"), std::string::npos);
}

TEST(ProfileVerdict, OnlyListingsSayHowManyTheyWere) {
  ProfileReport r = Report(1, 0.1, 2);
  Set(r, S::kList, 0.5, 3);
  r.Decide();
  EXPECT_EQ(r.verdict, "store-latency");
  EXPECT_EQ(r.reason, "no GETs were recorded; 3 listing requests took 0.50 s");
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Profiler, RecordsOnlyWhileRunningAndSumsStages) {
  Profiler& p = Profiler::Get();
  p.Record(S::kParse, 0, 1000000);  // not running: ignored
  ASSERT_TRUE(p.Start().ok());
  EXPECT_FALSE(p.Start().ok());  // one profile at a time
  const int64_t t = MonotonicNanos();
  p.Record(S::kTransform, t, t + 2000000);
  p.Record(S::kTransform, t, t + 1000000);
  p.RecordRequest(S::kFirstByte, t, t + 3000000, t + 4000000, 4096);
  p.RecordRequest(S::kList, t, 0, t + 5000000, 0);
  const int64_t waited = Profiler::ThreadIoWaitNanos();
  p.Record(S::kIoWait, t, t + 7000000);
  EXPECT_EQ(Profiler::ThreadIoWaitNanos() - waited, 7000000);
  ProfileReport r = p.Stop();
  EXPECT_FALSE(Profiler::Active());
  EXPECT_EQ(r[S::kTransform].count, 2u);
  EXPECT_NEAR(r[S::kTransform].seconds, 0.003, 1e-9);
  EXPECT_NEAR(r[S::kFirstByte].seconds, 0.003, 1e-9);
  EXPECT_NEAR(r[S::kTransfer].seconds, 0.001, 1e-9);
  EXPECT_EQ(r[S::kTransfer].bytes, 4096u);
  EXPECT_EQ(r[S::kList].count, 1u);
  EXPECT_EQ(r[S::kParse].count, 0u);
  EXPECT_EQ(r.events, 5u);
  EXPECT_GT(r.wall_seconds, 0);

  char dir[] = "/tmp/wharf-profiler-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string trace = absl::StrCat(dir, "/trace.json");
  ASSERT_TRUE(p.WriteTrace(trace).ok());
  nlohmann::json j = nlohmann::json::parse(ReadAll(trace));
  ASSERT_TRUE(j["traceEvents"].is_array());
  int spans = 0, on_lanes = 0, meta = 0;
  std::set<std::pair<int64_t, std::string>> lanes;
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e["ph"];
    EXPECT_TRUE(e.contains("pid") && e.contains("name"));
    if (ph == "X") {
      ++spans;
      EXPECT_GE(e["dur"].get<double>(), 0);
      if (e["tid"].get<int64_t>() >= (int64_t{1} << 30)) {
        ++on_lanes;
        lanes.insert({e["tid"].get<int64_t>(), e["name"].get<std::string>()});
      }
    }
    meta += ph == "M";
  }
  EXPECT_EQ(spans, 6);     // two transforms, the I/O wait, first byte + transfer, the listing
  EXPECT_EQ(on_lanes, 3);  // the requests' spans, on request lanes
  // The GET and the listing overlap: two lanes (each named), the process named once.
  EXPECT_EQ(meta, 3);
  std::set<int64_t> lane_ids;
  for (const auto& [tid, name] : lanes) lane_ids.insert(tid);
  EXPECT_EQ(lane_ids.size(), 2u);

  // A worker's spool, merged: its sums add to the report, its events to the trace.
  ASSERT_TRUE(p.Start().ok());
  p.Record(S::kParse, t, t + 9000000);
  const std::string spool = p.SpoolJson();
  (void)p.Stop();
  ASSERT_TRUE(p.Start().ok());
  ProfileReport parent = p.Stop();
  ASSERT_TRUE(WriteFileAtomically(absl::StrCat(dir, "/4242.json"), spool).ok());
  ASSERT_TRUE(WriteFileAtomically(absl::StrCat(dir, "/junk.json"), "{").ok());  // not a spool file
  p.MergeSpool(dir, parent);
  EXPECT_EQ(parent.processes, 2);
  EXPECT_EQ(parent[S::kParse].count, 1u);
  EXPECT_NEAR(parent[S::kParse].seconds, 0.009, 1e-9);
  EXPECT_NE(access(absl::StrCat(dir, "/4242.json").c_str(), F_OK), 0);  // consumed
  ASSERT_TRUE(p.WriteTrace(trace).ok());
  j = nlohmann::json::parse(ReadAll(trace));
  int workers = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["args"]["name"].get<std::string>().rfind("DataLoader worker", 0) == 0)
      ++workers;
  }
  EXPECT_EQ(workers, 1);
  p.MergeSpool("/nonexistent/wharf-spool", parent);  // nothing to merge
  EXPECT_EQ(parent.processes, 2);
  std::remove(trace.c_str());
  EXPECT_NE(access(absl::StrCat(dir, "/junk.json").c_str(), F_OK), 0);  // dropped too
  rmdir(dir);
}

}  // namespace
}  // namespace wharf
