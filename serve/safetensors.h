// The safetensors format's header: parsed and checked before a byte of tensor data is read, so
// a malformed file is refused with one error naming the file and the tensor instead of
// landing bytes in the wrong places (docs/design/serve.md).
//
// A file is: 8 bytes, the header's length N (little-endian u64); N bytes of JSON, an object
// mapping each tensor's name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the byte after the header) plus an optional "__metadata__" map of strings; then
// the data. Checked here: N within the file and at most 100 MB (the reference library's
// limit); the JSON an object of well-formed entries; every dtype one the format defines; the
// size the shape and dtype give equal to end - begin (overflow-checked); every range inside
// the data; and, as the reference library requires of every file (and every file it writes
// is so), the tensors sorted by offsets tile the data exactly: no byte shared, no hole, no
// bytes after the last tensor (a file with any of those is damaged or not what it says).
//
// Also the Hugging Face sharded layout's index (model.safetensors.index.json): its
// "weight_map" names the shard files, relative to the index's folder.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace wharf::serve {

// The reference library's bound on the header (100 MB): larger is refused as malformed.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Bits of one element of a safetensors dtype ("F32": 32, "BF16": 16, "F4": 4); 0 for a name
// the format does not define.
int SafetensorsDtypeBits(absl::string_view dtype);

struct SafetensorsTensor {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  uint64_t offset = 0;  // where its bytes start in the file (8 + N + data_offsets[0])
  uint64_t size = 0;    // bytes
};

struct SafetensorsHeader {
  uint64_t data_start = 0;                      // 8 + N: where the data begins in the file
  std::vector<SafetensorsTensor> tensors;       // sorted by name
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// The header's length N from the file's first 8 bytes. `file_size`: the whole file's size.
// Errors (InvalidArgument / DataLoss) name `uri`.
absl::StatusOr<uint64_t> ParseSafetensorsHeaderLength(absl::string_view first8, uint64_t file_size,
                                                      absl::string_view uri);

// Parses and checks the header's JSON (the N bytes after the length) of a file of `file_size`
// bytes whose header is `json.size()` bytes long.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json, uint64_t file_size,
                                                         absl::string_view uri);

// Both, from the first bytes of a file (at least 8 + N of them) of `file_size` bytes.
absl::StatusOr<SafetensorsHeader> ParseSafetensors(absl::string_view head, uint64_t file_size,
                                                   absl::string_view uri);

// An index (`model.safetensors.index.json`): which file holds each tensor.
struct SafetensorsIndex {
  std::vector<std::string> files;                 // sorted, without duplicates
  std::map<std::string, std::string> weight_map;  // tensor name -> file name
};

// Parses an index's "weight_map". Errors name `uri`: not JSON, no weight_map object, a name
// that is not a plain relative path (absolute, "..", empty segments).
absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(absl::string_view json,
                                                       absl::string_view uri);

}  // namespace wharf::serve
