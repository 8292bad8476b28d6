// What the files of the `wharf._wharf` extension share: Status -> exception conversion, running
// C++ with the GIL released, the zero-copy Buffer, fork-aware store handles and the rule for
// engine objects inherited across fork(). Internal to the extension.
//
// The rules every binding follows (convention 12):
//  - every call that may wait (I/O, a fetch batch, a listing, a permutation of many samples)
//    runs inside WithoutGil(); its Status is converted to an exception only after the GIL is
//    held again (raising without it crashes the interpreter);
//  - bytes reach Python as Buffer, which shares the C++ block (no copy);
//  - objects that own engine state (schedulers, open batches, object readers) remember the
//    ForkGeneration() they were created in. In a forked child (a DataLoader worker) stores are
//    reopened, stateless engine parts rebuilt, and engine parts with work in flight are never
//    used and never destroyed there (their threads do not exist in the child: destroying them
//    could wait forever), see LeakOrDestroy().
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/cancel.h"
#include "base/fork.h"
#include "dataset/index.h"
#include "io/fetch_scheduler.h"
#include "store/object_store.h"
#include "store/spec.h"

namespace wharf::python {

namespace py = pybind11;

// An object key from Python: a str, encoded as UTF-8 with surrogateescape, the inverse of
// KeyToPython. Keys are UTF-8 (listings leave other names out), so a str with escaped odd
// bytes reaches the store and is refused there naming the key, not by pybind11's TypeError.
struct KeyArg {
  std::string value;
};

// A URI from Python: a str, or an os.PathLike naming a local path (pathlib.Path), as open()
// and the os functions take it.
struct UriArg {
  std::string value;
  bool from_path = false;  // an os.PathLike, not a str
  // The URI of a folder: a path object names the folder itself (pathlib drops the trailing
  // '/' that a str URI needs: Store(Path("/data")) reads /data/<key>, not /data<key>).
  std::string Folder() const {
    return from_path && !value.empty() && value.back() != '/' ? value + "/" : value;
  }
};

// A key (or prefix) for Python: UTF-8 decoded with surrogateescape.
inline py::str KeyToPython(const std::string& key) {
  PyObject* s =
      PyUnicode_DecodeUTF8(key.data(), static_cast<Py_ssize_t>(key.size()), "surrogateescape");
  if (s == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(s);
}

// Sets the Python exception for `status` and throws py::error_already_set.
// REQUIRES: the GIL is held.
[[noreturn]] void Raise(const absl::Status& status);

// Whether the interpreter is being torn down (after atexit; only daemon threads are left
// besides the main thread, which runs the teardown).
bool InterpreterFinalizing();

// Releases the GIL for the scope, for a call into wharf. The thread takes its absl identity
// first (once per thread), so its first wait cannot race a fork (base/fork.h).
//
// Taking the GIL back at interpreter exit: CPython (before 3.14) ends a daemon thread that
// asks for it then by unwinding its stack (pthread_exit), and an unwind through a noexcept
// destructor is std::terminate, "terminate called without an active exception", rc 134 for
// a script whose daemon thread was in a wharf call. So a daemon thread that finds the
// teardown under way waits for the process to end instead (what Python 3.14 does with them),
// and the destructor is noexcept(false), so that the unwind of one that was already waiting
// for the GIL passes through (pybind11 lets it through its dispatcher).
class ReleaseGil {
 public:
  ReleaseGil() {
    EnsureThreadIdentity();
    tstate_ = PyEval_SaveThread();
  }
  ~ReleaseGil() noexcept(false);
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* tstate_ = nullptr;
};

// ---- Ctrl-C (base/cancel.h) ----
// On the main thread, a call blocked in wharf polls Python's signal handlers every
// kInterruptPollPeriod (taking the GIL for the check): when one raises (Ctrl-C's
// KeyboardInterrupt, or what a handler of the user's raises), the work of the call is
// cancelled, the call waits for it to end (soon: requests are aborted, nothing new is
// sent, multipart uploads are aborted) and then raises that exception instead of returning.

// The poll installed by WithoutGil on the main thread (_wharf.cc).
bool PollPythonSignals();
// Whether the calling thread is the main interpreter's main thread, which alone runs
// Python's signal handlers.
bool OnPythonMainThread();
// Raises what PollPythonSignals() caught on this thread, if anything. REQUIRES: the GIL.
void RaiseCaughtSignal();

// Runs `fn` with the GIL released and returns its result; convert it with Check() afterwards
// (the GIL is held again by then). The work runs with `scope` as its ambient token
// (base/cancel.h); a null one gets a token of its own, which is the right thing for a call
// whose work ends with it. An object whose calls leave work in flight between them (read-ahead
// of a stream or a file) passes its own token, so Ctrl-C in any of its calls stops all of it
// (and the object fails from then on with "cancelled"). Where Ctrl-C interrupted the call,
// its exception is raised once `fn` has returned.
template <typename Fn>
auto WithoutGilIn(CancelToken scope, Fn&& fn) {
  using R = decltype(fn());
  std::optional<R> result;
  const bool main = OnPythonMainThread();
  {
    ReleaseGil release;
    ScopedAmbientCancel ambient(scope != nullptr ? std::move(scope) : NewCancelToken());
    ScopedInterruptPoll poll(main ? &PollPythonSignals : nullptr);
    result.emplace(fn());
  }
  if (main) RaiseCaughtSignal();
  return std::move(*result);
}

template <typename Fn>
auto WithoutGil(Fn&& fn) {
  return WithoutGilIn(nullptr, std::forward<Fn>(fn));
}

template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return *std::move(v);
}
inline void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

// A Py_buffer held for the duration of one call (C-contiguous, as io requires).
class BufferView {
 public:
  BufferView(const py::handle& obj, bool writable) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) {
      throw py::error_already_set();
    }
  }
  ~BufferView() { PyBuffer_Release(&view_); }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;

  char* data() const { return static_cast<char*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_;
};

// Read-only bytes owned by C++ (a fetched block, a string, a Cord), exposed through the
// buffer protocol without a copy.
class Buffer {
 public:
  Buffer(std::shared_ptr<const char> owner, const char* data, size_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {}
  static Buffer FromString(std::string s);
  static Buffer FromFetch(const FetchBuffer& b) { return Buffer(b.block(), b.data(), b.size()); }
  // Shares the Cord's memory when it is one flat piece; otherwise flattens it once.
  static Buffer FromCord(absl::Cord cord);

  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::shared_ptr<const char> owner_;
  const char* data_;
  size_t size_;
};

// A store opened from a URI ("s3://bucket/prefix", "file:///path") or a StoreSpec, reopened
// in a forked child. Keys given to it are relative to the URI's key, which acts as a prefix.
// Pickled (State/FromState) as its URI, its spec's JSON and its prefix: the unpickled handle
// opens the spec, so the options it was opened with travel with it (a spawned DataLoader
// worker does not re-resolve the URI), while credentials, which the spec never holds, are
// resolved in the process that unpickles it.
class StoreHandle {
 public:
  // Raises for an invalid URI or option, or an unknown scheme. REQUIRES: the GIL is held.
  explicit StoreHandle(std::string uri, const StoreOptions& options = {});
  // `uri` is shown as the handle's URI; `prefix` is the key prefix within spec's store.
  StoreHandle(std::string uri, StoreSpec spec, std::string prefix);

  // (uri, spec JSON, prefix), and back. FromState also takes a bare URI string (pickles made
  // before specs). REQUIRES: the GIL is held.
  py::tuple State() const;
  static StoreHandle FromState(const py::object& state);

  // The store for this process. REQUIRES: the GIL is held (it may raise).
  std::shared_ptr<ObjectStore> store();
  // The URI's key: "train/" for "s3://bucket/train/".
  const std::string& prefix() const { return prefix_; }
  const std::string& uri() const { return uri_; }
  const StoreSpec& spec() const { return spec_; }
  std::string Key(const std::string& relative) const { return prefix_ + relative; }
  // A full store key relative to the URI's prefix when below it, else unchanged.
  std::string Relative(const std::string& key) const;
  // Whether this process is the one the store was opened in (false in a forked child until
  // store() reopens it).
  bool fresh() const { return generation_ == ForkGeneration(); }

 private:
  void Open();

  std::string uri_;
  StoreSpec spec_;
  std::string prefix_;
  std::shared_ptr<ObjectStore> store_;
  uint64_t generation_ = 0;
};

// The store options of Python keyword arguments (endpoint=, region=, anonymous=, profile=,
// addressing_style=, api=); None values are skipped. ValueError naming an unknown option
// (listing the valid ones) or a bad value; TypeError for a value of the wrong type.
StoreOptions StoreOptionsFromKwargs(const py::kwargs& kwargs);

// Destroys `p` with the GIL released when it was created in this process (`generation`);
// in a forked child leaks it instead: its work in flight belongs to threads that do not
// exist here, and tearing it down could wait for them forever (base/fork.h).
template <typename T>
void LeakOrDestroy(std::unique_ptr<T>& p, uint64_t generation) {
  if (!p) return;
  if (generation != ForkGeneration()) {
    (void)p.release();
    return;
  }
  ReleaseGil release;
  p.reset();
}
template <typename T>
void LeakOrDestroy(std::shared_ptr<T>& p, uint64_t generation) {
  if (!p) return;
  if (generation != ForkGeneration()) {
    new std::shared_ptr<T>(std::move(p));  // never deleted, on purpose
    return;
  }
  ReleaseGil release;
  p.reset();
}

// Marks a stream busy while it runs without the GIL: streams are used by one thread at a
// time, and a second Python thread calling in meanwhile gets RuntimeError instead of a data
// race. Constructed and destroyed with the GIL held (which guards `busy`).
class OneThread {
 public:
  // `what`: the kind of object, for the message ("stream", "file").
  explicit OneThread(bool& busy, const char* what = "stream") : busy_(busy) {
    if (busy_) {
      PyErr_SetString(PyExc_RuntimeError,
                      absl::StrCat("this ", what,
                                   " is being used by another thread; use one per "
                                   "thread")
                          .c_str());
      throw py::error_already_set();
    }
    busy_ = true;
  }
  ~OneThread() { busy_ = false; }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  bool& busy_;
};

// What the stream bindings (SampleStream, RecordStream) share: an engine stream owned by the
// process that created it (a forked child gets FailedPrecondition: the stream's read-ahead is
// in flight in the parent), read by one thread at a time with the GIL released. Derived sets
// stream_ in its constructor and provides py::object ToPython(Item&) for the stream's items.
template <typename Derived, typename Stream>
class StreamBinding {
 public:
  StreamBinding(const StreamBinding&) = delete;
  StreamBinding& operator=(const StreamBinding&) = delete;

  py::object Next() {
    Stream& s = stream();
    OneThread guard(busy_);
    auto item = Check(WithoutGilIn(scope_, [&] { return s.Next(); }));
    if (!item) throw py::stop_iteration();
    return self().ToPython(*item);
  }

  py::list NextBatch(size_t n) {
    Stream& s = stream();
    OneThread guard(busy_);
    auto items = Check(WithoutGilIn(scope_, [&] { return s.NextBatch(n); }));
    py::list out;
    for (auto& item : items) out.append(self().ToPython(item));
    return out;
  }

 protected:
  // `name`: the Python class, for messages.
  explicit StreamBinding(const char* name) : name_(name), generation_(ForkGeneration()) {}
  ~StreamBinding() { LeakOrDestroy(stream_, generation_); }

  Stream& stream() {
    if (generation_ != ForkGeneration()) {
      Raise(absl::FailedPreconditionError(
          absl::StrCat("this ", name_,
                       " was created in another process (before a fork): its read-ahead "
                       "is in flight there; create streams in the process that reads them (each "
                       "DataLoader worker creates its own in __iter__)")));
    }
    return *stream_;
  }

  const char* const name_;
  const uint64_t generation_;
  std::unique_ptr<Stream> stream_;
  bool busy_ = false;  // read and written with the GIL held
  // The ambient token of the stream's work (WithoutGilIn): Derived creates stream_ with it
  // too, so the read-ahead that calls leave in flight is cancelled by Ctrl-C in any of them.
  const CancelToken scope_ = NewCancelToken();

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
};

// The engine options the Python classes accept (FetchOptions subset).
struct EngineOptions {
  int max_in_flight = 0;  // 0: derived (FetchOptions)
  // This object's cap inside the runtime's one budget; 0: no cap of its own (the budget).
  uint64_t memory_budget = 0;

  FetchOptions ToFetchOptions() const;
};

// What a RecordStream (records.cc) takes from a wharf.SampleIndex (dataset.cc): the shard
// list, the store for this process, and the URI whose prefix keys are shown relative to.
// Raises TypeError when `index` is not a SampleIndex.
struct IndexParts {
  std::string uri;
  std::string prefix;
  std::shared_ptr<const SampleIndex> index;
  std::shared_ptr<ObjectStore> store;
};
IndexParts GetIndexParts(py::handle index);

// A SIZE argument: an int (bytes) or a str with an optional K/M/G/T suffix (powers of 1024).
// Raises TypeError / ValueError naming `name`. REQUIRES: the GIL is held.
uint64_t SizeArg(const py::handle& value, const char* name);

// Registration of each part of the module.
void RegisterDataset(py::module_& m);
void RegisterRecords(py::module_& m);
void RegisterRuntime(py::module_& m);     // runtime.cc: configure, metrics, parse_size
void RegisterFiles(py::module_& m);       // file.cc: the raw files under wharf.open
void RegisterCheckpoint(py::module_& m);  // checkpoint.cc: CheckpointRoot, copy_checkpoint
void RegisterServe(py::module_& m);       // serve.cc: _SafetensorsLoad (wharf.serve)

}  // namespace wharf::python

namespace pybind11::detail {
template <>
struct type_caster<wharf::python::KeyArg> {
  PYBIND11_TYPE_CASTER(wharf::python::KeyArg, const_name("str"));
  bool load(handle src, bool) {
    if (!PyUnicode_Check(src.ptr())) return false;
    PyObject* bytes = PyUnicode_AsEncodedString(src.ptr(), "utf-8", "surrogateescape");
    if (bytes == nullptr) {  // a surrogate that no escaped byte makes: not a key
      PyErr_Clear();
      return false;
    }
    value.value.assign(PyBytes_AS_STRING(bytes), static_cast<size_t>(PyBytes_GET_SIZE(bytes)));
    Py_DECREF(bytes);
    return true;
  }
};
template <>
struct type_caster<wharf::python::UriArg> {
  PYBIND11_TYPE_CASTER(wharf::python::UriArg, const_name("str | os.PathLike[str]"));
  bool load(handle src, bool) {
    if (PyBytes_Check(src.ptr())) {  // as pybind11's str argument takes it
      value.value.assign(PyBytes_AS_STRING(src.ptr()),
                         static_cast<size_t>(PyBytes_GET_SIZE(src.ptr())));
      return true;
    }
    if (!PyUnicode_Check(src.ptr()) && PyObject_HasAttrString(src.ptr(), "__fspath__") == 0) {
      return false;
    }
    value.from_path = !PyUnicode_Check(src.ptr());
    PyObject* path = PyOS_FSPath(src.ptr());  // a str is itself
    if (path == nullptr) {
      PyErr_Clear();
      return false;
    }
    const bool str = PyUnicode_Check(path);  // not a bytes path
    if (str) {
      PyObject* bytes = PyUnicode_AsEncodedString(path, "utf-8", "surrogateescape");
      if (bytes != nullptr) {
        value.value.assign(PyBytes_AS_STRING(bytes), static_cast<size_t>(PyBytes_GET_SIZE(bytes)));
        Py_DECREF(bytes);
      } else {
        PyErr_Clear();
      }
    }
    Py_DECREF(path);
    return str;
  }
};
}  // namespace pybind11::detail
