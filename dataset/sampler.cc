#include "dataset/sampler.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace wharf {
namespace {

using Json = nlohmann::json;

// The JSON layout: 1 before order versions (no "order": order 1), 2 with "order".
constexpr uint64_t kLegacyStateVersion = 1;
constexpr uint64_t kStateVersion = 2;

absl::Status StateError(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("parsing sampler state: ", message));
}

}  // namespace

absl::Status Partition::Validate() const {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid partition: rank ", rank, " of world size ", world_size));
  }
  if (num_workers < 1 || worker < 0 || worker >= num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid partition: worker ", worker, " of ", num_workers, " workers"));
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
  j["order"] = order;
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
  if (version != kStateVersion && version != kLegacyStateVersion) {
    return StateError(absl::StrCat("unsupported version ", version, " (this build reads ",
                                   kLegacyStateVersion, " and ", kStateVersion, ")"));
  }
  SamplerState state;
  state.order = kOrderFisherYates;  // what a state from before order versions was taken under
  if (version == kStateVersion) {
    if (absl::Status s = uint_field("order", &state.order); !s.ok()) return s;
    if (absl::Status s = CheckOrderVersion(state.order); !s.ok()) return StateError(s.message());
  }
  for (auto [name, out] :
       {std::pair{"num_samples", &state.num_samples}, std::pair{"seed", &state.seed},
        std::pair{"epoch", &state.epoch}, std::pair{"consumed", &state.consumed}}) {
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

uint64_t Shard::size() const {
  // The rank's share is dealt in blocks of B to K workers: full rounds of K * B samples,
  // then what is left of the last round, block by block.
  const uint64_t block = partition.worker_block;
  const uint64_t round = block * static_cast<uint64_t>(partition.num_workers);
  const uint64_t rest = rank_count % round;
  const uint64_t before = static_cast<uint64_t>(partition.worker) * block;
  return rank_count / round * block + (rest > before ? std::min(rest - before, block) : 0);
}

uint64_t Shard::SampleAt(uint64_t i) const { return order.At(GlobalPosition(i) % order.size()); }

std::vector<uint64_t> Shard::Samples() const {
  std::vector<uint64_t> out(size());
  for (uint64_t i = 0; i < out.size(); ++i) out[i] = SampleAt(i);
  return out;
}

absl::StatusOr<Sampler> Sampler::Create(uint64_t num_samples, SamplerOptions options,
                                        std::string fingerprint) {
  if (absl::Status s = CheckOrderVersion(options.order); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampler: ", s.message()));
  }
  if (options.order == kOrderFisherYates && num_samples > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampler: ", num_samples, " samples; at most ", std::numeric_limits<uint32_t>::max(),
        " are supported by order version ", kOrderFisherYates));
  }
  return Sampler(num_samples, options, std::move(fingerprint));
}

EpochOrder Sampler::Order(uint64_t epoch) const {
  // Create() checked the version and the size, the only ways this can fail.
  return *EpochOrder::Create(options_.order, OrderOf::kSamples, num_samples_, options_.seed, epoch,
                             options_.shuffle);
}

std::vector<uint64_t> Sampler::Permutation(uint64_t epoch) const {
  const EpochOrder order = Order(epoch);
  std::vector<uint64_t> out(num_samples_);
  for (uint64_t p = 0; p < num_samples_; ++p) out[p] = order.At(p);
  return out;
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
                      .consumed = consumed,
                      .order = options_.order};
}

absl::Status Sampler::Validate(const SamplerState& state) const {
  if (state.num_samples != num_samples_) {
    return absl::FailedPreconditionError(absl::StrCat("sampler state is for a dataset of ",
                                                      state.num_samples,
                                                      " samples, this dataset has ", num_samples_));
  }
  if (state.seed != options_.seed) {
    return absl::FailedPreconditionError(absl::StrCat("sampler state has seed ", state.seed,
                                                      ", this sampler has seed ", options_.seed));
  }
  if (state.shuffle != options_.shuffle) {
    return absl::FailedPreconditionError(
        absl::StrCat("sampler state has shuffle=", state.shuffle ? "true" : "false",
                     ", this sampler has shuffle=", options_.shuffle ? "true" : "false"));
  }
  if (state.order != options_.order) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sampler state was taken under order version ", state.order,
        ", this sampler computes order version ", options_.order,
        " (create the sampler with the state's order: a state continues in its own order)"));
  }
  if (!state.fingerprint.empty() && !fingerprint_.empty() && state.fingerprint != fingerprint_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sampler state is for a dataset with fingerprint ", state.fingerprint,
        ", this dataset has ", fingerprint_, " (same size, different keys or key order)"));
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

  shard.order = Order(state.epoch);
  return shard;
}

}  // namespace wharf
