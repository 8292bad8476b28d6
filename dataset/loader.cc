#include "dataset/loader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace wharf {
namespace {

std::string SampleContext(uint64_t index, const SampleRef& entry) {
  return absl::StrCat("sample ", index, " (", entry.key, ")");
}

// Turns the engine's result for sample `index` into a Sample, or an error naming it.
absl::StatusOr<Sample> ToSample(const SampleIndex& samples, uint64_t index, FetchResult r) {
  const SampleRef entry = samples.Ref(index);
  if (!r.data.ok()) return Annotate(r.data.status(), SampleContext(index, entry));
  // The engine reads the extent the index gives; an object that grew or shrank since
  // indexing would otherwise come back silently truncated or short.
  if (entry.size.has_value() && r.object_size != *entry.size) {
    return absl::FailedPreconditionError(absl::StrCat(
        SampleContext(index, entry), ": the object is ", r.object_size, " bytes, the index says ",
        *entry.size, " (it changed since indexing: rebuild the index)"));
  }
  return Sample{.index = index, .key = std::move(r.key), .data = *std::move(r.data)};
}

absl::Status OutOfRange(uint64_t index, size_t size) {
  return absl::OutOfRangeError(
      absl::StrCat("sample ", index, " of a dataset of ", size, " samples"));
}

}  // namespace

// ---- SampleReader ----

SampleReader::SampleReader(std::shared_ptr<const SampleIndex> index,
                           std::shared_ptr<FetchScheduler> scheduler)
    : index_(std::move(index)), scheduler_(std::move(scheduler)) {}

absl::StatusOr<Sample> SampleReader::Get(uint64_t index) const {
  const uint64_t indices[] = {index};
  WHARF_ASSIGN_OR_RETURN(std::vector<Sample> samples, GetBatch(indices));
  return std::move(samples.front());
}

absl::StatusOr<std::vector<Sample>> SampleReader::GetBatch(absl::Span<const uint64_t> indices,
                                                           FetchStats* stats) const {
  std::vector<FetchItem> items;
  items.reserve(indices.size());
  for (uint64_t i : indices) {
    if (i >= index_->size()) return OutOfRange(i, index_->size());
    items.push_back(index_->Ref(i).ToFetchItem());
  }
  auto batch = scheduler_->Fetch(std::move(items));
  std::vector<std::optional<absl::StatusOr<Sample>>> slots(indices.size());
  size_t received = 0;
  while (auto r = batch->Next()) {
    const size_t slot = r->index;
    slots[slot] = ToSample(*index_, indices[slot], *std::move(r));
    ++received;
  }
  if (stats != nullptr) *stats = batch->stats();
  if (received != indices.size()) {
    return absl::InternalError(
        absl::StrCat("fetch batch ended after ", received, " of ", indices.size(), " samples"));
  }
  std::vector<Sample> out;
  out.reserve(indices.size());
  for (auto& slot : slots) {
    if (!slot->ok()) return slot->status();
    out.push_back(*std::move(*slot));
  }
  return out;
}

// ---- SampleStream ----

absl::StatusOr<std::unique_ptr<SampleStream>> SampleStream::Create(
    std::shared_ptr<const SampleIndex> index, const Sampler& sampler, const SamplerState& state,
    const Partition& partition, std::shared_ptr<FetchScheduler> scheduler, StreamOptions options) {
  if (sampler.num_samples() != index->size()) {
    return absl::FailedPreconditionError(absl::StrCat("sampler is for ", sampler.num_samples(),
                                                      " samples, the index has ", index->size()));
  }
  WHARF_ASSIGN_OR_RETURN(Shard shard, sampler.ShardOf(state, partition));
  return Create(std::move(index), std::move(shard), std::move(scheduler), options);
}

absl::StatusOr<std::unique_ptr<SampleStream>> SampleStream::Create(
    std::shared_ptr<const SampleIndex> index, Shard shard,
    std::shared_ptr<FetchScheduler> scheduler, StreamOptions options) {
  // The share's samples are the order's elements: [0, order size).
  if (shard.size() > 0 && shard.order.size() > index->size()) {
    return OutOfRange(shard.order.size() - 1, index->size());
  }
  return std::unique_ptr<SampleStream>(
      new SampleStream(std::move(index), std::move(shard), std::move(scheduler), options));
}

SampleStream::SampleStream(std::shared_ptr<const SampleIndex> index, Shard shard,
                           std::shared_ptr<FetchScheduler> scheduler, StreamOptions options)
    : index_(std::move(index)),
      shard_(std::move(shard)),
      scheduler_(std::move(scheduler)),
      options_(options) {
  base_ = added_ = yielded_ = std::min<uint64_t>(options_.skip, shard_.size());
}

// The batch handle cancels outstanding requests; their buffers are freed as they finish.
SampleStream::~SampleStream() = default;

FetchStats SampleStream::stats() const { return batch_ ? batch_->stats() : FetchStats{}; }

size_t SampleStream::Prefetch() const {
  if (options_.prefetch != StreamOptions::kAutoPrefetch) return options_.prefetch;
  if (!remote_) return StreamOptions::kNearPrefetch;
  return std::max(StreamOptions::kNearPrefetch,
                  2 * static_cast<size_t>(scheduler_->max_in_flight()));
}

void SampleStream::Observe(const FetchResult& r) {
  if (!remote_ && r.time_to_first_byte >= StreamOptions::kRemoteFirstByte) remote_ = true;
}

uint64_t SampleStream::SizeAt(uint64_t position) const {
  return index_->Ref(shard_.SampleAt(position)).size.value_or(0);
}

void SampleStream::FillTo(uint64_t required, uint64_t ahead) {
  const uint64_t total = shard_.size();
  required = std::min(required, total);
  ahead = std::max(required, std::min(ahead, total));
  if (added_ >= ahead) return;
  // The window is topped up in chunks, not one sample per sample taken: the engine plans the
  // items of one Add together (composed reads group up to 32 small objects), and fewer Adds
  // take its lock and wake it less often.
  const uint64_t window = ahead > yielded_ ? ahead - yielded_ : 0;
  const uint64_t chunk = std::clamp<uint64_t>(window / 4, 1, 32);
  if (added_ >= required && ahead < total && ahead - added_ < chunk) return;
  if (!batch_) batch_ = scheduler_->StartBatch();
  std::vector<FetchItem> items;
  // Engine indices follow the share's positions: item i of the batch is SampleAt(base_ + i).
  for (; added_ < ahead; ++added_) {
    const uint64_t size = SizeAt(added_);
    if (added_ >= required && options_.prefetch_bytes > 0 &&
        window_bytes_ + size > options_.prefetch_bytes) {
      break;
    }
    window_bytes_ += size;
    items.push_back(index_->Ref(shard_.SampleAt(added_)).ToFetchItem());
  }
  if (items.empty()) return;
  batch_->Add(std::move(items));
  if (added_ == total) batch_->Close();
}

absl::StatusOr<Sample> SampleStream::TakeOne() {
  const uint64_t position = yielded_++;
  const uint64_t sample = shard_.SampleAt(position);
  window_bytes_ -= SizeAt(position);
  if (auto it = early_.find(position); it != early_.end()) {
    FetchResult r = std::move(it->second);
    early_.erase(it);
    Observe(r);
    return ToSample(*index_, sample, std::move(r));
  }
  // An ordered scheduler hands back exactly this one; an unordered one may hand back later
  // ones first, which wait in early_ (still charged to the budget, as they would be inside
  // the batch).
  while (auto r = batch_->Next()) {
    const uint64_t at = base_ + r->index;
    if (at == position) {
      Observe(*r);
      return ToSample(*index_, sample, *std::move(r));
    }
    early_.emplace(at, *std::move(r));
  }
  return absl::InternalError(
      absl::StrCat("fetch batch ended before ", SampleContext(sample, index_->Ref(sample))));
}

absl::StatusOr<std::optional<Sample>> SampleStream::Next() {
  if (remaining() == 0) return std::nullopt;
  FillTo(yielded_ + 1, yielded_ + 1 + Prefetch());
  WHARF_ASSIGN_OR_RETURN(Sample s, TakeOne());
  return std::optional<Sample>(std::move(s));
}

absl::StatusOr<std::vector<Sample>> SampleStream::NextBatch(size_t n) {
  n = static_cast<size_t>(std::min<uint64_t>(n, remaining()));
  std::vector<Sample> out;
  if (n == 0) return out;
  FillTo(yielded_ + n, yielded_ + n + Prefetch());
  out.reserve(n);
  absl::Status first_error;
  for (size_t i = 0; i < n; ++i) {
    auto s = TakeOne();
    if (!s.ok()) {
      if (first_error.ok()) first_error = s.status();
      continue;  // consume the rest of the batch so the stream stays aligned
    }
    out.push_back(*std::move(s));
  }
  if (!first_error.ok()) return first_error;
  return out;
}

}  // namespace wharf
