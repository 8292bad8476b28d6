// Runtime: the one object per process that owns what must be shared for limits to mean
// anything (docs/design/runtime.md): the memory budget and its block pool, the blocking pool,
// the timer, shared objects keyed by configuration (HTTP transports, credential caches), the
// metrics registry and per-store link estimates.
//
// Stores and engines keep a shared_ptr to the runtime they were opened with, because their
// asynchronous work may outlive the code that opened them. Runtime::Default() is the
// process's runtime; it is the only fork-aware singleton in wharf (base/fork.h): a forked
// child gets a fresh one built from the same settings.
// Thread-safety: all methods are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <typeindex>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "base/link_estimate.h"
#include "base/memory_budget.h"
#include "base/metrics.h"
#include "base/metrics_export.h"
#include "base/thread_pool.h"
#include "base/timer.h"

namespace wharf {

struct RuntimeOptions {
  // Threads for operations that must block in the kernel (local file I/O, writer closes,
  // credential refreshes). File reads of small objects are latency-bound on the page cache
  // and disk queue, so more threads than cores keep the device busy; 16 saturates an NVMe
  // queue in practice.
  int blocking_threads = 16;
  // Bytes of data wharf may hold at once in this process (all engines, readers, transfers).
  uint64_t memory_budget = uint64_t{1} << 30;
  // Requests in flight per engine; 0 derives it from the link estimate.
  int inflight = 0;

  // The defaults overridden by WHARF_MEMORY_BUDGET (a size: "512M", "2G", bytes) and
  // WHARF_INFLIGHT. A malformed value is an error naming the variable.
  static absl::StatusOr<RuntimeOptions> FromEnvironment();
};

// Parses a byte size: a number with an optional K, M, G or T suffix in powers of 1024
// ("256M", "2G", "1.5G", "4096"; "KiB"/"MB"-style spellings and lower case accepted, all
// binary). A fraction needs a suffix and is rounded down to whole bytes.
absl::StatusOr<uint64_t> ParseSize(absl::string_view text);
// "1 GiB", "256 MiB", "12345 B": for messages.
std::string FormatSize(uint64_t bytes);

class Runtime {
 public:
  explicit Runtime(RuntimeOptions options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The process's runtime, created on first use from the environment (a malformed variable
  // is reported once on stderr and the default used) and Configure().
  static std::shared_ptr<Runtime> Default();
  // Changes the default runtime's settings; unset fields stay. A new budget applies to new
  // reservations (bytes held stay held). Also used by a forked child's runtime.
  static void Configure(std::optional<uint64_t> memory_budget, std::optional<int> inflight);

  RuntimeOptions options() const;
  int inflight() const;

  MemoryBudget& budget() { return *budget_; }
  const std::shared_ptr<MemoryBudget>& shared_budget() { return budget_; }
  // Created on first use, so a process that never needs them starts no threads.
  ThreadPool& blocking_pool();
  Timer& timer();
  MetricsRegistry& metrics() { return metrics_; }
  // Every metric now (the memory budget's gauges are refreshed by a collector at each snapshot).
  std::vector<MetricPoint> MetricPoints();
  // Serves (or reports) this runtime's metrics at `address` (base/metrics_export.h).
  // Runtime::Default() calls it when WHARF_METRICS_ADDR is set. Once per runtime.
  absl::Status StartMetricsExport(const MetricsExportOptions& options);
  // The exporter started above; null when none.
  MetricsExporter* metrics_exporter();
  // The link estimate of the store named `store` (its root URI, e.g. "s3://bucket").
  LinkEstimator& link(const std::string& store);

  // One object of type T per key for the runtime's life (transports keyed by TLS settings,
  // credential caches keyed by source): `make` runs once per (T, key).
  template <typename T>
  std::shared_ptr<T> Shared(const std::string& key,
                            const std::function<std::shared_ptr<T>()>& make) {
    absl::MutexLock lock(&mu_);
    auto& slot = shared_[{std::type_index(typeid(T)), key}];
    if (!slot) slot = make();
    return std::static_pointer_cast<T>(slot);
  }

 private:
  void SetOptions(std::optional<uint64_t> memory_budget, std::optional<int> inflight);

  mutable absl::Mutex mu_;
  RuntimeOptions options_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<MemoryBudget> budget_;
  MetricsRegistry metrics_;
  std::unique_ptr<ThreadPool> blocking_pool_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Timer> timer_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<LinkEstimator>> links_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::type_index, std::string>, std::shared_ptr<void>> shared_
      ABSL_GUARDED_BY(mu_);
  // Last: destroyed first, while what it reads is still here.
  std::unique_ptr<MetricsExporter> exporter_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wharf
