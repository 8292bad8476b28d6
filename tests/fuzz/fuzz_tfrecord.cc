// libFuzzer target: TFRecord files (formats/tfrecord.h) read from an object whose bytes are
// the input: as a stored file, and as the GZIP and ZLIB streams of one (tf.data's
// compression_type, inflated by formats/byte_stream.h).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "formats/tfrecord.h"
#include "tests/fuzz/format_fuzz.h"

namespace wharf::fuzz {
namespace {

Transcript ReadRecords(std::shared_ptr<ObjectStore> store, const ObjectReaderOptions& io,
                       Compression compression) {
  TFRecordReaderOptions options;
  options.io = io;
  options.compression = compression;
  options.max_record_bytes = uint64_t{1} << 20;  // a corrupt length is refused, not allocated
  return Drain([&] { return TFRecordReader::Open(store, "data.tfrecord", options); },
               [](const TFRecord& r) { return absl::StrCat(r.offset, "=", std::string(r.data)); });
}

}  // namespace
}  // namespace wharf::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wharf::fuzz;
  auto store = StoreHolding(data, size, "data.tfrecord");
  using wharf::Compression;
  for (const Compression compression :
       {Compression::kNone, Compression::kGzip, Compression::kZlib}) {
    std::vector<Transcript> passes;
    for (const auto& io : ReadPlans()) {
      passes.push_back(ReadRecords(store, io, compression));
      RequireBounded(passes.back());
    }
    RequireSameTranscripts(passes);
  }
  return 0;
}
