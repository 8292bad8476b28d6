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
// One crc32 instruction takes 3 cycles to give its result but the CPU starts one every cycle,
// so three independent streams run three times as fast as one: the input is hashed in blocks
// of three stripes, each stripe into a register of its own starting from 0, and the three are
// joined. The raw register (no inversions) is linear: the register after stripes A, B equals
// raw(B from 0) ^ Z(raw after A), where Z appends kStripe zero bytes; Z is linear in its
// 32-bit input, so it is four table lookups (one per byte of the input).
constexpr size_t kStripe = 512;

struct ZeroShift {
  uint32_t table[4][256];
  uint32_t operator()(uint32_t r) const {
    return table[0][r & 0xff] ^ table[1][(r >> 8) & 0xff] ^ table[2][(r >> 16) & 0xff] ^
           table[3][r >> 24];
  }
};

__attribute__((target("sse4.2"))) ZeroShift MakeZeroShift() {
  uint32_t basis[32];  // Z of each single bit
  for (int k = 0; k < 32; ++k) {
    uint64_t r = uint32_t{1} << k;
    for (size_t i = 0; i < kStripe; i += 8) r = _mm_crc32_u64(r, 0);
    basis[k] = static_cast<uint32_t>(r);
  }
  ZeroShift z;
  for (int byte = 0; byte < 4; ++byte) {
    for (uint32_t v = 0; v < 256; ++v) {
      uint32_t out = 0;
      for (int bit = 0; bit < 8; ++bit) {
        if (v & (1u << bit)) out ^= basis[8 * byte + bit];
      }
      z.table[byte][v] = out;
    }
  }
  return z;
}

__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const char* data, size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  uint64_t l = crc ^ 0xffffffffu;
  if (n >= 3 * kStripe) {
    static const ZeroShift shift = MakeZeroShift();
    do {
      uint64_t a = l, b = 0, c = 0;
      for (size_t i = 0; i < kStripe; i += 8) {
        uint64_t va, vb, vc;
        std::memcpy(&va, p + i, 8);
        std::memcpy(&vb, p + kStripe + i, 8);
        std::memcpy(&vc, p + 2 * kStripe + i, 8);
        a = _mm_crc32_u64(a, va);
        b = _mm_crc32_u64(b, vb);
        c = _mm_crc32_u64(c, vc);
      }
      l = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^
          static_cast<uint32_t>(c);
      p += 3 * kStripe;
      n -= 3 * kStripe;
    } while (n >= 3 * kStripe);
  }
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
