// Bindings of the record formats (formats/) read over a list of shards: tar (WebDataset
// samples), TFRecord, CSV and JSON lines.
//
// A RecordStream is one (rank, worker) share of an epoch's shards:
//  - the shard order of epoch e is ShardPermutation(n, seed, e) (formats/shuffle.h), the
//    identity without shuffle; the same on every rank, so ranks agree without talking;
//  - position p of that order goes to rank p % world_size, and the rank's j-th shard to
//    worker j % num_workers (shards are partitioned across ranks, then workers);
//  - records are read shard after shard, the next shard opened (its first chunks requested)
//    while the current one is read, and optionally mixed by a bounded ShuffleBuffer seeded
//    from (seed, epoch, rank, worker).
// Counts per rank depend on the shards' sizes: give every rank the same number of samples by
// making the shards equal and their number a multiple of world_size * num_workers.
//
// The stream logic (ShardRecordStream) has no Python in it; it lives here because only the
// binding needed it so far.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "dataset/index.h"
#include "formats/lines.h"
#include "formats/object_reader.h"
#include "formats/shuffle.h"
#include "formats/tar.h"
#include "formats/tfrecord.h"
#include "python/binding.h"

namespace wharf::python {
namespace {

enum class RecordFormat { kTar, kTFRecord, kCsv, kJsonLines };

absl::StatusOr<RecordFormat> ParseFormat(absl::string_view name) {
  if (name == "tar") return RecordFormat::kTar;
  if (name == "tfrecord") return RecordFormat::kTFRecord;
  if (name == "csv") return RecordFormat::kCsv;
  if (name == "jsonl") return RecordFormat::kJsonLines;
  return absl::InvalidArgumentError(absl::StrCat(
      "record format \"", name, "\": expected \"tar\", \"tfrecord\", \"csv\" or \"jsonl\""));
}

struct RecordStreamOptions {
  RecordFormat format = RecordFormat::kTar;
  uint64_t seed = 0;
  uint64_t epoch = 0;
  bool shuffle = true;
  // Records held to mix neighbouring shards' records; 0 keeps shard order.
  size_t shuffle_buffer = 0;
  int rank = 0;
  int world_size = 1;
  int worker = 0;
  int num_workers = 1;
  ObjectReaderOptions io;
  // csv / jsonl.
  bool header = false;
  char delimiter = ',';
  char quote = '"';
  bool skip_empty_rows = false;
};

// One record of any format.
struct Record {
  size_t shard = 0;     // position in the shard list
  uint64_t offset = 0;  // byte offset of the record (tar: its first header; rows: the row)
  std::string key;      // tar: the WebDataset sample key
  std::vector<std::pair<std::string, absl::Cord>> fields;  // tar: extension -> bytes
  absl::Cord data;                                          // tfrecord payload, row text
};

// One open shard of any format.
class ShardReader {
 public:
  static absl::StatusOr<std::unique_ptr<ShardReader>> Open(std::shared_ptr<ObjectStore> store,
                                                           const SampleEntry& entry,
                                                           const RecordStreamOptions& options) {
    std::unique_ptr<ObjectReader> reader;
    if (entry.size.has_value()) {  // from a listing: no HEAD
      ObjectMeta meta{.key = entry.key, .size = *entry.size, .etag = entry.etag};
      WHARF_ASSIGN_OR_RETURN(reader, ObjectReader::Open(store, std::move(meta), options.io));
    } else {
      WHARF_ASSIGN_OR_RETURN(reader, ObjectReader::Open(store, entry.key, options.io));
    }
    auto out = std::unique_ptr<ShardReader>(new ShardReader);
    switch (options.format) {
      case RecordFormat::kTar:
        out->tar_ =
            std::make_unique<TarSampleReader>(std::make_unique<TarReader>(std::move(reader)));
        break;
      case RecordFormat::kTFRecord:
        out->tfrecord_ = std::make_unique<TFRecordReader>(std::move(reader));
        break;
      case RecordFormat::kCsv:
      case RecordFormat::kJsonLines: {
        LineReaderOptions lo;
        lo.format =
            options.format == RecordFormat::kCsv ? LineFormat::kCsv : LineFormat::kJsonLines;
        lo.header = options.header;
        lo.delimiter = options.delimiter;
        lo.quote = options.quote;
        lo.skip_empty_rows = options.skip_empty_rows;
        WHARF_ASSIGN_OR_RETURN(out->lines_, LineReader::Create(std::move(reader), lo));
        break;
      }
    }
    return out;
  }

  absl::StatusOr<std::optional<Record>> Next() {
    Record r;
    if (tar_) {
      WHARF_ASSIGN_OR_RETURN(std::optional<TarSample> s, tar_->Next());
      if (!s) return std::nullopt;
      r.offset = s->offset;
      r.key = std::move(s->key);
      r.fields = std::move(s->fields);
    } else if (tfrecord_) {
      WHARF_ASSIGN_OR_RETURN(std::optional<TFRecord> t, tfrecord_->Next());
      if (!t) return std::nullopt;
      r.offset = t->offset;
      r.data = std::move(t->data);
    } else {
      WHARF_ASSIGN_OR_RETURN(std::optional<Row> row, lines_->Next());
      if (!row) return std::nullopt;
      r.offset = row->offset;
      r.data = absl::Cord(std::move(row->text));
    }
    return r;
  }

  // Rows only: up to n rows as slices of one shared buffer (zero-copy).
  absl::StatusOr<std::vector<Record>> NextRows(size_t n) {
    WHARF_ASSIGN_OR_RETURN(RowBatch batch, lines_->NextBatch(n));
    std::vector<Record> out;
    out.reserve(batch.size());
    auto shared = std::make_shared<RowBatch>(std::move(batch));
    for (size_t i = 0; i < shared->size(); ++i) {
      Record r;
      r.offset = shared->offsets[i];
      r.data = absl::MakeCordFromExternal(shared->row(i), [shared] {});
      out.push_back(std::move(r));
    }
    return out;
  }

  bool lines() const { return lines_ != nullptr; }
  const std::optional<std::string>& header() const {
    static const std::optional<std::string> kNone;
    return lines_ ? lines_->header() : kNone;
  }

 private:
  ShardReader() = default;

  std::unique_ptr<TarSampleReader> tar_;
  std::unique_ptr<TFRecordReader> tfrecord_;
  std::unique_ptr<LineReader> lines_;
};

// The records of one (rank, worker) share of an epoch's shards (see the file comment).
// Not thread-safe: one thread at a time. Calls block.
class ShardRecordStream {
 public:
  ShardRecordStream(std::shared_ptr<ObjectStore> store, std::shared_ptr<const SampleIndex> shards,
                    RecordStreamOptions options)
      : store_(std::move(store)),
        shards_(std::move(shards)),
        options_(std::move(options)),
        buffer_(options_.shuffle_buffer,
                DeriveSeed(DeriveSeed(options_.seed, options_.epoch),
                           static_cast<uint64_t>(options_.rank) *
                                   static_cast<uint64_t>(options_.num_workers) +
                               static_cast<uint64_t>(options_.worker))) {
    std::vector<size_t> order;
    if (options_.shuffle) {
      order = ShardPermutation(shards_->size(), options_.seed, options_.epoch);
    } else {
      order.resize(shards_->size());
      std::iota(order.begin(), order.end(), size_t{0});
    }
    const size_t w = static_cast<size_t>(options_.world_size);
    const size_t k = static_cast<size_t>(options_.num_workers);
    for (size_t p = static_cast<size_t>(options_.rank), j = 0; p < order.size(); p += w, ++j) {
      if (j % k == static_cast<size_t>(options_.worker)) assigned_.push_back(order[p]);
    }
  }

  static absl::Status Validate(const RecordStreamOptions& o) {
    if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size || o.num_workers < 1 ||
        o.worker < 0 || o.worker >= o.num_workers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "partition: rank ", o.rank, " of ", o.world_size, ", worker ", o.worker, " of ",
          o.num_workers, " (need 0 <= rank < world_size and 0 <= worker < num_workers)"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::optional<Record>> Next() {
    if (options_.shuffle_buffer == 0) return NextInOrder();
    while (true) {
      WHARF_ASSIGN_OR_RETURN(std::optional<Record> r, NextInOrder());
      if (!r) return buffer_.Pop();  // the stream ended: drain
      if (std::optional<Record> out = buffer_.Push(*std::move(r))) return out;
    }
  }

  // Up to n records (fewer only at the end). Rows without a shuffle buffer come as slices of
  // the shard's row batches.
  absl::StatusOr<std::vector<Record>> NextBatch(size_t n) {
    std::vector<Record> out;
    while (out.size() < n) {
      if (options_.shuffle_buffer == 0 && IsLines()) {
        WHARF_ASSIGN_OR_RETURN(bool open, EnsureCurrent());
        if (!open) break;
        WHARF_ASSIGN_OR_RETURN(std::vector<Record> rows, current_->NextRows(n - out.size()));
        if (rows.empty()) {
          current_.reset();
          continue;
        }
        for (Record& r : rows) {
          r.shard = current_shard_;
          out.push_back(std::move(r));
        }
        continue;
      }
      WHARF_ASSIGN_OR_RETURN(std::optional<Record> r, Next());
      if (!r) break;
      out.push_back(*std::move(r));
    }
    return out;
  }

  const std::vector<size_t>& assigned() const { return assigned_; }
  const SampleIndex& shards() const { return *shards_; }
  std::optional<std::string> header() const {
    return current_ ? current_->header() : last_header_;
  }

 private:
  bool IsLines() const {
    return options_.format == RecordFormat::kCsv || options_.format == RecordFormat::kJsonLines;
  }

  // Opens the next assigned shard when none is open; false when all were read. Requests the
  // first chunks of the shard after it too, so a shard boundary does not stall.
  absl::StatusOr<bool> EnsureCurrent() {
    if (current_) return true;
    if (next_ >= assigned_.size()) return false;
    if (ahead_) {
      current_ = std::move(ahead_);
    } else {
      WHARF_ASSIGN_OR_RETURN(current_, OpenShard(assigned_[next_]));
    }
    current_shard_ = assigned_[next_++];
    if (current_->lines()) last_header_ = current_->header();
    if (next_ < assigned_.size()) {
      auto ahead = OpenShard(assigned_[next_]);
      // An error opening the next shard is reported when its turn comes.
      if (ahead.ok()) ahead_ = *std::move(ahead);
    }
    return true;
  }

  absl::StatusOr<std::unique_ptr<ShardReader>> OpenShard(size_t shard) {
    return ShardReader::Open(store_, (*shards_)[shard], options_);
  }

  absl::StatusOr<std::optional<Record>> NextInOrder() {
    while (true) {
      WHARF_ASSIGN_OR_RETURN(bool open, EnsureCurrent());
      if (!open) return std::nullopt;
      WHARF_ASSIGN_OR_RETURN(std::optional<Record> r, current_->Next());
      if (r) {
        r->shard = current_shard_;
        return r;
      }
      current_.reset();
    }
  }

  const std::shared_ptr<ObjectStore> store_;
  const std::shared_ptr<const SampleIndex> shards_;
  const RecordStreamOptions options_;
  std::vector<size_t> assigned_;  // shard positions this share reads, in order
  size_t next_ = 0;               // next position in assigned_ to open
  size_t current_shard_ = 0;
  std::unique_ptr<ShardReader> current_;
  std::unique_ptr<ShardReader> ahead_;
  std::optional<std::string> last_header_;
  ShuffleBuffer<Record> buffer_;
};

// The binding. The shard list is a SampleIndex binding object (from_keys, from_prefix, ...),
// handled through the functions below to keep dataset.cc's class private to it.
class PyRecordStream {
 public:
  PyRecordStream(std::shared_ptr<const SampleIndex> shards, std::shared_ptr<ObjectStore> store,
                 std::string prefix, RecordStreamOptions options)
      : prefix_(std::move(prefix)),
        format_(options.format),
        generation_(ForkGeneration()) {
    Check(ShardRecordStream::Validate(options));
    for (const SampleEntry& e : shards->entries()) shard_uris_.push_back(store->Uri(e.key));
    stream_ = std::make_unique<ShardRecordStream>(std::move(store), std::move(shards),
                                                  std::move(options));
  }
  ~PyRecordStream() { LeakOrDestroy(stream_, generation_); }
  PyRecordStream(const PyRecordStream&) = delete;
  PyRecordStream& operator=(const PyRecordStream&) = delete;

  py::object Next() {
    ShardRecordStream& s = stream();
    OneThread guard(busy_);
    auto r = Check(WithoutGil([&] { return s.Next(); }));
    if (!r) throw py::stop_iteration();
    return ToPython(*r);
  }

  py::list NextBatch(size_t n) {
    ShardRecordStream& s = stream();
    OneThread guard(busy_);
    std::vector<Record> got = Check(WithoutGil([&] { return s.NextBatch(n); }));
    py::list out;
    for (Record& r : got) out.append(ToPython(r));
    return out;
  }

  std::vector<std::string> Shards() {
    std::vector<std::string> out;
    for (size_t i : stream().assigned()) out.push_back(Relative(stream().shards()[i].key));
    return out;
  }
  py::object Header() {
    auto h = stream().header();
    return h ? py::object(py::str(*h)) : py::object(py::none());
  }
  const std::string& format_name() const {
    static const std::string kNames[] = {"tar", "tfrecord", "csv", "jsonl"};
    return kNames[static_cast<int>(format_)];
  }

 private:
  ShardRecordStream& stream() {
    if (generation_ != ForkGeneration()) {
      Raise(absl::FailedPreconditionError(
          "this RecordStream was created in another process (before a fork); create streams "
          "in the process that reads them (each DataLoader worker creates its own in "
          "__iter__)"));
    }
    return *stream_;
  }
  std::string Relative(const std::string& key) const {
    if (key.compare(0, prefix_.size(), prefix_) == 0) return key.substr(prefix_.size());
    return key;
  }

  // tar: {"__key__", "__url__", "__offset__", ext: Buffer...}; the other formats:
  // (shard URI, byte offset, Buffer).
  py::object ToPython(Record& r) {
    const std::string& url = shard_uris_[r.shard];
    if (format_ == RecordFormat::kTar) {
      py::dict d;
      d["__key__"] = py::bytes(r.key).attr("decode")("utf-8", "surrogateescape");
      d["__url__"] = url;
      d["__offset__"] = r.offset;
      for (auto& [ext, bytes] : r.fields) d[py::str(ext)] = Buffer::FromCord(std::move(bytes));
      return d;
    }
    return py::make_tuple(url, r.offset, Buffer::FromCord(std::move(r.data)));
  }

  const std::string prefix_;
  const RecordFormat format_;
  const uint64_t generation_;
  std::vector<std::string> shard_uris_;
  std::unique_ptr<ShardRecordStream> stream_;
  bool busy_ = false;  // read and written with the GIL held
};

py::list SplitCsv(absl::string_view row, char delimiter, char quote) {
  std::vector<std::string> fields = Check(SplitCsvFields(row, delimiter, quote));
  py::list out;
  for (const std::string& f : fields) {
    out.append(py::bytes(f).attr("decode")("utf-8", "surrogateescape"));
  }
  return out;
}

char OneChar(const std::string& s, const char* what) {
  if (s.size() != 1) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat(what, " must be one character, got \"", s, "\"")));
  }
  return s[0];
}

}  // namespace

void RegisterRecords(py::module_& m) {
  py::class_<PyRecordStream>(
      m, "RecordStream",
      "The records of one (rank, worker) share of an epoch's shards. tar yields dicts "
      "{'__key__', '__url__', '__offset__', ext: Buffer}; tfrecord, csv and jsonl yield "
      "(shard URI, byte offset, Buffer)")
      .def(py::init([](py::handle shards, const std::string& format, uint64_t seed,
                       uint64_t epoch, bool shuffle, size_t shuffle_buffer, int rank,
                       int world_size, int worker, int num_workers, bool header,
                       const std::string& delimiter, const std::string& quote,
                       bool skip_empty_rows, uint64_t chunk_size, int read_ahead) {
             IndexParts parts = GetIndexParts(shards);
             RecordStreamOptions o;
             o.format = Check(ParseFormat(format));
             o.seed = seed;
             o.epoch = epoch;
             o.shuffle = shuffle;
             o.shuffle_buffer = shuffle_buffer;
             o.rank = rank;
             o.world_size = world_size;
             o.worker = worker;
             o.num_workers = num_workers;
             o.header = header;
             o.delimiter = OneChar(delimiter, "delimiter");
             o.quote = OneChar(quote, "quote");
             o.skip_empty_rows = skip_empty_rows;
             o.io.chunk_size = chunk_size;
             o.io.read_ahead = read_ahead;
             if (chunk_size == 0 || read_ahead < 0) {
               Raise(absl::InvalidArgumentError("chunk_size must be > 0 and read_ahead >= 0"));
             }
             return std::make_unique<PyRecordStream>(std::move(parts.index),
                                                     std::move(parts.store),
                                                     std::move(parts.prefix), std::move(o));
           }),
           py::arg("shards"), py::arg("format"), py::kw_only(), py::arg("seed") = 0,
           py::arg("epoch") = 0, py::arg("shuffle") = true, py::arg("shuffle_buffer") = 0,
           py::arg("rank") = 0, py::arg("world_size") = 1, py::arg("worker") = 0,
           py::arg("num_workers") = 1, py::arg("header") = false, py::arg("delimiter") = ",",
           py::arg("quote") = "\"", py::arg("skip_empty_rows") = false,
           py::arg("chunk_size") = uint64_t{8} << 20, py::arg("read_ahead") = 2)
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &PyRecordStream::Next)
      .def("next_batch", &PyRecordStream::NextBatch, py::arg("n"),
           "Up to n records (fewer only at the end, [] after it); csv/jsonl rows of one "
           "batch share one buffer")
      .def_property_readonly("shards", &PyRecordStream::Shards,
                             "The shards this share reads, in order (keys)")
      .def_property_readonly("header", &PyRecordStream::Header,
                             "csv/jsonl with header=True: the current shard's header row")
      .def_property_readonly("format", &PyRecordStream::format_name);

  m.def("split_csv",
        [](py::buffer row, const std::string& delimiter, const std::string& quote) {
          py::buffer_info info = row.request();
          absl::string_view view(static_cast<const char*>(info.ptr), info.size * info.itemsize);
          return SplitCsv(view, OneChar(delimiter, "delimiter"), OneChar(quote, "quote"));
        },
        py::arg("row"), py::arg("delimiter") = ",", py::arg("quote") = "\"",
        "The fields of one CSV row (RFC 4180 quoting) as str")
      .def("split_csv",
           [](const std::string& row, const std::string& delimiter, const std::string& quote) {
             return SplitCsv(row, OneChar(delimiter, "delimiter"), OneChar(quote, "quote"));
           },
           py::arg("row"), py::arg("delimiter") = ",", py::arg("quote") = "\"");
}

}  // namespace wharf::python
