// Bindings of the dataset core (dataset/): SampleIndex, Sampler, SampleReader (map-style
// random access, one engine batch per get_batch) and SampleStream (one rank/worker share of an
// epoch, in order, with bounded read-ahead). See docs/design/python.md.
//
// Engine objects (FetchScheduler, SampleReader, SampleStream) are created in the process that
// uses them. A SampleReader inherited by a forked child rebuilds its engine there; a
// SampleStream inherited mid-read cannot continue (its read-ahead is in flight on threads the
// child does not have) and says so; in the child neither is destroyed (binding.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dataset/index.h"
#include "dataset/loader.h"
#include "dataset/sampler.h"
#include "python/binding.h"
#include "store/uri.h"
#include "tier/tier_store.h"

namespace wharf::python {
namespace {

// ---- SampleIndex ----

// The index cache directory an `index_cache` argument names for an index of `store`: None
// or True: the default, which is the tier's own folder (<tier>/.wharf/index) when the store
// reads through a tier (cache= or WHARF_CACHE), so the ranks of every node sharing the tier
// map one file, else dataset::DefaultIndexCacheDir ($WHARF_INDEX_CACHE, else
// ~/.cache/wharf/index); False or "": none (the index is held in memory); a str or
// os.PathLike: that directory.
std::string IndexCacheDir(const py::object& index_cache, const ObjectStore& store) {
  const bool by_default =
      index_cache.is_none() || (py::isinstance<py::bool_>(index_cache) && index_cache.cast<bool>());
  if (by_default) {
    if (const auto* tier = dynamic_cast<const TierStore*>(&store)) {
      return tier->tier()->MetaPath("index");
    }
    return DefaultIndexCacheDir();
  }
  if (py::isinstance<py::bool_>(index_cache)) return std::string();
  if (py::isinstance<py::str>(index_cache) || py::hasattr(index_cache, "__fspath__")) {
    return py::module_::import("os").attr("fspath")(index_cache).cast<std::string>();
  }
  PyErr_SetString(PyExc_TypeError,
                  "index_cache: expected None, a bool, or a directory (str or os.PathLike)");
  throw py::error_already_set();
}

// A SampleIndex with the store its keys belong to. Keys shown to Python are relative to the
// URI's prefix (as wharf.Store shows them) when below it, full store keys otherwise.
// Immutable after construction (the store handle reopens itself after fork).
class PyIndex {
 public:
  PyIndex(StoreHandle handle, SampleIndex index)
      : handle_(std::move(handle)), index_(std::make_shared<const SampleIndex>(std::move(index))) {}

  static std::shared_ptr<PyIndex> FromPrefix(const UriArg& uri,
                                             const std::vector<std::string>& suffixes, int workers,
                                             int page_size, bool keep_directory_markers,
                                             const py::object& index_cache,
                                             const py::kwargs& store_options) {
    StoreHandle handle(uri.Folder(), StoreOptionsFromKwargs(store_options));
    auto store = handle.store();
    ListingIndexOptions options;
    options.suffixes = suffixes;
    options.keep_directory_markers = keep_directory_markers;
    options.list.workers = workers;
    options.list.page_size = page_size;
    options.cache = {.dir = IndexCacheDir(index_cache, *store), .scope = handle.spec().ToJson()};
    SampleIndex index = Check(
        WithoutGil([&] { return SampleIndex::FromListing(*store, handle.prefix(), options); }));
    return std::make_shared<PyIndex>(std::move(handle), std::move(index));
  }

  static std::shared_ptr<PyIndex> FromManifest(const UriArg& manifest_uri,
                                               const std::string& format,
                                               const py::object& index_cache,
                                               const py::kwargs& store_options) {
    ManifestOptions options;
    if (format == "auto") {
      options.format = ManifestFormat::kAuto;
    } else if (format == "keys") {
      options.format = ManifestFormat::kKeys;
    } else if (format == "jsonl") {
      options.format = ManifestFormat::kJsonLines;
    } else {
      Raise(absl::InvalidArgumentError(absl::StrCat(
          "manifest format \"", format, "\": expected \"auto\", \"keys\" or \"jsonl\"")));
    }
    // Sample keys are shown relative to the manifest's folder, which relative keys of the
    // manifest are resolved against too.
    SpecAndKey parsed =
        Check(ParseStoreUri(manifest_uri.value, StoreOptionsFromKwargs(store_options)));
    const std::string manifest_key = parsed.key;
    parsed.key = parsed.key.substr(0, parsed.key.rfind('/') + 1);  // npos + 1 == 0
    StoreHandle handle(parsed.uri().ToString(), parsed.spec, parsed.key);
    auto store = handle.store();
    options.cache = {.dir = IndexCacheDir(index_cache, *store), .scope = handle.spec().ToJson()};
    SampleIndex index =
        Check(WithoutGil([&] { return SampleIndex::FromManifest(*store, manifest_key, options); }));
    return std::make_shared<PyIndex>(std::move(handle), std::move(index));
  }

  static std::shared_ptr<PyIndex> FromKeys(const UriArg& uri, const std::vector<std::string>& keys,
                                           const py::kwargs& store_options) {
    StoreHandle handle(uri.Folder(), StoreOptionsFromKwargs(store_options));
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const std::string& k : keys) full.push_back(handle.Key(k));
    return std::make_shared<PyIndex>(std::move(handle), SampleIndex::FromKeys(std::move(full)));
  }

  StoreHandle& handle() { return handle_; }
  const std::shared_ptr<const SampleIndex>& index() const { return index_; }
  size_t size() const { return index_->size(); }

  std::string Key(int64_t i) const {
    return handle_.Relative(std::string(index_->Ref(Position(i)).key));
  }
  py::object Size(int64_t i) const {
    const auto size = index_->Ref(Position(i)).size;
    return size ? py::object(py::int_(*size)) : py::object(py::none());
  }
  // O(N) strings: on request only (nothing on the datasets' paths builds it).
  std::vector<std::string> Keys() const {
    std::vector<std::string> out;
    out.reserve(index_->size());
    for (size_t i = 0; i < index_->size(); ++i) {
      out.push_back(handle_.Relative(std::string(index_->Ref(i).key)));
    }
    return out;
  }
  std::string Uri(int64_t i) { return handle_.store()->Uri(index_->Ref(Position(i)).key); }

  // SampleIndex::Fingerprint(): recorded when the index was built (O(1)).
  std::string Fingerprint() const { return index_->Fingerprint(); }

  // Pickled as the store's state and either the index file's path (a process of the same
  // node maps the same file: nothing of size N travels) or, for an index held in memory,
  // its bytes in the index file format.
  py::tuple GetState() {
    const std::shared_ptr<const SampleIndex> index = index_;
    if (!index->path().empty()) {
      return py::make_tuple(handle_.State(), py::str("file"), py::str(index->path()),
                            py::str(index->Fingerprint()), py::int_(index->size()));
    }
    std::string blob = WithoutGil([&] { return index->Serialize(); });
    return py::make_tuple(handle_.State(), py::str("bytes"), py::bytes(blob));
  }
  static std::shared_ptr<PyIndex> SetState(const py::tuple& t) {
    const std::string kind = t.size() >= 2 ? t[1].cast<std::string>() : std::string();
    if (kind == "file" && t.size() == 5) {
      const std::string path = t[2].cast<std::string>();
      const std::string fingerprint = t[3].cast<std::string>();
      const uint64_t count = t[4].cast<uint64_t>();
      SampleIndex index = Check(WithoutGil([&] { return SampleIndex::OpenFile(path); }));
      if (index.size() != count || index.Fingerprint() != fingerprint) {
        Raise(absl::FailedPreconditionError(
            absl::StrCat("pickled SampleIndex: index file ", path,
                         " changed since it was pickled (", index.size(), " samples, fingerprint ",
                         index.Fingerprint(), "; expected ", count, ", ", fingerprint, ")")));
      }
      return std::make_shared<PyIndex>(StoreHandle::FromState(t[0]), std::move(index));
    }
    if (kind == "bytes" && t.size() == 3) {
      std::string blob = t[2].cast<std::string>();
      SampleIndex index =
          Check(WithoutGil([&] { return SampleIndex::FromBytes(std::move(blob)); }));
      return std::make_shared<PyIndex>(StoreHandle::FromState(t[0]), std::move(index));
    }
    Raise(absl::InvalidArgumentError("pickled SampleIndex: bad tuple"));
    return nullptr;
  }

 private:
  size_t Position(int64_t i) const {
    const int64_t n = static_cast<int64_t>(index_->size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) {
      PyErr_SetString(PyExc_IndexError,
                      absl::StrCat("sample ", i, " of an index of ", n, " samples").c_str());
      throw py::error_already_set();
    }
    return static_cast<size_t>(i);
  }

  StoreHandle handle_;
  const std::shared_ptr<const SampleIndex> index_;
};

// ---- SampleReader ----

py::tuple SampleToPython(PyIndex& index, Sample& s) {
  return py::make_tuple(index.handle().Relative(s.key), Buffer::FromFetch(s.data));
}

// Map-style access. The engine (a FetchScheduler and a SampleReader) is built on first use in
// each process; counters say how many engine batches this process's engine ran.
class PyReader {
 public:
  PyReader(std::shared_ptr<PyIndex> index, EngineOptions options)
      : index_(std::move(index)), options_(options) {}
  ~PyReader() {
    LeakOrDestroy(reader_, generation_);
    LeakOrDestroy(scheduler_, generation_);
  }
  PyReader(const PyReader&) = delete;
  PyReader& operator=(const PyReader&) = delete;

  py::tuple Get(int64_t i) {
    py::list batch = GetBatch({i});
    return batch[0].cast<py::tuple>();
  }

  py::list GetBatch(const std::vector<int64_t>& indices) {
    std::vector<uint64_t> positions;
    positions.reserve(indices.size());
    const int64_t n = static_cast<int64_t>(index_->size());
    for (int64_t i : indices) {
      const int64_t p = i < 0 ? i + n : i;
      if (p < 0 || p >= n) {
        PyErr_SetString(PyExc_IndexError,
                        absl::StrCat("sample ", i, " of a dataset of ", n, " samples").c_str());
        throw py::error_already_set();
      }
      positions.push_back(static_cast<uint64_t>(p));
    }
    SampleReader& r = reader();
    FetchStats stats;
    auto samples = WithoutGil([&] { return r.GetBatch(positions, &stats); });
    ++batches_;
    samples_ += positions.size();
    requests_ += stats.requests;
    bytes_ += stats.bytes;
    retries_ += stats.retries;
    composed_reads_ += stats.composed_reads;
    std::vector<Sample> got = Check(std::move(samples));
    py::list out;
    for (Sample& s : got) out.append(SampleToPython(*index_, s));
    return out;
  }

  py::dict Stats() const {
    py::dict d;
    d["batches"] = batches_;
    d["samples"] = samples_;
    d["requests"] = requests_;
    d["bytes"] = bytes_;
    d["retries"] = retries_;
    d["composed_reads"] = composed_reads_;  // of `requests`: GETs of composed objects
    return d;
  }

  const std::shared_ptr<PyIndex>& index() const { return index_; }

 private:
  SampleReader& reader() {
    if (!reader_ || generation_ != ForkGeneration()) {
      // First use, or first use in a forked child: the inherited engine belongs to the parent.
      LeakOrDestroy(reader_, generation_);
      LeakOrDestroy(scheduler_, generation_);
      batches_ = samples_ = requests_ = bytes_ = retries_ = composed_reads_ = 0;
      scheduler_ =
          std::make_shared<FetchScheduler>(index_->handle().store(), options_.ToFetchOptions());
      reader_ = std::make_unique<SampleReader>(index_->index(), scheduler_);
      generation_ = ForkGeneration();
    }
    return *reader_;
  }

  const std::shared_ptr<PyIndex> index_;
  const EngineOptions options_;
  std::shared_ptr<FetchScheduler> scheduler_;
  std::unique_ptr<SampleReader> reader_;
  uint64_t generation_ = 0;
  uint64_t batches_ = 0, samples_ = 0, requests_ = 0, bytes_ = 0, retries_ = 0, composed_reads_ = 0;
};

// ---- SampleStream ----

class PyStream : public StreamBinding<PyStream, SampleStream> {
 public:
  PyStream(std::shared_ptr<PyIndex> index, uint64_t seed, uint64_t epoch, bool shuffle,
           bool drop_last, int rank, int world_size, int worker, int num_workers,
           uint64_t worker_block, uint64_t consumed, uint64_t skip, size_t prefetch,
           uint64_t prefetch_bytes, uint64_t order, EngineOptions engine)
      : StreamBinding("SampleStream"), index_(std::move(index)) {
    Sampler sampler = Check(Sampler::Create(
        index_->size(), {.seed = seed, .shuffle = shuffle, .drop_last = drop_last, .order = order},
        index_->Fingerprint()));
    const SamplerState state = sampler.State(epoch, consumed);
    const Partition partition{.rank = rank,
                              .world_size = world_size,
                              .worker = worker,
                              .num_workers = num_workers,
                              .worker_block = worker_block};
    scheduler_ =
        std::make_shared<FetchScheduler>(index_->handle().store(), engine.ToFetchOptions());
    const StreamOptions options{
        .prefetch = prefetch, .prefetch_bytes = prefetch_bytes, .skip = skip};
    // An order 1 permutation of the whole epoch is computed here: without the GIL.
    stream_ = Check(WithoutGilIn(scope_, [&] {
      return SampleStream::Create(index_->index(), sampler, state, partition, scheduler_, options);
    }));
  }
  ~PyStream() { LeakOrDestroy(scheduler_, generation_); }

  uint64_t yielded() { return stream().yielded(); }
  uint64_t remaining() { return stream().remaining(); }
  size_t size() { return stream().shard().size(); }
  const Shard& shard() { return stream().shard(); }
  uint64_t GlobalPosition(uint64_t i) {
    const Shard& s = shard();
    if (i >= s.size()) {
      Raise(absl::OutOfRangeError(
          absl::StrCat("position ", i, " of a share of ", s.size(), " samples")));
    }
    return s.GlobalPosition(i);
  }
  py::dict Stats() {
    FetchStats st = stream().stats();
    py::dict d;
    d["samples"] = st.items;
    d["requests"] = st.requests;
    d["bytes"] = st.bytes;
    d["retries"] = st.retries;
    d["composed_reads"] = st.composed_reads;  // of `requests`: GETs of composed objects
    d["peak_in_flight"] = st.peak_in_flight;
    d["peak_bytes_held"] = st.peak_bytes_held;
    d["max_in_flight"] = scheduler_->max_in_flight();  // the depth now (tuned unless fixed)
    return d;
  }

 private:
  friend class StreamBinding<PyStream, SampleStream>;

  py::tuple ToPython(Sample& s) {
    return py::make_tuple(s.index, index_->handle().Relative(s.key), Buffer::FromFetch(s.data));
  }

  const std::shared_ptr<PyIndex> index_;
  std::shared_ptr<FetchScheduler> scheduler_;
};

SamplerState ParseState(const std::string& json) { return Check(SamplerState::FromJson(json)); }

}  // namespace

IndexParts GetIndexParts(py::handle index) {
  auto i = index.cast<std::shared_ptr<PyIndex>>();
  return IndexParts{.uri = i->handle().uri(),
                    .prefix = i->handle().prefix(),
                    .index = i->index(),
                    .store = i->handle().store()};
}

void RegisterDataset(py::module_& m) {
  py::class_<PyIndex, std::shared_ptr<PyIndex>>(
      m, "SampleIndex",
      "The samples of a dataset (one object each) in a canonical order. Keys are shown "
      "relative to the URI's prefix. Picklable: it pickles as its store spec (no "
      "credentials) and its index file's path (or, held in memory, its entries).")
      .def_static("from_prefix", &PyIndex::FromPrefix, py::arg("uri"),
                  py::arg("suffixes") = std::vector<std::string>{}, py::arg("workers") = 16,
                  py::arg("page_size") = 1000, py::arg("keep_directory_markers") = false,
                  py::arg("index_cache") = py::none(),
                  "Every object below the URI (a string prefix: end it with '/' for a folder), "
                  "listed by `workers` parallel list calls and sorted by key; only keys ending "
                  "in one of `suffixes` when given. The listing is written to an index file in "
                  "`index_cache` (None: the tier's .wharf/index when reading through one, else "
                  "$WHARF_INDEX_CACHE or ~/.cache/wharf/index; a directory; False: keep it in "
                  "memory) and mapped, shared by every process "
                  "that opens the same listing. Store options as keyword arguments "
                  "(endpoint=, region=, anonymous=, profile=, ...), as for wharf.Store")
      .def_static("from_manifest", &PyIndex::FromManifest, py::arg("uri"),
                  py::arg("format") = "auto", py::arg("index_cache") = py::none(),
                  "The samples a manifest object lists (one key per line, or JSON lines with "
                  "key/size/etag); relative keys resolve against the manifest's folder. The "
                  "index file of each manifest version (URI, ETag, size) is built once in "
                  "`index_cache` (as for from_prefix) and mapped by every process after")
      .def_static(
          "cache_dir",
          [](const UriArg& uri, const py::object& index_cache,
             const py::kwargs& store_options) -> py::object {
            StoreHandle handle(uri.Folder(), StoreOptionsFromKwargs(store_options));
            std::string dir = IndexCacheDir(index_cache, *handle.store());
            return dir.empty() ? py::object(py::none()) : py::object(py::str(dir));
          },
          py::arg("uri"), py::arg("index_cache") = py::none(),
          "The directory the index files of a dataset at `uri` go to (None: held in memory): "
          "`index_cache` when given, else the tier's .wharf/index when the store reads "
          "through one (cache=, WHARF_CACHE), else $WHARF_INDEX_CACHE or ~/.cache/wharf/index")
      .def_static("from_keys", &PyIndex::FromKeys, py::arg("uri"), py::arg("keys"),
                  "Keys relative to the URI, in the order given (e.g. a list of shards)")
      .def("__len__", &PyIndex::size)
      .def("key", &PyIndex::Key, py::arg("i"))
      .def("size", &PyIndex::Size, py::arg("i"), "The object's size when known, else None")
      .def("url", &PyIndex::Uri, py::arg("i"), "The full URI of sample i")
      .def("keys", &PyIndex::Keys, "Every key (a list of N strings: built on each call)")
      .def_property_readonly("uri", [](PyIndex& i) { return i.handle().uri(); })
      .def_property_readonly(
          "spec", [](PyIndex& i) { return i.handle().spec().ToJson(); },
          "The store spec (JSON, no credentials) the index's store is opened from")
      .def_property_readonly("fingerprint", &PyIndex::Fingerprint,
                             "A digest of the keys in order (checked when resuming)")
      .def_property_readonly(
          "path",
          [](PyIndex& i) -> py::object {
            const std::string& path = i.index()->path();
            return path.empty() ? py::object(py::none()) : py::object(py::str(path));
          },
          "The index file this index maps, or None when it is held in memory")
      .def_property_readonly(
          "memory_bytes", [](PyIndex& i) { return i.index()->memory_bytes(); },
          "Bytes of this process's heap the index holds (0 for a mapped index file)")
      .def(py::pickle([](PyIndex& i) { return i.GetState(); }, &PyIndex::SetState));

  py::class_<Sampler>(m, "Sampler",
                      "The global order of each epoch (the same for any world size), its "
                      "partition across ranks and workers, and resumable states (JSON)")
      .def(py::init([](uint64_t num_samples, uint64_t seed, bool shuffle, bool drop_last,
                       std::string fingerprint, uint64_t order) {
             return Check(Sampler::Create(
                 num_samples,
                 {.seed = seed, .shuffle = shuffle, .drop_last = drop_last, .order = order},
                 std::move(fingerprint)));
           }),
           py::arg("num_samples"), py::arg("seed") = 0, py::arg("shuffle") = true,
           py::arg("drop_last") = false, py::arg("fingerprint") = "",
           py::arg("order") = kCurrentOrder,
           "order: the order version (current_order for new runs; a state continues only "
           "under its own, parse_sampler_state(state)['order'])")
      .def_property_readonly("num_samples", &Sampler::num_samples)
      .def_property_readonly("order", [](const Sampler& s) { return s.options().order; })
      .def(
          "permutation",
          [](const Sampler& s, uint64_t epoch) {
            return WithoutGil([&] { return s.Permutation(epoch); });
          },
          py::arg("epoch"))
      .def("end_of_epoch", &Sampler::EndOfEpoch, py::arg("consumed"), py::arg("world_size"),
           "The end of the epoch's sequence (padding included) from the cursor `consumed`")
      .def(
          "state",
          [](const Sampler& s, uint64_t epoch, uint64_t consumed) {
            return s.State(epoch, consumed).ToJson();
          },
          py::arg("epoch"), py::arg("consumed"), "The SamplerState JSON at this cursor")
      .def(
          "restore",
          [](const Sampler& s, const std::string& json) {
            SamplerState state = Check(s.Restore(json));
            return py::make_tuple(state.epoch, state.consumed);
          },
          py::arg("state"),
          "(epoch, consumed) of a SamplerState JSON, after checking it belongs to this "
          "sampler (size, seed, shuffle, fingerprint)")
      .def(
          "shard",
          [](const Sampler& s, uint64_t epoch, uint64_t consumed, int rank, int world_size,
             int worker, int num_workers, uint64_t worker_block, uint64_t start,
             std::optional<uint64_t> count) {
            const Partition p{.rank = rank,
                              .world_size = world_size,
                              .worker = worker,
                              .num_workers = num_workers,
                              .worker_block = worker_block};
            Shard shard = Check(WithoutGil([&] { return s.ShardOf(s.State(epoch, consumed), p); }));
            // Computed per position: a slice costs its own length, whatever the epoch's.
            return WithoutGil([&] {
              const uint64_t begin = std::min(start, shard.size());
              const uint64_t end = count ? std::min(shard.size(), begin + *count) : shard.size();
              std::vector<uint64_t> out;
              out.reserve(end - begin);
              for (uint64_t i = begin; i < end; ++i) out.push_back(shard.SampleAt(i));
              return out;
            });
          },
          py::arg("epoch"), py::arg("consumed") = 0, py::arg("rank") = 0, py::arg("world_size") = 1,
          py::arg("worker") = 0, py::arg("num_workers") = 1, py::arg("worker_block") = 1,
          py::arg("start") = 0, py::arg("count") = py::none(),
          "The sample indices one (rank, worker) takes from the cursor to the end of the "
          "epoch; with start/count, only that slice of them");

  m.attr("current_order") = kCurrentOrder;
  m.attr("order_versions") = py::make_tuple(kOrderFisherYates, kOrderCounterBased);
  m.def(
      "parse_sampler_state",
      [](const std::string& json) {
        SamplerState s = ParseState(json);
        py::dict d;
        d["num_samples"] = s.num_samples;
        d["seed"] = s.seed;
        d["shuffle"] = s.shuffle;
        d["fingerprint"] = s.fingerprint;
        d["epoch"] = s.epoch;
        d["consumed"] = s.consumed;
        d["order"] = s.order;
        return d;
      },
      py::arg("state"), "The fields of a SamplerState JSON (ValueError when malformed)");
  m.def("consumed_after", &ConsumedAfter, py::arg("start"), py::arg("samples_per_rank"),
        py::arg("world_size"),
        "The global cursor after every rank took samples_per_rank more samples from `start`: "
        "start + samples_per_rank * world_size");

  py::class_<PyReader>(m, "SampleReader",
                       "Random access to the samples of an index; get_batch is ONE engine batch")
      .def(py::init([](std::shared_ptr<PyIndex> index, int max_in_flight,
                       const py::object& memory_budget) {
             return std::make_unique<PyReader>(
                 std::move(index),
                 EngineOptions{max_in_flight, SizeArg(memory_budget, "memory_budget")});
           }),
           py::arg("index"), py::arg("max_in_flight") = 0, py::arg("memory_budget") = 0)
      .def("get", &PyReader::Get, py::arg("i"), "(key, Buffer) of sample i")
      .def("get_batch", &PyReader::GetBatch, py::arg("indices"),
           "[(key, Buffer)] of the samples, in that order, fetched as one engine batch")
      .def_property_readonly("index", &PyReader::index)
      .def_property_readonly("stats", &PyReader::Stats,
                             "Engine batches, samples, requests, bytes and retries of this "
                             "process's engine");

  py::class_<PyStream>(m, "SampleStream",
                       "One (rank, worker) share of an epoch from a cursor, in order, read "
                       "ahead; iterating yields (index, key, Buffer)")
      .def(py::init([](std::shared_ptr<PyIndex> index, uint64_t seed, uint64_t epoch, bool shuffle,
                       bool drop_last, int rank, int world_size, int worker, int num_workers,
                       uint64_t worker_block, uint64_t consumed, uint64_t skip,
                       std::optional<size_t> prefetch, uint64_t prefetch_bytes, int max_in_flight,
                       const py::object& memory_budget, uint64_t order) {
             const EngineOptions engine{max_in_flight, SizeArg(memory_budget, "memory_budget")};
             return std::make_unique<PyStream>(
                 std::move(index), seed, epoch, shuffle, drop_last, rank, world_size, worker,
                 num_workers, worker_block, consumed, skip,
                 prefetch.value_or(StreamOptions::kAutoPrefetch), prefetch_bytes, order, engine);
           }),
           py::arg("index"), py::kw_only(), py::arg("seed") = 0, py::arg("epoch") = 0,
           py::arg("shuffle") = true, py::arg("drop_last") = false, py::arg("rank") = 0,
           py::arg("world_size") = 1, py::arg("worker") = 0, py::arg("num_workers") = 1,
           py::arg("worker_block") = 1, py::arg("consumed") = 0, py::arg("skip") = 0,
           py::arg("prefetch") = py::none(), py::arg("prefetch_bytes") = 0,
           py::arg("max_in_flight") = 0, py::arg("memory_budget") = 0,
           py::arg("order") = kCurrentOrder)
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &PyStream::Next)
      .def("next_batch", &PyStream::NextBatch, py::arg("n"),
           "The next min(n, remaining) samples, fetched together; [] at the end")
      .def("__len__", &PyStream::size)
      .def_property_readonly("yielded", &PyStream::yielded)
      .def_property_readonly("remaining", &PyStream::remaining)
      .def_property_readonly("start", [](PyStream& s) { return s.shard().start; })
      .def_property_readonly("end", [](PyStream& s) { return s.shard().end; })
      .def_property_readonly(
          "rank_count", [](PyStream& s) { return s.shard().rank_count; },
          "Samples the whole rank takes (equal for every rank)")
      .def_property_readonly(
          "samples", [](PyStream& s) { return WithoutGil([&] { return s.shard().Samples(); }); },
          "The sample indices of this share, in order (a list: computed on each access)")
      .def("global_position", &PyStream::GlobalPosition, py::arg("i"),
           "The position in the epoch's sequence of this share's i-th sample")
      .def_property_readonly("stats", &PyStream::Stats);
}

}  // namespace wharf::python
