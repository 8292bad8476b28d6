// libFuzzer target: tar shards (formats/tar.h), member by member and grouped into WebDataset
// samples, read from an object whose bytes are the input.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "formats/tar.h"
#include "tests/fuzz/format_fuzz.h"

namespace wharf::fuzz {
namespace {

TarOptions Options(const ObjectReaderOptions& io) {
  TarOptions options;
  options.io = io;
  // A corrupt size may make the reader hold up to the bound; keep it within the fuzzer's.
  options.max_member_bytes = uint64_t{1} << 20;
  options.max_extended_header_bytes = uint64_t{64} << 10;
  return options;
}

Transcript ReadMembers(std::shared_ptr<ObjectStore> store, const ObjectReaderOptions& io) {
  return Drain([&] { return TarReader::Open(store, "shard.tar", Options(io)); },
               [](const TarMember& m) {
                 return absl::StrCat(m.name, "@", m.header_offset, "/", m.data_offset, "=",
                                     std::string(m.data));
               });
}

Transcript ReadSamples(std::shared_ptr<ObjectStore> store, const ObjectReaderOptions& io) {
  return Drain([&] { return TarSampleReader::Open(store, "shard.tar", Options(io)); },
               [](const TarSample& sample) {
                 std::string line = absl::StrCat(sample.key, "@", sample.offset);
                 for (const auto& [extension, data] : sample.fields) {
                   absl::StrAppend(&line, " ", extension, "=", std::string(data));
                 }
                 return line;
               });
}

}  // namespace
}  // namespace wharf::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wharf::fuzz;
  auto store = StoreHolding(data, size, "shard.tar");
  std::vector<Transcript> members, samples;
  for (const auto& io : ReadPlans()) {
    members.push_back(ReadMembers(store, io));
    samples.push_back(ReadSamples(store, io));
    RequireBounded(members.back());
    RequireBounded(samples.back());
  }
  RequireSameTranscripts(members);
  RequireSameTranscripts(samples);
  return 0;
}
