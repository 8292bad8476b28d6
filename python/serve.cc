// Serving (serve/): a safetensors model loaded straight into tensors the Python side
// allocated (wharf.serve.load_safetensors / iter_safetensors, python/wharf/serve/).
//
// _SafetensorsLoad(uris, **store_options) opens the files and reads their headers; Python
// reads `tensors`, allocates one tensor each (torch.empty) and calls start() with their
// addresses; the bytes then move on a thread of this object while next() hands out the index
// of each tensor as it completes (waiting without the GIL). close() (and destruction) cancels
// what is still in flight and waits for it, so no request touches a tensor after it returns.
// read_spans() instead reads pieces of the files into given addresses and returns when they
// are in (the GIL released; several threads may call it at once): the Python side stages a
// model through a few pinned buffers on its way to an accelerator with it. close() cancels
// those calls too (they raise); their callers wait for them before freeing the buffers.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/fork.h"
#include "python/binding.h"
#include "serve/model_loader.h"

namespace wharf::python {
namespace {

using serve::ModelLoadOptions;
using serve::SafetensorsModel;

class PySafetensorsLoad {
 public:
  PySafetensorsLoad(const std::vector<std::string>& uris, int max_in_flight,
                    uint64_t max_request_bytes, const py::kwargs& kwargs)
      : generation_(ForkGeneration()), cancel_(NewCancelToken()) {
    ModelLoadOptions options;
    options.store = StoreOptionsFromKwargs(kwargs);
    options.max_in_flight = max_in_flight;
    options.max_request_bytes = max_request_bytes;
    model_ = Check(WithoutGil([&] { return SafetensorsModel::Open(uris, options); }));
  }
  PySafetensorsLoad(const PySafetensorsLoad&) = delete;
  PySafetensorsLoad& operator=(const PySafetensorsLoad&) = delete;

  ~PySafetensorsLoad() {
    if (generation_ != ForkGeneration()) {
      // A forked child: the thread does not exist here; never join or destroy it.
      (void)thread_.release();
      (void)model_.release();
      return;
    }
    ReleaseGil release;
    Stop();
  }

  // (name, dtype, shape, nbytes, file index, offset in the file) per tensor, in load order.
  py::list Tensors() const {
    py::list out;
    for (const serve::ModelTensor& t : model_->tensors()) {
      py::tuple shape(t.tensor->shape.size());
      for (size_t i = 0; i < t.tensor->shape.size(); ++i) shape[i] = t.tensor->shape[i];
      out.append(py::make_tuple(t.tensor->name, t.tensor->dtype, shape, t.tensor->size, t.file,
                                t.tensor->offset));
    }
    return out;
  }

  py::list Files() const {
    py::list out;
    for (const serve::ModelFile& f : model_->files()) {
      py::dict d;
      d["uri"] = f.uri;
      d["size"] = f.size;
      d["etag"] = f.etag;
      d["metadata"] = f.header.metadata;
      d["tensors"] = f.header.tensors.size();
      out.append(d);
    }
    return out;
  }

  void Start(const std::vector<uintptr_t>& addresses) {
    if (thread_ != nullptr) Raise(absl::FailedPreconditionError("load safetensors: started twice"));
    if (addresses.size() != model_->tensors().size()) {
      Raise(absl::InvalidArgumentError("load safetensors: one address per tensor expected"));
    }
    dsts_.reserve(addresses.size());
    for (uintptr_t a : addresses) dsts_.push_back(reinterpret_cast<char*>(a));
    thread_ = std::make_unique<std::thread>(StartThread([this] {
      absl::StatusOr<ReadRangesStats> read = model_->Read(
          dsts_,
          [this](size_t i) {
            absl::MutexLock lock(&mu_);
            ready_.push_back(i);
          },
          cancel_);
      absl::MutexLock lock(&mu_);
      status_ = read.status();
      finished_ = true;
    }));
  }

  // The next complete tensor's index; None when all were handed out. Raises the load's error.
  py::object Next() {
    if (thread_ == nullptr) Raise(absl::FailedPreconditionError("load safetensors: not started"));
    std::optional<size_t> index;
    absl::Status status;
    // Ctrl-C here cancels the load (cancel_ is the thread's token) and raises once it ended.
    WithoutGilIn(cancel_, [&] {
      absl::MutexLock lock(&mu_);
      AwaitInterruptibly(mu_,
                         absl::Condition(
                             +[](PySafetensorsLoad* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
                               return !self->ready_.empty() || self->finished_;
                             },
                             this));
      if (!status_.ok()) {
        status = status_;
      } else if (!ready_.empty()) {
        index = ready_.front();
        ready_.pop_front();
      }
      return 0;
    });
    if (!status.ok()) Raise(status);
    if (!index.has_value()) return py::none();
    return py::int_(*index);
  }

  // Reads (file index, offset, size, address) spans; returns the bytes read. Raises the
  // read's error (a cancelled one after close()).
  uint64_t ReadSpans(const std::vector<std::tuple<size_t, uint64_t, uint64_t, uintptr_t>>& spans) {
    std::vector<serve::ModelSpan> todo;
    todo.reserve(spans.size());
    for (const auto& [file, offset, size, address] : spans) {
      todo.push_back({file, offset, size, reinterpret_cast<char*>(address)});
    }
    absl::StatusOr<ReadRangesStats> read =
        WithoutGilIn(cancel_, [&] { return model_->ReadSpans(todo, nullptr, cancel_); });
    return Check(std::move(read)).bytes;
  }

  void Close() {
    ReleaseGil release;
    Stop();
  }

 private:
  // Cancels what is in flight (nothing when finished) and waits for the thread.
  void Stop() {
    cancel_->Cancel();
    if (thread_ == nullptr) return;
    if (thread_->joinable()) thread_->join();
  }

  const uint64_t generation_;
  std::unique_ptr<SafetensorsModel> model_;
  std::vector<char*> dsts_;
  const CancelToken cancel_;
  std::unique_ptr<std::thread> thread_;
  absl::Mutex mu_;
  std::deque<size_t> ready_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

void RegisterServe(py::module_& m) {
  py::class_<PySafetensorsLoad>(m, "_SafetensorsLoad")
      .def(py::init<const std::vector<std::string>&, int, uint64_t, const py::kwargs&>(),
           py::arg("uris"), py::arg("max_in_flight") = 0, py::arg("max_request_bytes") = 0)
      .def_property_readonly("tensors", &PySafetensorsLoad::Tensors)
      .def_property_readonly("files", &PySafetensorsLoad::Files)
      .def("start", &PySafetensorsLoad::Start, py::arg("addresses"))
      .def("next", &PySafetensorsLoad::Next)
      .def("read_spans", &PySafetensorsLoad::ReadSpans, py::arg("spans"))
      .def("close", &PySafetensorsLoad::Close);
}

}  // namespace wharf::python
