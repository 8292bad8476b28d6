#include "dataset/records.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/profiler.h"
#include "base/runtime.h"
#include "base/status.h"
#include "formats/byte_stream.h"
#include "formats/registry.h"
#include "nlohmann/json.hpp"

namespace wharf {
namespace {

// The JSON layout: 1 before order versions (no "order": order 1), 2 with "order".
constexpr uint64_t kLegacyStateVersion = 1;
constexpr uint64_t kStateVersion = 2;
// Buffered records re-read at once when restoring: each holds one small chunk.
constexpr size_t kRestoreGroup = 64;
constexpr uint64_t kSingleRecordChunk = uint64_t{1} << 20;
// The smallest chunk a memory_budget makes readers use.
constexpr uint64_t kMinCappedChunk = uint64_t{4} << 10;

// Under a memory_budget `cap` (records.h): a reader's share of it, and how many buffered
// records are re-read at once when restoring (each reader holding one chunk of its share).
uint64_t ReaderShare(uint64_t cap, bool single_record) {
  return std::max(kMinCappedChunk, cap / (single_record ? kRestoreGroup : 2));
}
size_t RestoreGroup(uint64_t cap) {
  if (cap == 0) return kRestoreGroup;
  return static_cast<size_t>(std::clamp<uint64_t>(cap / ReaderShare(cap, true), 1, kRestoreGroup));
}

absl::Status StateError(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("parsing record stream state: ", message));
}

}  // namespace

absl::Status RecordStreamOptions::Validate() const {
  if (world_size < 1 || rank < 0 || rank >= world_size || num_workers < 1 || worker < 0 ||
      worker >= num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: rank ", rank, " of ", world_size, ", worker ", worker, " of ",
                     num_workers, " (need 0 <= rank < world_size and 0 <= worker < num_workers)"));
  }
  return CheckOrderVersion(order);
}

// ---- RecordStreamState ----

std::string RecordStreamState::ToJson() const {
  nlohmann::ordered_json j;
  j["version"] = kStateVersion;
  j["order"] = order;
  j["format"] = format;
  j["num_shards"] = num_shards;
  j["fingerprint"] = fingerprint;
  j["seed"] = seed;
  j["epoch"] = epoch;
  j["shuffle"] = shuffle;
  j["shuffle_buffer"] = shuffle_buffer;
  j["rank"] = rank;
  j["world_size"] = world_size;
  j["worker"] = worker;
  j["num_workers"] = num_workers;
  j["yielded"] = yielded;
  j["shards_done"] = shards_done;
  j["last_offset"] = last_offset ? nlohmann::ordered_json(*last_offset) : nullptr;
  nlohmann::ordered_json held = nlohmann::ordered_json::array();
  for (const auto& [shard, offset] : buffered) held.push_back({shard, offset});
  j["buffered"] = std::move(held);
  j["rng"] = std::to_string(rng);
  nlohmann::ordered_json tags = nlohmann::ordered_json::array();
  for (const auto& [shard, etag] : etags) tags.push_back({shard, etag});
  j["etags"] = std::move(tags);
  return j.dump();
}

absl::StatusOr<RecordStreamState> RecordStreamState::FromJson(absl::string_view json) {
  using Json = nlohmann::json;
  Json j = Json::parse(json.begin(), json.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return StateError("not valid JSON");
  if (!j.is_object()) return StateError("expected a JSON object");
  auto field = [&j](const char* name) -> absl::StatusOr<const Json*> {
    auto it = j.find(name);
    if (it == j.end()) return StateError(absl::StrCat("missing \"", name, "\""));
    return &*it;
  };
  auto uint_field = [&](const char* name, uint64_t* out) -> absl::Status {
    WHARF_ASSIGN_OR_RETURN(const Json* v, field(name));
    if (!v->is_number_unsigned()) {
      return StateError(absl::StrCat("\"", name, "\" must be a non-negative integer"));
    }
    *out = v->get<uint64_t>();
    return absl::OkStatus();
  };
  auto int_field = [&](const char* name, int* out) -> absl::Status {
    uint64_t v = 0;
    WHARF_RETURN_IF_ERROR(uint_field(name, &v));
    if (v > (uint64_t{1} << 30)) return StateError(absl::StrCat("\"", name, "\" is too large"));
    *out = static_cast<int>(v);
    return absl::OkStatus();
  };
  uint64_t version = 0;
  WHARF_RETURN_IF_ERROR(uint_field("version", &version));
  if (version != kStateVersion && version != kLegacyStateVersion) {
    return StateError(absl::StrCat("unsupported version ", version, " (this build reads ",
                                   kLegacyStateVersion, " and ", kStateVersion, ")"));
  }
  RecordStreamState s;
  s.order = kOrderFisherYates;  // what a state from before order versions was taken under
  if (version == kStateVersion) {
    WHARF_RETURN_IF_ERROR(uint_field("order", &s.order));
    if (absl::Status v = CheckOrderVersion(s.order); !v.ok()) return StateError(v.message());
  }
  WHARF_ASSIGN_OR_RETURN(const Json* format, field("format"));
  if (!format->is_string()) return StateError("\"format\" must be a string");
  s.format = format->get<std::string>();
  if (auto known = FindRecordFormat(s.format); !known.ok()) {
    return StateError(known.status().message());
  }
  WHARF_ASSIGN_OR_RETURN(const Json* fingerprint, field("fingerprint"));
  if (!fingerprint->is_string()) return StateError("\"fingerprint\" must be a string");
  s.fingerprint = fingerprint->get<std::string>();
  WHARF_ASSIGN_OR_RETURN(const Json* shuffle, field("shuffle"));
  if (!shuffle->is_boolean()) return StateError("\"shuffle\" must be true or false");
  s.shuffle = shuffle->get<bool>();
  for (auto [name, out] :
       {std::pair{"num_shards", &s.num_shards}, std::pair{"seed", &s.seed},
        std::pair{"epoch", &s.epoch}, std::pair{"shuffle_buffer", &s.shuffle_buffer},
        std::pair{"yielded", &s.yielded}, std::pair{"shards_done", &s.shards_done}}) {
    WHARF_RETURN_IF_ERROR(uint_field(name, out));
  }
  for (auto [name, out] :
       {std::pair{"rank", &s.rank}, std::pair{"world_size", &s.world_size},
        std::pair{"worker", &s.worker}, std::pair{"num_workers", &s.num_workers}}) {
    WHARF_RETURN_IF_ERROR(int_field(name, out));
  }
  WHARF_ASSIGN_OR_RETURN(const Json* last, field("last_offset"));
  if (!last->is_null()) {
    if (!last->is_number_unsigned()) {
      return StateError("\"last_offset\" must be null or a non-negative integer");
    }
    s.last_offset = last->get<uint64_t>();
  }
  WHARF_ASSIGN_OR_RETURN(const Json* held, field("buffered"));
  if (!held->is_array()) return StateError("\"buffered\" must be an array");
  for (const Json& e : *held) {
    if (!e.is_array() || e.size() != 2 || !e[0].is_number_unsigned() ||
        !e[1].is_number_unsigned()) {
      return StateError("\"buffered\" entries must be [shard, offset] pairs");
    }
    s.buffered.emplace_back(e[0].get<uint64_t>(), e[1].get<uint64_t>());
  }
  WHARF_ASSIGN_OR_RETURN(const Json* rng, field("rng"));
  if (!rng->is_string() || !absl::SimpleAtoi(rng->get<std::string>(), &s.rng)) {
    return StateError("\"rng\" must be a decimal string");
  }
  WHARF_ASSIGN_OR_RETURN(const Json* tags, field("etags"));
  if (!tags->is_array()) return StateError("\"etags\" must be an array");
  for (const Json& e : *tags) {
    if (!e.is_array() || e.size() != 2 || !e[0].is_number_unsigned() || !e[1].is_string()) {
      return StateError("\"etags\" entries must be [shard, etag] pairs");
    }
    s.etags.emplace_back(e[0].get<uint64_t>(), e[1].get<std::string>());
  }
  return s;
}

// ---- RecordStream ----

absl::StatusOr<std::unique_ptr<RecordStream>> RecordStream::Create(
    std::shared_ptr<ObjectStore> store, std::shared_ptr<const SampleIndex> shards,
    RecordStreamOptions options, const RecordStreamState* resume) {
  WHARF_RETURN_IF_ERROR(options.Validate());
  WHARF_RETURN_IF_ERROR(FindRecordFormat(options.format).status());
  WHARF_ASSIGN_OR_RETURN(EpochOrder order,
                         EpochOrder::Create(options.order, OrderOf::kShards, shards->size(),
                                            options.seed, options.epoch, options.shuffle));
  auto stream = std::unique_ptr<RecordStream>(
      new RecordStream(std::move(store), std::move(shards), std::move(options), order));
  if (resume != nullptr) WHARF_RETURN_IF_ERROR(stream->Restore(*resume));
  return stream;
}

RecordStream::RecordStream(std::shared_ptr<ObjectStore> store,
                           std::shared_ptr<const SampleIndex> shards, RecordStreamOptions options,
                           const EpochOrder& shard_order)
    : store_(std::move(store)),
      shards_(std::move(shards)),
      options_(std::move(options)),
      fingerprint_(shards_->Fingerprint()),
      buffer_(options_.shuffle_buffer,
              DeriveSeed(DeriveSeed(options_.seed, options_.epoch),
                         static_cast<uint64_t>(options_.rank) *
                                 static_cast<uint64_t>(options_.num_workers) +
                             static_cast<uint64_t>(options_.worker))) {
  // Position p of the order goes to rank p % W; the rank's j-th shard to worker j % K.
  const uint64_t w = static_cast<uint64_t>(options_.world_size);
  const uint64_t k = static_cast<uint64_t>(options_.num_workers);
  const uint64_t first =
      static_cast<uint64_t>(options_.rank) + static_cast<uint64_t>(options_.worker) * w;
  for (uint64_t p = first; p < shard_order.size(); p += w * k) {
    assigned_.push_back(static_cast<size_t>(shard_order.At(p)));
  }
}

RecordStream::~RecordStream() = default;

RecordStreamState RecordStream::State() const {
  RecordStreamState s;
  s.format = options_.format;
  s.num_shards = shards_->size();
  s.fingerprint = fingerprint_;
  s.seed = options_.seed;
  s.epoch = options_.epoch;
  s.shuffle = options_.shuffle;
  s.shuffle_buffer = options_.shuffle_buffer;
  s.rank = options_.rank;
  s.world_size = options_.world_size;
  s.worker = options_.worker;
  s.num_workers = options_.num_workers;
  s.order = options_.order;
  s.yielded = yielded_;
  s.shards_done = next_ - (current_ ? 1 : 0);
  if (current_) s.last_offset = last_offset_;
  for (const Record& r : buffer_.items()) s.buffered.emplace_back(r.shard, r.offset);
  s.rng = buffer_.rng_state();
  // The ETags of the shards the state names, once each, in shard order.
  std::map<size_t, std::string> tags;
  auto tag = [&](size_t shard) {
    if (auto it = etags_.find(shard); it != etags_.end() && !it->second.empty()) {
      tags.emplace(shard, it->second);
    }
  };
  if (current_) tag(current_shard_);
  for (const Record& r : buffer_.items()) tag(r.shard);
  s.etags.assign(tags.begin(), tags.end());
  return s;
}

absl::Status RecordStream::Restore(const RecordStreamState& state) {
  // Everything that decides the share's records and order must match.
  std::string differs;
  auto check = [&differs](const char* name, auto saved, auto here) {
    if (saved != here && differs.empty()) {
      differs = absl::StrCat(name, " ", saved, " in the state, ", here, " here");
    }
  };
  check("format", state.format, options_.format);
  check("shard count", state.num_shards, shards_->size());
  check("shard list fingerprint", state.fingerprint, fingerprint_);
  check("seed", state.seed, options_.seed);
  check("epoch", state.epoch, options_.epoch);
  check("shuffle", state.shuffle, options_.shuffle);
  check("shuffle_buffer", state.shuffle_buffer, options_.shuffle_buffer);
  check("rank", state.rank, options_.rank);
  check("world_size", state.world_size, options_.world_size);
  check("worker", state.worker, options_.worker);
  check("num_workers", state.num_workers, options_.num_workers);
  check("order version", state.order, options_.order);
  if (!differs.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "record stream state is for another share: ", differs,
        " (resume with the same shards, seed, epoch, world size, number of workers and "
        "order version)"));
  }
  const uint64_t open_shards = state.shards_done + (state.last_offset ? 1 : 0);
  if (open_shards > assigned_.size() || state.buffered.size() > options_.shuffle_buffer) {
    return absl::FailedPreconditionError(
        "record stream state is inconsistent with its share (more shards or buffered "
        "records than the share has)");
  }
  for (const auto& [shard, offset] : state.buffered) {
    if (shard >= shards_->size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("record stream state: buffered shard ", shard, " out of range"));
    }
  }
  std::map<size_t, std::string> saved_etags(state.etags.begin(), state.etags.end());
  auto no_record = [this](size_t shard, uint64_t offset) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resuming: ", store_->Uri(shards_->Ref(shard).key), " has no ", options_.format,
        " record at byte offset ", offset, " (the shard changed since the checkpoint)"));
  };
  // Reads one record at `offset` of `shard` from `reader`: the shard must be the version the
  // state was taken from, and the record must be there.
  auto expect_record = [this, &saved_etags, &no_record](RecordReader& reader, size_t shard,
                                                        uint64_t offset) -> absl::StatusOr<Record> {
    const std::string& etag = reader.reader().meta().etag;
    if (auto it = saved_etags.find(shard);
        it != saved_etags.end() && !etag.empty() && etag != it->second) {
      return absl::FailedPreconditionError(absl::StrCat(
          "resuming: ", store_->Uri(shards_->Ref(shard).key),
          " changed since the checkpoint (ETag ", it->second, " then, ", etag, " now)"));
    }
    etags_[shard] = etag;
    WHARF_ASSIGN_OR_RETURN(std::optional<Record> r, reader.Next());
    if (!r || r->offset != offset) return no_record(shard, offset);
    r->shard = shard;
    return *std::move(r);
  };

  // The held records. A stored shard's are read one by one at their offsets (ranged GETs), a
  // group of reads in flight at a time. A compressed shard has no random access (a reader
  // opened at an offset inflates the shard from its start), so its held records are read in
  // one pass over it from the first of them: a reader per record would inflate the shard
  // once per record (a shuffle buffer of 1,000 records of one .tar.gz: 1,000 passes).
  std::vector<std::optional<Record>> slots(state.buffered.size());
  std::vector<size_t> stored;
  std::map<size_t, std::vector<size_t>> compressed;  // shard -> its slots
  for (size_t i = 0; i < state.buffered.size(); ++i) {
    const size_t shard = state.buffered[i].first;
    if (ResolveCompression(Compression::kAuto, shards_->Ref(shard).key) == Compression::kNone) {
      stored.push_back(i);
    } else {
      compressed[shard].push_back(i);
    }
  }
  const size_t group = RestoreGroup(options_.memory_budget);
  for (size_t begin = 0; begin < stored.size(); begin += group) {
    const size_t end = std::min(stored.size(), begin + group);
    std::vector<std::unique_ptr<RecordReader>> readers;
    for (size_t i = begin; i < end; ++i) {
      const auto [shard, offset] = state.buffered[stored[i]];
      WHARF_ASSIGN_OR_RETURN(auto reader, OpenShard(shard, offset, /*single_record=*/true));
      readers.push_back(std::move(reader));
    }
    for (size_t i = begin; i < end; ++i) {
      const auto [shard, offset] = state.buffered[stored[i]];
      WHARF_ASSIGN_OR_RETURN(slots[stored[i]], expect_record(*readers[i - begin], shard, offset));
    }
  }
  for (auto& [shard, wanted] : compressed) {
    std::sort(wanted.begin(), wanted.end(), [&](size_t a, size_t b) {
      return state.buffered[a].second < state.buffered[b].second;
    });
    const uint64_t first = state.buffered[wanted.front()].second;
    WHARF_ASSIGN_OR_RETURN(auto reader, OpenShard(shard, first));
    WHARF_ASSIGN_OR_RETURN(Record r, expect_record(*reader, shard, first));
    for (size_t slot : wanted) {
      const uint64_t offset = state.buffered[slot].second;
      while (r.offset < offset) {
        WHARF_ASSIGN_OR_RETURN(std::optional<Record> next, reader->Next());
        if (!next) break;
        r = *std::move(next);
        r.shard = shard;
      }
      if (r.offset != offset) return no_record(shard, offset);
      slots[slot] = r;
    }
  }
  std::vector<Record> held;
  held.reserve(slots.size());
  for (std::optional<Record>& r : slots) held.push_back(*std::move(r));
  buffer_.Restore(std::move(held), state.rng);

  next_ = state.shards_done;
  if (state.last_offset) {
    const size_t shard = assigned_[next_];
    WHARF_ASSIGN_OR_RETURN(current_, OpenShard(shard, *state.last_offset));
    WHARF_RETURN_IF_ERROR(expect_record(*current_, shard, *state.last_offset).status());
    current_shard_ = shard;
    last_offset_ = state.last_offset;
    last_header_ = current_->header();
    ++next_;
    OpenAhead();
  }
  yielded_ = state.yielded;
  return absl::OkStatus();
}

std::optional<std::string> RecordStream::header() const {
  return current_ ? current_->header() : last_header_;
}

absl::StatusOr<std::unique_ptr<RecordReader>> RecordStream::OpenShard(size_t shard, uint64_t offset,
                                                                      bool single_record) {
  RecordReaderOptions o;
  o.io = options_.io;
  o.io.offset = offset;
  if (options_.memory_budget > 0) {
    // The stream's cap, shared by the readers open at once (records.h). Derived settings are
    // resolved here, so that a chunk can be kept within a reader's share.
    if (!o.io.runtime) o.io.runtime = Runtime::Default();
    o.io = o.io.Resolved(o.io.runtime->link(store_->Uri("")));
    const uint64_t share = ReaderShare(options_.memory_budget, single_record);
    o.io.chunk_size = std::min(o.io.chunk_size, share);
    o.io.max_buffered_bytes =
        o.io.max_buffered_bytes == 0 ? share : std::min(o.io.max_buffered_bytes, share);
  }
  if (single_record) {
    o.io.chunk_size = o.io.chunk_size == 0 ? kSingleRecordChunk  // 0: derived, always larger
                                           : std::min(o.io.chunk_size, kSingleRecordChunk);
    o.io.read_ahead = 0;
    o.io.max_buffered_bytes = 0;
  }
  o.header = options_.header && !single_record;
  o.delimiter = options_.delimiter;
  o.quote = options_.quote;
  o.skip_empty_rows = options_.skip_empty_rows;
  const SampleEntry entry = (*shards_)[shard];
  RecordObject object{store_, entry.key, std::nullopt};
  if (entry.size.has_value()) {  // from a listing: no HEAD
    object.meta = ObjectMeta{.key = entry.key, .size = *entry.size, .etag = entry.etag};
  }
  return OpenRecordReader(options_.format, object, o);
}

void RecordStream::OpenAhead() {
  if (next_ >= assigned_.size()) return;
  auto ahead = OpenShard(assigned_[next_]);
  if (ahead.ok()) ahead_ = *std::move(ahead);
}

absl::StatusOr<bool> RecordStream::EnsureCurrent() {
  if (current_) return true;
  if (next_ >= assigned_.size()) return false;
  if (ahead_) {
    current_ = std::move(ahead_);
  } else {
    WHARF_ASSIGN_OR_RETURN(current_, OpenShard(assigned_[next_]));
  }
  current_shard_ = assigned_[next_++];
  etags_[current_shard_] = current_->reader().meta().etag;
  last_offset_.reset();
  last_header_ = current_->header();
  OpenAhead();
  return true;
}

absl::StatusOr<std::optional<Record>> RecordStream::NextInOrder() {
  while (true) {
    WHARF_ASSIGN_OR_RETURN(bool open, EnsureCurrent());
    if (!open) return std::nullopt;
    WHARF_ASSIGN_OR_RETURN(std::optional<Record> r, current_->Next());
    if (r) {
      r->shard = current_shard_;
      last_offset_ = r->offset;
      return r;
    }
    current_.reset();
  }
}

namespace {

// Profiles one call that parses records: its time, less the time its thread spent blocked on
// bytes (recorded by the reader as I/O wait), is parse time.
class ParseSpan {
 public:
  ParseSpan()
      : start_ns_(Profiler::Active() ? MonotonicNanos() : 0),
        waited_ns_(start_ns_ != 0 ? Profiler::ThreadIoWaitNanos() : 0) {}
  ~ParseSpan() {
    if (start_ns_ == 0) return;
    const int64_t end = MonotonicNanos();
    const int64_t parse = (end - start_ns_) - (Profiler::ThreadIoWaitNanos() - waited_ns_);
    Profiler::Get().Record(ProfileStage::kParse, end - std::max<int64_t>(0, parse), end);
  }

 private:
  const int64_t start_ns_;
  const int64_t waited_ns_;
};

}  // namespace

absl::StatusOr<std::optional<Record>> RecordStream::Next() {
  if (!pending_.ok()) return std::exchange(pending_, absl::OkStatus());
  ParseSpan span;
  std::optional<Record> out;
  if (options_.shuffle_buffer == 0) {
    WHARF_ASSIGN_OR_RETURN(out, NextInOrder());
  } else {
    while (true) {
      WHARF_ASSIGN_OR_RETURN(std::optional<Record> r, NextInOrder());
      if (!r) {
        out = buffer_.Pop();  // the stream ended: drain
        break;
      }
      if ((out = buffer_.Push(*std::move(r)))) break;
    }
  }
  if (out) ++yielded_;
  return out;
}

absl::StatusOr<std::vector<Record>> RecordStream::NextBatch(size_t n) {
  if (!pending_.ok()) return std::exchange(pending_, absl::OkStatus());
  ParseSpan span;
  std::vector<Record> out;
  absl::Status status = FillBatch(n, &out);
  if (status.ok()) return out;
  if (out.empty()) return status;
  pending_ = std::move(status);  // the records taken are returned; the error comes next
  return out;
}

absl::Status RecordStream::FillBatch(size_t n, std::vector<Record>* out) {
  while (out->size() < n) {
    if (options_.shuffle_buffer == 0) {
      WHARF_ASSIGN_OR_RETURN(bool open, EnsureCurrent());
      if (!open) break;
      WHARF_ASSIGN_OR_RETURN(std::vector<Record> rows, current_->NextBatch(n - out->size()));
      if (rows.empty()) {
        current_.reset();
        continue;
      }
      last_offset_ = rows.back().offset;
      yielded_ += rows.size();
      for (Record& r : rows) {
        r.shard = current_shard_;
        out->push_back(std::move(r));
      }
      continue;
    }
    WHARF_ASSIGN_OR_RETURN(std::optional<Record> r, Next());
    if (!r) break;
    out->push_back(*std::move(r));
  }
  return absl::OkStatus();
}

}  // namespace wharf
