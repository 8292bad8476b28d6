// Metrics: counters, gauges and histograms in one registry per runtime (docs/design/metrics.md).
//
// Hot paths touch only atomics: a metric is looked up once (by name and labels) and the
// returned pointer is kept; the registry lock is taken only to create or to snapshot.
// Names follow Prometheus conventions: wharf_<subsystem>_<name>_<unit> (`_total` for
// counters, base units: seconds, bytes). Labels are low-cardinality (store scheme, operation,
// status); an object key is never a label.
// Thread-safety: thread-safe; metrics live as long as the registry.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace wharf {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Gauge {
 public:
  void Set(int64_t v) { value_.store(v, std::memory_order_relaxed); }
  void Add(int64_t n) { value_.fetch_add(n, std::memory_order_relaxed); }
  int64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// Fixed upper bounds (Prometheus `le`), counts per bucket, sum and count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Cumulative counts per bound, then +Inf (the total count).
  std::vector<uint64_t> CumulativeCounts() const;
  double sum() const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

  // Bounds for latencies in seconds: 1 ms .. ~65 s, doubling.
  static std::vector<double> LatencyBounds();
  // Bounds for sizes in bytes: 1 KiB .. 4 GiB, x4.
  static std::vector<double> SizeBounds();

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_bits_{0};  // a double, added by CAS
};

class MetricsRegistry {
 public:
  enum class Kind { kCounter, kGauge, kHistogram };

  // Whether `name` follows the naming rule (^wharf_[a-z0-9_]+$) the Get* methods require.
  static bool ValidName(const std::string& name);

  // The metric named `name` with `labels`, created on first use. `help` is kept from the
  // first call. REQUIRES: one name always has the same kind (checked: a mismatch aborts,
  // it is a programming error) and matches ^wharf_[a-z0-9_]+$.
  Counter* GetCounter(const std::string& name, const std::string& help,
                      const MetricLabels& labels = {});
  Gauge* GetGauge(const std::string& name, const std::string& help,
                  const MetricLabels& labels = {});
  Histogram* GetHistogram(const std::string& name, const std::string& help,
                          std::vector<double> bounds, const MetricLabels& labels = {});

  struct Sample {
    std::string name;
    Kind kind;
    std::string help;
    MetricLabels labels;
    double value = 0;                      // counters and gauges
    const Histogram* histogram = nullptr;  // histograms (alive as long as the registry)
  };
  // A function Snapshot() runs first, to publish counts an object keeps itself (the tier's
  // per-store counters: adding to the registry on its hot paths would buy nothing). It may
  // call the Get* methods above; it must be quick and must not call Snapshot(). Returns an
  // id for RemoveCollector.
  uint64_t AddCollector(std::function<void()> collect);
  // After it returns the collector is not running and never runs again.
  void RemoveCollector(uint64_t id);

  // Every metric, sorted by name then labels (the collectors run first).
  std::vector<Sample> Snapshot() const;
  // Prometheus text exposition format (version 0.0.4).
  std::string PrometheusText() const;

 private:
  struct Family {
    Kind kind;
    std::string help;
    std::map<MetricLabels, std::unique_ptr<Counter>> counters;
    std::map<MetricLabels, std::unique_ptr<Gauge>> gauges;
    std::map<MetricLabels, std::unique_ptr<Histogram>> histograms;
  };
  Family& FamilyLocked(const std::string& name, const std::string& help, Kind kind)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
  // Held while collectors run (never together with mu_ by this class: they take mu_).
  mutable absl::Mutex collectors_mu_;
  std::map<uint64_t, std::function<void()>> collectors_ ABSL_GUARDED_BY(collectors_mu_);
  uint64_t next_collector_ ABSL_GUARDED_BY(collectors_mu_) = 1;
};

}  // namespace wharf
