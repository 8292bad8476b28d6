#include "base/md5_many.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "base/fork.h"
#include "base/hash.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define WHARF_MD5_X86 1
#endif

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers build their results from a self-initialized "undefined" vector,
// which -Wuninitialized reports at every inlined use.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace wharf {
namespace {

constexpr uint32_t kInit[4] = {0x67452301u, 0xefcdab89u, 0x98badcfeu, 0x10325476u};
constexpr int kMaxLanes = 16;

// The state of every lane: st[0..3] are MD5's a, b, c, d, one column per lane.
struct alignas(64) LaneState {
  uint32_t st[4][kMaxLanes];
};
// Processes one 64-byte block for every lane: block[l] points at lane l's block.
using BlockFn = void (*)(LaneState& s, const uint8_t* const* block);

// RFC 1321's 64 steps: a = b + ((a + f(b, c, d) + x[w] + k) <<< s), the roles of a, b, c, d
// rotating every step. FF, GG, HH, II, ADD, ROL and SET1 are defined by each kernel.
#define STEP(FN, a, b, c, d, w, s, k) \
  a = ADD(b, ROL(ADD(ADD(a, FN(b, c, d)), ADD(m[w], SET1(static_cast<int>(k)))), s))
#define MD5_64_STEPS                        \
  STEP(FF, a, b, c, d, 0, 7, 0xd76aa478);   \
  STEP(FF, d, a, b, c, 1, 12, 0xe8c7b756);  \
  STEP(FF, c, d, a, b, 2, 17, 0x242070db);  \
  STEP(FF, b, c, d, a, 3, 22, 0xc1bdceee);  \
  STEP(FF, a, b, c, d, 4, 7, 0xf57c0faf);   \
  STEP(FF, d, a, b, c, 5, 12, 0x4787c62a);  \
  STEP(FF, c, d, a, b, 6, 17, 0xa8304613);  \
  STEP(FF, b, c, d, a, 7, 22, 0xfd469501);  \
  STEP(FF, a, b, c, d, 8, 7, 0x698098d8);   \
  STEP(FF, d, a, b, c, 9, 12, 0x8b44f7af);  \
  STEP(FF, c, d, a, b, 10, 17, 0xffff5bb1); \
  STEP(FF, b, c, d, a, 11, 22, 0x895cd7be); \
  STEP(FF, a, b, c, d, 12, 7, 0x6b901122);  \
  STEP(FF, d, a, b, c, 13, 12, 0xfd987193); \
  STEP(FF, c, d, a, b, 14, 17, 0xa679438e); \
  STEP(FF, b, c, d, a, 15, 22, 0x49b40821); \
  STEP(GG, a, b, c, d, 1, 5, 0xf61e2562);   \
  STEP(GG, d, a, b, c, 6, 9, 0xc040b340);   \
  STEP(GG, c, d, a, b, 11, 14, 0x265e5a51); \
  STEP(GG, b, c, d, a, 0, 20, 0xe9b6c7aa);  \
  STEP(GG, a, b, c, d, 5, 5, 0xd62f105d);   \
  STEP(GG, d, a, b, c, 10, 9, 0x02441453);  \
  STEP(GG, c, d, a, b, 15, 14, 0xd8a1e681); \
  STEP(GG, b, c, d, a, 4, 20, 0xe7d3fbc8);  \
  STEP(GG, a, b, c, d, 9, 5, 0x21e1cde6);   \
  STEP(GG, d, a, b, c, 14, 9, 0xc33707d6);  \
  STEP(GG, c, d, a, b, 3, 14, 0xf4d50d87);  \
  STEP(GG, b, c, d, a, 8, 20, 0x455a14ed);  \
  STEP(GG, a, b, c, d, 13, 5, 0xa9e3e905);  \
  STEP(GG, d, a, b, c, 2, 9, 0xfcefa3f8);   \
  STEP(GG, c, d, a, b, 7, 14, 0x676f02d9);  \
  STEP(GG, b, c, d, a, 12, 20, 0x8d2a4c8a); \
  STEP(HH, a, b, c, d, 5, 4, 0xfffa3942);   \
  STEP(HH, d, a, b, c, 8, 11, 0x8771f681);  \
  STEP(HH, c, d, a, b, 11, 16, 0x6d9d6122); \
  STEP(HH, b, c, d, a, 14, 23, 0xfde5380c); \
  STEP(HH, a, b, c, d, 1, 4, 0xa4beea44);   \
  STEP(HH, d, a, b, c, 4, 11, 0x4bdecfa9);  \
  STEP(HH, c, d, a, b, 7, 16, 0xf6bb4b60);  \
  STEP(HH, b, c, d, a, 10, 23, 0xbebfbc70); \
  STEP(HH, a, b, c, d, 13, 4, 0x289b7ec6);  \
  STEP(HH, d, a, b, c, 0, 11, 0xeaa127fa);  \
  STEP(HH, c, d, a, b, 3, 16, 0xd4ef3085);  \
  STEP(HH, b, c, d, a, 6, 23, 0x04881d05);  \
  STEP(HH, a, b, c, d, 9, 4, 0xd9d4d039);   \
  STEP(HH, d, a, b, c, 12, 11, 0xe6db99e5); \
  STEP(HH, c, d, a, b, 15, 16, 0x1fa27cf8); \
  STEP(HH, b, c, d, a, 2, 23, 0xc4ac5665);  \
  STEP(II, a, b, c, d, 0, 6, 0xf4292244);   \
  STEP(II, d, a, b, c, 7, 10, 0x432aff97);  \
  STEP(II, c, d, a, b, 14, 15, 0xab9423a7); \
  STEP(II, b, c, d, a, 5, 21, 0xfc93a039);  \
  STEP(II, a, b, c, d, 12, 6, 0x655b59c3);  \
  STEP(II, d, a, b, c, 3, 10, 0x8f0ccc92);  \
  STEP(II, c, d, a, b, 10, 15, 0xffeff47d); \
  STEP(II, b, c, d, a, 1, 21, 0x85845dd1);  \
  STEP(II, a, b, c, d, 8, 6, 0x6fa87e4f);   \
  STEP(II, d, a, b, c, 15, 10, 0xfe2ce6e0); \
  STEP(II, c, d, a, b, 6, 15, 0xa3014314);  \
  STEP(II, b, c, d, a, 13, 21, 0x4e0811a1); \
  STEP(II, a, b, c, d, 4, 6, 0xf7537e82);   \
  STEP(II, d, a, b, c, 11, 10, 0xbd3af235); \
  STEP(II, c, d, a, b, 2, 15, 0x2ad7d2bb);  \
  STEP(II, b, c, d, a, 9, 21, 0xeb86d391);

#ifdef WHARF_MD5_X86
__attribute__((target("avx512f"))) void Block16(LaneState& s, const uint8_t* const* block) {
  // Load each lane's 16 words as a row, then transpose so m[w] holds word w of every lane.
  __m512i r[16], t[16], m[16];
  for (int l = 0; l < 16; ++l) r[l] = _mm512_loadu_si512(block[l]);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // r[4g + j], 128-bit chunk k: word 4k + j of lanes 4g .. 4g + 3.
  for (int g = 0; g < 4; ++g) {
    r[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    r[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i v0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xee);
    const __m512i v2 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xee);
    m[j] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    m[4 + j] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
    m[8 + j] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    m[12 + j] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
  }
  __m512i a = _mm512_load_si512(s.st[0]), b = _mm512_load_si512(s.st[1]);
  __m512i c = _mm512_load_si512(s.st[2]), d = _mm512_load_si512(s.st[3]);
  const __m512i a0 = a, b0 = b, c0 = c, d0 = d;
#define ADD(x, y) _mm512_add_epi32(x, y)
#define ROL(x, n) _mm512_rol_epi32(x, n)
#define SET1(k) _mm512_set1_epi32(k)
// vpternlogd truth tables (b = 0xf0, c = 0xcc, d = 0xaa).
#define FF(x, y, z) _mm512_ternarylogic_epi32(x, y, z, 0xca)
#define GG(x, y, z) _mm512_ternarylogic_epi32(x, y, z, 0xe4)
#define HH(x, y, z) _mm512_ternarylogic_epi32(x, y, z, 0x96)
#define II(x, y, z) _mm512_ternarylogic_epi32(x, y, z, 0x39)
  MD5_64_STEPS;
#undef ADD
#undef ROL
#undef SET1
#undef FF
#undef GG
#undef HH
#undef II
  _mm512_store_si512(s.st[0], _mm512_add_epi32(a, a0));
  _mm512_store_si512(s.st[1], _mm512_add_epi32(b, b0));
  _mm512_store_si512(s.st[2], _mm512_add_epi32(c, c0));
  _mm512_store_si512(s.st[3], _mm512_add_epi32(d, d0));
}

// Transposes 8 rows of 8 words (r) into 8 columns (m).
__attribute__((target("avx2"))) inline void Transpose8(__m256i* r, __m256i* m) {
  __m256i t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int g = 0; g < 2; ++g) {
    r[4 * g + 0] = _mm256_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 1] = _mm256_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 2] = _mm256_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    r[4 * g + 3] = _mm256_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    m[j] = _mm256_permute2x128_si256(r[j], r[4 + j], 0x20);
    m[4 + j] = _mm256_permute2x128_si256(r[j], r[4 + j], 0x31);
  }
}

__attribute__((target("avx2"))) void Block8(LaneState& s, const uint8_t* const* block) {
  __m256i r[8], m[16];
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 8; ++l) {
      r[l] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block[l] + 32 * half));
    }
    Transpose8(r, m + 8 * half);
  }
  __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.st[0]));
  __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.st[1]));
  __m256i c = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.st[2]));
  __m256i d = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.st[3]));
  const __m256i a0 = a, b0 = b, c0 = c, d0 = d;
  const __m256i ones = _mm256_set1_epi32(-1);
#define ADD(x, y) _mm256_add_epi32(x, y)
#define ROL(x, n) _mm256_or_si256(_mm256_slli_epi32(x, n), _mm256_srli_epi32(x, 32 - (n)))
#define SET1(k) _mm256_set1_epi32(k)
#define FF(x, y, z) _mm256_xor_si256(z, _mm256_and_si256(x, _mm256_xor_si256(y, z)))
#define GG(x, y, z) _mm256_xor_si256(y, _mm256_and_si256(z, _mm256_xor_si256(x, y)))
#define HH(x, y, z) _mm256_xor_si256(_mm256_xor_si256(x, y), z)
#define II(x, y, z) _mm256_xor_si256(y, _mm256_or_si256(x, _mm256_xor_si256(z, ones)))
  MD5_64_STEPS;
#undef ADD
#undef ROL
#undef SET1
#undef FF
#undef GG
#undef HH
#undef II
  _mm256_store_si256(reinterpret_cast<__m256i*>(s.st[0]), _mm256_add_epi32(a, a0));
  _mm256_store_si256(reinterpret_cast<__m256i*>(s.st[1]), _mm256_add_epi32(b, b0));
  _mm256_store_si256(reinterpret_cast<__m256i*>(s.st[2]), _mm256_add_epi32(c, c0));
  _mm256_store_si256(reinterpret_cast<__m256i*>(s.st[3]), _mm256_add_epi32(d, d0));
}
#endif  // WHARF_MD5_X86

#undef STEP
#undef MD5_64_STEPS

// One message fed to a lane a 64-byte block at a time, MD5's padding included: blocks that
// lie whole inside one chunk of the Cord are used where they are, the rest are copied into
// the lane's stage.
class LaneFeed {
 public:
  explicit LaneFeed(const absl::Cord& data)
      : it_(data.chunk_begin()),
        left_(data.size()),
        bits_(static_cast<uint64_t>(data.size()) * 8),
        blocks_((data.size() + 72) / 64) {
    if (left_ > 0) chunk_ = *it_;
  }

  uint64_t blocks_left() const { return blocks_; }

  // REQUIRES blocks_left() > 0.
  const uint8_t* Next(uint8_t* stage) {
    --blocks_;
    if (chunk_.size() >= 64) {
      const auto* p = reinterpret_cast<const uint8_t*>(chunk_.data());
      chunk_.remove_prefix(64);
      left_ -= 64;
      return p;
    }
    size_t n = 0;
    while (n < 64 && left_ > 0) {
      if (chunk_.empty()) {
        chunk_ = *++it_;
        continue;
      }
      const size_t take = std::min(64 - n, chunk_.size());
      std::memcpy(stage + n, chunk_.data(), take);
      chunk_.remove_prefix(take);
      left_ -= take;
      n += take;
    }
    if (n == 64) return stage;
    if (!marked_) {
      stage[n++] = 0x80;
      marked_ = true;
    }
    if (blocks_ > 0) {  // the length goes into the next block
      std::memset(stage + n, 0, 64 - n);
      return stage;
    }
    std::memset(stage + n, 0, 56 - n);
    for (int i = 0; i < 8; ++i) stage[56 + i] = static_cast<uint8_t>(bits_ >> (8 * i));
    return stage;
  }

 private:
  absl::Cord::ChunkIterator it_;
  absl::string_view chunk_;
  uint64_t left_;  // message bytes not yet fed
  const uint64_t bits_;
  uint64_t blocks_;      // blocks not yet fed, padding included
  bool marked_ = false;  // the 0x80 after the message is fed
};

// Runs the messages through `lanes` lanes: a lane that finishes takes the next message, so
// messages of different sizes keep the lanes busy until the list runs out.
void RunLanes(BlockFn fn, int lanes, absl::Span<const absl::Cord* const> messages, Md5Digest* out) {
  static const uint8_t kIdle[64] = {};
  LaneState s;
  std::optional<LaneFeed> feed[kMaxLanes];
  size_t job[kMaxLanes] = {};
  alignas(64) uint8_t stage[kMaxLanes][64];
  const uint8_t* block[kMaxLanes];
  size_t next = 0;
  for (;;) {
    uint64_t run = UINT64_MAX;
    for (int l = 0; l < lanes; ++l) {
      if (!feed[l].has_value() && next < messages.size()) {
        feed[l].emplace(*messages[next]);
        job[l] = next++;
        for (int i = 0; i < 4; ++i) s.st[i][l] = kInit[i];
      }
      if (feed[l].has_value()) run = std::min(run, feed[l]->blocks_left());
    }
    if (run == UINT64_MAX) break;
    for (uint64_t step = 0; step < run; ++step) {
      for (int l = 0; l < lanes; ++l)
        block[l] = feed[l].has_value() ? feed[l]->Next(stage[l]) : kIdle;
      fn(s, block);
    }
    for (int l = 0; l < lanes; ++l) {
      if (!feed[l].has_value() || feed[l]->blocks_left() > 0) continue;
      for (int i = 0; i < 4; ++i) {
        for (int byte = 0; byte < 4; ++byte) {
          out[job[l]][4 * i + byte] = static_cast<uint8_t>(s.st[i][l] >> (8 * byte));
        }
      }
      feed[l].reset();
    }
  }
}

}  // namespace

namespace internal {

bool Md5ManyAvailable(Md5Kernel kind) {
  switch (kind) {
    case Md5Kernel::kScalar:
      return true;
#ifdef WHARF_MD5_X86
    case Md5Kernel::kAvx2:
      return __builtin_cpu_supports("avx2");
    case Md5Kernel::kAvx512:
      return __builtin_cpu_supports("avx512f");
#else
    default:
      return false;
#endif
  }
  return false;
}

std::vector<Md5Digest> Md5ManyWith(Md5Kernel kind, absl::Span<const absl::Cord* const> messages) {
  std::vector<Md5Digest> out(messages.size());
  switch (kind) {
#ifdef WHARF_MD5_X86
    case Md5Kernel::kAvx512:
      RunLanes(&Block16, 16, messages, out.data());
      return out;
    case Md5Kernel::kAvx2:
      RunLanes(&Block8, 8, messages, out.data());
      return out;
#endif
    default:
      break;
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    Md5 md5;
    md5.Update(*messages[i]);
    out[i] = md5.Finish();
  }
  return out;
}

}  // namespace internal

std::vector<Md5Digest> Md5Many(absl::Span<const absl::Cord* const> messages) {
  using internal::Md5Kernel;
  static const bool avx512 = internal::Md5ManyAvailable(Md5Kernel::kAvx512);
  static const bool avx2 = internal::Md5ManyAvailable(Md5Kernel::kAvx2);
  // A lane costs about as much as the whole vector: with few messages, one at a time wins.
  Md5Kernel kind = Md5Kernel::kScalar;
  if (messages.size() > 8 && avx512) {
    kind = Md5Kernel::kAvx512;
  } else if (messages.size() >= 3 && avx2) {
    kind = Md5Kernel::kAvx2;
  }
  return internal::Md5ManyWith(kind, messages);
}

Md5Batcher::~Md5Batcher() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

void Md5Batcher::Hash(absl::Cord data, ThreadPool& pool, Done done) {
  absl::MutexLock lock(&mu_);
  queued_bytes_ += data.size();
  last_arrival_ = absl::Now();
  queue_.push_back(Job{std::move(data), &pool, std::move(done), last_arrival_});
  if (!thread_.joinable()) thread_ = StartThread([this] { Loop(); });
}

void Md5Batcher::Loop() {
  std::vector<Job> batch;
  std::vector<const absl::Cord*> messages;
  for (;;) {
    batch.clear();
    {
      absl::MutexLock lock(&mu_);
      auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&any));
      if (queue_.empty()) return;  // stopping, nothing left
      auto full = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || queue_.size() >= options_.max_batch || queued_bytes_ >= options_.max_bytes;
      };
      // Arrivals that do not fill the batch do not wake this wait: each deadline passed is
      // recomputed from the latest arrival.
      for (;;) {
        const absl::Time deadline =
            std::min(queue_.front().queued + options_.max_wait, last_arrival_ + options_.gap);
        if (full() || absl::Now() >= deadline) break;
        mu_.AwaitWithDeadline(absl::Condition(&full), deadline);
      }
      uint64_t bytes = 0;
      while (!queue_.empty() && batch.size() < options_.max_batch && bytes < options_.max_bytes) {
        bytes += queue_.front().data.size();
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      queued_bytes_ -= bytes;
    }
    messages.clear();
    for (const Job& job : batch) messages.push_back(&job.data);
    const std::vector<Md5Digest> digests = Md5Many(messages);
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i].pool->Schedule(
          [done = std::move(batch[i].done), data = std::move(batch[i].data),
           md5 = digests[i]]() mutable { std::move(done)(std::move(data), md5); });
    }
  }
}

}  // namespace wharf
