// libFuzzer target: tar shards (formats/tar.h), member by member and grouped into WebDataset
// samples, read from an object whose bytes are the input: as a stored tar, and as a gzip
// stream of one (.tar.gz, inflated by formats/byte_stream.h).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "formats/tar.h"
#include "tests/fuzz/format_fuzz.h"

namespace wharf::fuzz {
namespace {

TarOptions Options(const ObjectReaderOptions& io, Compression compression) {
  TarOptions options;
  options.io = io;
  options.compression = compression;
  // A corrupt size may make the reader hold up to the bound; keep it within the fuzzer's.
  options.max_member_bytes = uint64_t{1} << 20;
  options.max_extended_header_bytes = uint64_t{64} << 10;
  return options;
}

Transcript ReadMembers(std::shared_ptr<ObjectStore> store, const ObjectReaderOptions& io,
                       Compression compression) {
  return Drain([&] { return TarReader::Open(store, "shard.tar", Options(io, compression)); },
               [](const TarMember& m) {
                 return absl::StrCat(m.name, "@", m.header_offset, "/", m.data_offset, "=",
                                     std::string(m.data));
               });
}

Transcript ReadSamples(std::shared_ptr<ObjectStore> store, const ObjectReaderOptions& io,
                       Compression compression) {
  return Drain([&] { return TarSampleReader::Open(store, "shard.tar", Options(io, compression)); },
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
  using wharf::Compression;
  for (const Compression compression : {Compression::kNone, Compression::kGzip}) {
    std::vector<Transcript> members, samples;
    for (const auto& io : ReadPlans()) {
      members.push_back(ReadMembers(store, io, compression));
      samples.push_back(ReadSamples(store, io, compression));
      RequireBounded(members.back());
      RequireBounded(samples.back());
    }
    RequireSameTranscripts(members);
    RequireSameTranscripts(samples);
  }
  return 0;
}
