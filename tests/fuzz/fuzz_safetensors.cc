// libFuzzer target: the safetensors header parser and the sharded index parser
// (serve/safetensors.h), which read bytes from files of any origin before a model load
// trusts them with destinations in memory.
//
// The input is a whole file. Checked beyond the sanitizers: a header the parser accepts
// places every tensor inside the file's data, gives each exactly the bytes its shape and
// dtype need, and lets no two non-empty tensors overlap (the promises a loader relies on
// when it writes each tensor's bytes into its own buffer).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "serve/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wharf::serve;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto header = ParseSafetensors(bytes, bytes.size(), "fuzz://model.safetensors");
  if (header.ok()) {
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (const SafetensorsTensor& t : header->tensors) {
      const int bits = SafetensorsDtypeBits(t.dtype);
      if (bits == 0) std::abort();
      if (t.offset < header->data_start || t.offset + t.size > bytes.size()) std::abort();
      unsigned __int128 elements = 1;
      for (uint64_t d : t.shape) elements *= d;
      if (elements * static_cast<unsigned>(bits) != static_cast<unsigned __int128>(t.size) * 8) {
        std::abort();
      }
      if (t.size > 0) spans.emplace_back(t.offset, t.offset + t.size);
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      if (spans[i].first < spans[i - 1].second) std::abort();
    }
  }
  auto files = ParseSafetensorsIndex(bytes, "fuzz://model.safetensors.index.json");
  if (files.ok()) {
    // Every accepted name stays inside the index's folder: relative, no "", "." or "..".
    for (const std::string& f : files->files) {
      if (f.empty() || f.front() == '/') std::abort();
      size_t start = 0;
      while (start <= f.size()) {
        const size_t end = std::min(f.find('/', start), f.size());
        const std::string segment = f.substr(start, end - start);
        if (segment.empty() || segment == "." || segment == "..") std::abort();
        start = end + 1;
      }
    }
  }
  return 0;
}
