#include "dataset/sampler.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace wharf {
namespace {

using Json = nlohmann::json;

constexpr int kStateVersion = 1;

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

absl::Status StateError(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("parsing sampler state: ", message));
}

}  // namespace

namespace internal {

uint64_t SplitMix64::Next() {
  state_ += 0x9e3779b97f4a7c15ULL;
  return Mix64(state_);
}

uint64_t SplitMix64::Bounded(uint64_t bound) {
  // Multiply-shift maps x to floor(x * bound / 2^64); rejecting the few x whose low product
  // word falls below 2^64 mod bound makes every result equally likely.
  absl::uint128 m = absl::uint128(Next()) * bound;
  uint64_t low = absl::Uint128Low64(m);
  if (low < bound) {
    const uint64_t threshold = (0 - bound) % bound;
    while (low < threshold) {
      m = absl::uint128(Next()) * bound;
      low = absl::Uint128Low64(m);
    }
  }
  return absl::Uint128High64(m);
}

uint64_t EpochSeed(uint64_t seed, uint64_t epoch) {
  // Two rounds of mixing so that nearby (seed, epoch) pairs give unrelated streams and
  // (seed, epoch) != (epoch, seed).
  return Mix64(Mix64(seed) ^ (epoch * 0xd1b54a32d192ed03ULL + 0x8bb84b93962eacc9ULL));
}

}  // namespace internal

absl::Status Partition::Validate() const {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("invalid partition: rank ", rank,
                                                   " of world size ", world_size));
  }
  if (num_workers < 1 || worker < 0 || worker >= num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("invalid partition: worker ", worker,
                                                   " of ", num_workers, " workers"));
  }
  if (worker_block < 1) {
    return absl::InvalidArgumentError("invalid partition: worker_block must be >= 1");
  }
  return absl::OkStatus();
}

std::string SamplerState::ToJson() const {
  // ordered_json keeps the fields in a readable order.
  nlohmann::ordered_json j;
  j["version"] = kStateVersion;
  j["num_samples"] = num_samples;
  j["seed"] = seed;
  j["shuffle"] = shuffle;
  j["fingerprint"] = fingerprint;
  j["epoch"] = epoch;
  j["consumed"] = consumed;
  return j.dump();
}

absl::StatusOr<SamplerState> SamplerState::FromJson(absl::string_view json) {
  Json j = Json::parse(json.begin(), json.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return StateError("not valid JSON");
  if (!j.is_object()) return StateError("expected a JSON object");
  auto uint_field = [&j](const char* name, uint64_t* out) -> absl::Status {
    auto it = j.find(name);
    if (it == j.end()) return StateError(absl::StrCat("missing \"", name, "\""));
    if (!it->is_number_unsigned()) {
      return StateError(absl::StrCat("\"", name, "\" must be a non-negative integer"));
    }
    *out = it->get<uint64_t>();
    return absl::OkStatus();
  };
  uint64_t version = 0;
  if (absl::Status s = uint_field("version", &version); !s.ok()) return s;
  if (version != kStateVersion) {
    return StateError(absl::StrCat("unsupported version ", version, " (this build reads ",
                                   kStateVersion, ")"));
  }
  SamplerState state;
  for (auto [name, out] : {std::pair{"num_samples", &state.num_samples},
                           std::pair{"seed", &state.seed}, std::pair{"epoch", &state.epoch},
                           std::pair{"consumed", &state.consumed}}) {
    if (absl::Status s = uint_field(name, out); !s.ok()) return s;
  }
  auto shuffle = j.find("shuffle");
  if (shuffle == j.end()) return StateError("missing \"shuffle\"");
  if (!shuffle->is_boolean()) return StateError("\"shuffle\" must be true or false");
  state.shuffle = shuffle->get<bool>();
  if (auto fp = j.find("fingerprint"); fp != j.end()) {
    if (!fp->is_string()) return StateError("\"fingerprint\" must be a string");
    state.fingerprint = fp->get<std::string>();
  }
  return state;
}

uint64_t ConsumedAfter(uint64_t start, uint64_t samples_per_rank, int world_size) {
  return start + samples_per_rank * static_cast<uint64_t>(world_size);
}

uint64_t Shard::GlobalPosition(uint64_t i) const {
  // Worker w's i-th sample is in its (i / B)-th block, the rank's block b * K + w.
  const uint64_t block_size = partition.worker_block;
  const uint64_t workers = static_cast<uint64_t>(partition.num_workers);
  const uint64_t rank_local =
      ((i / block_size) * workers + static_cast<uint64_t>(partition.worker)) * block_size +
      i % block_size;
  return start + static_cast<uint64_t>(partition.rank) +
         rank_local * static_cast<uint64_t>(partition.world_size);
}

absl::StatusOr<Sampler> Sampler::Create(uint64_t num_samples, SamplerOptions options,
                                        std::string fingerprint) {
  if (num_samples > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: ", num_samples, " samples; at most ",
                     std::numeric_limits<uint32_t>::max(), " are supported"));
  }
  return Sampler(num_samples, options, std::move(fingerprint));
}

std::vector<uint32_t> Sampler::Permutation(uint64_t epoch) const {
  std::vector<uint32_t> order(num_samples_);
  std::iota(order.begin(), order.end(), uint32_t{0});
  if (!options_.shuffle || num_samples_ < 2) return order;
  // Fisher-Yates (Durstenfeld): position i takes a uniform pick among positions [0, i].
  internal::SplitMix64 rng(internal::EpochSeed(options_.seed, epoch));
  for (uint64_t i = num_samples_ - 1; i > 0; --i) {
    const uint64_t j = rng.Bounded(i + 1);
    std::swap(order[i], order[j]);
  }
  return order;
}

uint64_t Sampler::EndOfEpoch(uint64_t consumed, int world_size) const {
  if (consumed >= num_samples_ || world_size < 1) return consumed;
  const uint64_t w = static_cast<uint64_t>(world_size);
  const uint64_t remaining = num_samples_ - consumed;
  const uint64_t per_rank = options_.drop_last ? remaining / w : (remaining + w - 1) / w;
  return consumed + per_rank * w;
}

SamplerState Sampler::State(uint64_t epoch, uint64_t consumed) const {
  return SamplerState{.num_samples = num_samples_,
                      .seed = options_.seed,
                      .shuffle = options_.shuffle,
                      .fingerprint = fingerprint_,
                      .epoch = epoch,
                      .consumed = consumed};
}

absl::Status Sampler::Validate(const SamplerState& state) const {
  if (state.num_samples != num_samples_) {
    return absl::FailedPreconditionError(
        absl::StrCat("sampler state is for a dataset of ", state.num_samples,
                     " samples, this dataset has ", num_samples_));
  }
  if (state.seed != options_.seed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sampler state has seed ", state.seed, ", this sampler has seed ", options_.seed));
  }
  if (state.shuffle != options_.shuffle) {
    return absl::FailedPreconditionError(
        absl::StrCat("sampler state has shuffle=", state.shuffle ? "true" : "false",
                     ", this sampler has shuffle=", options_.shuffle ? "true" : "false"));
  }
  if (!state.fingerprint.empty() && !fingerprint_.empty() &&
      state.fingerprint != fingerprint_) {
    return absl::FailedPreconditionError(
        absl::StrCat("sampler state is for a dataset with fingerprint ", state.fingerprint,
                     ", this dataset has ", fingerprint_,
                     " (same size, different keys or key order)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SamplerState> Sampler::Restore(absl::string_view json) const {
  auto state = SamplerState::FromJson(json);
  if (!state.ok()) return state.status();
  if (absl::Status s = Validate(*state); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("restoring: ", s.message()));
  }
  return state;
}

absl::StatusOr<Shard> Sampler::ShardOf(const SamplerState& state,
                                       const Partition& partition) const {
  if (absl::Status s = Validate(state); !s.ok()) return s;
  if (absl::Status s = partition.Validate(); !s.ok()) return s;
  Shard shard;
  shard.epoch = state.epoch;
  shard.start = state.consumed;
  shard.end = EndOfEpoch(state.consumed, partition.world_size);
  shard.partition = partition;
  const uint64_t w = static_cast<uint64_t>(partition.world_size);
  shard.rank_count = (shard.end - shard.start) / w;
  if (shard.rank_count == 0) return shard;

  const std::vector<uint32_t> order = Permutation(state.epoch);
  const uint64_t k = static_cast<uint64_t>(partition.num_workers);
  const uint64_t block = partition.worker_block;
  // The rank's share is positions start + rank + j * W, j in [0, rank_count); this worker
  // takes the blocks j / block == worker (mod K).
  shard.samples.reserve(shard.rank_count / k + block);
  for (uint64_t first = static_cast<uint64_t>(partition.worker) * block;
       first < shard.rank_count; first += k * block) {
    const uint64_t last = std::min(first + block, shard.rank_count);
    for (uint64_t j = first; j < last; ++j) {
      const uint64_t p = shard.start + static_cast<uint64_t>(partition.rank) + j * w;
      shard.samples.push_back(order[p % num_samples_]);
    }
  }
  return shard;
}

}  // namespace wharf
