#include "base/metrics_export.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/file_io.h"
#include "base/fork.h"
#include "base/runtime.h"
#include "base/status.h"
#include "nlohmann/json.hpp"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"

namespace wharf {
namespace {

// Ordered: a series is matched by name and labels in their order, so a reporter's labels
// must come back in the order its registry gave them (a sorted object made the workers'
// series a second one beside the server's own).
using json = nlohmann::ordered_json;
using Kind = MetricsRegistry::Kind;

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kCounter:
      return "counter";
    case Kind::kGauge:
      return "gauge";
    case Kind::kHistogram:
      return "histogram";
  }
  return "untyped";
}

std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

std::string LabelText(const MetricLabels& labels, const std::string& extra = "") {
  if (labels.empty() && extra.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    absl::StrAppend(&out, i > 0 ? "," : "", labels[i].first, "=\"", Escape(labels[i].second), "\"");
  }
  if (!extra.empty()) absl::StrAppend(&out, labels.empty() ? "" : ",", extra);
  return out + "}";
}

std::string Number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

bool SameSeries(const MetricPoint& a, const MetricPoint& b) {
  return a.name == b.name && a.labels == b.labels;
}

bool SeriesLess(const MetricPoint& a, const MetricPoint& b) {
  return std::tie(a.name, a.labels) < std::tie(b.name, b.labels);
}

bool ProcessAlive(int64_t pid) {
  return pid > 0 && (kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

std::string DefaultSpool(int port) {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  return absl::StrCat(dir, "/wharf-metrics-", getuid(), "-", port);
}

// The spool is ours: a real folder (not a link) owned by this user, not writable by others.
bool OwnedSpool(const std::string& dir) {
  struct stat st;
  return lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid() &&
         (st.st_mode & 0022) == 0;
}

std::vector<std::string> SpoolFiles(const std::string& dir) { return ListFiles(dir, ".json"); }

// The serving process's pid, in its spool: a process that finds the port taken reports there
// only while that process lives (a folder left by a killed server, and another program on
// the port, must not swallow its metrics).
constexpr char kServerPidFile[] = "server.pid";

bool ServerAlive(const std::string& spool) {
  std::string text;
  int64_t pid = 0;
  return ReadFile(absl::StrCat(spool, "/", kServerPidFile), &text) &&
         absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &pid) && pid != getpid() &&
         ProcessAlive(pid);
}

void RemoveSpool(const std::string& spool) {
  for (const std::string& f : SpoolFiles(spool)) unlink(f.c_str());
  unlink(absl::StrCat(spool, "/", kServerPidFile).c_str());
  rmdir(spool.c_str());
}

// The spool of this process's server, removed at exit (the server itself is not destroyed
// then) by the process that made it, not by a forked child that exits.
absl::Mutex serving_mu(absl::kConstInit);
std::string* serving_spool ABSL_GUARDED_BY(serving_mu) = nullptr;
pid_t serving_pid ABSL_GUARDED_BY(serving_mu) = 0;

prometheus::MetricType PromType(Kind kind) {
  switch (kind) {
    case Kind::kCounter:
      return prometheus::MetricType::Counter;
    case Kind::kGauge:
      return prometheus::MetricType::Gauge;
    case Kind::kHistogram:
      return prometheus::MetricType::Histogram;
  }
  return prometheus::MetricType::Untyped;
}

std::vector<prometheus::MetricFamily> ToFamilies(const std::vector<MetricPoint>& points) {
  std::vector<prometheus::MetricFamily> out;
  for (const MetricPoint& p : points) {
    if (out.empty() || out.back().name != p.name) {
      prometheus::MetricFamily f;
      f.name = p.name;
      f.help = p.help;
      f.type = PromType(p.kind);
      out.push_back(std::move(f));
    }
    prometheus::ClientMetric m;
    for (const auto& [k, v] : p.labels) m.label.push_back({k, v});
    switch (p.kind) {
      case Kind::kCounter:
        m.counter.value = p.value;
        break;
      case Kind::kGauge:
        m.gauge.value = p.value;
        break;
      case Kind::kHistogram:
        m.histogram.sample_count = p.counts.empty() ? 0 : p.counts.back();
        m.histogram.sample_sum = p.sum;
        for (size_t i = 0; i < p.counts.size(); ++i) {
          m.histogram.bucket.push_back({p.counts[i], i < p.bounds.size() ? p.bounds[i] : INFINITY});
        }
        break;
    }
    out.back().metric.push_back(std::move(m));
  }
  return out;
}

class Server;

// prometheus-cpp holds collectables by weak_ptr; this one forwards to the server.
class Bridge : public prometheus::Collectable {
 public:
  explicit Bridge(MetricsExporter* exporter) : exporter_(exporter) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    return ToFamilies(exporter_->Collect());
  }

 private:
  MetricsExporter* const exporter_;
};

class Server : public MetricsExporter {
 public:
  explicit Server(Runtime& runtime) : runtime_(runtime) {}
  ~Server() override {
    exposer_.reset();  // stops serving before the bridge and the spool go
    if (spool_.empty()) return;
    RemoveSpool(spool_);
    absl::MutexLock lock(&serving_mu);
    if (serving_spool != nullptr && *serving_spool == spool_) serving_spool->clear();
  }

  // A fresh private spool (stale files of an earlier run on this port would count twice).
  absl::Status MakeSpool(std::string dir) {
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::InternalError(absl::StrCat("metrics spool ", dir, ": ", strerror(errno)));
    }
    if (!OwnedSpool(dir)) {
      return absl::PermissionDeniedError(
          absl::StrCat("metrics spool ", dir, ": not a private folder of this user"));
    }
    for (const std::string& f : SpoolFiles(dir)) unlink(f.c_str());
    WHARF_RETURN_IF_ERROR(
        WriteFileAtomically(absl::StrCat(dir, "/", kServerPidFile), absl::StrCat(getpid(), "\n")));
    {
      absl::MutexLock lock(&serving_mu);
      if (serving_spool == nullptr) {
        serving_spool = new std::string;
        std::atexit([] {
          absl::MutexLock lock(&serving_mu);
          if (!serving_spool->empty() && serving_pid == getpid()) RemoveSpool(*serving_spool);
        });
      }
      *serving_spool = dir;
      serving_pid = getpid();
    }
    spool_ = std::move(dir);
    return absl::OkStatus();
  }

  absl::Status Listen(const std::string& host, int port) {
    try {
      exposer_ = std::make_unique<prometheus::Exposer>(absl::StrCat(host, ":", port), 2);
    } catch (const std::exception& e) {
      return absl::UnavailableError(e.what());
    }
    const std::vector<int> ports = exposer_->GetListeningPorts();
    port_ = ports.empty() ? port : ports.front();
    return absl::OkStatus();
  }

  // Answers scrapes from now on (after MakeSpool: Collect reads the spool).
  void Serve() {
    bridge_ = std::make_shared<Bridge>(this);
    exposer_->RegisterCollectable(bridge_);
  }

  bool serving() const override { return true; }
  int port() const override { return port_; }
  void Flush() override {}

  std::vector<MetricPoint> Collect() override {
    std::vector<MetricPoint> points = runtime_.MetricPoints();
    const int64_t self = getpid();
    std::string text;
    for (const std::string& path : SpoolFiles(spool_)) {
      if (!ReadFile(path, &text)) continue;
      int64_t pid = 0;
      absl::StatusOr<std::vector<MetricPoint>> more = MetricPointsFromJson(text, path, &pid);
      if (!more.ok() || pid == self) continue;  // half-written files never appear (rename)
      MergeMetricPoints(points, *more, /*gauges=*/ProcessAlive(pid));
    }
    return points;
  }

 private:
  Runtime& runtime_;
  std::string spool_;  // set once, before the first scrape can reach Collect
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<Bridge> bridge_;
  int port_ = 0;
};

class Reporter;
absl::Mutex reporters_mu(absl::kConstInit);
std::vector<Reporter*>* reporters = nullptr;  // flushed at exit()

class Reporter : public MetricsExporter {
 public:
  Reporter(Runtime& runtime, std::string spool, int port, absl::Duration interval)
      : runtime_(runtime),
        path_(absl::StrCat(spool, "/", getpid(), ".json")),
        port_(port),
        interval_(interval) {
    {
      absl::MutexLock lock(&reporters_mu);
      if (reporters == nullptr) {
        reporters = new std::vector<Reporter*>;
        std::atexit([] {
          absl::MutexLock lock(&reporters_mu);
          for (Reporter* r : *reporters) r->Write();
        });
      }
      reporters->push_back(this);
    }
    thread_ = StartThread([this] { Loop(); });
  }
  ~Reporter() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
    Write();
    absl::MutexLock lock(&reporters_mu);
    reporters->erase(std::remove(reporters->begin(), reporters->end(), this), reporters->end());
  }

  bool serving() const override { return false; }
  int port() const override { return port_; }
  void Flush() override { Write(); }
  std::vector<MetricPoint> Collect() override { return runtime_.MetricPoints(); }

 private:
  void Loop() {
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      mu_.AwaitWithTimeout(absl::Condition(&stop_), interval_);
      if (stop_) break;
      mu_.Unlock();
      Write();
      mu_.Lock();
    }
  }
  void Write() {
    absl::MutexLock lock(&write_mu_);
    (void)WriteFileAtomically(path_, MetricPointsToJson(runtime_.MetricPoints(), getpid()));
  }

  Runtime& runtime_;
  const std::string path_;
  const int port_;
  const absl::Duration interval_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex write_mu_;
  std::thread thread_;
};

}  // namespace

std::vector<MetricPoint> MetricPoints(const MetricsRegistry& registry) {
  std::vector<MetricPoint> out;
  for (const MetricsRegistry::Sample& s : registry.Snapshot()) {
    MetricPoint p;
    p.name = s.name;
    p.kind = s.kind;
    p.help = s.help;
    p.labels = s.labels;
    p.value = s.value;
    if (s.histogram != nullptr) {
      p.bounds = s.histogram->bounds();
      p.counts = s.histogram->CumulativeCounts();
      p.sum = s.histogram->sum();
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::string MetricPointsToJson(const std::vector<MetricPoint>& points, int64_t pid) {
  json metrics = json::array();
  for (const MetricPoint& p : points) {
    json m = {{"name", p.name}, {"kind", KindName(p.kind)}, {"help", p.help}};
    json labels = json::object();
    for (const auto& [k, v] : p.labels) labels[k] = v;
    m["labels"] = labels;
    if (p.kind == Kind::kHistogram) {
      m["bounds"] = p.bounds;
      m["counts"] = p.counts;
      m["sum"] = p.sum;
    } else {
      m["value"] = p.value;
    }
    metrics.push_back(std::move(m));
  }
  json doc = {{"pid", pid},
              {"time", absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch())},
              {"metrics", std::move(metrics)}};
  return doc.dump();
}

absl::StatusOr<std::vector<MetricPoint>> MetricPointsFromJson(absl::string_view text,
                                                              absl::string_view what,
                                                              int64_t* pid) {
  const json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(what, ": not a metrics snapshot: ", why));
  };
  if (doc.is_discarded() || !doc.is_object()) return bad("not a JSON object");
  const auto metrics = doc.find("metrics");
  if (metrics == doc.end() || !metrics->is_array()) return bad("no \"metrics\" array");
  if (pid != nullptr) {
    const auto p = doc.find("pid");
    *pid = p != doc.end() && p->is_number_integer() ? p->get<int64_t>() : 0;
  }
  std::vector<MetricPoint> out;
  for (const json& m : *metrics) {
    if (!m.is_object()) return bad("a metric is not an object");
    MetricPoint p;
    const auto name = m.find("name"), kind = m.find("kind"), help = m.find("help");
    const auto labels = m.find("labels");
    if (name == m.end() || !name->is_string() || kind == m.end() || !kind->is_string()) {
      return bad("a metric without name or kind");
    }
    p.name = name->get<std::string>();
    const std::string k = kind->get<std::string>();
    if (k == "counter") {
      p.kind = Kind::kCounter;
    } else if (k == "gauge") {
      p.kind = Kind::kGauge;
    } else if (k == "histogram") {
      p.kind = Kind::kHistogram;
    } else {
      return bad(absl::StrCat(p.name, ": unknown kind ", k));
    }
    if (help != m.end() && help->is_string()) p.help = help->get<std::string>();
    if (labels != m.end() && labels->is_object()) {
      for (const auto& [lk, lv] : labels->items()) {
        if (!lv.is_string()) return bad(absl::StrCat(p.name, ": a label value is not a string"));
        p.labels.emplace_back(lk, lv.get<std::string>());
      }
    }
    if (p.kind == Kind::kHistogram) {
      const auto bounds = m.find("bounds"), counts = m.find("counts"), sum = m.find("sum");
      if (bounds == m.end() || !bounds->is_array() || counts == m.end() || !counts->is_array() ||
          counts->size() != bounds->size() + 1 || sum == m.end() || !sum->is_number()) {
        return bad(absl::StrCat(p.name, ": a histogram without bounds, counts and sum"));
      }
      for (const json& b : *bounds) {
        if (!b.is_number()) return bad(absl::StrCat(p.name, ": a bound is not a number"));
        p.bounds.push_back(b.get<double>());
      }
      for (const json& c : *counts) {
        if (!c.is_number_unsigned()) return bad(absl::StrCat(p.name, ": a count is not a count"));
        p.counts.push_back(c.get<uint64_t>());
      }
      p.sum = sum->get<double>();
    } else {
      const auto value = m.find("value");
      if (value == m.end() || !value->is_number()) return bad(absl::StrCat(p.name, ": no value"));
      p.value = value->get<double>();
    }
    out.push_back(std::move(p));
  }
  std::sort(out.begin(), out.end(), SeriesLess);
  return out;
}

void MergeMetricPoints(std::vector<MetricPoint>& into, const std::vector<MetricPoint>& more,
                       bool gauges) {
  for (const MetricPoint& p : more) {
    if (p.kind == Kind::kGauge && !gauges) continue;
    auto it = std::lower_bound(into.begin(), into.end(), p, SeriesLess);
    if (it == into.end() || !SameSeries(*it, p)) {
      // A name known with another kind is skipped (one name, one kind). Sorted by name, so
      // the series of p's name, if any, are next to where it would go.
      const auto clashes = [&](const MetricPoint& q) {
        return q.name == p.name && q.kind != p.kind;
      };
      const bool clash =
          (it != into.end() && clashes(*it)) || (it != into.begin() && clashes(*std::prev(it)));
      if (!clash) into.insert(it, p);
      continue;
    }
    if (it->kind != p.kind) continue;
    if (p.kind == Kind::kHistogram) {
      if (it->bounds != p.bounds || it->counts.size() != p.counts.size()) continue;
      for (size_t i = 0; i < p.counts.size(); ++i) it->counts[i] += p.counts[i];
      it->sum += p.sum;
    } else {
      it->value += p.value;
    }
  }
}

std::string MetricPointsToPrometheusText(const std::vector<MetricPoint>& points) {
  std::string out;
  std::string last;
  for (const MetricPoint& p : points) {
    if (p.name != last) {
      absl::StrAppend(&out, "# HELP ", p.name, " ", p.help, "\n# TYPE ", p.name, " ",
                      KindName(p.kind), "\n");
      last = p.name;
    }
    if (p.kind != Kind::kHistogram) {
      absl::StrAppend(&out, p.name, LabelText(p.labels), " ", Number(p.value), "\n");
      continue;
    }
    for (size_t i = 0; i < p.counts.size(); ++i) {
      const std::string le = i < p.bounds.size() ? Number(p.bounds[i]) : "+Inf";
      absl::StrAppend(&out, p.name, "_bucket", LabelText(p.labels, absl::StrCat("le=\"", le, "\"")),
                      " ", p.counts[i], "\n");
    }
    absl::StrAppend(&out, p.name, "_sum", LabelText(p.labels), " ", Number(p.sum), "\n", p.name,
                    "_count", LabelText(p.labels), " ", p.counts.empty() ? 0 : p.counts.back(),
                    "\n");
  }
  return out;
}

absl::StatusOr<std::pair<std::string, int>> ParseMetricsAddress(absl::string_view address) {
  std::string host = "127.0.0.1";
  absl::string_view port_text = address;
  const size_t colon = address.rfind(':');
  if (colon != absl::string_view::npos) {
    if (colon > 0) host = std::string(address.substr(0, colon));
    port_text = address.substr(colon + 1);
  }
  int port = -1;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535 || host.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address,
                     "': expected HOST:PORT, :PORT or PORT (e.g. 127.0.0.1:9464)"));
  }
  return std::make_pair(host, port);
}

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(
    Runtime& runtime, const MetricsExportOptions& options) {
  absl::StatusOr<std::pair<std::string, int>> address = ParseMetricsAddress(options.address);
  if (!address.ok()) return address.status();
  const auto& [host, port] = *address;
  auto server = std::make_unique<Server>(runtime);
  const absl::Status listened = server->Listen(host, port);
  if (listened.ok()) {
    // Named after the port actually bound (port 0 picks one).
    absl::Status spooled = server->MakeSpool(
        options.spool_dir.empty() ? DefaultSpool(server->port()) : options.spool_dir);
    if (!spooled.ok()) return spooled;
    server->Serve();
    return std::unique_ptr<MetricsExporter>(std::move(server));
  }
  const std::string spool = options.spool_dir.empty() ? DefaultSpool(port) : options.spool_dir;
  if (port != 0 && OwnedSpool(spool) && ServerAlive(spool)) {
    return std::unique_ptr<MetricsExporter>(
        new Reporter(runtime, spool, port, options.report_interval));
  }
  return absl::UnavailableError(
      absl::StrCat("serving metrics on ", host, ":", port, ": ", listened.message()));
}

}  // namespace wharf
