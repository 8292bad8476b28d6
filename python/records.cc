// Bindings of the record streams (dataset/records.h) over a list of shards of any format of
// the registry (formats/registry.h: tar, TFRecord, CSV, JSON lines, ...), resumable mid-epoch
// through state(), and of the registry itself (record_formats(), record_format()). Records
// are converted by their format's shape, never by its name.
#include "dataset/records.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "base/status.h"
#include "dataset/index.h"
#include "formats/lines.h"
#include "formats/registry.h"
#include "python/binding.h"

namespace wharf::python {
namespace {

// The binding. The shard list is a SampleIndex binding object (from_keys, from_prefix, ...),
// handled through the functions below to keep dataset.cc's class private to it.
class PyRecordStream : public StreamBinding<PyRecordStream, RecordStream> {
 public:
  // `state`: a RecordStreamState JSON to continue from, or empty for the epoch's start.
  PyRecordStream(std::shared_ptr<const SampleIndex> shards, std::shared_ptr<ObjectStore> store,
                 std::string prefix, RecordStreamOptions options, const std::string& state)
      : StreamBinding("RecordStream"),
        prefix_(std::move(prefix)),
        format_(Check(FindRecordFormat(options.format))) {
    for (const SampleEntry& e : shards->entries()) shard_uris_.push_back(store->Uri(e.key));
    std::optional<RecordStreamState> resume;
    if (!state.empty()) resume = Check(RecordStreamState::FromJson(state));
    // Restoring re-reads the buffered records: without the GIL.
    stream_ = Check(WithoutGilIn(scope_, [&] {
      return RecordStream::Create(std::move(store), std::move(shards), std::move(options),
                                  resume ? &*resume : nullptr);
    }));
  }
  uint64_t yielded() { return stream().yielded(); }
  std::vector<std::string> Shards() {
    std::vector<std::string> out;
    for (size_t i : stream().assigned()) out.push_back(Relative(stream().shards()[i].key));
    return out;
  }
  // Both read what next() changes without the GIL: refused while another thread reads.
  py::object Header() {
    RecordStream& s = stream();
    OneThread guard(busy_);
    auto h = s.header();
    return h ? py::object(py::str(*h)) : py::object(py::none());
  }
  std::string format_name() const { return format_->name; }
  std::string State() {
    RecordStream& s = stream();
    OneThread guard(busy_);
    return s.State().ToJson();
  }

 private:
  friend class StreamBinding<PyRecordStream, RecordStream>;

  std::string Relative(const std::string& key) const {
    if (key.compare(0, prefix_.size(), prefix_) == 0) return key.substr(prefix_.size());
    return key;
  }

  // Formats of keyed records (tar): {"__key__", "__url__", "__offset__", field: Buffer...};
  // one-payload formats: (shard URI, byte offset, Buffer of the "data" field).
  py::object ToPython(Record& r) {
    const std::string& url = shard_uris_[r.shard];
    if (format_->shape == RecordShape::kFields) {
      py::dict d;
      d["__key__"] = py::bytes(r.key).attr("decode")("utf-8", "surrogateescape");
      d["__url__"] = url;
      d["__offset__"] = r.offset;
      for (auto& [name, bytes] : r.fields) d[py::str(name)] = Buffer::FromCord(std::move(bytes));
      return d;
    }
    absl::Cord data;
    for (auto& [name, bytes] : r.fields) {
      if (name == kDataField) data = std::move(bytes);
    }
    return py::make_tuple(url, r.offset, Buffer::FromCord(std::move(data)));
  }

  const std::string prefix_;
  const RecordFormatSpec* const format_;
  std::vector<std::string> shard_uris_;
};

py::list SplitCsv(absl::string_view row, char delimiter, char quote) {
  std::vector<std::string> fields = Check(SplitCsvFields(row, delimiter, quote));
  py::list out;
  for (const std::string& f : fields) {
    out.append(py::bytes(f).attr("decode")("utf-8", "surrogateescape"));
  }
  return out;
}

// The format's suffixes, and with `compressed` those of its compressed objects after them.
py::tuple Suffixes(const RecordFormatSpec& spec, bool compressed = false) {
  std::vector<std::string> all = spec.suffixes;
  if (compressed) {
    all.insert(all.end(), spec.compressed_suffixes.begin(), spec.compressed_suffixes.end());
  }
  py::tuple out(all.size());
  for (size_t i = 0; i < all.size(); ++i) out[i] = py::str(all[i]);
  return out;
}

char OneChar(const std::string& s, const char* what) {
  if (s.size() != 1) {
    Raise(
        absl::InvalidArgumentError(absl::StrCat(what, " must be one character, got \"", s, "\"")));
  }
  return s[0];
}

}  // namespace

void RegisterRecords(py::module_& m) {
  py::class_<PyRecordStream>(
      m, "RecordStream",
      "The records of one (rank, worker) share of an epoch's shards. Formats of keyed records "
      "(tar) yield dicts {'__key__', '__url__', '__offset__', field: Buffer}; one-payload "
      "formats (tfrecord, csv, jsonl) yield (shard URI, byte offset, Buffer). chunk_size 0 "
      "and read_ahead -1 derive them from the store's link estimate; memory_budget: this "
      "stream's cap inside the process's budget (int or \"64M\"; 0: none of its own)")
      .def(py::init([](py::handle shards, const std::string& format, uint64_t seed, uint64_t epoch,
                       bool shuffle, size_t shuffle_buffer, int rank, int world_size, int worker,
                       int num_workers, bool header, const std::string& delimiter,
                       const std::string& quote, bool skip_empty_rows, uint64_t chunk_size,
                       int read_ahead, const py::object& memory_budget,
                       const std::optional<std::string>& state, uint64_t order) {
             IndexParts parts = GetIndexParts(shards);
             RecordStreamOptions o;
             o.format = Check(FindRecordFormat(format))->name;
             o.seed = seed;
             o.epoch = epoch;
             o.shuffle = shuffle;
             o.shuffle_buffer = shuffle_buffer;
             o.rank = rank;
             o.world_size = world_size;
             o.worker = worker;
             o.num_workers = num_workers;
             o.order = order;
             o.header = header;
             o.delimiter = OneChar(delimiter, "delimiter");
             o.quote = OneChar(quote, "quote");
             o.skip_empty_rows = skip_empty_rows;
             o.io.chunk_size = chunk_size;
             o.io.read_ahead = read_ahead;
             o.memory_budget = SizeArg(memory_budget, "memory_budget");
             if (read_ahead < -1) {
               Raise(absl::InvalidArgumentError(
                   "read_ahead must be >= 0 (or -1: derived from the store's link estimate)"));
             }
             return std::make_unique<PyRecordStream>(std::move(parts.index), std::move(parts.store),
                                                     std::move(parts.prefix), std::move(o),
                                                     state.value_or(""));
           }),
           py::arg("shards"), py::arg("format"), py::kw_only(), py::arg("seed") = 0,
           py::arg("epoch") = 0, py::arg("shuffle") = true, py::arg("shuffle_buffer") = 0,
           py::arg("rank") = 0, py::arg("world_size") = 1, py::arg("worker") = 0,
           py::arg("num_workers") = 1, py::arg("header") = false, py::arg("delimiter") = ",",
           py::arg("quote") = "\"", py::arg("skip_empty_rows") = false, py::arg("chunk_size") = 0,
           py::arg("read_ahead") = -1, py::arg("memory_budget") = 0, py::arg("state") = py::none(),
           py::arg("order") = kCurrentOrder)
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &PyRecordStream::Next)
      .def("next_batch", &PyRecordStream::NextBatch, py::arg("n"),
           "Up to n records (fewer only at the end, [] after it); csv/jsonl rows of one "
           "batch share one buffer")
      .def_property_readonly("shards", &PyRecordStream::Shards,
                             "The shards this share reads, in order (keys)")
      .def_property_readonly("header", &PyRecordStream::Header,
                             "csv/jsonl with header=True: the current shard's header row")
      .def_property_readonly("format", &PyRecordStream::format_name)
      .def("state", &PyRecordStream::State,
           "Where this share stands after the records yielded so far (a JSON string); pass "
           "it as state= to a stream of the same share to continue exactly there")
      .def_property_readonly("yielded", [](PyRecordStream& s) { return s.yielded(); });

  m.def(
      "record_formats",
      [](bool compressed) {
        py::dict out;
        for (const RecordFormatSpec* spec : RecordFormats()) {
          out[py::str(spec->name)] = Suffixes(*spec, compressed);
        }
        return out;
      },
      py::arg("compressed") = false,
      "Every record format of the registry: {name: (object name suffixes, ...)}; with "
      "compressed=True also the suffixes of its compressed objects (\".tar.gz\", \".tgz\", "
      "\".tfrecord.gz\", ...), which are read by their name: every shard of a prefix");
  m.def(
      "record_format",
      [](const std::string& name) {
        const RecordFormatSpec* spec = Check(FindRecordFormat(name));
        py::dict out;
        out["name"] = spec->name;
        out["suffixes"] = Suffixes(*spec);
        out["shape"] = spec->shape == RecordShape::kFields ? "fields" : "payload";
        out["rows"] = spec->rows;
        return out;
      },
      py::arg("name"),
      "One record format: {'name', 'suffixes', 'shape': 'fields' (a key and named fields, "
      "e.g. tar) or 'payload' (one 'data' field), 'rows': whether its records are rows of "
      "text (header=, delimiter=, quote=, skip_empty_rows= and rows_per_item= apply)}; "
      "ValueError listing the known formats for an unknown name");

  m.def(
      "tfrecord_crc_ok",
      [](py::buffer frame) {
        BufferView view(frame, /*writable=*/false);  // contiguous bytes, else BufferError
        const absl::string_view f(view.data(), view.size());
        if (f.size() < 16) return false;
        const auto le32 = [&](size_t at) {
          uint32_t v = 0;
          for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(f[at + i]);
          return v;
        };
        ReleaseGil unlocked;
        return MaskCrc32c(Crc32c(f.substr(0, 8))) == le32(8) &&
               MaskCrc32c(Crc32c(f.substr(12, f.size() - 16))) == le32(f.size() - 4);
      },
      py::arg("frame"),
      "Whether a whole TFRecord frame (length, its masked CRC32C, data, the data's masked "
      "CRC32C) carries the checksums of its bytes");

  m.def(
       "split_csv",
       [](py::buffer row, const std::string& delimiter, const std::string& quote) {
         BufferView bytes(row, /*writable=*/false);  // contiguous bytes, else BufferError
         return SplitCsv(absl::string_view(bytes.data(), bytes.size()),
                         OneChar(delimiter, "delimiter"), OneChar(quote, "quote"));
       },
       py::arg("row"), py::arg("delimiter") = ",", py::arg("quote") = "\"",
       "The fields of one CSV row (RFC 4180 quoting) as str")
      .def(
          "split_csv",
          [](const std::string& row, const std::string& delimiter, const std::string& quote) {
            return SplitCsv(row, OneChar(delimiter, "delimiter"), OneChar(quote, "quote"));
          },
          py::arg("row"), py::arg("delimiter") = ",", py::arg("quote") = "\"");
}

}  // namespace wharf::python
