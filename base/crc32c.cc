#include "base/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define WHARF_CRC32C_SSE42 1
#endif

namespace wharf {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli

// kTables[0] is the byte-at-a-time table; kTables[k][b] is the CRC of byte b followed by k
// zero bytes, so eight bytes are folded with eight independent lookups (slicing-by-8).
constexpr std::array<std::array<uint32_t, 256>, 8> MakeTables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  }
  return t;
}
constexpr auto kTables = MakeTables();

inline uint64_t LoadLE64(const unsigned char* p) {
  // Byte by byte so the result does not depend on the host's byte order; compilers turn
  // this into one load on little-endian machines.
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

#ifdef WHARF_CRC32C_SSE42
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const char* data, size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  uint64_t l = crc ^ 0xffffffffu;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    l = _mm_crc32_u64(l, v);
    p += 8;
    n -= 8;
  }
  auto l32 = static_cast<uint32_t>(l);
  while (n-- > 0) l32 = _mm_crc32_u8(l32, *p++);
  return l32 ^ 0xffffffffu;
}
#endif

using ExtendFn = uint32_t (*)(uint32_t, const char*, size_t);

ExtendFn ChooseExtend() {
  return internal::Crc32cHardwareAvailable() ? internal::Crc32cExtendHardware
                                             : internal::Crc32cExtendPortable;
}

}  // namespace

namespace internal {

bool Crc32cHardwareAvailable() {
#ifdef WHARF_CRC32C_SSE42
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

uint32_t Crc32cExtendHardware(uint32_t crc, const char* data, size_t n) {
#ifdef WHARF_CRC32C_SSE42
  return ExtendSse42(crc, data, n);
#else
  return Crc32cExtendPortable(crc, data, n);
#endif
}

uint32_t Crc32cExtendPortable(uint32_t crc, const char* data, size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  uint32_t l = crc ^ 0xffffffffu;
  while (n >= 8) {
    const uint64_t v = LoadLE64(p) ^ l;
    l = kTables[7][v & 0xff] ^ kTables[6][(v >> 8) & 0xff] ^ kTables[5][(v >> 16) & 0xff] ^
        kTables[4][(v >> 24) & 0xff] ^ kTables[3][(v >> 32) & 0xff] ^ kTables[2][(v >> 40) & 0xff] ^
        kTables[1][(v >> 48) & 0xff] ^ kTables[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) l = (l >> 8) ^ kTables[0][(l ^ *p++) & 0xff];
  return l ^ 0xffffffffu;
}

}  // namespace internal

uint32_t Crc32cExtend(uint32_t crc, const char* data, size_t n) {
  static const ExtendFn extend = ChooseExtend();
  return extend(crc, data, n);
}

uint32_t Crc32c(const absl::Cord& data) {
  uint32_t crc = 0;
  for (absl::string_view chunk : data.Chunks()) crc = Crc32cExtend(crc, chunk.data(), chunk.size());
  return crc;
}

}  // namespace wharf
