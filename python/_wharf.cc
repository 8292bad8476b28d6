// The `wharf._wharf` extension: thin pybind11 wrappers over the C++ library (convention 12).
// Types are converted, Statuses become Python exceptions, and the GIL is released around every
// wait. Bytes reach Python without a copy: Buffer exposes the library's buffers through the
// buffer protocol (memoryview / numpy.frombuffer / torch.frombuffer see the same memory).
// Not linked against torch.
//
// This file holds the module, the exceptions, Buffer and Store; dataset.cc the dataset core
// (index, sampler, map-style reader, per-partition stream) and records.cc the record readers
// over shards (tar, TFRecord, CSV / JSON lines), file.cc the raw files under wharf.open. What
// they share is in binding.h.
//
// Fork safety: a Store remembers the fork generation it was opened in and reopens itself in a
// forked child (DataLoader workers), whose copy of the parent's event loop has no thread.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/fork.h"
#include "io/fetch_scheduler.h"
#include "io/parallel_list.h"
#include "python/binding.h"
#include "store/gcs/gcs_json_store.h"
#include "store/gcs/gcs_store.h"
#include "store/local/local_store.h"
#include "store/registry.h"
#include "store/s3/s3_store.h"
#include "tier/tier_store.h"

namespace wharf::python {
namespace {

// Exception types, created in the module init.
PyObject* g_error = nullptr;       // wharf.WharfError(OSError)
PyObject* g_not_found = nullptr;   // wharf.NotFoundError(WharfError, FileNotFoundError)
PyObject* g_permission = nullptr;  // wharf.PermissionDeniedError(WharfError, PermissionError)
PyObject* g_exists = nullptr;      // wharf.AlreadyExistsError(WharfError, FileExistsError)
PyObject* g_data_loss = nullptr;   // wharf.DataLossError(WharfError, ValueError)

// Ctrl-C (binding.h): the main thread's ident, set at import and in a forked child (whose
// main thread is the one that forked).
std::atomic<unsigned long> g_main_thread{0};
// What the poll caught on this thread: the exception a signal handler raised.
#if PY_VERSION_HEX >= 0x030C0000
thread_local PyObject* t_caught = nullptr;
#else
thread_local PyObject* t_caught_type = nullptr;
thread_local PyObject* t_caught_value = nullptr;
thread_local PyObject* t_caught_traceback = nullptr;
#endif

}  // namespace

bool InterpreterFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

ReleaseGil::~ReleaseGil() noexcept(false) {
  if (InterpreterFinalizing() && !OnPythonMainThread()) {
    for (;;) pause();  // the process ends around this thread
  }
  PyEval_RestoreThread(tstate_);
}

bool OnPythonMainThread() {
  return PyThread_get_thread_ident() == g_main_thread.load(std::memory_order_relaxed);
}

bool PollPythonSignals() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() == 0) return false;
#if PY_VERSION_HEX >= 0x030C0000
  t_caught = PyErr_GetRaisedException();
  return t_caught != nullptr;
#else
  PyErr_Fetch(&t_caught_type, &t_caught_value, &t_caught_traceback);
  return t_caught_type != nullptr;
#endif
}

void RaiseCaughtSignal() {
#if PY_VERSION_HEX >= 0x030C0000
  if (t_caught == nullptr) return;
  PyErr_SetRaisedException(std::exchange(t_caught, nullptr));
#else
  if (t_caught_type == nullptr) return;
  PyErr_Restore(std::exchange(t_caught_type, nullptr), std::exchange(t_caught_value, nullptr),
                std::exchange(t_caught_traceback, nullptr));
#endif
  throw py::error_already_set();
}

[[noreturn]] void Raise(const absl::Status& status) {
  PyObject* type = g_error;
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      type = g_not_found;
      break;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      type = g_permission;
      break;
    case absl::StatusCode::kAlreadyExists:
      type = g_exists;
      break;
    case absl::StatusCode::kDataLoss:
      type = g_data_loss;
      break;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      type = PyExc_ValueError;
      break;
    default:
      break;
  }
  // A message may quote a key that is not UTF-8 (a local file's name): its odd bytes are
  // shown escaped rather than turning the error into a UnicodeDecodeError.
  PyObject* message =
      PyUnicode_DecodeUTF8(status.message().data(),
                           static_cast<Py_ssize_t>(status.message().size()), "backslashreplace");
  if (message != nullptr) {
    PyErr_SetObject(type, message);
    Py_DECREF(message);
  }
  throw py::error_already_set();
}

Buffer Buffer::FromString(std::string s) {
  auto holder = std::make_shared<std::string>(std::move(s));
  const char* data = holder->data();
  const size_t size = holder->size();
  return Buffer(std::shared_ptr<const char>(holder, data), data, size);
}

Buffer Buffer::FromCord(absl::Cord cord) {
  // The pointer is taken after the move: a small Cord keeps its bytes inline, in the object.
  auto holder = std::make_shared<absl::Cord>(std::move(cord));
  absl::string_view flat;
  if (auto f = holder->TryFlat()) {
    flat = *f;
  } else {
    flat = holder->Flatten();
  }
  return Buffer(std::shared_ptr<const char>(holder, flat.data()), flat.data(), flat.size());
}

FetchOptions EngineOptions::ToFetchOptions() const {
  FetchOptions options;
  options.max_in_flight = max_in_flight;
  options.memory_budget = memory_budget;
  return options;
}

StoreHandle::StoreHandle(std::string uri, const StoreOptions& options) : uri_(std::move(uri)) {
  SpecAndKey parsed = Check(ParseStoreUri(uri_, options));
  spec_ = std::move(parsed.spec);
  prefix_ = std::move(parsed.key);
  Open();
}

StoreHandle::StoreHandle(std::string uri, StoreSpec spec, std::string prefix)
    : uri_(std::move(uri)), spec_(std::move(spec)), prefix_(std::move(prefix)) {
  Open();
}

py::tuple StoreHandle::State() const { return py::make_tuple(uri_, spec_.ToJson(), prefix_); }

StoreHandle StoreHandle::FromState(const py::object& state) {
  if (py::isinstance<py::str>(state)) return StoreHandle(state.cast<std::string>());
  auto t = state.cast<py::tuple>();
  if (t.size() != 3)
    Raise(absl::InvalidArgumentError("pickled store: expected (uri, spec, prefix)"));
  return StoreHandle(t[0].cast<std::string>(), Check(StoreSpec::FromJson(t[1].cast<std::string>())),
                     t[2].cast<std::string>());
}

std::shared_ptr<ObjectStore> StoreHandle::store() {
  if (generation_ != ForkGeneration()) Open();  // in a forked child: reopen (see fork.h)
  return store_;
}

std::string StoreHandle::Relative(const std::string& key) const {
  if (key.size() >= prefix_.size() && key.compare(0, prefix_.size(), prefix_) == 0) {
    return key.substr(prefix_.size());
  }
  return key;
}

void StoreHandle::Open() {
  // Deletes through a Store on a folder never remove the folder or what is above it.
  if (spec_.scheme == "file") LocalStore::KeepDirectory(absl::StrCat("/", prefix_));
  std::shared_ptr<ObjectStore> opened = Check(OpenSpec(spec_));
  // The parent's store is kept, not destroyed, in a child (base/fork.h).
  if (store_ != nullptr && generation_ != ForkGeneration()) {
    new std::shared_ptr<ObjectStore>(std::move(store_));
  }
  store_ = std::move(opened);
  generation_ = ForkGeneration();
}

StoreOptions StoreOptionsFromKwargs(const py::kwargs& kwargs) {
  StoreOptions options;
  for (const auto& [key, value] : kwargs) {
    const std::string name = py::str(key);
    if (value.is_none()) continue;
    std::string text;
    if (py::isinstance<py::bool_>(value) && name == "anonymous") {
      text = value.cast<bool>() ? "true" : "false";
    } else if (name == "cache" && py::hasattr(value, "__fspath__")) {  // a pathlib.Path
      text = py::str(py::module_::import("os").attr("fspath")(value));
    } else if (py::isinstance<py::str>(value) && name != "anonymous") {
      text = value.cast<std::string>();
    } else if (std::find(StoreOptions::Names().begin(), StoreOptions::Names().end(), name) !=
               StoreOptions::Names().end()) {
      PyErr_SetString(PyExc_TypeError, absl::StrCat("store option '", name, "' takes ",
                                                    name == "anonymous" ? "a bool" : "a str",
                                                    ", not ", Py_TYPE(value.ptr())->tp_name)
                                           .c_str());
      throw py::error_already_set();
    }
    Check(options.Set(name, text));
  }
  return options;
}

namespace {

py::dict MetaToDict(const ObjectMeta& m) {
  py::dict d;
  d["key"] = KeyToPython(m.key);
  d["size"] = m.size;
  d["etag"] = m.etag;
  d["mtime"] = absl::ToDoubleSeconds(m.mtime - absl::UnixEpoch());
  return d;
}

// A store opened from a URI ("s3://bucket/prefix", "file:///path"); keys are relative to the
// URI's key, which acts as a prefix.
class Store {
 public:
  explicit Store(StoreHandle handle) : handle_(std::move(handle)) {}

  std::shared_ptr<ObjectStore> store() { return handle_.store(); }
  std::string Key(const std::string& key) const { return handle_.Key(key); }
  const std::string& uri() const { return handle_.uri(); }

  std::string Uri(const KeyArg& key) { return store()->Uri(Key(key.value)); }
  const StoreHandle& handle() const { return handle_; }

  py::list List(const KeyArg& prefix_arg, bool recursive, int parallel, int limit) {
    const std::string& prefix = prefix_arg.value;
    auto s = store();
    const std::string& base = handle_.prefix();
    ListOptions options;
    options.prefix = Key(prefix);
    ListPage all;
    if (limit < 0) throw py::value_error("list: limit must be >= 0 (0: no limit)");
    if (parallel < 0) {
      throw py::value_error("list: parallel must be >= 0 (0: one listing, N: N workers)");
    }
    if (limit > 0) {
      // One page of at most `limit` entries: enough to tell whether a prefix holds anything
      // (wharf.fsspec's isdir) without listing all of it.
      if (!recursive) options.delimiter = "/";
      options.page_size = std::min(limit, s->capabilities().max_page_size);
      all = Check(WithoutGil([&] { return s->List(options); }));
      all.continuation.clear();
      // A server may send more than it was asked for (the GCS emulator ignores maxResults):
      // the first `limit` entries in key order, objects and prefixes together.
      size_t objects = 0, prefixes = 0;
      while (objects + prefixes < static_cast<size_t>(limit) &&
             (objects < all.objects.size() || prefixes < all.common_prefixes.size())) {
        const bool take_object = prefixes == all.common_prefixes.size() ||
                                 (objects < all.objects.size() &&
                                  all.objects[objects].key < all.common_prefixes[prefixes]);
        ++(take_object ? objects : prefixes);
      }
      all.objects.resize(objects);
      all.common_prefixes.resize(prefixes);
    } else if (recursive && parallel > 0) {
      all.objects =
          Check(WithoutGil([&] { return ParallelListAll(*s, options, {.workers = parallel}); }));
    } else {
      if (!recursive) options.delimiter = "/";
      all = Check(WithoutGil([&] { return s->ListAll(options); }));
    }
    py::list out;
    for (ObjectMeta& m : all.objects) {
      m.key = m.key.substr(base.size());
      out.append(MetaToDict(m));
    }
    for (const std::string& p : all.common_prefixes) {
      py::dict d;
      d["prefix"] = KeyToPython(p.substr(base.size()));
      out.append(d);
    }
    return out;
  }

  py::dict Head(const KeyArg& key_arg) {
    const std::string& key = key_arg.value;
    auto s = store();
    ObjectMeta m = Check(WithoutGil([&] { return s->Head(Key(key)); }));
    m.key = key;
    return MetaToDict(m);
  }

  Buffer Get(const KeyArg& key_arg, std::optional<int64_t> start, std::optional<int64_t> end) {
    const std::string& key = key_arg.value;
    auto s = store();
    if (end && *end < 0) {
      throw py::value_error(absl::StrCat("get ", key, ": end=", *end,
                                         " is negative (a negative start=-N reads the last N "
                                         "bytes; end counts from the object's first byte)"));
    }
    if (start && *start < 0) {
      // The last N bytes, as data[-N:] (one suffix-range request, no HEAD first).
      if (end) {
        throw py::value_error(absl::StrCat("get ", key, ": a negative start=", *start,
                                           " (the last ", -*start, " bytes) takes no end"));
      }
      const uint64_t n = static_cast<uint64_t>(-(*start + 1)) + 1;
      return Buffer::FromString(
          Check(WithoutGil([&] { return s->Read(Key(key), ByteRange::Last(n)); })));
    }
    const uint64_t from = start.value_or(0);
    if (end && static_cast<uint64_t>(*end) <= from) {
      // An empty range, as a slice of bytes: b"" for an object that exists.
      Check(WithoutGil([&] { return s->Head(Key(key)); }));
      return Buffer::FromString(std::string());
    }
    ByteRange range;
    if (start || end) {
      range = end ? ByteRange::Of(from, static_cast<uint64_t>(*end) - from) : ByteRange::From(from);
    }
    absl::StatusOr<std::string> data = WithoutGil([&] { return s->Read(Key(key), range); });
    if (!data.ok() && data.status().code() == absl::StatusCode::kOutOfRange) {
      // A range starting at or past the end: b"" like a slice, once the size confirms it.
      absl::StatusOr<ObjectMeta> meta = WithoutGil([&] { return s->Head(Key(key)); });
      if (meta.ok() && from >= meta->size) return Buffer::FromString(std::string());
    }
    return Buffer::FromString(Check(std::move(data)));
  }

  // Many objects at once through the I/O engine; returns buffers in the order of `keys`.
  // Buffers come from the runtime's one budget (capped at `memory_budget`, 0: no cap of its
  // own); each result is copied out as it arrives and its buffer released, so the budget
  // bounds what is in flight however much the list holds (the list is the caller's memory).
  // Results are taken as they complete, not in order: an ordered batch would hold later
  // results while an earlier object waits for room they occupy.
  // `items`: keys, or entries of list() (mappings with "key" and, optionally, "size" and
  // "etag"): with a size the engine plans each read at once (a key alone costs a first GET
  // whose answer tells the size; a second one for an object longer than it), and with an ETag
  // every read is pinned to that version, so an object changed since the listing fails with
  // the object's URI instead of passing off other bytes.
  std::vector<Buffer> GetMany(const py::sequence& items_in, int inflight,
                              const py::object& memory_budget) {
    if (py::isinstance<py::str>(items_in) || py::isinstance<py::bytes>(items_in)) {
      // A str is a sequence too: its characters would be fetched as keys.
      throw py::type_error(
          "get_many: keys must be a list of keys or list() entries, not one str (use get() "
          "for one object, or get_many([key]))");
    }
    if (inflight < 0) throw py::value_error("get_many: inflight must be >= 0 (0: the runtime's)");
    auto s = store();
    FetchOptions options;
    options.max_in_flight = inflight;
    options.memory_budget = SizeArg(memory_budget, "memory_budget");
    // Results are released as they arrive, so a full budget is always someone else's bytes
    // (or a release on its way): wait for room rather than fail.
    options.wait_for_release = true;
    std::vector<FetchItem> items;
    items.reserve(py::len(items_in));
    for (const py::handle& entry : items_in) {
      FetchItem item;
      py::object key = py::reinterpret_borrow<py::object>(entry);
      if (!py::isinstance<py::str>(entry)) {
        if (!py::hasattr(entry, "get")) {
          throw py::type_error(absl::StrCat(
              "get_many: each item is a key (str) or an entry of list() (a dict with \"key\"), "
              "not ",
              Py_TYPE(entry.ptr())->tp_name));
        }
        key = entry.attr("get")("key", py::none());
        if (!py::isinstance<py::str>(key)) {
          throw py::type_error("get_many: an entry that is a mapping needs a str \"key\"");
        }
        if (py::object size = entry.attr("get")("size", py::none()); !size.is_none()) {
          if (!py::isinstance<py::int_>(size) || size.cast<py::int_>() < py::int_(0) ||
              size.cast<py::int_>() > py::int_(std::numeric_limits<int64_t>::max())) {
            throw py::value_error(
                absl::StrCat("get_many: the \"size\" of an entry is a byte count (an int >= 0), "
                             "got ",
                             py::repr(size).cast<std::string>()));
          }
          item.size = size.cast<uint64_t>();
        }
        if (py::object etag = entry.attr("get")("etag", py::none()); !etag.is_none()) {
          if (!py::isinstance<py::str>(etag)) {
            throw py::type_error(absl::StrCat("get_many: the \"etag\" of an entry is a str, got ",
                                              py::repr(etag).cast<std::string>()));
          }
          item.etag = etag.cast<std::string>();
        }
      }
      item.key = Key(key.cast<KeyArg>().value);
      items.push_back(std::move(item));
    }
    const size_t n = items.size();
    std::vector<std::string> bytes(n);
    absl::Status status = WithoutGil([&] {
      FetchScheduler scheduler(s, options);
      auto batch = scheduler.Fetch(std::move(items));
      absl::Status first;  // the failure of the first key in order
      size_t first_index = n;
      while (auto r = batch->Next()) {
        if (!r->data.ok()) {
          if (r->index < first_index) {
            first_index = r->index;
            first = r->data.status();
          }
          continue;
        }
        bytes[r->index].assign(r->data->data(), r->data->size());
      }
      return first;
    });
    Check(status);
    std::vector<Buffer> out;
    out.reserve(bytes.size());
    for (std::string& b : bytes) out.push_back(Buffer::FromString(std::move(b)));
    return out;
  }

  py::dict Put(const KeyArg& key_arg, const py::buffer& data, bool if_absent) {
    const std::string& key = key_arg.value;
    auto s = store();
    // One contiguous span of bytes (a strided view, e.g. a[::2], is a BufferError rather than
    // the memory under it). The Cord references the caller's memory while the put runs
    // without the GIL; the view keeps that memory alive until we return.
    BufferView view(data, /*writable=*/false);
    absl::Cord cord =
        absl::MakeCordFromExternal(absl::string_view(view.data(), view.size()), [] {});
    PutOptions options;
    options.if_absent = if_absent;
    ObjectMeta m = Check(WithoutGil([&] { return s->Put(Key(key), std::move(cord), options); }));
    m.key = key;
    return MetaToDict(m);
  }

  void Delete(const KeyArg& key) {
    auto s = store();
    Check(WithoutGil([&] { return s->Delete(Key(key.value)); }));
  }

  void DeleteMany(const std::vector<KeyArg>& keys) {
    auto s = store();
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(Key(k.value));
    Check(WithoutGil([&] { return s->DeleteMany(std::move(full)); }));
  }

  // Server-side copy within this store (S3 CopyObject, GCS rewrite, a file copy).
  py::dict Copy(const KeyArg& src_key, const KeyArg& dst_key) {
    auto s = store();
    ObjectMeta m =
        Check(WithoutGil([&] { return s->Copy(Key(src_key.value), Key(dst_key.value)); }));
    m.key = dst_key.value;
    return MetaToDict(m);
  }

  // Creates the store's bucket where the backend has bucket administration (S3, GCS); false,
  // doing nothing, for any other store (file://). The registry's stores are decorated
  // (metered, maybe a tier), so the backend is opened on its own from the spec for this.
  bool CreateBucket() {
    StoreSpec spec = handle_.spec();
    spec.options.cache.reset();  // the registry's option, not the backend's
    absl::StatusOr<std::shared_ptr<ObjectStore>> backend;
    if (spec.scheme == "s3") {
      backend = WithoutGil([&] { return s3::OpenS3Spec(spec); });
    } else if (spec.scheme == "gs") {
      backend = WithoutGil([&] { return gcs::OpenGcsSpec(spec); });
    } else {
      return false;
    }
    std::shared_ptr<ObjectStore> s = Check(std::move(backend));
    absl::Status status;
    if (auto* s3 = dynamic_cast<s3::S3Store*>(s.get())) {
      status = WithoutGil([&] { return s3->CreateBucket(); });
    } else if (auto* gcs = dynamic_cast<gcs::GcsJsonStore*>(s.get())) {
      status = WithoutGil([&] { return gcs->CreateBucket(); });
    } else {
      return false;
    }
    Check(status);
    return true;
  }

 private:
  StoreHandle handle_;
};

}  // namespace

PYBIND11_MODULE(_wharf, m) {
  m.doc() = "wharf: fast object-store I/O for ML (C++ core)";
  g_main_thread =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  py::module_::import("os").attr("register_at_fork")(
      py::arg("after_in_child") =
          py::cpp_function([] { g_main_thread = PyThread_get_thread_ident(); }));
  RegisterTierCache(StoreRegistry::Global());  // cache= and WHARF_CACHE
  m.def(
      "list_buckets",
      [](std::string scheme, const py::kwargs& options) {
        // "gs://" (a URI without a bucket, as `wharf ls gs://` takes it) is the scheme too.
        if (absl::EndsWith(scheme, "://")) scheme.resize(scheme.size() - 3);
        if (scheme.find_first_of(":/") != std::string::npos) {
          throw py::value_error(
              absl::StrCat("list_buckets: expected a scheme such as 's3' or "
                           "'gs://', got '",
                           scheme, "'"));
        }
        const StoreOptions opts = StoreOptionsFromKwargs(options);
        std::vector<BucketInfo> buckets =
            Check(WithoutGil([&] { return StoreRegistry::Global().ListBuckets(scheme, opts); }));
        py::list out;
        for (const BucketInfo& b : buckets) {
          py::dict d;
          d["name"] = b.name;
          d["created"] = b.creation_time == absl::InfinitePast()
                             ? py::object(py::none())
                             : py::object(py::float_(
                                   absl::ToDoubleSeconds(b.creation_time - absl::UnixEpoch())));
          out.append(d);
        }
        return out;
      },
      py::arg("scheme"),
      "The buckets of the endpoint of `scheme` (\"s3\", \"gs\", or \"s3://\"), as dicts with name "
      "and "
      "created (seconds since the epoch, or None); store options as for Store (endpoint=, "
      "region=, profile=, ...)");
  m.def(
      "_tier_at_exit", [] { WithoutGil([] { return TierStore::AtExit(), 0; }); },
      "What exit does for this process's cache stores and tiers (counters written, temporary "
      "directories removed), for children that end with os._exit (multiprocessing)");

  static py::exception<std::runtime_error> error(m, "WharfError", PyExc_OSError);
  g_error = error.ptr();
  // Multiple inheritance so `except FileNotFoundError` works too.
  py::object builtins = py::module_::import("builtins");
  py::object type = builtins.attr("type");
  // __module__ names where pickle finds them (DCP pickles a rank's error to send it to the
  // coordinator).
  error.attr("__doc__") =
      "A wharf operation failed; the message names the operation, the object and the cause "
      "(an OSError; the subclasses below are also the matching built-in errors)";
  auto attrs = [](const char* doc) {
    py::dict d;
    d["__module__"] = "wharf._wharf";
    d["__doc__"] = doc;
    return d;
  };
  py::object not_found =
      type("NotFoundError", py::make_tuple(error, builtins.attr("FileNotFoundError")),
           attrs("The object, prefix or bucket does not exist (also a FileNotFoundError)"));
  py::object permission =
      type("PermissionDeniedError", py::make_tuple(error, builtins.attr("PermissionError")),
           attrs("The store refused the credentials or their permissions (also a "
                 "PermissionError)"));
  py::object exists =
      type("AlreadyExistsError", py::make_tuple(error, builtins.attr("FileExistsError")),
           attrs("A create-only write found the key taken (also a FileExistsError)"));
  py::object data_loss =
      type("DataLossError", py::make_tuple(error, builtins.attr("ValueError")),
           attrs("The data is corrupt or malformed: a record, a file's header (safetensors), "
                 "bytes that fail their checksum (also a ValueError)"));
  m.attr("NotFoundError") = not_found;
  m.attr("PermissionDeniedError") = permission;
  m.attr("AlreadyExistsError") = exists;
  m.attr("DataLossError") = data_loss;
  // The store option names (keyword arguments of wharf.Store and everything that opens a URI).
  m.attr("store_option_names") = py::tuple(py::cast(StoreOptions::Names()));
  g_not_found = not_found.release().ptr();
  g_permission = permission.release().ptr();
  g_exists = exists.release().ptr();
  g_data_loss = data_loss.release().ptr();

  py::class_<Buffer>(m, "Buffer", py::buffer_protocol(),
                     "Read-only bytes owned by wharf; zero-copy via memoryview, "
                     "numpy.frombuffer or torch.frombuffer.")
      .def_buffer([](Buffer& b) {
        return py::buffer_info(const_cast<char*>(b.data()), 1, "B", 1,
                               {static_cast<py::ssize_t>(b.size())}, {1}, /*readonly=*/true);
      })
      .def("__len__", &Buffer::size)
      .def("__bytes__", [](const Buffer& b) { return py::bytes(b.data(), b.size()); })
      .def("__repr__",
           [](const Buffer& b) { return absl::StrCat("<wharf.Buffer ", b.size(), " bytes>"); })
      // Pickled as its bytes (a copy), e.g. when a DataLoader worker sends samples to the main
      // process; the copy is a Buffer again.
      .def(py::pickle([](const Buffer& b) { return py::bytes(b.data(), b.size()); },
                      [](const py::bytes& data) { return Buffer::FromString(std::string(data)); }));

  py::class_<Store, std::shared_ptr<Store>>(m, "Store",
                                            "An object store opened from a URI; keys are "
                                            "relative to the URI's path, which is a plain key "
                                            "prefix: end it with '/' for a folder "
                                            "(Store('s3://b/a/').url('x') is s3://b/a/x, "
                                            "Store('s3://b/a').url('x') is s3://b/ax).")
      .def(py::init([](UriArg uri, const py::kwargs& options) {
             return std::make_shared<Store>(
                 StoreHandle(uri.Folder(), StoreOptionsFromKwargs(options)));
           }),
           py::arg("uri"),
           "Store(uri, *, endpoint=None, region=None, anonymous=None, profile=None, "
           "addressing_style=None, api=None, cache=None): store options override the URI's "
           "query options (s3://bucket/prefix/?region=...); unset ones come from the "
           "environment. cache=TIER_DIR reads through a tier (WHARF_CACHE for a whole "
           "process)")
      .def_property_readonly("uri", &Store::uri, "The URI the store was opened from")
      .def_property_readonly(
          "spec", [](const Store& s) { return s.handle().spec().ToJson(); },
          "The store spec (JSON, no credentials) the store is opened from")
      .def("url", &Store::Uri, py::arg("key"), "The full URI of a key")
      .def("list", &Store::List, py::arg("prefix") = "", py::arg("recursive") = true,
           py::arg("parallel") = 0, py::arg("limit") = 0,
           "Objects (dicts with key, size, etag, mtime) below prefix, in key order; without "
           "recursive, common prefixes too. parallel=N lists with N work-stealing workers. "
           "limit=N: one request for at most N entries (the first of the listing).")
      .def("head", &Store::Head, py::arg("key"),
           "The object's meta (a dict with key, size, etag, mtime) without its bytes; "
           "NotFoundError when it does not exist")
      .def("get", &Store::Get, py::arg("key"), py::arg("start") = py::none(),
           py::arg("end") = py::none(),
           "The object's bytes [start, end) as a Buffer; like a slice, a range that is empty or "
           "starts at or past the end gives no bytes (a missing object still raises), and "
           "get(key, -N) is the last N bytes (one suffix-range request)")
      .def("get_many", &Store::GetMany, py::arg("keys"), py::arg("inflight") = 0,
           py::arg("memory_budget") = 0,
           "Many objects at once through the I/O engine, in the order given. keys: str keys, "
           "or entries of list() (dicts with key, size, etag: reads planned from the listed "
           "size and pinned to the listed version). inflight: "
           "requests in flight (0: wharf.configure / WHARF_INFLIGHT, else derived); "
           "memory_budget: this call's cap inside the process's budget (int or \"64M\"; "
           "0: none of its own)")
      .def("put", &Store::Put, py::arg("key"), py::arg("data"), py::arg("if_absent") = false,
           "Uploads data as the object `key`; its meta. if_absent=True creates only: "
           "AlreadyExistsError (a FileExistsError) when the key holds an object, decided by "
           "the store atomically")
      .def("delete", &Store::Delete, py::arg("key"),
           "Deletes the object `key`; deleting a missing object is not an error")
      .def("delete_many", &Store::DeleteMany, py::arg("keys"),
           "Deletes the objects of a list of keys, in batches (S3 DeleteObjects); missing "
           "ones are not an error")
      .def("copy", &Store::Copy, py::arg("src_key"), py::arg("dst_key"),
           "Server-side copy of src_key to dst_key within this store; the new object's meta")
      .def("_create_bucket", &Store::CreateBucket,
           "Creates the store's bucket (S3, GCS JSON); False where the store has no bucket "
           "administration (used by wharf.fsspec's mkdir)")
      // Pickled as its spec (no credentials), reopened from it (see StoreHandle).
      .def(py::pickle([](const Store& s) -> py::object { return s.handle().State(); },
                      [](const py::object& state) {
                        return std::make_shared<Store>(StoreHandle::FromState(state));
                      }));

  RegisterDataset(m);
  RegisterRecords(m);
  RegisterRuntime(m);
  RegisterFiles(m);
  RegisterCheckpoint(m);
  RegisterServe(m);
}

}  // namespace wharf::python
