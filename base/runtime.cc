#include "base/runtime.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/fork.h"
#include "base/status.h"

namespace wharf {

absl::StatusOr<uint64_t> ParseSize(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  uint64_t n = 0;
  if (digits == 0 || !absl::SimpleAtoi(s.substr(0, digits), &n)) {
    if (absl::StartsWith(s, "-") && s.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid size '", text,
          "': a size cannot be negative (a number with an optional K, M, G or T suffix)"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("invalid size '", text,
                     "': expected a number with an optional K, M, G or T suffix (powers of "
                     "1024), such as 512M or 1.5G"));
  }
  // A decimal fraction of a unit ("1.5G"): its bytes are added below, rounded down.
  absl::string_view fraction;
  size_t end = digits;
  if (end < s.size() && s[end] == '.') {
    ++end;
    while (end < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[end]))) ++end;
    fraction = s.substr(digits + 1, end - digits - 1);
    if (fraction.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid size '", text,
                       "': expected digits after the decimal point (a "
                       "number with an optional K, M, G or T suffix)"));
    }
  }
  std::string suffix = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(s.substr(end)));
  // "K", "KB", "KIB", "B", "" are accepted; every multiple is a power of 1024.
  if (absl::EndsWith(suffix, "IB"))
    suffix.resize(suffix.size() - 2);
  else if (suffix.size() == 2 && suffix.back() == 'B')
    suffix.resize(1);
  else if (suffix == "B")
    suffix.clear();
  int shift = 0;
  if (suffix.empty())
    shift = 0;
  else if (suffix == "K")
    shift = 10;
  else if (suffix == "M")
    shift = 20;
  else if (suffix == "G")
    shift = 30;
  else if (suffix == "T")
    shift = 40;
  else {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid size '", text,
                     "': expected a number with an optional K, M, G or T suffix "
                     "(powers of 1024), not '",
                     s.substr(end), "'"));
  }
  if (!fraction.empty() && shift == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid size '", text,
                     "': a fraction of a byte (a fraction needs a K, M, G or T suffix)"));
  }
  if (shift > 0 && n > (~uint64_t{0} >> shift)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid size '", text, "': too large"));
  }
  uint64_t bytes = n << shift;
  if (!fraction.empty()) {
    // At most 12 digits count (finer than a byte of a terabyte).
    uint64_t num = 0, den = 1;
    for (char c : fraction.substr(0, 12)) {
      num = num * 10 + static_cast<uint64_t>(c - '0');
      den *= 10;
    }
    const unsigned __int128 part = (static_cast<unsigned __int128>(num) << shift) / den;
    if (bytes > ~uint64_t{0} - part) {
      return absl::InvalidArgumentError(absl::StrCat("invalid size '", text, "': too large"));
    }
    bytes += static_cast<uint64_t>(part);
  }
  return bytes;
}

std::string FormatSize(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && unit < 4 && bytes % (uint64_t{1} << (10 * (unit + 1))) == 0) {
    v /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.0f %s", v, kUnits[unit]);
}

absl::StatusOr<RuntimeOptions> RuntimeOptions::FromEnvironment() {
  RuntimeOptions options;
  if (const char* v = std::getenv("WHARF_MEMORY_BUDGET"); v != nullptr && *v != '\0') {
    absl::StatusOr<uint64_t> size = ParseSize(v);
    if (!size.ok()) return Annotate(size.status(), "WHARF_MEMORY_BUDGET");
    if (*size == 0) return absl::InvalidArgumentError("WHARF_MEMORY_BUDGET: must be positive");
    options.memory_budget = *size;
  }
  if (const char* v = std::getenv("WHARF_INFLIGHT"); v != nullptr && *v != '\0') {
    int n = 0;
    if (!absl::SimpleAtoi(v, &n) || n < 1 || n > 65536) {
      return absl::InvalidArgumentError(
          absl::StrCat("WHARF_INFLIGHT: expected an integer in [1, 65536], got '", v, "'"));
    }
    options.inflight = n;
  }
  return options;
}

Runtime::Runtime(RuntimeOptions options)
    : options_(options), budget_(std::make_shared<MemoryBudget>(options.memory_budget)) {
  budget_->SetWaitHistogram(metrics_.GetHistogram(
      "wharf_memory_budget_wait_seconds",
      "Waits of readers and transfers for room in the memory budget", Histogram::LatencyBounds()));
  // The budget keeps its own counts under its lock; they are copied into gauges at each
  // snapshot rather than on every allocation.
  Gauge* limit =
      metrics_.GetGauge("wharf_memory_budget_limit_bytes", "The process's memory budget");
  Gauge* held =
      metrics_.GetGauge("wharf_memory_budget_held_bytes", "Bytes of data held now (all consumers)");
  Gauge* peak =
      metrics_.GetGauge("wharf_memory_budget_peak_bytes", "Most bytes of data held at once");
  Gauge* pooled = metrics_.GetGauge("wharf_memory_budget_pooled_bytes",
                                    "Released large blocks kept mapped for reuse");
  metrics_.AddCollector([b = budget_.get(), limit, held, peak, pooled] {
    limit->Set(static_cast<int64_t>(b->limit()));
    held->Set(static_cast<int64_t>(b->held()));
    peak->Set(static_cast<int64_t>(b->peak()));
    pooled->Set(static_cast<int64_t>(b->pooled()));
  });
}

Runtime::~Runtime() = default;

namespace {
absl::Mutex default_mu(absl::kConstInit);
// Settings given to Configure(), kept across fork so a child's runtime has them.
std::optional<uint64_t>* configured_budget ABSL_GUARDED_BY(default_mu) = nullptr;
std::optional<int>* configured_inflight ABSL_GUARDED_BY(default_mu) = nullptr;
}  // namespace

std::shared_ptr<Runtime> Runtime::Default() {
  static auto* runtime = new std::shared_ptr<Runtime>;
  static uint64_t generation = 0;
  // A forked child's first wharf call comes here: default_mu must not be inherited locked.
  static const bool fork_safe = (ReleaseAcrossFork(&default_mu), true);
  (void)fork_safe;
  // A thread's first wait may be on default_mu, which fork() holds (base/fork.h).
  EnsureThreadIdentity();
  absl::MutexLock lock(&default_mu);
  if (*runtime == nullptr || generation != ForkGeneration()) {
    // A forked child's copy of the parent's runtime has no threads: leak it (base/fork.h).
    if (*runtime != nullptr) new std::shared_ptr<Runtime>(*runtime);
    generation = ForkGeneration();
    absl::StatusOr<RuntimeOptions> options = RuntimeOptions::FromEnvironment();
    if (!options.ok()) {
      std::fprintf(stderr, "wharf: %s; using the defaults\n",
                   std::string(options.status().message()).c_str());
      options = RuntimeOptions{};
    }
    *runtime = std::make_shared<Runtime>(*options);
    if (configured_budget != nullptr || configured_inflight != nullptr) {
      (*runtime)->SetOptions(configured_budget ? *configured_budget : std::nullopt,
                             configured_inflight ? *configured_inflight : std::nullopt);
    }
    // The opt-in metrics endpoint; a failure is reported, never fatal (metrics are not worth
    // failing a training job for).
    if (const char* addr = std::getenv("WHARF_METRICS_ADDR"); addr != nullptr && *addr != '\0') {
      MetricsExportOptions export_options;
      export_options.address = addr;
      if (absl::Status s = (*runtime)->StartMetricsExport(export_options); !s.ok()) {
        std::fprintf(stderr, "wharf: WHARF_METRICS_ADDR: %s\n", std::string(s.message()).c_str());
      } else if (auto asked = ParseMetricsAddress(addr);
                 asked.ok() && asked->second == 0 && (*runtime)->metrics_exporter()->serving()) {
        // Port 0 picked a port: children (DataLoader workers, forked or spawned) inherit it,
        // so they report to this server instead of each serving on a port of its own.
        const std::string bound =
            absl::StrCat(asked->first, ":", (*runtime)->metrics_exporter()->port());
        setenv("WHARF_METRICS_ADDR", bound.c_str(), 1);
      }
    }
  }
  return *runtime;
}

std::vector<MetricPoint> Runtime::MetricPoints() { return wharf::MetricPoints(metrics_); }

absl::Status Runtime::StartMetricsExport(const MetricsExportOptions& options) {
  {
    absl::MutexLock lock(&mu_);
    if (exporter_ != nullptr) {
      return absl::FailedPreconditionError("metrics export: already started in this process");
    }
  }
  // Started outside the lock: a reporter's first write reads the runtime.
  absl::StatusOr<std::unique_ptr<MetricsExporter>> exporter =
      MetricsExporter::Start(*this, options);
  if (!exporter.ok()) return exporter.status();
  absl::MutexLock lock(&mu_);
  exporter_ = *std::move(exporter);
  return absl::OkStatus();
}

MetricsExporter* Runtime::metrics_exporter() {
  absl::MutexLock lock(&mu_);
  return exporter_.get();
}

void Runtime::Configure(std::optional<uint64_t> memory_budget, std::optional<int> inflight) {
  std::shared_ptr<Runtime> runtime = Default();
  {
    absl::MutexLock lock(&default_mu);
    if (configured_budget == nullptr) configured_budget = new std::optional<uint64_t>;
    if (configured_inflight == nullptr) configured_inflight = new std::optional<int>;
    if (memory_budget) *configured_budget = memory_budget;
    if (inflight) *configured_inflight = inflight;
  }
  runtime->SetOptions(memory_budget, inflight);
}

void Runtime::SetOptions(std::optional<uint64_t> memory_budget, std::optional<int> inflight) {
  absl::MutexLock lock(&mu_);
  if (memory_budget) {
    options_.memory_budget = *memory_budget;
    budget_->set_limit(*memory_budget);
  }
  if (inflight) options_.inflight = *inflight;
}

RuntimeOptions Runtime::options() const {
  absl::MutexLock lock(&mu_);
  return options_;
}

int Runtime::inflight() const {
  absl::MutexLock lock(&mu_);
  return options_.inflight;
}

ThreadPool& Runtime::blocking_pool() {
  absl::MutexLock lock(&mu_);
  if (!blocking_pool_) blocking_pool_ = std::make_unique<ThreadPool>(options_.blocking_threads);
  return *blocking_pool_;
}

Timer& Runtime::timer() {
  absl::MutexLock lock(&mu_);
  if (!timer_) timer_ = std::make_unique<Timer>();
  return *timer_;
}

LinkEstimator& Runtime::link(const std::string& store) {
  absl::MutexLock lock(&mu_);
  auto& slot = links_[store];
  if (!slot) slot = std::make_unique<LinkEstimator>();
  return *slot;
}

}  // namespace wharf
