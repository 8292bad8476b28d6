// CRC32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of TFRecord framing
// (and of leveldb, ext4 metadata, iSCSI). Uses the SSE4.2 crc32 instruction when the CPU has
// it (checked once at run time) and a slicing-by-8 table otherwise; both give identical
// results.
// Thread-safety: all functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace wharf {

// The CRC32C of `data` appended to bytes whose CRC32C is `crc` (0 for none): Extend(Value(a),
// b) == Value(a + b).
uint32_t Crc32cExtend(uint32_t crc, const char* data, size_t n);
inline uint32_t Crc32c(absl::string_view data) { return Crc32cExtend(0, data.data(), data.size()); }
uint32_t Crc32c(const absl::Cord& data);

// TFRecord (and leveldb) store masked CRCs, because a CRC of bytes that contain CRCs is weak.
inline uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t UnmaskCrc32c(uint32_t masked) {
  const uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

namespace internal {
// The two implementations, for tests and benchmarks. ExtendHardware REQUIRES
// Crc32cHardwareAvailable().
uint32_t Crc32cExtendPortable(uint32_t crc, const char* data, size_t n);
uint32_t Crc32cExtendHardware(uint32_t crc, const char* data, size_t n);
bool Crc32cHardwareAvailable();
}  // namespace internal

}  // namespace wharf
