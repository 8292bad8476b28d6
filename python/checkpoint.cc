// Checkpoints (checkpoint/): the root of a set of checkpoints (CheckpointRoot: layout,
// manifests, copies between roots) and the byte movers the PyTorch Distributed Checkpoint
// backend and CheckpointManager (python/wharf/torch/checkpoint.py) call with tensors' memory.
//
// Memory is handed over as (address, nbytes) pairs of ints (torch: t.data_ptr(),
// t.untyped_storage() sizes; every dtype, bfloat16 included, which numpy cannot view) or as
// any object with the buffer protocol (bytes, memoryview, numpy arrays); the caller keeps the
// memory alive and unchanged for the call, which holds a buffer view of protocol objects and
// releases the GIL while the bytes move.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "checkpoint/catalog.h"
#include "checkpoint/io.h"
#include "python/binding.h"

namespace wharf::python {
namespace {

using checkpoint::CheckpointRoot;
using checkpoint::Manifest;

py::dict ManifestToDict(const Manifest& m) {
  py::dict d;
  d["step"] = m.step;
  d["time"] = absl::ToDoubleSeconds(m.time - absl::UnixEpoch());
  py::dict metrics;
  for (const auto& [k, v] : m.metrics) metrics[py::str(k)] = v;
  d["metrics"] = metrics;
  py::list files;
  for (const auto& f : m.files) {
    py::dict one;
    one["path"] = f.path;
    one["size"] = f.size;
    one["etag"] = f.etag;
    files.append(one);
  }
  d["files"] = files;
  d["bytes"] = m.bytes;
  d["world_size"] = m.world_size;
  d["layout"] = m.layout;
  d["user_json"] = m.user_json;
  return d;
}

// Memory given as (address, nbytes) or a buffer-protocol object; views are kept in `views`.
absl::Span<char> Memory(const py::handle& obj, bool writable,
                        std::vector<std::unique_ptr<BufferView>>& views) {
  if (py::isinstance<py::tuple>(obj) && py::len(obj) == 2) {
    auto t = obj.cast<py::tuple>();
    const auto addr = t[0].cast<uintptr_t>();
    const auto size = t[1].cast<size_t>();
    if (addr == 0 && size > 0) {
      Raise(absl::InvalidArgumentError("a null address with a nonzero size"));
    }
    return absl::Span<char>(reinterpret_cast<char*>(addr), size);
  }
  views.push_back(std::make_unique<BufferView>(obj, writable));
  return absl::Span<char>(views.back()->data(), views.back()->size());
}

// A cancel token Python holds (checkpoint writes on a pool thread, cancelled from the thread
// that Ctrl-C reaches).
struct CancelScope {
  CancelToken token = NewCancelToken();
};

class PyCheckpointRoot {
 public:
  PyCheckpointRoot(const std::string& uri, const py::kwargs& options) {
    StoreOptions opts = StoreOptionsFromKwargs(options);
    root_ = Check(WithoutGil([&] { return CheckpointRoot::Open(uri, opts); }));
  }

  const CheckpointRoot& root() const { return *root_; }

  py::dict List() {
    auto listing = Check(WithoutGil([&] { return root_->List(); }));
    py::list complete;
    for (const Manifest& m : listing.complete) complete.append(ManifestToDict(m));
    py::dict d;
    d["complete"] = complete;
    d["incomplete"] = py::cast(listing.incomplete);
    py::list damaged;  // [(step, why)]: manifests that are not one
    for (const auto& [step, why] : listing.damaged) {
      damaged.append(py::make_tuple(step, std::string(why.message())));
    }
    d["damaged"] = damaged;
    return d;
  }

  py::dict Read(int64_t step) {
    return ManifestToDict(Check(WithoutGil([&] { return root_->Read(step); })));
  }

  // [{path, size, etag}] of the step as it is here (checked against its manifest).
  py::list Files(int64_t step) {
    auto files = Check(WithoutGil([&]() -> absl::StatusOr<std::vector<checkpoint::ManifestFile>> {
      WHARF_ASSIGN_OR_RETURN(Manifest m, root_->Read(step));
      return root_->Files(m);
    }));
    py::list out;
    for (const auto& f : files) {
      py::dict one;
      one["path"] = f.path;
      one["size"] = f.size;
      one["etag"] = f.etag;
      out.append(one);
    }
    return out;
  }

  py::dict Commit(int64_t step, const std::map<std::string, double>& metrics, int world_size,
                  const std::string& layout, const std::string& user_json,
                  const std::map<std::string, uint64_t>& expected) {
    CheckpointRoot::CommitOptions options;
    options.metrics = metrics;
    options.world_size = world_size;
    options.layout = layout;
    options.user_json = user_json;
    options.expected = expected;
    return ManifestToDict(Check(WithoutGil([&] { return root_->Commit(step, options); })));
  }

  void Delete(int64_t step) {
    Check(WithoutGil([&] { return root_->Delete(step); }));
  }

  int RemoveLeftovers() {
    return Check(WithoutGil([&] { return root_->RemoveLeftovers(); }));
  }
  int RemoveAbandoned(int64_t before_step) {
    return Check(WithoutGil([&] { return root_->RemoveAbandoned(before_step); }));
  }

  py::dict ReadConfig() {
    auto c = Check(WithoutGil([&] { return root_->ReadConfig(); }));
    py::dict d;
    d["export_to"] = c.export_to;
    d["metric"] = c.metric;
    d["mode"] = c.mode;
    return d;
  }

  void WriteConfig(const std::string& export_to, const std::string& metric,
                   const std::string& mode) {
    Check(WithoutGil([&] { return root_->WriteConfig({export_to, metric, mode}); }));
  }

  // files: [(key relative to the root, [memory, ...]), ...] -> [(key, size, etag), ...]
  // `cancel`: a CancelScope another thread may cancel (Ctrl-C in the thread that waits for
  // this one): the writes in flight are aborted, their uploads too.
  py::list WriteFiles(const py::list& files, int max_files_in_flight, const py::object& cancel) {
    std::vector<std::unique_ptr<BufferView>> views;
    std::vector<checkpoint::FileToWrite> todo;
    for (const py::handle& f : files) {
      auto t = f.cast<py::tuple>();
      checkpoint::FileToWrite file;
      file.key = root_->prefix() + t[0].cast<std::string>();
      for (const py::handle& region : t[1]) {
        absl::Span<char> m = Memory(region, /*writable=*/false, views);
        file.regions.push_back(absl::Span<const char>(m.data(), m.size()));
      }
      todo.push_back(std::move(file));
    }
    checkpoint::WriteFilesOptions options;
    options.max_files_in_flight = max_files_in_flight;
    CancelToken token = cancel.is_none() ? nullptr : cancel.cast<CancelScope&>().token;
    auto written = Check(WithoutGilIn(std::move(token), [&] {
      return checkpoint::WriteFiles(*root_->store(), std::move(todo), options);
    }));
    py::list out;
    for (const auto& w : written) {
      out.append(py::make_tuple(w.key.substr(root_->prefix().size()), w.size, w.etag));
    }
    return out;
  }

  // ranges: [(key relative to the root, offset, length, memory, etag), ...] -> stats
  py::dict ReadRanges(const py::list& ranges, int max_in_flight, uint64_t max_request_bytes,
                      uint64_t coalesce_gap) {
    std::vector<std::unique_ptr<BufferView>> views;
    std::vector<RangeToRead> todo;
    for (const py::handle& r : ranges) {
      auto t = r.cast<py::tuple>();
      RangeToRead range;
      range.key = root_->prefix() + t[0].cast<std::string>();
      range.offset = t[1].cast<uint64_t>();
      range.length = t[2].cast<uint64_t>();
      absl::Span<char> m = Memory(t[3], /*writable=*/true, views);
      if (m.size() < range.length) {
        Raise(absl::InvalidArgumentError(absl::StrCat("read ", root_->store()->Uri(range.key),
                                                      ": destination of ", m.size(), " bytes for ",
                                                      range.length)));
      }
      range.dst = m.data();
      if (t.size() > 4 && !t[4].is_none()) range.etag = t[4].cast<std::string>();
      todo.push_back(std::move(range));
    }
    ReadRangesOptions options;
    options.max_in_flight = max_in_flight;
    options.max_request_bytes = max_request_bytes;
    options.coalesce_gap = coalesce_gap;
    auto stats = Check(
        WithoutGil([&] { return wharf::ReadRanges(*root_->store(), std::move(todo), options); }));
    py::dict d;
    d["ranges"] = stats.ranges;
    d["requests"] = stats.requests;
    d["bytes"] = stats.bytes;
    d["bytes_fetched"] = stats.bytes_fetched;
    return d;
  }

  // The whole object at `key` (relative to the root), or None when it does not exist.
  py::object ReadObject(const std::string& key) {
    auto text = WithoutGil([&] { return root_->store()->Read(root_->prefix() + key); });
    if (absl::IsNotFound(text.status())) return py::none();
    return py::bytes(Check(std::move(text)));
  }

  // Writes one small object atomically (`.metadata`).
  void PutObject(const std::string& key, const py::bytes& data) {
    std::string bytes = data;
    Check(WithoutGil(
        [&] { return root_->store()->Put(root_->prefix() + key, absl::Cord(std::move(bytes))); }));
  }

  // Deleting a missing key succeeds.
  void DeleteObject(const std::string& key) {
    Check(WithoutGil([&] { return root_->store()->Delete(root_->prefix() + key); }));
  }

  bool Exists(const std::string& key) {
    auto head = WithoutGil([&] { return root_->store()->Head(root_->prefix() + key); });
    if (absl::IsNotFound(head.status())) return false;
    Check(head.status());
    return true;
  }

 private:
  std::shared_ptr<CheckpointRoot> root_;
};

}  // namespace

void RegisterCheckpoint(py::module_& m) {
  py::class_<CancelScope>(m, "CancelScope",
                          "A cancellation shared by calls on other threads: cancel() aborts "
                          "their requests in flight")
      .def(py::init<>())
      .def("cancel", [](CancelScope& c) { c.token->Cancel(); })
      .def_property_readonly("cancelled",
                             [](const CancelScope& c) { return IsCancelled(c.token); });

  py::class_<PyCheckpointRoot>(
      m, "CheckpointRoot",
      "Where checkpoints live (a bucket prefix, a local directory, a directory of a tier): "
      "step-<N>/ directories committed by a manifest written last (docs/design/checkpoint.md)")
      .def(py::init<const std::string&, const py::kwargs&>(), py::arg("uri"))
      .def_property_readonly("uri", [](const PyCheckpointRoot& r) { return r.root().uri(); })
      .def_property_readonly("is_local",
                             [](const PyCheckpointRoot& r) { return r.root().is_local(); })
      .def_property_readonly("in_tier",
                             [](const PyCheckpointRoot& r) { return r.root().tier() != nullptr; })
      .def_property_readonly("local_dir",
                             [](const PyCheckpointRoot& r) { return r.root().local_dir(); })
      .def("step_uri",
           [](const PyCheckpointRoot& r, int64_t step) { return r.root().StepUri(step); })
      .def_static(
          "step_dir", [](int64_t step) { return checkpoint::StepDirName(step); }, py::arg("step"),
          "The directory name of a step: step-<N:012d>")
      .def("list", &PyCheckpointRoot::List,
           "{'complete': [manifest, ...] by step, 'incomplete': [step, ...]}")
      .def("files", &PyCheckpointRoot::Files, py::arg("step"),
           "The step's files here now (path, size, etag), checked against its manifest")
      .def("read", &PyCheckpointRoot::Read, py::arg("step"),
           "The manifest of a complete checkpoint (NotFoundError otherwise)")
      .def("commit", &PyCheckpointRoot::Commit, py::arg("step"),
           py::arg("metrics") = std::map<std::string, double>{}, py::arg("world_size") = 1,
           py::arg("layout") = "dcp", py::arg("user_json") = "{}",
           py::arg("expected") = std::map<std::string, uint64_t>{},
           "Writes the step's manifest (last): the checkpoint exists from now on")
      .def("delete", &PyCheckpointRoot::Delete, py::arg("step"))
      .def("remove_abandoned", &PyCheckpointRoot::RemoveAbandoned, py::arg("before_step"))
      .def("remove_leftovers", &PyCheckpointRoot::RemoveLeftovers,
           "Temporary files of dead writers and multipart uploads of files directly in the "
           "folder (what killed DCP saves left); how many were removed")
      .def("read_config", &PyCheckpointRoot::ReadConfig)
      .def("write_config", &PyCheckpointRoot::WriteConfig, py::arg("export_to") = "",
           py::arg("metric") = "", py::arg("mode") = "min")
      .def("write_files", &PyCheckpointRoot::WriteFiles, py::arg("files"),
           py::arg("max_files_in_flight") = 0, py::arg("cancel") = py::none())
      .def("read_ranges", &PyCheckpointRoot::ReadRanges, py::arg("ranges"),
           py::arg("max_in_flight") = 0, py::arg("max_request_bytes") = 0,
           py::arg("coalesce_gap") = uint64_t{256} << 10)
      .def("read_object", &PyCheckpointRoot::ReadObject, py::arg("key"))
      .def("put_object", &PyCheckpointRoot::PutObject, py::arg("key"), py::arg("data"))
      .def("delete_object", &PyCheckpointRoot::DeleteObject, py::arg("key"))
      .def("exists", &PyCheckpointRoot::Exists, py::arg("key"));

  m.def(
      "copy_checkpoint",
      [](const PyCheckpointRoot& from, const PyCheckpointRoot& to, int64_t step, int inflight,
         bool exported) {
        checkpoint::CopyOptions options;
        options.inflight = inflight;
        options.mark_exported = exported;
        auto s = Check(WithoutGil(
            [&] { return checkpoint::CopyCheckpoint(from.root(), to.root(), step, options); }));
        py::dict d;
        d["manifest"] = ManifestToDict(s.manifest);
        d["files"] = s.files;
        d["bytes"] = s.bytes;
        d["skipped"] = s.skipped;
        d["aborted_uploads"] = s.aborted_uploads;
        d["seconds"] = absl::ToDoubleSeconds(s.elapsed);
        return d;
      },
      py::arg("src"), py::arg("dst"), py::arg("step"), py::arg("inflight") = 0,
      py::arg("exported") = false,
      "Copies complete checkpoint `step` from one root to another, manifest last; "
      "exported=True: an export (from a tier, the copied files lose `local`)");
}

}  // namespace wharf::python
