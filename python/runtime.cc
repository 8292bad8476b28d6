// Bindings of the process's runtime (base/runtime.h): wharf.configure(), wharf.metrics(),
// wharf.parse_size() and the SIZE arguments (`memory_budget=`) of the other bindings.
//
// The budget is the process's one bound on data bytes; every engine object of the module
// (get_many, SampleReader, SampleStream, RecordStream) takes its buffers from it, and a
// `memory_budget=` argument is that call's cap inside it (docs/design/python.md).
#include "base/runtime.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file_io.h"
#include "base/log.h"
#include "base/profiler.h"
#include "python/binding.h"

namespace wharf::python {

uint64_t SizeArg(const py::handle& value, const char* name) {
  if (py::isinstance<py::bool_>(value)) {
    PyErr_SetString(PyExc_TypeError, absl::StrCat(name, ": expected a size, got a bool").c_str());
    throw py::error_already_set();
  }
  if (py::isinstance<py::int_>(value)) {
    const py::int_ v = py::reinterpret_borrow<py::int_>(value);
    if (v < py::int_(0)) {
      Raise(absl::InvalidArgumentError(absl::StrCat(name, ": a size must not be negative")));
    }
    return v.cast<uint64_t>();
  }
  if (py::isinstance<py::str>(value)) {
    absl::StatusOr<uint64_t> size = ParseSize(value.cast<std::string>());
    if (!size.ok())
      Raise(absl::InvalidArgumentError(absl::StrCat(name, ": ", size.status().message())));
    return *size;
  }
  PyErr_SetString(PyExc_TypeError,
                  absl::StrCat(name, ": expected an int (bytes) or a str such as \"256M\", got ",
                               std::string(py::str(py::type::handle_of(value).attr("__name__"))))
                      .c_str());
  throw py::error_already_set();
}

namespace {

// A name the registry would abort on is a ValueError here (Python passes any string).
void CheckMetricName(const std::string& name) {
  if (!MetricsRegistry::ValidName(name)) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat("metric name ", name, ": expected ^wharf_[a-z0-9_]+$")));
  }
}

py::dict Metrics() {
  std::shared_ptr<Runtime> rt = Runtime::Default();
  py::dict counters, gauges, histograms;
  for (const MetricPoint& s : rt->MetricPoints()) {
    // Keyed as Prometheus writes a series: name{label="value",...} (the bare name when it
    // has no labels), so the dict prints and serializes as it reads.
    std::string key = s.name;
    if (!s.labels.empty()) {
      key += "{";
      for (size_t i = 0; i < s.labels.size(); ++i) {
        absl::StrAppend(&key, i > 0 ? "," : "", s.labels[i].first, "=\"", s.labels[i].second, "\"");
      }
      key += "}";
    }
    py::object value;
    py::dict* into = nullptr;
    switch (s.kind) {
      case MetricsRegistry::Kind::kCounter:
        value = py::int_(static_cast<uint64_t>(s.value));
        into = &counters;
        break;
      case MetricsRegistry::Kind::kGauge:
        value = py::int_(static_cast<int64_t>(s.value));
        into = &gauges;
        break;
      case MetricsRegistry::Kind::kHistogram: {
        py::dict h;
        py::list buckets;
        for (size_t i = 0; i < s.bounds.size(); ++i) {
          buckets.append(py::make_tuple(s.bounds[i], s.counts[i]));
        }
        h["buckets"] = buckets;  // (upper bound, cumulative count)
        h["count"] = s.counts.empty() ? 0 : s.counts.back();
        h["sum"] = s.sum;
        value = h;
        into = &histograms;
        break;
      }
    }
    (*into)[py::str(key)] = value;
  }
  py::dict out;
  out["counters"] = counters;
  out["gauges"] = gauges;
  out["histograms"] = histograms;
  return out;
}

}  // namespace

void RegisterRuntime(py::module_& m) {
  m.def(
      "parse_size", [](py::handle v) { return SizeArg(v, "size"); }, py::arg("size"),
      "Bytes of a SIZE: an int, or a str with an optional K, M, G or T suffix (powers of "
      "1024): \"256M\" is 268435456");
  m.def(
      "_configure",
      [](py::object memory_budget, std::optional<int> inflight) {
        std::optional<uint64_t> budget;
        if (!memory_budget.is_none()) {
          budget = SizeArg(memory_budget, "memory_budget");
          if (*budget == 0) Raise(absl::InvalidArgumentError("memory_budget: must be positive"));
        }
        if (inflight && (*inflight < 1 || *inflight > 65536)) {
          Raise(absl::InvalidArgumentError("inflight: expected an integer in [1, 65536]"));
        }
        WithoutGil([&] {
          Runtime::Configure(budget, inflight);
          return 0;
        });
      },
      py::arg("memory_budget") = py::none(), py::arg("inflight") = py::none());
  m.def(
      "_set_log_level", [](const std::string& level) { SetLogLevel(Check(ParseLogLevel(level))); },
      py::arg("level"), "Sets the log level: debug, info, warning, error or off (WHARF_LOG)");
  m.def("_runtime_options", [] {
    std::shared_ptr<Runtime> rt = Runtime::Default();
    const RuntimeOptions o = rt->options();
    py::dict d;
    d["memory_budget"] = rt->budget().limit();
    d["inflight"] = o.inflight;  // 0: derived per engine
    return d;
  });
  m.def(
      "_reset_peak", [] { Runtime::Default()->budget().ResetPeak(); },
      "Resets the budget's peak to what is held now (tests and benchmarks measure a phase)");
  // Metrics recorded from Python (the prediction cache, wharf.serve): a handle is looked up
  // once and kept, so recording is one atomic add (base/metrics.h). The metric lives as
  // long as the process's runtime, which outlives every Python object.
  py::class_<Counter>(m, "_Counter")
      .def(
          "add", [](Counter& c, uint64_t n) { c.Add(n); }, py::arg("n") = 1)
      .def_property_readonly("value", &Counter::value);
  py::class_<Histogram>(m, "_Histogram")
      .def("observe", &Histogram::Observe, py::arg("value"))
      .def_property_readonly("count", &Histogram::count);
  m.def(
      "_counter",
      [](const std::string& name, const std::string& help, const MetricLabels& labels) {
        CheckMetricName(name);
        return Runtime::Default()->metrics().GetCounter(name, help, labels);
      },
      py::arg("name"), py::arg("help"), py::arg("labels") = MetricLabels{},
      py::return_value_policy::reference,
      "The runtime's counter `name` with `labels` (a list of (key, value) pairs), created on "
      "first use; name: ^wharf_[a-z0-9_]+_total$");
  m.def(
      "_histogram",
      [](const std::string& name, const std::string& help, std::vector<double> bounds,
         const MetricLabels& labels) {
        CheckMetricName(name);
        if (bounds.empty() || !std::is_sorted(bounds.begin(), bounds.end())) {
          Raise(absl::InvalidArgumentError("histogram bounds: expected a sorted, non-empty list"));
        }
        return Runtime::Default()->metrics().GetHistogram(name, help, std::move(bounds), labels);
      },
      py::arg("name"), py::arg("help"), py::arg("bounds"), py::arg("labels") = MetricLabels{},
      py::return_value_policy::reference,
      "The runtime's histogram `name` with upper `bounds` and `labels`, created on first use");
  m.def(
      "_metrics_export",
      [](const std::string& address) {
        Check(Runtime::Default()->StartMetricsExport(MetricsExportOptions{address}));
      },
      py::arg("address"), "Serves (or reports) the metrics at HOST:PORT (WHARF_METRICS_ADDR)");
  m.def(
      "_metrics_exporter",
      []() -> py::object {
        MetricsExporter* e = Runtime::Default()->metrics_exporter();
        if (e == nullptr) return py::none();
        py::dict d;
        d["serving"] = e->serving();
        d["port"] = e->port();
        return d;
      },
      "None, or {'serving': this process serves /metrics, 'port': its port}");
  m.def(
      "_metrics_flush",
      [] {
        // Only an exporter that already exists: a process that never used wharf has nothing
        // to report, and must not create a runtime at exit.
        WithoutGil([] {
          if (MetricsExporter* e = Runtime::Default()->metrics_exporter()) e->Flush();
          return 0;
        });
      },
      "A reporting process writes its metrics for the serving one now (at exit)");
  m.def(
      "metrics_text",
      [] {
        MetricsExporter* e = Runtime::Default()->metrics_exporter();
        return MetricPointsToPrometheusText(e != nullptr ? e->Collect()
                                                         : Runtime::Default()->MetricPoints());
      },
      "The runtime's metrics in the Prometheus text format: what /metrics answers now "
      "(WHARF_METRICS_ADDR; with its reporters' added in when this process serves them)");
  m.def("metrics", &Metrics,
        "The runtime's metrics: {'counters': {...}, 'gauges': {...}, 'histograms': {...}}, "
        "each keyed by series: 'name' or 'name{label=\"value\",...}' (docs/design/metrics.md). "
        "Gauges include the memory budget's limit, held, peak and pooled bytes.");

  // The profiler (base/profiler.h), driven by wharf.profile (python/wharf/_profile.py).
  py::list stages;
  for (int i = 0; i < kProfileStages; ++i) {
    stages.append(std::string(ProfileStageId(static_cast<ProfileStage>(i))));
  }
  m.attr("_profile_stages") = stages;  // ids in the order _profile_record numbers them
  m.def("_profile_start", [] { Check(Profiler::Get().Start()); });
  m.def("_profile_start_in_child", [] { Profiler::Get().StartInChild(); });
  m.def(
      "_profile_record",
      [](int stage, int64_t start_ns, int64_t end_ns) {
        if (stage < 0 || stage >= kProfileStages) {
          Raise(absl::InvalidArgumentError(absl::StrCat("profile stage ", stage)));
        }
        Profiler::Get().Record(static_cast<ProfileStage>(stage), start_ns, end_ns);
      },
      py::arg("stage"), py::arg("start_ns"), py::arg("end_ns"),
      "Adds a span of a stage (an index into _profile_stages) on this thread, in "
      "time.perf_counter_ns() nanoseconds");
  m.def(
      "_profile_stop",
      [](const std::string& spool) {
        ProfileReport r = WithoutGil([] { return Profiler::Get().Stop(); });
        if (!spool.empty()) {
          WithoutGil([&] {
            Profiler::Get().MergeSpool(spool, r);
            return 0;
          });
        }
        return py::make_tuple(r.ToJson(), r.Table());
      },
      py::arg("spool") = "",
      "Stops the profile; merges the workers' files in `spool`; returns (report JSON, table)");
  m.def(
      "_profile_spool",
      [](const std::string& folder) {
        const std::string json = Profiler::Get().SpoolJson();
        Check(WithoutGil([&] {
          return WriteFileAtomically(absl::StrCat(folder, "/", getpid(), ".json"), json);
        }));
      },
      py::arg("folder"), "Writes this process's profile into the parent's spool folder");
  m.def(
      "_profile_trace",
      [](const std::string& path) {
        Check(WithoutGil([&] { return Profiler::Get().WriteTrace(path); }));
      },
      py::arg("path"), "Writes the last profile's Chrome/Perfetto trace to `path`");
  m.def("_profile_trace_path", &DefaultProfileTracePath);
  m.def("_profile_requested", &ProfileRequestedByEnvironment,
        "WHARF_PROFILE is set to 1/true/yes/on");
}

}  // namespace wharf::python
