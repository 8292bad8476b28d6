// Exporting the runtime's metrics (docs/design/metrics.md): as JSON (the CLI's --metrics FILE,
// and what a process reports to the one that serves), and on an opt-in HTTP endpoint that
// Prometheus scrapes (WHARF_METRICS_ADDR), aggregated over the processes of one job.
//
// The endpoint: the first process that binds WHARF_METRICS_ADDR serves `/metrics` (Prometheus
// text, through prometheus-cpp's civetweb Exposer). A process that finds the address taken by
// a server of the same user (PyTorch DataLoader workers, forked or spawned, inherit the
// variable) becomes a reporter instead: once a second (and when its exporter is destroyed, or
// Flush() is called at exit) it writes its metrics as JSON into the server's spool folder
// (`<tmp>/wharf-metrics-<uid>-<port>/<pid>.json`, mode 0700, written to a temp file and
// renamed). At each scrape the server adds every spool file's counters and histograms to its
// own (a finished worker's totals keep counting, so rates stay right) and the gauges of the
// reporters still alive. Its own runtime's samples come first; series are matched by name and
// labels, never by object key (no key is ever a label).
//
// Thread-safety: MetricsExporter's methods are thread-safe; the functions are pure.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/metrics.h"

namespace wharf {

class Runtime;

// A metric's value at one moment, copied out of the registry (histograms included).
struct MetricPoint {
  std::string name;
  MetricsRegistry::Kind kind = MetricsRegistry::Kind::kCounter;
  std::string help;
  MetricLabels labels;
  double value = 0;              // counters and gauges
  std::vector<double> bounds;    // histograms: upper bounds (+Inf implied)
  std::vector<uint64_t> counts;  // histograms: cumulative per bound, then +Inf
  double sum = 0;                // histograms
};

// Every metric of `registry`, sorted by name then labels.
std::vector<MetricPoint> MetricPoints(const MetricsRegistry& registry);

// {"pid": ..., "time": unix seconds, "metrics": [{"name", "kind", "help", "labels": {...},
// "value"} or, for histograms, {"bounds", "counts", "sum"}]}.
std::string MetricPointsToJson(const std::vector<MetricPoint>& points, int64_t pid);
// The points of such a JSON document (and its pid). Errors name `what` (a file name).
absl::StatusOr<std::vector<MetricPoint>> MetricPointsFromJson(absl::string_view json,
                                                              absl::string_view what,
                                                              int64_t* pid = nullptr);

// Adds `more` into `into`: counters and gauges summed, histograms with equal bounds summed
// bucket by bucket (a histogram whose bounds differ is skipped); series only in `more` are
// appended. With `gauges` false, `more`'s gauges are ignored. Keeps `into` sorted.
void MergeMetricPoints(std::vector<MetricPoint>& into, const std::vector<MetricPoint>& more,
                       bool gauges = true);

// Prometheus text exposition format (0.0.4) of `points`.
std::string MetricPointsToPrometheusText(const std::vector<MetricPoint>& points);

struct MetricsExportOptions {
  // "HOST:PORT", or "PORT" (127.0.0.1), or ":PORT" (127.0.0.1); port 0 picks a free one.
  std::string address;
  // How often a reporter writes its spool file.
  absl::Duration report_interval = absl::Seconds(1);
  // The spool folder; empty: <TMPDIR or /tmp>/wharf-metrics-<uid>-<port>.
  std::string spool_dir;
};

class MetricsExporter {
 public:
  // Serves `runtime`'s metrics at options.address, or reports them to the process serving it.
  // REQUIRES: `runtime` outlives the exporter (the runtime owns it). Errors: a malformed
  // address, an address taken by something that is not a wharf metrics server.
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(
      Runtime& runtime, const MetricsExportOptions& options);
  virtual ~MetricsExporter() = default;
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // True: this process serves /metrics; false: it reports to the process that does.
  virtual bool serving() const = 0;
  virtual int port() const = 0;
  // A reporter writes its spool file now (a process about to exit); a server does nothing.
  virtual void Flush() = 0;
  // What a scrape answers now: this process's metrics and the spool's (a server), or this
  // process's own (a reporter).
  virtual std::vector<MetricPoint> Collect() = 0;

 protected:
  MetricsExporter() = default;
};

// "HOST:PORT" / "PORT" / ":PORT" into host and port. InvalidArgument naming the text.
absl::StatusOr<std::pair<std::string, int>> ParseMetricsAddress(absl::string_view address);

}  // namespace wharf
