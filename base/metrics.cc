#include "base/metrics.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/metrics_export.h"

namespace wharf {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  uint64_t old = sum_bits_.load(std::memory_order_relaxed);
  while (!sum_bits_.compare_exchange_weak(
      old, std::bit_cast<uint64_t>(std::bit_cast<double>(old) + v), std::memory_order_relaxed)) {
  }
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    out[i] = total;
  }
  return out;
}

double Histogram::sum() const {
  return std::bit_cast<double>(sum_bits_.load(std::memory_order_relaxed));
}

std::vector<double> Histogram::LatencyBounds() {
  std::vector<double> b;
  for (double v = 0.001; v < 70; v *= 2) b.push_back(v);
  return b;
}

std::vector<double> Histogram::SizeBounds() {
  std::vector<double> b;
  for (double v = 1024; v <= 4294967296.0; v *= 4) b.push_back(v);
  return b;
}

bool MetricsRegistry::ValidName(const std::string& name) {
  if (name.rfind("wharf_", 0) != 0 || name.size() <= 6) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

MetricsRegistry::Family& MetricsRegistry::FamilyLocked(const std::string& name,
                                                       const std::string& help, Kind kind) {
  if (!ValidName(name)) {
    std::fprintf(stderr, "wharf: invalid metric name %s\n", name.c_str());
    std::abort();
  }
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.kind = kind;
    it->second.help = help;
  } else if (it->second.kind != kind) {
    std::fprintf(stderr, "wharf: metric %s registered with two kinds\n", name.c_str());
    std::abort();
  }
  return it->second;
}

Counter* MetricsRegistry::GetCounter(const std::string& name, const std::string& help,
                                     const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyLocked(name, help, Kind::kCounter).counters[labels];
  if (!slot) slot = std::make_unique<Counter>();
  return slot.get();
}

Gauge* MetricsRegistry::GetGauge(const std::string& name, const std::string& help,
                                 const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyLocked(name, help, Kind::kGauge).gauges[labels];
  if (!slot) slot = std::make_unique<Gauge>();
  return slot.get();
}

Histogram* MetricsRegistry::GetHistogram(const std::string& name, const std::string& help,
                                         std::vector<double> bounds, const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyLocked(name, help, Kind::kHistogram).histograms[labels];
  if (!slot) slot = std::make_unique<Histogram>(std::move(bounds));
  return slot.get();
}

uint64_t MetricsRegistry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&collectors_mu_);
  const uint64_t id = next_collector_++;
  collectors_[id] = std::move(collect);
  return id;
}

void MetricsRegistry::RemoveCollector(uint64_t id) {
  absl::MutexLock lock(&collectors_mu_);
  collectors_.erase(id);
}

std::vector<MetricsRegistry::Sample> MetricsRegistry::Snapshot() const {
  {
    absl::MutexLock lock(&collectors_mu_);
    for (const auto& [id, collect] : collectors_) collect();
  }
  absl::MutexLock lock(&mu_);
  std::vector<Sample> out;
  for (const auto& [name, f] : families_) {
    for (const auto& [labels, c] : f.counters) {
      out.push_back({name, f.kind, f.help, labels, static_cast<double>(c->value()), nullptr});
    }
    for (const auto& [labels, g] : f.gauges) {
      out.push_back({name, f.kind, f.help, labels, static_cast<double>(g->value()), nullptr});
    }
    for (const auto& [labels, h] : f.histograms) {
      out.push_back({name, f.kind, f.help, labels, 0, h.get()});
    }
  }
  return out;
}

std::string MetricsRegistry::PrometheusText() const {
  return MetricPointsToPrometheusText(MetricPoints(*this));
}

}  // namespace wharf
