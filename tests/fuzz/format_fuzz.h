// Shared by the record-format fuzz targets: the input becomes one object of an in-memory
// store (as a shard in a bucket would be), and each target reads every record of it twice,
// through ObjectReaders with different chunk sizes. The two passes must agree (the same
// records, the same error code): a parser's answer may not depend on where the network
// happened to split the bytes. A disagreement aborts, which libFuzzer reports as a crash.
//
// Not thread-safe: libFuzzer runs one input at a time.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "io/object_reader.h"
#include "store/testing/memory_store.h"

namespace wharf::fuzz {

// What one pass read: a line per record, then the status that ended it.
struct Transcript {
  std::vector<std::string> records;
  absl::StatusCode end = absl::StatusCode::kOk;
};

// The store every input is put into, under `key` (overwriting the previous input).
inline std::shared_ptr<ObjectStore> StoreHolding(const uint8_t* data, size_t size,
                                                 const std::string& key) {
  static auto* store = new std::shared_ptr<ObjectStore>(
      std::make_shared<store_testing::MemoryStore>(store_testing::MemoryStoreOptions{}));
  auto put =
      (*store)->Put(key, absl::Cord(absl::string_view(reinterpret_cast<const char*>(data), size)));
  if (!put.ok()) {
    std::fprintf(stderr, "fuzz: %s\n", put.status().ToString().c_str());
    std::abort();
  }
  return *store;
}

// The two ways an input is read: chunks of a few bytes (records and headers straddle many
// chunk boundaries) and one chunk larger than any input.
inline std::vector<ObjectReaderOptions> ReadPlans() {
  ObjectReaderOptions small;
  small.chunk_size = 61;
  small.read_ahead = 2;
  ObjectReaderOptions whole;
  whole.chunk_size = uint64_t{1} << 20;
  whole.read_ahead = 0;
  return {small, whole};
}

// Aborts unless every transcript equals the first.
inline void RequireSameTranscripts(const std::vector<Transcript>& passes) {
  for (size_t i = 1; i < passes.size(); ++i) {
    if (passes[i].records == passes[0].records && passes[i].end == passes[0].end) continue;
    std::fprintf(stderr,
                 "fuzz: pass %zu read %zu records ending in %s, pass 0 read %zu ending in %s\n", i,
                 passes[i].records.size(), absl::StatusCodeToString(passes[i].end).c_str(),
                 passes[0].records.size(), absl::StatusCodeToString(passes[0].end).c_str());
    std::abort();
  }
}

// Records end a pass at most this many: a parser that returns records forever is a bug.
inline constexpr size_t kMaxRecords = 1 << 16;

inline void RequireBounded(const Transcript& t) {
  if (t.records.size() > kMaxRecords) {
    std::fprintf(stderr, "fuzz: more than %zu records from one input\n", kMaxRecords);
    std::abort();
  }
}

// Reads every record into a transcript: `open()` returns a StatusOr of a reader whose Next()
// returns StatusOr<optional<Record>>, and `line(record)` is the record's transcript line.
template <typename Open, typename Line>
Transcript Drain(Open open, Line line) {
  Transcript t;
  auto reader = open();
  if (!reader.ok()) {
    t.end = reader.status().code();
    return t;
  }
  while (t.records.size() <= kMaxRecords) {
    auto next = (*reader)->Next();
    if (!next.ok()) {
      t.end = next.status().code();
      break;
    }
    if (!next->has_value()) break;
    t.records.push_back(line(**next));
  }
  return t;
}

}  // namespace wharf::fuzz
