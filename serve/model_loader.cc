#include "serve/model_loader.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "io/get_all.h"
#include "nlohmann/json.hpp"
#include "store/registry.h"

namespace wharf::serve {
namespace {

using nlohmann::json;

bool IsIndex(absl::string_view uri) {
  const size_t query = uri.find('?');
  return absl::EndsWithIgnoreCase(uri.substr(0, query), ".json");
}

// The URI's folder ("s3://b/m/" for "s3://b/m/model.safetensors.index.json"), where an
// index's shards live.
std::string Folder(absl::string_view uri) {
  const size_t slash = uri.rfind('/');
  return slash == absl::string_view::npos ? "" : std::string(uri.substr(0, slash + 1));
}

// Opens each URI's store once per distinct spec (four shards of one bucket share one store).
class Stores {
 public:
  Stores(const StoreOptions& options, std::shared_ptr<Runtime> runtime)
      : options_(options), runtime_(std::move(runtime)) {}

  absl::StatusOr<std::pair<std::shared_ptr<ObjectStore>, std::string>> Open(absl::string_view uri) {
    WHARF_ASSIGN_OR_RETURN(SpecAndKey parsed, ParseStoreUri(uri, options_));
    std::shared_ptr<ObjectStore>& store = opened_[parsed.spec.ToJson()];
    if (store == nullptr) {
      WHARF_ASSIGN_OR_RETURN(store, OpenSpec(parsed.spec, runtime_));
    }
    return std::make_pair(store, std::move(parsed.key));
  }

 private:
  const StoreOptions& options_;
  std::shared_ptr<Runtime> runtime_;
  std::map<std::string, std::shared_ptr<ObjectStore>> opened_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsModel>> SafetensorsModel::Open(
    const std::vector<std::string>& uris, const ModelLoadOptions& options) {
  std::unique_ptr<SafetensorsModel> model(new SafetensorsModel(options));
  std::shared_ptr<Runtime> runtime = options.runtime ? options.runtime : Runtime::Default();
  model->options_.runtime = runtime;
  if (uris.empty()) return absl::InvalidArgumentError("load safetensors: no file named");
  Stores stores(options.store, runtime);

  // The files: each URI, or the shards its index names.
  std::vector<std::string> file_uris;
  std::vector<std::pair<std::shared_ptr<ObjectStore>, std::string>> file_stores;  // store, key
  std::set<std::string> seen;  // the files' canonical URIs
  // What each index promises: (index URI, tensor, the URI of the file holding it).
  struct Promise {
    const std::string* index;
    std::string tensor;
    std::string file;
  };
  std::vector<Promise> promised;
  std::map<std::string, std::string> named_by;  // a shard's URI -> the index naming it
  for (const std::string& uri : uris) {
    std::vector<std::string> expanded;
    if (IsIndex(uri)) {
      WHARF_ASSIGN_OR_RETURN(auto opened, stores.Open(uri));
      absl::StatusOr<std::string> text = opened.first->Read(opened.second);
      if (!text.ok()) return text.status();
      WHARF_ASSIGN_OR_RETURN(SafetensorsIndex index, ParseSafetensorsIndex(*text, uri));
      if (index.files.empty()) {
        return absl::DataLossError(absl::StrCat(uri, ": the index's weight_map names no file"));
      }
      for (const std::string& name : index.files) {
        expanded.push_back(Folder(uri) + name);
        named_by.emplace(expanded.back(), uri);
      }
      for (auto& [tensor, name] : index.weight_map) {
        promised.push_back({&uri, tensor, Folder(uri) + name});
      }
    } else {
      expanded.push_back(uri);
    }
    // One file named twice (also spelled two ways: a path and its file:// URI) is read once.
    for (std::string& u : expanded) {
      WHARF_ASSIGN_OR_RETURN(auto opened, stores.Open(u));
      if (seen.insert(opened.first->Uri(opened.second)).second) {
        file_uris.push_back(std::move(u));
        file_stores.push_back(std::move(opened));
      }
    }
  }

  // Headers: one ranged GET of each file's first bytes, all in flight together (per store).
  const uint64_t probe = std::max<uint64_t>(options.header_probe_bytes, 4096);
  std::vector<ModelFile>& files = model->files_;
  files.resize(file_uris.size());
  std::map<ObjectStore*, std::vector<size_t>> by_store;
  for (size_t i = 0; i < file_uris.size(); ++i) {
    auto& opened = file_stores[i];
    files[i].uri = file_uris[i];
    files[i].store = std::move(opened.first);
    files[i].key = std::move(opened.second);
    files[i].head.assign(probe, '\0');
    by_store[files[i].store.get()].push_back(i);
  }
  for (auto& [store, indices] : by_store) {
    std::vector<GetRequest> gets;
    for (size_t i : indices) {
      GetRequest get;
      get.key = files[i].key;
      get.range = ByteRange::Of(0, probe);
      get.buffer = absl::MakeSpan(files[i].head);
      gets.push_back(std::move(get));
    }
    GetAllOptions get_options;
    get_options.max_in_flight = 64;
    get_options.allow_short_reads = true;
    GetAllResult got = GetAll(*store, std::move(gets), get_options);
    for (size_t j = 0; j < indices.size(); ++j) {
      ModelFile& f = files[indices[j]];
      absl::StatusOr<GetResult>& r = got.results[j];
      if (!r.ok()) {
        // An empty object answers a range with OutOfRange: a file too short to be one.
        if (absl::IsOutOfRange(r.status())) {
          return absl::DataLossError(
              absl::StrCat(f.uri, ": not a valid safetensors file: the file is empty"));
        }
        if (auto by = named_by.find(f.uri); by != named_by.end() && absl::IsNotFound(r.status())) {
          return Annotate(r.status(), absl::StrCat("the index ", by->second,
                                                   " names a shard "
                                                   "that does not exist"));
        }
        return r.status();
      }
      f.size = r->meta.size;
      f.etag = r->meta.etag;
      f.head.resize(r->bytes);
    }
  }
  for (ModelFile& f : files) {
    WHARF_ASSIGN_OR_RETURN(uint64_t n, ParseSafetensorsHeaderLength(f.head, f.size, f.uri));
    if (f.head.size() < 8 + n) {
      // A header longer than the probe: the rest, from the same version of the file.
      GetRequest get;
      get.key = f.key;
      get.range = ByteRange::Of(f.head.size(), 8 + n - f.head.size());
      get.if_match = f.etag;
      const size_t have = f.head.size();
      f.head.resize(8 + n);
      get.buffer = absl::MakeSpan(f.head.data() + have, f.head.size() - have);
      WHARF_ASSIGN_OR_RETURN(GetResult r, f.store->Get(get));
      if (r.bytes != f.head.size() - have) {
        return absl::DataLossError(absl::StrCat(f.uri, ": short read of the header"));
      }
    }
    WHARF_ASSIGN_OR_RETURN(f.header, ParseSafetensors(f.head, f.size, f.uri));
  }

  // The tensors, file by file; a name in two files is ambiguous.
  absl::flat_hash_map<absl::string_view, size_t> owner;
  for (size_t i = 0; i < files.size(); ++i) {
    // Within a file, in the order of the bytes (as safetensors.torch.load_file returns them).
    std::vector<const SafetensorsTensor*> in_file;
    for (const SafetensorsTensor& t : files[i].header.tensors) in_file.push_back(&t);
    std::sort(
        in_file.begin(), in_file.end(), [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
          return std::tie(a->offset, a->size, a->name) < std::tie(b->offset, b->size, b->name);
        });
    for (const SafetensorsTensor* p : in_file) {
      const SafetensorsTensor& t = *p;
      auto [it, inserted] = owner.emplace(t.name, i);
      if (!inserted) {
        return absl::DataLossError(absl::StrCat("tensor '", t.name, "' is in both ",
                                                files[it->second].uri, " and ", files[i].uri));
      }
      model->tensors_.push_back({i, &t});
      model->total_bytes_ += t.size;
    }
  }
  // Each tensor an index names is in the file it names: a model short of a tensor its index
  // promises (a shard from another version of the model) is refused, never loaded partly.
  for (const Promise& p : promised) {
    auto it = owner.find(p.tensor);
    if (it == owner.end()) {
      return absl::DataLossError(absl::StrCat(*p.index, ": weight_map puts tensor '", p.tensor,
                                              "' in ", p.file, ", which does not hold it"));
    }
    if (files[it->second].uri != p.file) {
      return absl::DataLossError(absl::StrCat(*p.index, ": weight_map puts tensor '", p.tensor,
                                              "' in ", p.file, ", but it is in ",
                                              files[it->second].uri));
    }
  }
  return model;
}

absl::StatusOr<ReadRangesStats> SafetensorsModel::Read(absl::Span<char* const> dsts,
                                                       std::function<void(size_t)> on_tensor,
                                                       CancelToken cancel) const {
  if (dsts.size() != tensors_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "load safetensors: ", dsts.size(), " destinations for ", tensors_.size(), " tensors"));
  }
  std::vector<ModelSpan> spans(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const SafetensorsTensor& t = *tensors_[i].tensor;
    if (t.size > 0 && dsts[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("load ", files_[tensors_[i].file].uri,
                                                     ": tensor '", t.name, "': no destination for ",
                                                     t.size, " bytes"));
    }
    spans[i] = {tensors_[i].file, t.offset, t.size, dsts[i]};
  }
  return ReadSpans(spans, std::move(on_tensor), std::move(cancel));
}

absl::StatusOr<ReadRangesStats> SafetensorsModel::ReadSpans(absl::Span<const ModelSpan> spans,
                                                            std::function<void(size_t)> on_span,
                                                            CancelToken cancel) const {
  ReadRangesStats total;
  // Per store: the ranges to fetch, and which span each is.
  std::map<ObjectStore*, std::pair<std::vector<RangeToRead>, std::vector<size_t>>> by_store;
  for (size_t i = 0; i < spans.size(); ++i) {
    const ModelSpan& s = spans[i];
    if (s.file >= files_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("load safetensors: span ", i, " names file ",
                                                     s.file, " of ", files_.size()));
    }
    const ModelFile& f = files_[s.file];
    if (s.offset > f.size || s.size > f.size - s.offset) {
      return absl::InvalidArgumentError(absl::StrCat("load ", f.uri, ": bytes ", s.offset, "+",
                                                     s.size, " lie beyond the file's ", f.size));
    }
    if (s.size > 0 && s.dst == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("load ", f.uri, ": no destination for ", s.size, " bytes"));
    }
    if (s.offset + s.size <= f.head.size()) {
      // Already here: the header probe read it.
      if (s.size > 0) std::memcpy(s.dst, f.head.data() + s.offset, s.size);
      total.bytes += s.size;
      if (on_span) on_span(i);
      continue;
    }
    auto& [ranges, which] = by_store[f.store.get()];
    ranges.push_back({f.key, s.offset, s.size, s.dst, f.etag});
    which.push_back(i);
  }
  for (auto& [store, work] : by_store) {
    auto& [ranges, which] = work;
    ReadRangesOptions options;
    options.max_in_flight = options_.max_in_flight;
    options.max_request_bytes = options_.max_request_bytes;
    options.runtime = options_.runtime;
    options.cancel = cancel;
    // Safetensors packs tensors back to back: neighbours share GETs up to the part size.
    options.coalesce_gap = 0;
    if (on_span) {
      options.on_range_done = [&on_span, &which](size_t r) { on_span(which[r]); };
    }
    WHARF_ASSIGN_OR_RETURN(ReadRangesStats stats, ReadRanges(*store, std::move(ranges), options));
    total.ranges += stats.ranges;
    total.requests += stats.requests;
    total.bytes += stats.bytes;
    total.bytes_fetched += stats.bytes_fetched;
  }
  return total;
}

}  // namespace wharf::serve
