// The engine side of wharf.open() (python/wharf/_file.py): ObjectReadFile ("rb") and
// ObjectWriteFile ("wb"), the raw objects the Python io.BufferedIOBase class wraps.
//
// "rb" is an io/ObjectReader (chunked ranged GETs with read-ahead, charged to the runtime's
// budget; opening is one GET, of the first chunk, whose ETag pins every later GET) moved by
// Seek(). Bytes already in the current chunk are copied with the GIL held (no release per
// small read); a read that needs a chunk not here yet waits with the GIL released. readinto()
// copies straight from the chunk into the caller's buffer (one copy); read(n) allocates the bytes
// object and reads into it. Positions past the end are allowed, as for files: reads there return
// nothing.
//
// "wb" is the store's ObjectWriter (S3: a multipart upload whose parts go up in parallel).
// io's contract lets write() touch the caller's buffer only during the call, while the
// writer keeps its bytes until their part is uploaded, so every byte is copied once, into
// staging blocks of the runtime's budget (kStagingBlock bytes, the S3 default part size, so
// a part is one block and none is held back); the blocks return to the budget when their
// part is uploaded, which bounds the bytes in flight by the budget as for every other
// transfer (see Allocate() for the one exception). Close() commits (the object appears,
// atomically); Abort() or destruction without Close() leaves nothing (the writer's contract).
//
// Thread-safety: as io's raw objects, one thread at a time; the Python wrapper holds the GIL
// around every call except the waits.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/runtime.h"
#include "io/object_reader.h"
#include "io/read_ranges.h"
#include "python/binding.h"

namespace wharf::python {
namespace {

constexpr uint64_t kStagingBlock = uint64_t{8} << 20;
// peek() returns at most this much: io's readline() looks for the newline in it.
constexpr uint64_t kMaxPeek = uint64_t{64} << 10;

[[noreturn]] void RaiseClosed() {
  PyErr_SetString(PyExc_ValueError, "I/O operation on closed file.");
  throw py::error_already_set();
}

class ObjectReadFile {
 public:
  ObjectReadFile(StoreHandle handle, uint64_t chunk_size, int read_ahead, bool adaptive)
      : handle_(std::move(handle)), generation_(ForkGeneration()) {
    auto store = handle_.store();
    ObjectReaderOptions options;
    options.chunk_size = chunk_size;
    options.read_ahead = read_ahead;
    options.adaptive = adaptive;
    reader_ = Check(WithoutGilIn(
        scope_, [&] { return ObjectReader::Open(std::move(store), handle_.prefix(), options); }));
    size_ = reader_->meta().size;
    etag_ = reader_->meta().etag;
  }
  ~ObjectReadFile() { LeakOrDestroy(reader_, generation_); }
  ObjectReadFile(const ObjectReadFile&) = delete;
  ObjectReadFile& operator=(const ObjectReadFile&) = delete;

  uint64_t size() const { return size_; }
  const std::string& etag() const { return etag_; }
  uint64_t tell() const { return pos_; }
  bool closed() const { return reader_ == nullptr; }

  // Reads up to dst.size() bytes at the position; with `one_chunk`, at most what one chunk
  // (the current one, or the next after waiting) holds. Returns the bytes read.
  size_t ReadInto(char* dst, size_t n, bool one_chunk) {
    ObjectReader& r = reader();
    OneThread guard(busy_, "file");
    if (pos_ >= size_) return 0;
    n = static_cast<size_t>(std::min<uint64_t>(n, size_ - pos_));
    Checked(MoveReader(r));
    // What is here already: no GIL release.
    size_t done = Take(r, r.Buffered(), dst, n);
    if (done == n || (one_chunk && done > 0)) return done;
    absl::Status status = WithoutGilIn(scope_, [&]() -> absl::Status {
      if (!one_chunk) {
        // Large reads skip the chunk buffers: GETs straight into dst (ObjectReader).
        absl::Status s = r.ReadDirect(absl::MakeSpan(dst + done, n - done));
        if (s.ok()) {
          pos_ += n - done;
          done = n;
        }
        return s;
      }
      while (done < n) {
        auto view = r.Peek();
        if (!view.ok()) return view.status();
        if (view->empty()) break;  // cannot happen below size_, but never loop
        done += Take(r, *view, dst + done, n - done);
        if (one_chunk) break;
      }
      return absl::OkStatus();
    });
    Checked(status);
    return done;
  }

  size_t ReadIntoBuffer(const py::handle& b, bool one_chunk) {
    BufferView view(b, /*writable=*/true);
    return ReadInto(view.data(), view.size(), one_chunk);
  }

  // n < 0: to the end (read1: the rest of one chunk).
  py::bytes Read(int64_t n, bool one_chunk) {
    reader();
    const uint64_t left = pos_ < size_ ? size_ - pos_ : 0;
    uint64_t want = n < 0 ? left : std::min<uint64_t>(static_cast<uint64_t>(n), left);
    if (one_chunk && n < 0) {
      // The rest of the chunk at the position, waiting for it if needed.
      ObjectReader& r = reader();
      OneThread guard(busy_, "file");
      Checked(MoveReader(r));
      if (r.Buffered().empty() && left > 0) {
        auto view = Checked(WithoutGilIn(scope_, [&] { return r.Peek(); }));
        want = view.size();
      } else {
        want = r.Buffered().size();
      }
    }
    PyObject* bytes = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(want));
    if (bytes == nullptr) throw py::error_already_set();
    auto out = py::reinterpret_steal<py::bytes>(bytes);
    const size_t got = ReadInto(PyBytes_AS_STRING(bytes), want, one_chunk);
    if (got < want) {
      if (_PyBytes_Resize(&bytes, static_cast<Py_ssize_t>(got)) != 0) {
        out.release();
        throw py::error_already_set();
      }
      out.release();
      out = py::reinterpret_steal<py::bytes>(bytes);
    }
    return out;
  }

  // Up to kMaxPeek bytes from the position without moving it; waits for one chunk at most.
  py::bytes Peek() {
    ObjectReader& r = reader();
    if (pos_ >= size_) return py::bytes();
    OneThread guard(busy_, "file");
    Checked(MoveReader(r));
    absl::string_view view = r.Buffered();
    if (view.empty()) view = Checked(WithoutGilIn(scope_, [&] { return r.Peek(); }));
    view = view.substr(0, kMaxPeek);
    return py::bytes(view.data(), view.size());
  }

  uint64_t Seek(int64_t offset, int whence) {
    reader();
    int64_t base = 0;
    if (whence == 1) {
      base = static_cast<int64_t>(pos_);
    } else if (whence == 2) {
      base = static_cast<int64_t>(size_);
    } else if (whence != 0) {
      Raise(absl::InvalidArgumentError(
          absl::StrCat("invalid whence (", whence, ", should be 0, 1 or 2)")));
    }
    int64_t target = 0;
    if (__builtin_add_overflow(base, offset, &target)) {
      PyErr_SetString(PyExc_OverflowError, "seek position out of range");
      throw py::error_already_set();
    }
    if (target < 0) {
      Raise(absl::InvalidArgumentError(absl::StrCat("negative seek position ", target)));
    }
    // The reader moves on the next read: seeking back and forth between reads costs nothing.
    pos_ = static_cast<uint64_t>(target);
    return pos_;
  }

  void Close() {
    OneThread guard(busy_, "file");  // not under a read of another thread
    LeakOrDestroy(reader_, generation_);
  }

  py::dict Stats() {
    const ObjectReaderStats st = reader().stats();
    py::dict d;
    d["requests"] = st.requests;
    d["bytes_fetched"] = st.bytes_fetched;
    d["bytes_direct"] = st.bytes_direct;
    d["peak_buffered_bytes"] = st.peak_buffered_bytes;
    d["chunk_size"] = st.chunk_size;
    d["read_ahead"] = st.read_ahead;
    d["jumps"] = st.jumps;
    return d;
  }

 private:
  // Check() with the reason of an ETag mismatch spelled out.
  void Checked(const absl::Status& status) {
    if (status.code() == absl::StatusCode::kFailedPrecondition) {  // If-Match failed
      Raise(absl::FailedPreconditionError(absl::StrCat(
          status.message(), ": ", handle_.uri(), " was overwritten after it was opened (ETag ",
          etag_, " at open); reads never mix versions: open it again to read the new one")));
    }
    Check(status);
  }
  template <typename T>
  T Checked(absl::StatusOr<T> v) {
    if (!v.ok()) Checked(v.status());
    return *std::move(v);
  }

  ObjectReader& reader() {
    if (reader_ == nullptr) RaiseClosed();
    if (generation_ != ForkGeneration()) {
      Raise(absl::FailedPreconditionError(absl::StrCat(
          "this file of ", handle_.uri(),
          " was opened in another process (before a fork): its read-ahead is in flight there; "
          "open it again in the process that reads it")));
    }
    return *reader_;
  }

  // Moves the reader to the position (clamped to the end: reads past it return nothing).
  absl::Status MoveReader(ObjectReader& r) {
    const uint64_t at = std::min(pos_, size_);
    if (r.position() == at) return absl::OkStatus();
    return r.Seek(at);
  }

  // Copies up to n bytes of `view` to dst and advances; returns the count.
  size_t Take(ObjectReader& r, absl::string_view view, char* dst, size_t n) {
    const size_t k = std::min(view.size(), n);
    if (k == 0) return 0;
    std::memcpy(dst, view.data(), k);
    r.Consume(k);
    pos_ += k;
    return k;
  }

  StoreHandle handle_;
  const uint64_t generation_;
  std::unique_ptr<ObjectReader> reader_;
  uint64_t size_ = 0;
  std::string etag_;
  uint64_t pos_ = 0;   // may be past size_ (a seek beyond the end)
  bool busy_ = false;  // a call is waiting without the GIL (OneThread)
  // The ambient token of this file's work (binding.h WithoutGilIn): Ctrl-C in any call
  // stops the read-ahead or the upload that calls leave in flight.
  const CancelToken scope_ = NewCancelToken();
};

class ObjectWriteFile {
 public:
  // `exclusive`: create only (PutOptions::if_absent): Close fails with AlreadyExists when
  // the key holds an object by then.
  ObjectWriteFile(StoreHandle handle, bool exclusive)
      : handle_(std::move(handle)), generation_(ForkGeneration()) {
    auto store = handle_.store();
    uri_ = store->Uri(handle_.prefix());
    PutOptions options;
    options.if_absent = exclusive;
    writer_ =
        Check(WithoutGilIn(scope_, [&] { return store->NewWriter(handle_.prefix(), options); }));
    budget_ = Runtime::Default()->shared_budget();
    account_ = budget_->NewAccount(0, "write file " + uri_);
  }
  ~ObjectWriteFile() { Abort(); }
  ObjectWriteFile(const ObjectWriteFile&) = delete;
  ObjectWriteFile& operator=(const ObjectWriteFile&) = delete;

  uint64_t tell() const { return written_; }
  bool closed() const { return writer_ == nullptr; }

  size_t Write(const py::handle& b) {
    ObjectWriter& w = writer();
    RaiseIfInterrupted("write");
    std::optional<OneThread> guard(std::in_place, busy_, "file");
    BufferView view(b, /*writable=*/false);
    const char* src = view.data();
    const size_t n = view.size();
    absl::Status status = WithoutGilIn(scope_, [&]() -> absl::Status {
      size_t done = 0;
      while (done < n) {
        if (!staging_) {
          staging_ = Allocate();
          if (!staging_) return absl::CancelledError(absl::StrCat("write ", uri_, ": cancelled"));
          staged_ = 0;
        }
        const size_t k = std::min<size_t>(n - done, kStagingBlock - staged_);
        std::memcpy(staging_.get() + staged_, src + done, k);
        staged_ += k;
        done += k;
        if (staged_ == kStagingBlock) {
          if (absl::Status s = w.Write(TakeStaged()); !s.ok()) return s;
        }
      }
      return absl::OkStatus();
    });
    if (!status.ok()) {
      guard.reset();
      Abort();
      Raise(status);
    }
    written_ += n;
    return n;
  }

  // Commits: the object appears now, whole. On failure nothing is left (the writer aborts).
  py::dict Close() {
    ObjectWriter& w = writer();
    RaiseIfInterrupted("close");
    std::optional<OneThread> guard(std::in_place, busy_, "file");
    absl::StatusOr<ObjectMeta> meta = WithoutGilIn(scope_, [&]() -> absl::StatusOr<ObjectMeta> {
      if (staged_ > 0) {
        if (absl::Status s = w.Write(TakeStaged()); !s.ok()) return s;
      }
      staging_.reset();
      return w.Close();
    });
    guard.reset();
    if (!meta.ok()) {
      Abort();
      Raise(meta.status());
    }
    LeakOrDestroy(writer_, generation_);
    py::dict d;
    d["size"] = meta->size;
    d["etag"] = meta->etag;
    return d;
  }

  // A call that Ctrl-C interrupted cancelled the upload: the file is spent. Each later write
  // or close fails at once, rather than buffer bytes that can never be committed; the first
  // drops the upload and what the file holds (abort() or the finalizer then close it).
  void RaiseIfInterrupted(absl::string_view op) {
    if (!IsCancelled(scope_)) return;
    DropUpload();
    Raise(absl::CancelledError(absl::StrCat(
        op, " ", uri_, ": cancelled (an earlier call was interrupted); nothing was committed")));
  }

  // abort() of Python: not under a write of another thread.
  void AbortFromPython() {
    OneThread guard(busy_, "file");
    Abort();
  }

  // Drops the upload: nothing becomes visible. Idempotent.
  void Abort() {
    if (writer_ == nullptr) return;
    if (generation_ != ForkGeneration()) {  // the upload belongs to the parent
      (void)writer_.release();
      return;
    }
    DropUpload();
    LeakOrDestroy(writer_, generation_);
  }

 private:
  void DropUpload() {
    if (dropped_) return;
    dropped_ = true;
    ReleaseGil release;
    writer_->Abort();
    staging_.reset();
  }

  ObjectWriter& writer() {
    if (writer_ == nullptr) RaiseClosed();
    if (generation_ != ForkGeneration()) {
      Raise(absl::FailedPreconditionError(absl::StrCat(
          "this file of ", uri_, " was opened for writing in another process (before a fork)")));
    }
    return *writer_;
  }

  // A staging block from the budget, waiting for room: the blocks of parts in flight return
  // as the parts finish. A writer keeps bytes short of a part until more arrive, which no
  // wait gets back, so when this file alone holds the budget and nothing of it was released
  // for kStall, one block is taken outside the budget rather than wait forever; the store's
  // writer still bounds its parts in flight. The owner is a budget Block's: the charge
  // returns when the last reference (the uploaded part's) is gone. Null when the call was
  // interrupted while it waited.
  std::shared_ptr<char> Allocate() {
    constexpr absl::Duration kStall = absl::Seconds(2);
    std::shared_ptr<char> out;
    uint64_t last_held = account_->held();
    absl::Time last_change = absl::Now();
    (void)budget_->WaitUntil([&] {
      if (Block block = budget_->TryAllocate(account_, kStagingBlock)) {
        out = block.owner();
        return true;
      }
      const uint64_t held = account_->held();
      if (held != last_held) {
        last_held = held;
        last_change = absl::Now();
      } else if (budget_->held() <= held && absl::Now() - last_change >= kStall) {
        out = std::shared_ptr<char>(new char[kStagingBlock], std::default_delete<char[]>());
        return true;
      }
      return false;
    });
    return out;
  }

  absl::Cord TakeStaged() {
    std::shared_ptr<char> owner = std::move(staging_);
    const absl::string_view bytes(owner.get(), staged_);
    staged_ = 0;
    return absl::MakeCordFromExternal(bytes, [owner = std::move(owner)] {});
  }

  StoreHandle handle_;
  const uint64_t generation_;
  std::string uri_;
  std::unique_ptr<ObjectWriter> writer_;
  bool dropped_ = false;  // writer_'s upload was aborted
  std::shared_ptr<MemoryBudget> budget_;
  std::shared_ptr<MemoryBudget::Account> account_;
  std::shared_ptr<char> staging_;  // the block being filled, or null
  uint64_t staged_ = 0;
  uint64_t written_ = 0;
  bool busy_ = false;  // a call is waiting without the GIL (OneThread)
  // The ambient token of this file's work (binding.h WithoutGilIn).
  const CancelToken scope_ = NewCancelToken();
};

// Byte ranges of objects below one URI, read by parallel, coalesced ranged GETs
// (io/read_ranges.h) into new bytes objects: the Parquet row-group reader
// (wharf.torch's row datasets) and fsspec's cat_ranges. Pickled as its store handle.
class RangeReader {
 public:
  explicit RangeReader(StoreHandle handle) : handle_(std::move(handle)) {}

  // ranges: [(key relative to the URI, offset, length[, etag]), ...] -> [bytes, ...] in the
  // same order. Errors name the object; a range past an object's end is OutOfRange.
  py::list Read(const py::list& ranges, uint64_t coalesce_gap, int max_in_flight) {
    auto store = handle_.store();
    std::vector<RangeToRead> todo;
    std::vector<py::bytes> out;
    todo.reserve(py::len(ranges));
    out.reserve(py::len(ranges));
    for (const py::handle& r : ranges) {
      auto t = r.cast<py::tuple>();
      if (t.size() < 3 || t.size() > 4) {
        Raise(
            absl::InvalidArgumentError("read_ranges: each range is (key, offset, length[, etag])"));
      }
      RangeToRead range;
      range.key = handle_.Key(t[0].cast<std::string>());
      const int64_t offset = t[1].cast<int64_t>();
      const int64_t length = t[2].cast<int64_t>();
      if (offset < 0 || length < 0) {
        Raise(absl::InvalidArgumentError(absl::StrCat("read ", store->Uri(range.key), ": range (",
                                                      offset, ", ", length, ") is negative")));
      }
      range.offset = static_cast<uint64_t>(offset);
      range.length = static_cast<uint64_t>(length);
      if (t.size() == 4 && !t[3].is_none()) range.etag = t[3].cast<std::string>();
      PyObject* bytes = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(length));
      if (bytes == nullptr) throw py::error_already_set();
      out.push_back(py::reinterpret_steal<py::bytes>(bytes));
      range.dst = PyBytes_AS_STRING(bytes);
      todo.push_back(std::move(range));
    }
    ReadRangesOptions options;
    options.coalesce_gap = coalesce_gap;
    options.max_in_flight = max_in_flight;
    auto stats = WithoutGil([&] { return wharf::ReadRanges(*store, std::move(todo), options); });
    Check(stats.status());
    requests_ += stats->requests;
    bytes_fetched_ += stats->bytes_fetched;
    py::list result;
    for (auto& b : out) result.append(std::move(b));
    return result;
  }

  py::dict Stats() const {
    py::dict d;
    d["requests"] = requests_;
    d["bytes_fetched"] = bytes_fetched_;
    return d;
  }
  StoreHandle& handle() { return handle_; }

 private:
  StoreHandle handle_;
  uint64_t requests_ = 0;
  uint64_t bytes_fetched_ = 0;
};

}  // namespace

void RegisterFiles(py::module_& m) {
  py::class_<RangeReader>(m, "_RangeReader",
                          "Byte ranges of objects below a URI by parallel coalesced GETs")
      .def(py::init([](std::string uri, const py::kwargs& options) {
             return std::make_unique<RangeReader>(
                 StoreHandle(std::move(uri), StoreOptionsFromKwargs(options)));
           }),
           py::arg("uri"))
      .def("read", &RangeReader::Read, py::arg("ranges"),
           py::arg("coalesce_gap") = uint64_t{256} << 10, py::arg("max_in_flight") = 0,
           "[(key, offset, length[, etag]), ...] -> [bytes, ...]: neighbours closer than "
           "coalesce_gap share a GET; long ranges are split into parallel GETs")
      .def("stats", &RangeReader::Stats)
      .def(py::pickle([](RangeReader& r) -> py::object { return r.handle().State(); },
                      [](const py::object& state) {
                        return std::make_unique<RangeReader>(StoreHandle::FromState(state));
                      }));
  py::class_<ObjectReadFile>(m, "_ObjectReadFile",
                             "The raw reader under wharf.open(uri, 'rb'); use wharf.open.")
      .def(py::init([](std::string uri, uint64_t chunk_size, int read_ahead, bool adaptive,
                       const py::kwargs& options) {
             return std::make_unique<ObjectReadFile>(
                 StoreHandle(std::move(uri), StoreOptionsFromKwargs(options)), chunk_size,
                 read_ahead, adaptive);
           }),
           py::arg("uri"), py::arg("chunk_size") = 0, py::arg("read_ahead") = -1,
           py::arg("adaptive") = true)
      .def_property_readonly("size", &ObjectReadFile::size)
      .def_property_readonly("etag", &ObjectReadFile::etag)
      .def_property_readonly("closed", &ObjectReadFile::closed)
      .def("tell", &ObjectReadFile::tell)
      .def("seek", &ObjectReadFile::Seek, py::arg("offset"), py::arg("whence") = 0)
      .def("read", &ObjectReadFile::Read, py::arg("n") = -1, py::arg("one_chunk") = false)
      .def("readinto", &ObjectReadFile::ReadIntoBuffer, py::arg("b"), py::arg("one_chunk") = false)
      .def("peek", &ObjectReadFile::Peek)
      .def("stats", &ObjectReadFile::Stats)
      .def("close", &ObjectReadFile::Close);

  py::class_<ObjectWriteFile>(m, "_ObjectWriteFile",
                              "The raw writer under wharf.open(uri, 'wb'); use wharf.open.")
      .def(py::init([](std::string uri, bool exclusive, const py::kwargs& options) {
             return std::make_unique<ObjectWriteFile>(
                 StoreHandle(std::move(uri), StoreOptionsFromKwargs(options)), exclusive);
           }),
           py::arg("uri"), py::arg("exclusive") = false)
      .def_property_readonly("closed", &ObjectWriteFile::closed)
      .def("tell", &ObjectWriteFile::tell)
      .def("write", &ObjectWriteFile::Write, py::arg("b"))
      .def("close", &ObjectWriteFile::Close)
      .def("abort", &ObjectWriteFile::AbortFromPython);
}

}  // namespace wharf::python
