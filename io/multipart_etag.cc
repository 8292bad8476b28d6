#include "io/multipart_etag.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/hash.h"

namespace wharf {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kMaxPart = uint64_t{5} << 30;  // S3's largest part
constexpr uint32_t kMaxParts = 10000;             // S3's most parts
constexpr uint64_t kChunk = 4 * kMiB;             // bytes read at a time

// A part plan: every part `base` bytes (the last one the rest), or with `doubling` the base
// doubled every 1,000 parts, at most 5 GiB (wharf's writer).
struct Plan {
  uint64_t base = 0;
  bool doubling = false;
  uint64_t PartSize(uint64_t n) const {
    if (!doubling) return base;
    return std::min(base << std::min<uint64_t>(10, n / 1000), kMaxPart);
  }
  // The parts `size` bytes take, or kMaxParts + 1 when more than S3 allows.
  uint32_t Parts(uint64_t size) const {
    if (!doubling) {
      const uint64_t n = (size + base - 1) / base;
      return n > kMaxParts ? kMaxParts + 1 : static_cast<uint32_t>(n);
    }
    uint32_t n = 0;
    for (uint64_t at = 0; at < size && n <= kMaxParts; ++n) at += PartSize(n);
    return n;
  }
};

// One plan's hashing state during the pass.
struct Hashing {
  Plan plan;
  uint64_t part = 0;  // the part being hashed (0-based)
  uint64_t left = 0;  // its bytes still to come
  std::unique_ptr<Md5> md5;
  std::string digests;  // the finished parts' MD5s, concatenated

  void Feed(absl::string_view bytes) {
    while (!bytes.empty()) {
      const uint64_t n = std::min<uint64_t>(left, bytes.size());
      md5->Update(bytes.substr(0, n));
      bytes.remove_prefix(n);
      left -= n;
      if (left == 0) Next();
    }
  }
  void Next() {
    const std::array<uint8_t, 16> d = md5->Finish();
    digests.append(reinterpret_cast<const char*>(d.data()), d.size());
    md5 = std::make_unique<Md5>();
    left = plan.PartSize(++part);
  }
};

// The plans that cut `size` bytes into exactly `parts` parts, each once.
std::vector<Plan> Candidates(uint64_t size, uint32_t parts, uint64_t base) {
  std::vector<uint64_t> bases = {5 * kMiB,   8 * kMiB,   15 * kMiB,  16 * kMiB,
                                 32 * kMiB,  50 * kMiB,  64 * kMiB,  100 * kMiB,
                                 128 * kMiB, 256 * kMiB, 512 * kMiB, 1024 * kMiB};
  if (base > 0) bases.push_back(base);
  const uint64_t even = (size + parts - 1) / parts;
  bases.push_back(even);
  bases.push_back((even + kMiB - 1) / kMiB * kMiB);
  std::sort(bases.begin(), bases.end());
  bases.erase(std::unique(bases.begin(), bases.end()), bases.end());
  std::vector<Plan> plans;
  for (uint64_t b : bases) {
    if (b == 0 || b > kMaxPart) continue;
    for (bool doubling : {false, true}) {
      // Below 1,001 parts doubling changes nothing: one plan.
      if (doubling && parts <= 1000) continue;
      Plan p{b, doubling};
      if (p.Parts(size) == parts) plans.push_back(p);
    }
    // One part: every base at least the size cuts the same way.
    if (parts == 1 && !plans.empty()) break;
  }
  return plans;
}

}  // namespace

uint32_t MultipartEtagParts(absl::string_view etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') {
    etag = etag.substr(1, etag.size() - 2);
  }
  const size_t dash = etag.find('-');
  if (dash != 32) return 0;
  for (char c : etag.substr(0, 32)) {
    if (!absl::ascii_isxdigit(c)) return 0;
  }
  const absl::string_view count = etag.substr(33);
  uint32_t n = 0;
  if (count.empty() || count.size() > 5 ||
      !std::all_of(count.begin(), count.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(count, &n) || n == 0 || n > kMaxParts) {
    return 0;
  }
  return n;
}

absl::StatusOr<std::vector<std::string>> MultipartEtags(ObjectStore& store, const std::string& key,
                                                        uint64_t size, uint32_t parts,
                                                        uint64_t base) {
  std::vector<std::string> etags;
  if (parts == 0 || parts > kMaxParts || size == 0) return etags;
  std::vector<Hashing> hashing;
  for (const Plan& p : Candidates(size, parts, base)) {
    hashing.push_back(Hashing{p, 0, p.PartSize(0), std::make_unique<Md5>(), {}});
  }
  if (hashing.empty()) return etags;
  std::unique_ptr<char[]> buf(new char[kChunk]);
  for (uint64_t at = 0; at < size;) {
    const uint64_t n = std::min(kChunk, size - at);
    GetRequest request;
    request.key = key;
    request.range = ByteRange::Of(at, n);
    request.buffer = absl::Span<char>(buf.get(), n);
    absl::StatusOr<GetResult> got = store.Get(request);
    if (!got.ok()) return got.status();
    if (got->meta.size != size || got->bytes == 0) return etags;  // changed since listed
    const absl::string_view bytes(buf.get(), got->bytes);
    for (Hashing& h : hashing) h.Feed(bytes);
    at += got->bytes;
  }
  for (Hashing& h : hashing) {
    if (h.left != h.plan.PartSize(h.part)) h.Next();  // the last, shorter part
    if (h.part == parts) etags.push_back(absl::StrCat(Md5Hex(h.digests), "-", parts));
  }
  return etags;
}

absl::StatusOr<bool> MultipartEtagMatches(ObjectStore& store, const std::string& key, uint64_t size,
                                          absl::string_view etag, uint64_t base) {
  const uint32_t parts = MultipartEtagParts(etag);
  if (parts == 0) return false;
  if (etag.front() == '"') etag = etag.substr(1, etag.size() - 2);
  const std::string want = absl::AsciiStrToLower(etag);
  absl::StatusOr<std::vector<std::string>> etags = MultipartEtags(store, key, size, parts, base);
  if (!etags.ok()) return etags.status();
  return std::find(etags->begin(), etags->end(), want) != etags->end();
}

}  // namespace wharf
