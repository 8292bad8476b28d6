#include "base/profiler.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <queue>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_io.h"
#include "base/fork.h"
#include "base/status.h"
#include "nlohmann/json.hpp"

namespace wharf {
namespace {

using nlohmann::json;

struct StageName {
  absl::string_view id;
  absl::string_view label;
};
constexpr StageName kStages[kProfileStages] = {
    {"list", "listing"},        {"budget", "budget wait"},      {"first_byte", "first byte"},
    {"transfer", "transfer"},   {"io_wait", "waiting for I/O"}, {"parse", "parse/decode"},
    {"transform", "transform"}, {"collate", "collate"},         {"consumer_wait", "consumer wait"},
    {"step", "consumer step"},
};

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

int UsableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

// Not cached: a forked child's threads have new ids.
uint32_t ThreadId() { return static_cast<uint32_t>(syscall(SYS_gettid)); }

thread_local int64_t t_io_wait_ns = 0;

double Share(double part, double whole) { return whole > 0 ? part / whole : 0; }

}  // namespace

absl::string_view ProfileStageId(ProfileStage stage) { return kStages[static_cast<int>(stage)].id; }

std::optional<ProfileStage> ProfileStageFromId(absl::string_view id) {
  for (int i = 0; i < kProfileStages; ++i) {
    if (kStages[i].id == id) return static_cast<ProfileStage>(i);
  }
  return std::nullopt;
}

std::string DefaultProfileTracePath() {
  const char* env = std::getenv("WHARF_PROFILE_TRACE");
  if (env != nullptr && *env != '\0') return env;
  return absl::StrCat("wharf-trace-", getpid(), ".json");
}

bool ProfileRequestedByEnvironment() {
  const char* env = std::getenv("WHARF_PROFILE");
  if (env == nullptr) return false;
  const std::string v = absl::AsciiStrToLower(env);
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

int64_t MonotonicNanos() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// ---- the verdict ----

void ProfileReport::Decide() {
  using S = ProfileStage;
  auto sec = [&](S s) { return (*this)[s].seconds; };
  const double wall = std::max(wall_seconds, 1e-9);
  // 1. The consumer: it is the bottleneck when it seldom waits for data.
  const double wait = sec(S::kConsumerWait), step = sec(S::kStep);
  if ((*this)[S::kStep].count > 0 && step > 0 && wait < 0.25 * (wait + step)) {
    verdict = "consumer";
    reason = absl::StrFormat(
        "the consumer waited for data %.0f%% of its time (%.2f s) and spent %.2f s in its own "
        "step: the data arrives faster than it is used",
        100 * Share(wait, wait + step), wait, step);
    return;
  }
  const double parse = sec(S::kParse);
  const double python_cpu = sec(S::kTransform) + sec(S::kCollate);
  const double cpu_stages = parse + python_cpu;
  const char* cpu_word = parse >= python_cpu ? "parse" : "client-cpu";
  // 2. The CPU: the process (all its threads) uses nearly every core it may run on.
  const double utilization = Share(cpu_seconds, cores * wall);
  if (utilization >= 0.85) {
    verdict = cpu_stages > 0 ? cpu_word : "client-cpu";
    reason = absl::StrFormat(
        "the process used %.0f%% of its %d cores (%.2f s CPU in %.2f s)%s", 100 * utilization,
        cores, cpu_seconds, wall,
        cpu_stages > 0
            ? absl::StrFormat("; parse %.2f s, transform + collate %.2f s", parse, python_cpu)
            : "");
    return;
  }
  // 3. The loader's threads: busy computing (parse, transform, collate) more than blocked on
  // bytes.
  const double io_wait = sec(S::kIoWait);
  if (cpu_stages > 0 && cpu_stages > io_wait) {
    verdict = cpu_word;
    reason = absl::StrFormat(
        "the loader computed for %.2f s (parse %.2f s, transform %.2f s, collate %.2f s) and "
        "waited for bytes %.2f s",
        cpu_stages, parse, sec(S::kTransform), sec(S::kCollate), io_wait);
    return;
  }
  // 4. The store: time to first byte against transfer time, over every request.
  const double first = sec(S::kFirstByte), transfer = sec(S::kTransfer);
  const uint64_t gets = (*this)[S::kFirstByte].count;
  if (gets > 0 && transfer > first) {
    verdict = "bandwidth";
    reason = absl::StrFormat(
        "requests spent %.0f%% of their time moving bytes (%.1f MB/s over %.2f s) and %.0f%% "
        "waiting for the first byte",
        100 * Share(transfer, first + transfer), (*this)[S::kTransfer].bytes / wall / 1e6, wall,
        100 * Share(first, first + transfer));
    return;
  }
  verdict = "store-latency";
  if (gets == 0) {
    const uint64_t pages = (*this)[S::kList].count;
    reason = pages > 0 ? absl::StrFormat("no GETs were recorded; %d listing request%s took %.2f s",
                                         pages, pages == 1 ? "" : "s", sec(S::kList))
                       : "no store requests were recorded; the loader waited for bytes";
    return;
  }
  reason = absl::StrFormat(
      "requests spent %.0f%% of their time waiting for the first byte (mean %.1f ms, %.1f "
      "requests waiting on average); more in flight or fewer, larger requests would help",
      100 * Share(first, first + transfer), 1e3 * first / static_cast<double>(gets), first / wall);
}

std::string ProfileReport::Table() const {
  std::string out = absl::StrFormat(
      "wharf profile: %.2f s wall, %.2f s CPU on %d cores, %d process%s\n"
      "%-18s %10s %9s %10s %10s %10s\n",
      wall_seconds, cpu_seconds, cores, processes, processes == 1 ? "" : "es", "stage", "seconds",
      "% wall", "count", "mean ms", "MB");
  for (int i = 0; i < kProfileStages; ++i) {
    const Stage& s = stages[i];
    if (s.count == 0) continue;
    absl::StrAppend(&out,
                    absl::StrFormat("%-18s %10.3f %8.1f%% %10d %10.3f %10s\n", kStages[i].label,
                                    s.seconds, 100 * Share(s.seconds, wall_seconds), s.count,
                                    1e3 * s.seconds / static_cast<double>(s.count),
                                    s.bytes > 0 ? absl::StrFormat("%.1f", s.bytes / 1e6) : "-"));
  }
  absl::StrAppend(&out,
                  "(stages overlap: requests and workers run concurrently, so a share above "
                  "100% is an average concurrency)\n");
  if (dropped_events > 0) {
    absl::StrAppend(
        &out, absl::StrFormat("(trace kept %d events, dropped %d)\n", events, dropped_events));
  }
  absl::StrAppend(&out, "verdict: ", verdict, " (", reason, ")\n");
  return out;
}

std::string ProfileReport::ToJson() const {
  json j;
  j["wall_seconds"] = wall_seconds;
  j["cpu_seconds"] = cpu_seconds;
  j["cores"] = cores;
  j["processes"] = processes;
  j["events"] = events;
  j["dropped_events"] = dropped_events;
  j["verdict"] = verdict;
  j["reason"] = reason;
  json st = json::object();
  for (int i = 0; i < kProfileStages; ++i) {
    st[std::string(kStages[i].id)] = {{"label", std::string(kStages[i].label)},
                                      {"seconds", stages[i].seconds},
                                      {"count", stages[i].count},
                                      {"bytes", stages[i].bytes}};
  }
  j["stages"] = std::move(st);
  return j.dump();
}

// ---- recording ----

Profiler& Profiler::Get() {
  static Profiler* const profiler = [] {
    auto* p = new Profiler();  // never destroyed: hooks may run during exit
    // A child forked while a store thread held the lock would never see it released.
    ReleaseAcrossFork(&p->mu_);
    return p;
  }();
  return *profiler;
}

absl::Status Profiler::Start() {
  absl::MutexLock lock(&mu_);
  if (active_.load(std::memory_order_relaxed)) {
    return absl::FailedPreconditionError("a profile is already running in this process");
  }
  Reset();
  return absl::OkStatus();
}

void Profiler::StartInChild() {
  absl::MutexLock lock(&mu_);
  Reset();
}

void Profiler::Reset() {
  for (int i = 0; i < kProfileStages; ++i) {
    ns_[i].store(0, std::memory_order_relaxed);
    count_[i].store(0, std::memory_order_relaxed);
    bytes_[i].store(0, std::memory_order_relaxed);
  }
  dropped_.store(0, std::memory_order_relaxed);
  events_.clear();
  events_.reserve(1 << 16);
  merged_.clear();
  start_ns_ = MonotonicNanos();
  start_cpu_ = ProcessCpuSeconds();
  active_.store(true, std::memory_order_release);
}

ProfileReport Profiler::Stop() {
  ProfileReport r;
  absl::MutexLock lock(&mu_);
  active_.store(false, std::memory_order_release);
  r.wall_seconds = static_cast<double>(MonotonicNanos() - start_ns_) / 1e9;
  r.cpu_seconds = ProcessCpuSeconds() - start_cpu_;
  r.cores = UsableCores();
  for (int i = 0; i < kProfileStages; ++i) {
    r.stages[i].seconds = static_cast<double>(ns_[i].load(std::memory_order_relaxed)) / 1e9;
    r.stages[i].count = count_[i].load(std::memory_order_relaxed);
    r.stages[i].bytes = bytes_[i].load(std::memory_order_relaxed);
  }
  r.events = events_.size();
  r.dropped_events = dropped_.load(std::memory_order_relaxed);
  r.Decide();
  return r;
}

void Profiler::Add(ProfileStage stage, int64_t ns, uint64_t bytes) {
  const int i = static_cast<int>(stage);
  ns_[i].fetch_add(std::max<int64_t>(0, ns), std::memory_order_relaxed);
  count_[i].fetch_add(1, std::memory_order_relaxed);
  if (bytes > 0) bytes_[i].fetch_add(bytes, std::memory_order_relaxed);
}

void Profiler::Record(ProfileStage stage, int64_t start_ns, int64_t end_ns, uint64_t bytes) {
  if (!active_.load(std::memory_order_relaxed)) return;
  Add(stage, end_ns - start_ns, bytes);
  if (stage == ProfileStage::kIoWait) t_io_wait_ns += end_ns - start_ns;
  Push({start_ns, end_ns, 0, bytes, ThreadId(), stage, false});
}

void Profiler::Push(const Event& e) {
  absl::MutexLock lock(&mu_);
  if (events_.size() >= kMaxEvents) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  events_.push_back(e);
}

void Profiler::RecordRequest(ProfileStage stage, int64_t start_ns, int64_t first_byte_ns,
                             int64_t end_ns, uint64_t bytes) {
  if (!active_.load(std::memory_order_relaxed)) return;
  if (first_byte_ns > 0) {
    first_byte_ns = std::clamp(first_byte_ns, start_ns, end_ns);
    Add(ProfileStage::kFirstByte, first_byte_ns - start_ns, 0);
    Add(ProfileStage::kTransfer, end_ns - first_byte_ns, bytes);
  } else {
    Add(stage, end_ns - start_ns, bytes);
  }
  // No thread id: the trace draws requests on lanes of their own (EventsText).
  Push({start_ns, end_ns, first_byte_ns, bytes, 0, stage, true});
}

int64_t Profiler::ThreadIoWaitNanos() { return t_io_wait_ns; }

// ---- the trace and the spool ----

namespace {

// Chrome trace events of one process (https://docs.google.com/document/d/
// 1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU): complete events ("X") for the spans of a
// thread, and for requests on lanes of their own (EventsText).
// Formatted by hand: a JSON library's objects cost several times the recording itself for
// the tens of thousands of events of a short run. Names are fixed ASCII (no escaping).
// Nanoseconds as microseconds with three decimals ("12.345"), without floating point.
void AppendMicros(std::string& out, int64_t ns) {
  ns = std::max<int64_t>(0, ns);
  absl::StrAppend(&out, ns / 1000);
  const int frac = static_cast<int>(ns % 1000);
  const char digits[4] = {'.', static_cast<char>('0' + frac / 100),
                          static_cast<char>('0' + frac / 10 % 10),
                          static_cast<char>('0' + frac % 10)};
  out.append(digits, 4);
}

void AppendSpan(std::string& out, absl::string_view name, int64_t start_ns, int64_t end_ns, int pid,
                uint32_t tid, uint64_t bytes) {
  absl::StrAppend(&out, ",{\"name\":\"", name, "\",\"cat\":\"stage\",\"ph\":\"X\",\"ts\":");
  AppendMicros(out, start_ns);
  out += ",\"dur\":";
  AppendMicros(out, end_ns - start_ns);
  absl::StrAppend(&out, ",\"pid\":", pid, ",\"tid\":", tid);
  if (bytes > 0) absl::StrAppend(&out, ",\"args\":{\"bytes\":", bytes, "}");
  out += '}';
}

}  // namespace

// A spool file: one line of JSON (pid, CPU, stage sums), then the process's trace events as
// one JSON array, kept as text by the parent.
std::string Profiler::SpoolJson(absl::string_view process_name) {
  json j;
  const int pid = getpid();
  j["pid"] = pid;
  j["cpu_seconds"] = ProcessCpuSeconds() - start_cpu_;
  j["dropped_events"] = dropped_.load(std::memory_order_relaxed);
  json st = json::object();
  for (int i = 0; i < kProfileStages; ++i) {
    st[std::string(kStages[i].id)] = {{"ns", ns_[i].load(std::memory_order_relaxed)},
                                      {"count", count_[i].load(std::memory_order_relaxed)},
                                      {"bytes", bytes_[i].load(std::memory_order_relaxed)}};
  }
  j["stages"] = std::move(st);
  std::string out = j.dump();
  out += '\n';
  out += EventsText(process_name);
  return out;
}

std::string Profiler::EventsText(absl::string_view process_name) {
  const int pid = getpid();
  std::string out =
      absl::StrFormat("[{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":%s}}",
                      pid, json(absl::StrCat(process_name, " (pid ", pid, ")")).dump());
  absl::MutexLock lock(&mu_);
  out.reserve(out.size() + events_.size() * 150);
  // Store requests overlap on one event loop: each gets a lane ("request slot N", a track of
  // its own in the viewer) that is free from its start to its end, the fewest lanes that hold
  // them all (greedy by start time), and two spans on it: first byte, then transfer.
  std::vector<const Event*> requests;
  for (const Event& e : events_) {
    if (!e.request) {
      AppendSpan(out, kStages[static_cast<int>(e.stage)].label, e.start_ns, e.end_ns, pid, e.tid,
                 e.bytes);
    } else {
      requests.push_back(&e);
    }
  }
  std::sort(requests.begin(), requests.end(),
            [](const Event* a, const Event* b) { return a->start_ns < b->start_ns; });
  using Lane = std::pair<int64_t, uint32_t>;  // (free from, lane)
  std::priority_queue<Lane, std::vector<Lane>, std::greater<Lane>> free_at;
  uint32_t lanes = 0;
  constexpr uint32_t kLaneBase = 1u << 30;  // far from real thread ids
  for (const Event* e : requests) {
    uint32_t lane;
    if (!free_at.empty() && free_at.top().first <= e->start_ns) {
      lane = free_at.top().second;
      free_at.pop();
    } else {
      lane = lanes++;
      absl::StrAppend(&out, ",{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":", pid,
                      ",\"tid\":", kLaneBase + lane, ",\"args\":{\"name\":\"request slot ", lane,
                      "\"}}");
    }
    free_at.push({e->end_ns, lane});
    if (e->mid_ns > 0) {
      AppendSpan(out, "first byte", e->start_ns, e->mid_ns, pid, kLaneBase + lane, 0);
      AppendSpan(out, "transfer", e->mid_ns, e->end_ns, pid, kLaneBase + lane, e->bytes);
    } else {
      AppendSpan(out, kStages[static_cast<int>(e->stage)].label, e->start_ns, e->end_ns, pid,
                 kLaneBase + lane, e->bytes);
    }
  }
  out += ']';
  return out;
}

void Profiler::MergeSpool(const std::string& folder, ProfileReport& report) {
  // Temp files being written end in ".tmp-<pid>-<random>", not ".json": only whole files are read.
  std::string text;
  for (const std::string& path : ListFiles(folder, ".json")) {
    const bool read = ReadFile(path, &text);
    unlink(path.c_str());
    if (!read) continue;
    const size_t eol = std::min(text.find('\n'), text.size());
    json j = json::parse(text.substr(0, eol), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("stages")) continue;
    report.processes += 1;
    report.cpu_seconds += j.value("cpu_seconds", 0.0);
    report.dropped_events += j.value("dropped_events", uint64_t{0});
    for (const auto& [id, s] : j["stages"].items()) {
      const std::optional<ProfileStage> stage = ProfileStageFromId(id);
      if (!stage.has_value()) continue;
      ProfileReport::Stage& to = report.stages[static_cast<int>(*stage)];
      to.seconds += static_cast<double>(s.value("ns", int64_t{0})) / 1e9;
      to.count += s.value("count", uint64_t{0});
      to.bytes += s.value("bytes", uint64_t{0});
    }
    // The events stay text: checked to be one JSON array, counted, spliced into the trace.
    std::string events = eol < text.size() ? text.substr(eol + 1) : "[]";
    while (!events.empty() && (events.back() == '\n' || events.back() == ' ')) events.pop_back();
    if (events.size() >= 2 && events.front() == '[' && events.back() == ']' &&
        json::accept(events)) {
      for (size_t at = events.find("\"ph\":"); at != std::string::npos;
           at = events.find("\"ph\":", at + 5)) {
        ++report.events;
      }
      absl::MutexLock lock(&mu_);
      merged_.push_back(std::move(events));
    }
  }
  report.Decide();
}

absl::Status Profiler::WriteTrace(const std::string& path) {
  // This process's events, then the merged ones: JSON arrays spliced as text into one.
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  bool first = true;
  auto append = [&](absl::string_view array) {
    if (array.size() <= 2) return;  // "[]"
    absl::StrAppend(&out, first ? "" : ",", array.substr(1, array.size() - 2));
    first = false;
  };
  append(EventsText("wharf"));
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& m : merged_) append(m);
  }
  absl::StrAppend(&out, "]}\n");
  return Annotate(WriteFileAtomically(path, out), "profile trace");
}

}  // namespace wharf
