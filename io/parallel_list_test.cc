#include "io/parallel_list.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "base/runtime.h"
#include "base/thread_pool.h"
#include "base/timer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "http/curl_transport.h"
#include "store/forwarding_store.h"
#include "store/local/local_store.h"
#include "store/s3/aws_config.h"
#include "store/s3/s3_store.h"
#include "store/testing/delayed_get_store.h"
#include "store/testing/memory_store.h"

namespace wharf {
namespace {

namespace fs = std::filesystem;
using internal::MidpointKey;
using internal::PrefixSuccessor;
using internal::SplitKey;
using internal::Utf8MidpointKey;
using ::testing::HasSubstr;

std::string Esc(absl::string_view s) { return absl::StrCat("\"", absl::CHexEscape(s), "\""); }

// Strict UTF-8 decoding, written independently of the library's.
bool DecodeUtf8(absl::string_view s, std::vector<char32_t>* out) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    const size_t len = c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    char32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return false;
    out->push_back(cp);
    i += len;
  }
  return true;
}

bool IsUtf8(absl::string_view s) {
  std::vector<char32_t> ignored;
  return DecodeUtf8(s, &ignored);
}

// ---------------------------------------------------------------- midpoints

TEST(MidpointKeyTest, EdgeCases) {
  using namespace std::string_literals;
  // Unbounded above.
  EXPECT_EQ(MidpointKey("", ""), "\x80");
  auto m = MidpointKey("\xff\xff", "");
  ASSERT_TRUE(m.has_value());
  EXPECT_GT(*m, "\xff\xff");
  // Empty lower bound.
  m = MidpointKey("", "b");
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(*m > "" && *m < "b") << Esc(*m);
  m = MidpointKey("", "\x01");
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(*m > "" && *m < "\x01") << Esc(*m);
  // Lower a prefix of upper.
  m = MidpointKey("a", "ab");
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(*m > "a" && *m < "ab") << Esc(*m);
  // Adjacent strings: nothing lies strictly between "a" and "a\0".
  EXPECT_EQ(MidpointKey("a", "a\0"s), std::nullopt);
  EXPECT_EQ(MidpointKey("", "\0"s), std::nullopt);
  EXPECT_EQ(MidpointKey("a", "a\0\0"s), "a\0"s);
  // Halfway, as base-256 fractions after the common prefix.
  EXPECT_EQ(MidpointKey("data/0", "data/4"), "data/2");
  EXPECT_EQ(MidpointKey("data/0", "data/3"), "data/1");
  EXPECT_EQ(MidpointKey("data/0", "data/1"), "data/0\x80");
  EXPECT_EQ(MidpointKey("a\xff", "b"), "a\xff\x80");
}

// A string of 0..6 bytes, biased towards the bytes at the edges of the order.
std::string RandomBytes(std::mt19937_64& rng) {
  static constexpr unsigned char kEdges[] = {0x00, 0x01, 0x02, 0x7F, 0x80, 0xFE, 0xFF};
  std::string s(rng() % 7, '\0');
  for (char& c : s) {
    c = static_cast<char>(rng() % 2 ? kEdges[rng() % sizeof(kEdges)] : rng() % 256);
  }
  return s;
}

TEST(MidpointKeyTest, StrictlyBetweenRandomByteStrings) {
  std::mt19937_64 rng(1);
  int splits = 0;
  for (int trial = 0; trial < 300000; ++trial) {
    std::string a = RandomBytes(rng), b = RandomBytes(rng);
    if (a == b) continue;
    if (b < a) std::swap(a, b);
    const bool unbounded = trial % 8 == 0;
    if (unbounded) b.clear();
    const auto m = MidpointKey(a, b);
    if (!unbounded && b == a + '\0') {
      EXPECT_EQ(m, std::nullopt) << Esc(a) << " " << Esc(b);
      continue;
    }
    ASSERT_TRUE(m.has_value()) << Esc(a) << " " << Esc(b);
    ASSERT_LT(a, *m) << Esc(a) << " " << Esc(b);
    if (!unbounded) {
      ASSERT_LT(*m, b) << Esc(a) << " " << Esc(b);
    }
    EXPECT_LE(m->size(), std::max(a.size(), b.size()) + 1);
    ++splits;
  }
  EXPECT_GT(splits, 250000);
}

// A string of code points drawn from a pool with edge cases of UTF-8 (1-4 bytes, U+0001,
// U+D7FF and U+E000 around the surrogates, U+FFFF, U+10FFFF).
std::string RandomUtf8(std::mt19937_64& rng, size_t max_len) {
  static const char* kPool[] = {"\x01",
                                "a",
                                "b",
                                "z",
                                "/",
                                "0",
                                "9",
                                "\x7f",
                                "é",
                                "ÿ",
                                "日",
                                "本",
                                "😀",
                                "\xed\x9f\xbf",
                                "\xee\x80\x80",
                                "\xef\xbf\xbf",
                                "\xf4\x8f\xbf\xbf"};
  std::string s;
  const size_t len = rng() % (max_len + 1);
  for (size_t i = 0; i < len; ++i) s += kPool[rng() % std::size(kPool)];
  return s;
}

TEST(Utf8MidpointKeyTest, StrictlyBetweenAndValidUtf8) {
  std::mt19937_64 rng(2);
  int splits = 0;
  for (int trial = 0; trial < 100000; ++trial) {
    std::string a = RandomUtf8(rng, 5), b = RandomUtf8(rng, 5);
    if (a == b) continue;
    if (b < a) std::swap(a, b);
    const bool unbounded = trial % 8 == 0;
    if (unbounded) b.clear();
    std::vector<char32_t> hint;
    DecodeUtf8(RandomUtf8(rng, 3), &hint);
    const auto m = Utf8MidpointKey(a, b, hint);
    // The digits are the code points of a, b and the hint; the least of them is "zero",
    // and only b == a + zero leaves no string of those digits strictly between.
    std::vector<char32_t> all = hint;
    DecodeUtf8(a, &all);
    DecodeUtf8(b, &all);
    if (!m.has_value() && all.empty()) continue;  // no digits to build a key from
    if (!m.has_value()) {
      ASSERT_FALSE(unbounded) << Esc(a);
      std::vector<char32_t> b_cps;
      DecodeUtf8(b, &b_cps);
      const char32_t least = *std::min_element(all.begin(), all.end());
      std::vector<char32_t> a_cps;
      DecodeUtf8(a, &a_cps);
      a_cps.push_back(least);
      EXPECT_EQ(a_cps, b_cps) << "no split between " << Esc(a) << " and " << Esc(b);
      continue;
    }
    ASSERT_TRUE(IsUtf8(*m)) << Esc(*m);
    ASSERT_LT(a, *m) << Esc(a) << " " << Esc(b);
    if (!unbounded) {
      ASSERT_LT(*m, b) << Esc(a) << " " << Esc(b);
    }
    std::vector<char32_t> m_cps;
    DecodeUtf8(*m, &m_cps);
    for (char32_t cp : m_cps) {
      ASSERT_NE(std::find(all.begin(), all.end(), cp), all.end()) << "digit outside alphabet";
    }
    ++splits;
  }
  EXPECT_GT(splits, 80000);
}

TEST(Utf8MidpointKeyTest, SplitsAmongTheDigitsOfRealKeys) {
  // With the digits of the keys, the split lands among them, not in empty code space.
  const std::vector<char32_t> digits = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9'};
  EXPECT_EQ(Utf8MidpointKey("0000", "8000", digits), "4");
  EXPECT_EQ(Utf8MidpointKey("img/00000", "img/80000", digits), "img/40000");
  auto m = Utf8MidpointKey("img/12345", "", digits);
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(*m > "img/12345") << *m;
  EXPECT_EQ(Utf8MidpointKey("a\xff", "b"), std::nullopt);  // not UTF-8
  EXPECT_EQ(Utf8MidpointKey("", ""), std::nullopt);        // no digits at all
}

TEST(SplitKeyTest, ExtrapolatesFromThePageWhenTheBoundIsLoose) {
  const std::vector<char32_t> digits = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9'};
  // A page held the keys in (img/000100, img/000200]: 4 more such pages end at img/000600.
  EXPECT_EQ(SplitKey("img/000100", "img/000200", "", 4, digits), "img/000600");
  EXPECT_EQ(SplitKey("img/000100", "img/000200", "img0", 4, digits), "img/000600");
  // A nearer bound: the midpoint is smaller, and wins.
  EXPECT_EQ(SplitKey("img/000100", "img/000200", "img/000300", 4, digits),
            Utf8MidpointKey("img/000200", "img/000300", digits));
  // No density to go by (listed_from >= lower), or past the end of the key space.
  EXPECT_EQ(SplitKey("img/000200", "img/000200", "", 4, digits),
            Utf8MidpointKey("img/000200", "", digits));
  EXPECT_EQ(SplitKey("", "\xf4\x8f\xbf\xbf", "", 4), Utf8MidpointKey("\xf4\x8f\xbf\xbf", ""));
  // Bytes that are not UTF-8: byte arithmetic.
  EXPECT_EQ(SplitKey("a\x80\x10", "a\x80\x20", "", 2), "a\x80\x40");
}

TEST(SplitKeyTest, NumberedKeysExtrapolateAsNumbers) {
  // Letters seen elsewhere in the keys sort above '9': as digits they put the estimate in
  // the gap before "k10/f01000". Read as a number, the run gives the next page's end.
  const std::vector<char32_t> seen = {'/', '0', '1', '9', 'f', 'k'};
  EXPECT_EQ(SplitKey("k10/f00000", "k10/f00999", "k100", 1, seen), "k10/f01998");
  EXPECT_EQ(SplitKey("k10/f01999", "k10/f02998", "k100", 2, seen), "k10/f04996");
  EXPECT_EQ(SplitKey("s/shard-000000.tar", "s/shard-000099.tar", "", 3), "s/shard-000396");
  // A nearer bound: the midpoint wins.
  EXPECT_EQ(SplitKey("k10/f00000", "k10/f00999", "k10/f01500", 1, seen),
            SplitKey("", "k10/f00999", "k10/f01500", 0, seen));
  // Past the run's last number, or runs of different lengths: the other estimates, still
  // strictly between.
  for (const auto& [from, lower] : std::vector<std::pair<std::string, std::string>>{
           {"k/f99000", "k/f99999"}, {"k/f9", "k/f10"}, {"k/f1", "k/f10x"}}) {
    auto m = SplitKey(from, lower, "", 4, seen);
    ASSERT_TRUE(m.has_value()) << from;
    EXPECT_LT(lower, *m) << from;
  }
}

TEST(SplitKeyTest, StrictlyBetweenOnRandomStrings) {
  std::mt19937_64 rng(3);
  int splits = 0;
  for (int trial = 0; trial < 100000; ++trial) {
    const bool bytes = trial % 2 == 0;
    std::string k[3];
    for (auto& s : k) s = bytes ? RandomBytes(rng) : RandomUtf8(rng, 5);
    std::sort(std::begin(k), std::end(k));
    const std::string& from = k[0];
    const std::string& a = k[1];
    std::string b = k[2];
    if (a == b) continue;
    const bool unbounded = trial % 8 < 2;
    if (unbounded) b.clear();
    const uint64_t stride = uint64_t{1} << (rng() % 40);
    const auto m = SplitKey(from, a, b, stride);
    if (!m.has_value()) continue;  // too narrow (checked for the midpoints above)
    ASSERT_LT(a, *m) << Esc(from) << " " << Esc(a) << " " << Esc(b);
    if (!unbounded) {
      ASSERT_LT(*m, b) << Esc(from) << " " << Esc(a) << " " << Esc(b);
    }
    if (IsUtf8(a)) {
      ASSERT_TRUE(IsUtf8(*m)) << Esc(*m);
    }
    ++splits;
  }
  EXPECT_GT(splits, 50000);
}

TEST(PrefixSuccessorTest, IsTheLeastStringAfterThePrefixedOnes) {
  EXPECT_EQ(PrefixSuccessor("a/b"), "a/c");
  EXPECT_EQ(PrefixSuccessor("a\xff\xff"), "b");
  EXPECT_EQ(PrefixSuccessor("\xff"), "");
  EXPECT_EQ(PrefixSuccessor(""), "");
  EXPECT_EQ(PrefixSuccessor("a\x7f"), "a\x80");
}

// ---------------------------------------------------------------- key sets

// What keys a store can hold: any bytes (the memory store), UTF-8 file names, S3 keys.
enum class KeyKind { kBytes, kLocal, kS3 };

// Key pieces with awkward bytes for URLs, XML and file systems.
const std::vector<std::string>& Tokens(KeyKind kind) {
  static const std::vector<std::string> kS3 = {"a", "b", "c", "m",    "z",
                                               "A", "Z", "0", "1",    "7",
                                               "9", " ", "é", "日本", "😀",
                                               "+", "%", "=", "&",    "~",
                                               "-", "_", ".", "ÿ",    "aaaaaaaaaaaaaaaa"};
  static const std::vector<std::string> kLocal = [] {
    std::vector<std::string> t = kS3;
    for (const char* extra : {"\x01", "\x7f", "\xef\xbf\xbf", "\xf4\x8f\xbf\xbf"}) {
      t.push_back(extra);
    }
    return t;
  }();
  static const std::vector<std::string> kBytes = [] {
    std::vector<std::string> t = kLocal;
    for (const char* extra : {"\x80", "\xc3", "\xfe", "\xff", "\xff\xff"}) t.push_back(extra);
    t.push_back(std::string(1, '\0'));
    t.push_back(std::string("a\0b", 3));
    return t;
  }();
  return kind == KeyKind::kS3 ? kS3 : kind == KeyKind::kLocal ? kLocal : kBytes;
}

std::string RandomComponent(std::mt19937_64& rng, KeyKind kind) {
  const auto& tokens = Tokens(kind);
  std::string c;
  const int n = 1 + static_cast<int>(rng() % 5);
  for (int i = 0; i < n; ++i) c += tokens[rng() % tokens.size()];
  if (c == "." || c == "..") c += "x";
  return c;
}

std::string RandomKey(std::mt19937_64& rng, KeyKind kind) {
  switch (rng() % 5) {
    case 0:  // many keys behind one long shared prefix: splits land inside it
      return absl::StrCat("shared/long/common/prefix/for/the/splits/item-",
                          absl::Dec(rng() % 100000, absl::kZeroPad5),
                          rng() % 3 ? "" : RandomComponent(rng, kind));
    case 1: {  // deep prefixes
      std::string key;
      const int depth = 1 + static_cast<int>(rng() % 8);
      for (int i = 0; i < depth; ++i) absl::StrAppend(&key, std::string(1, 'a' + i), "/");
      return key + RandomComponent(rng, kind);
    }
    default: {
      std::string key;
      const int parts = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < parts; ++i) {
        absl::StrAppend(&key, i > 0 ? "/" : "", RandomComponent(rng, kind));
      }
      return key;
    }
  }
}

// `count` distinct keys (fewer for file://), sorted. For file:// no key is a "directory"
// of another ("a" and "a/b" cannot both be files).
std::vector<std::string> RandomKeySet(std::mt19937_64& rng, int count, KeyKind kind) {
  std::set<std::string> keys;
  while (static_cast<int>(keys.size()) < count) {
    std::string key = RandomKey(rng, kind);
    if (kind != KeyKind::kBytes && !LocalStore::ValidateKey(key).ok()) continue;
    keys.insert(std::move(key));
  }
  std::vector<std::string> out;
  for (const std::string& key : keys) {
    auto next = keys.lower_bound(key + "/");
    if (kind == KeyKind::kLocal && next != keys.end() && absl::StartsWith(*next, key + "/")) {
      continue;
    }
    out.push_back(key);
  }
  return out;
}

// A prefix of `key`, cut at a code point boundary (or anywhere, when `bytes`).
std::string RandomPrefixOf(std::mt19937_64& rng, const std::string& key, bool bytes) {
  size_t cut = rng() % (key.size() + 1);
  while (!bytes && cut > 0 && cut < key.size() && (key[cut] & 0xC0) == 0x80) --cut;
  return key.substr(0, cut);
}

// A bound near the keys: a key, a key's prefix, a key plus a character, or nothing.
std::string RandomBound(std::mt19937_64& rng, const std::vector<std::string>& keys, KeyKind kind) {
  const std::string& key = keys[rng() % keys.size()];
  switch (rng() % (kind == KeyKind::kBytes ? 7 : 5)) {
    case 0:
      return "";
    case 1:
      return key;
    case 2:
      return RandomPrefixOf(rng, key, kind == KeyKind::kBytes);
    case 3:
      return key + "0";
    case 4:
      return key + " ";
    case 5:
      return key + std::string(1, '\0');
    default:
      return key + "\xff";
  }
}

ListOptions RandomRange(std::mt19937_64& rng, const std::vector<std::string>& keys, KeyKind kind) {
  ListOptions range;
  const int variant = static_cast<int>(rng() % 4);
  if (variant == 1 || variant == 3) {
    const bool bytes = kind == KeyKind::kBytes || (kind == KeyKind::kLocal && rng() % 4 == 0);
    range.prefix = RandomPrefixOf(rng, keys[rng() % keys.size()], bytes);
  }
  if (variant >= 2) {
    range.start_after = RandomBound(rng, keys, kind);
    range.end_before = RandomBound(rng, keys, kind);
    if (rng() % 4 != 0 && !range.end_before.empty() && range.end_before < range.start_after) {
      std::swap(range.start_after, range.end_before);
    }
  }
  return range;
}

std::vector<std::string> Expected(const std::vector<std::string>& keys, const ListOptions& r) {
  std::vector<std::string> out;
  for (const std::string& key : keys) {
    if (absl::StartsWith(key, r.prefix) && key > r.start_after &&
        (r.end_before.empty() || key < r.end_before)) {
      out.push_back(key);
    }
  }
  return out;
}

std::string Describe(const ListOptions& r, const ParallelListOptions& o) {
  return absl::StrCat("prefix=", Esc(r.prefix), " start_after=", Esc(r.start_after),
                      " end_before=", Esc(r.end_before), " workers=", o.workers,
                      " page_size=", o.page_size, " max_pending_pages=", o.max_pending_pages);
}

// The size each test object gets, so listings can be checked beyond their keys.
uint64_t SizeOf(const std::string& key) { return key.size() % 7; }

void PutAll(ObjectStore& store, const std::vector<std::string>& keys) {
  absl::BlockingCounter pending(static_cast<int>(keys.size()));
  absl::Mutex mu;
  absl::Status first;
  for (const std::string& key : keys) {
    store.PutAsync(key, absl::Cord(std::string(SizeOf(key), 'x')),
                   [&](absl::StatusOr<ObjectMeta> r) {
                     if (!r.ok()) {
                       absl::MutexLock lock(&mu);
                       if (first.ok()) first = r.status();
                     }
                     pending.DecrementCount();
                   });
  }
  pending.Wait();
  ASSERT_TRUE(first.ok()) << first;
}

std::vector<std::string> KeysOf(const std::vector<ObjectMeta>& objects) {
  std::vector<std::string> keys;
  for (const ObjectMeta& o : objects) keys.push_back(o.key);
  return keys;
}

// Lists `range` in parallel and sequentially and checks both against `keys` filtered in
// memory: same keys, same order, no duplicates, none missing, sizes right. With
// `exact_pages` (every page but a range's last is full), also that no page was listed
// twice: only the last call of each of the splits + 1 ranges returns a short page.
void CheckListing(ObjectStore& store, const std::vector<std::string>& keys,
                  const ListOptions& range, const ParallelListOptions& options, bool exact_pages) {
  SCOPED_TRACE(Describe(range, options));
  const std::vector<std::string> expected = Expected(keys, range);

  ParallelListStats stats;
  auto listed = ParallelListAll(store, range, options, &stats);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(KeysOf(*listed), expected);
  for (const ObjectMeta& o : *listed) ASSERT_EQ(o.size, SizeOf(o.key)) << Esc(o.key);
  EXPECT_EQ(stats.objects, static_cast<int64_t>(expected.size()));
  EXPECT_LE(stats.peak_in_flight, options.workers);
  if (exact_pages) {
    const int64_t full_pages = static_cast<int64_t>(expected.size()) / options.page_size;
    EXPECT_LE(stats.list_calls, full_pages + stats.splits + 1);
    EXPECT_LE(stats.splits, internal::kSplitsPerPage * full_pages);
  }
  if (options.workers == 1) {
    EXPECT_EQ(stats.splits, 0);
  }

  std::vector<std::string> sequential;
  ASSERT_TRUE(SequentialList(store, range, options, [&](std::vector<ObjectMeta> page) {
                for (auto& o : page) sequential.push_back(std::move(o.key));
                return absl::OkStatus();
              }).ok());
  ASSERT_EQ(sequential, expected);
}

// With `quirks`, pages hold a random number of keys and one in ten is empty but for a
// continuation token (as a store may answer), so listings must go by the token, not by page
// sizes. Its tokens are "q" + the inner store's ("q" alone: the inner listing's start).
class QuirkyPages : public ForwardingStore {
 public:
  QuirkyPages(ObjectStore& inner, uint64_t seed) : ForwardingStore(inner), rng_(seed) {}

  void ListAsync(ListOptions options, std::string continuation, Callback<ListPage> done) override {
    bool empty_page;
    {
      absl::MutexLock lock(&mu_);
      options.page_size = 1 + static_cast<int>(rng_() % std::max(1, options.page_size));
      empty_page = rng_() % 10 == 0;
    }
    std::string inner_token = continuation.empty() ? "" : continuation.substr(1);
    inner().ListAsync(
        std::move(options), inner_token,
        [empty_page, inner_token, done = std::move(done)](absl::StatusOr<ListPage> page) mutable {
          if (page.ok() && empty_page && !page->objects.empty()) {
            *page = ListPage{.continuation = absl::StrCat("q", inner_token)};  // the same again
          } else if (page.ok() && !page->continuation.empty()) {
            page->continuation = absl::StrCat("q", page->continuation);
          }
          std::move(done)(std::move(page));
        });
  }

 private:
  absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

std::string MakeTempDir() {
  std::string tmpl = (fs::temp_directory_path() / "wharf-plist-test-XXXXXX").string();
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

// ---------------------------------------------------------------- property tests

constexpr int kWorkers[] = {1, 2, 7, 16};
constexpr int kPageSizes[] = {1, 3, 10, 1000};

// Hundreds to a few thousand keys, log-uniformly.
int RandomCount(std::mt19937_64& rng) {
  return static_cast<int>(200 * std::pow(15.0, static_cast<double>(rng() % 1000) / 1000.0));
}

ParallelListOptions RandomOptions(std::mt19937_64& rng, int workers, int page_size) {
  ParallelListOptions options;
  options.workers = workers;
  options.page_size = page_size;
  options.max_pending_pages = rng() % 3 == 0 ? 1 : 64;
  return options;
}

TEST(ParallelListPropertyTest, MatchesTheSequentialListingOnMemoryStore) {
  int listings = 0;
  for (uint64_t seed = 1; seed <= 48 && !HasFatalFailure(); ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937_64 rng(seed);
    const KeyKind kind = seed % 2 ? KeyKind::kBytes : KeyKind::kLocal;
    const bool quirks = seed % 3 == 0;
    const std::vector<std::string> keys = RandomKeySet(rng, RandomCount(rng), kind);
    store_testing::MemoryStore memory;
    PutAll(memory, keys);
    QuirkyPages quirky(memory, seed);
    ObjectStore& store = quirks ? static_cast<ObjectStore&>(quirky) : memory;
    for (int workers : kWorkers) {
      for (int page_size : kPageSizes) {
        for (int i = 0; i < 3 && !HasFatalFailure(); ++i) {
          CheckListing(store, keys, RandomRange(rng, keys, kind),
                       RandomOptions(rng, workers, page_size), /*exact_pages=*/!quirks);
          ++listings;
        }
      }
    }
  }
  std::cout << "compared " << listings << " parallel listings with the sequential one\n";
}

TEST(ParallelListPropertyTest, MatchesTheSequentialListingOnLocalStore) {
  int listings = 0;
  // File system calls dominate here; the memory store above carries most of the trials.
  for (uint64_t seed = 1; seed <= 4 && !HasFatalFailure(); ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937_64 rng(seed);
    const std::string root = MakeTempDir();
    auto store = LocalStore::Open(root, Runtime::Default());
    ASSERT_TRUE(store.ok()) << store.status();
    const std::vector<std::string> keys =
        RandomKeySet(rng, seed == 1 ? 2000 : RandomCount(rng), KeyKind::kLocal);
    PutAll(**store, keys);
    for (int workers : kWorkers) {
      for (int page_size : kPageSizes) {
        for (int i = 0; i < 2 && !HasFatalFailure(); ++i) {
          ListOptions range = RandomRange(rng, keys, KeyKind::kLocal);
          // Tiny pages over thousands of files are slow; narrow the range.
          while (page_size <= 3 && Expected(keys, range).size() > 200) {
            range.start_after = keys[rng() % keys.size()];
            range.end_before = "";
          }
          CheckListing(**store, keys, range, RandomOptions(rng, workers, page_size),
                       /*exact_pages=*/true);
          ++listings;
        }
      }
    }
    fs::remove_all(root);
  }
  std::cout << "compared " << listings << " parallel listings with the sequential one\n";
}

// ---------------------------------------------------------------- S3

std::shared_ptr<HttpTransport> SharedTransport() {
  static auto* transport = new std::shared_ptr<HttpTransport>(NewCurlTransport());
  return *transport;
}

TEST(ParallelListPropertyTest, MatchesTheSequentialListingOnS3) {
  const char* endpoint = std::getenv("WHARF_S3_ENDPOINT");
  ASSERT_NE(endpoint, nullptr)
      << "WHARF_S3_ENDPOINT is not set: this test needs the real S3 server. Start it with "
         "`scripts/s3-server start` and `eval \"$(scripts/s3-server env)\"`, or run "
         "`./run test`";
  s3::S3ClientOverrides overrides;
  overrides.endpoint_url = endpoint;
  auto config = s3::ResolveS3ClientConfig(overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  std::mt19937_64 bucket_rng(std::random_device{}());
  auto store =
      s3::S3Store::Open(absl::StrCat("wharf-plist-", absl::Hex(bucket_rng(), absl::kZeroPad16)),
                        *config, SharedTransport());
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->CreateBucket().ok());

  int listings = 0;
  for (uint64_t seed = 1; seed <= 2 && !HasFatalFailure(); ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937_64 rng(seed);
    const std::vector<std::string> keys = RandomKeySet(rng, 400, KeyKind::kS3);
    PutAll(**store, keys);
    for (int workers : kWorkers) {
      for (int page_size : kPageSizes) {
        ListOptions range = RandomRange(rng, keys, KeyKind::kS3);
        ParallelListOptions options;
        options.workers = workers;
        options.page_size = page_size;
        // S3 trims pages at end_before client-side, so pages may be short.
        CheckListing(**store, keys, range, options, /*exact_pages=*/false);
        ++listings;
        if (HasFatalFailure()) break;
      }
      if (HasFatalFailure()) break;
    }
    EXPECT_TRUE((*store)->DeleteMany(keys).ok());
  }
  EXPECT_TRUE((*store)->DeleteBucket().ok());
  std::cout << "compared " << listings << " parallel listings with the sequential one on S3\n";
}

// ---------------------------------------------------------------- a slow store

// Delays every list page by `delay` (on the shared timer: no thread sleeps) and counts the
// calls in flight; optionally fails call number `fail_call` (1-based).
class SlowListStore : public ForwardingStore {
 public:
  SlowListStore(ObjectStore& inner, absl::Duration delay) : ForwardingStore(inner), delay_(delay) {}

  void FailCall(int n, absl::Status status) {
    absl::MutexLock lock(&mu_);
    fail_call_ = n;
    fail_status_ = std::move(status);
  }
  int peak_in_flight() { return lists_.peak(); }
  int in_flight() { return lists_.in_flight(); }
  int calls() { return lists_.calls(); }
  // Calls that answered a page holding nothing.
  int empty_pages() { return empty_pages_.load(); }

  void ListAsync(ListOptions options, std::string continuation, Callback<ListPage> done) override {
    const int call = lists_.Enter();
    absl::Status fail_status;
    {
      absl::MutexLock lock(&mu_);
      if (call == fail_call_) fail_status = fail_status_;
    }
    inner().ListAsync(std::move(options), std::move(continuation),
                      [this, fail_status = std::move(fail_status),
                       done = std::move(done)](absl::StatusOr<ListPage> page) mutable {
                        if (!fail_status.ok()) page = fail_status;
                        if (page.ok() && page->objects.empty() && page->common_prefixes.empty()) {
                          ++empty_pages_;
                        }
                        Timer::Global().After(delay_, [this, page = std::move(page),
                                                       done = std::move(done)]() mutable {
                          lists_.Leave();
                          std::move(done)(std::move(page));
                        });
                      });
  }

 private:
  const absl::Duration delay_;
  store_testing::InFlightCounter lists_;
  absl::Mutex mu_;
  int fail_call_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status fail_status_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> empty_pages_{0};
};

std::vector<std::string> NumberedKeys(int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) {
    keys.push_back(
        absl::StrCat("train/shard-", i % 7, "/sample-", absl::Dec(i, absl::kZeroPad6), ".jpg"));
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

// One file:// store of 5,000 keys, written once for the tests below.
class LocalListTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(MakeTempDir());
    auto store = LocalStore::Open(*root_, Runtime::Default());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = store->release();
    keys_ = new std::vector<std::string>(NumberedKeys(5000));
    PutAll(*store_, *keys_);
  }
  static void TearDownTestSuite() {
    fs::remove_all(*root_);
    delete store_;
    delete keys_;
    delete root_;
  }

  static std::string* root_;
  static LocalStore* store_;
  static std::vector<std::string>* keys_;
};

std::string* LocalListTest::root_ = nullptr;
LocalStore* LocalListTest::store_ = nullptr;
std::vector<std::string>* LocalListTest::keys_ = nullptr;

TEST_F(LocalListTest, SlowListingsRunInParallel) {
  const std::vector<std::string>& keys = *keys_;
  SlowListStore slow(*store_, absl::Milliseconds(20));
  ParallelListOptions options;
  options.page_size = 100;

  ParallelListStats sequential;
  int64_t sequential_keys = 0;
  ASSERT_TRUE(SequentialList(
                  slow, {}, options,
                  [&](std::vector<ObjectMeta> page) {
                    sequential_keys += static_cast<int64_t>(page.size());
                    return absl::OkStatus();
                  },
                  &sequential)
                  .ok());
  EXPECT_EQ(sequential_keys, 5000);
  EXPECT_EQ(sequential.list_calls, 50);

  for (const ListOptions& range : {ListOptions{}, ListOptions{.prefix = "train/"}}) {
    SCOPED_TRACE(Esc(range.prefix));
    const int calls_before = slow.calls();
    ParallelListStats stats;
    auto listed = ParallelListAll(slow, range, options, &stats);
    ASSERT_TRUE(listed.ok()) << listed.status();
    EXPECT_EQ(KeysOf(*listed), keys);
    EXPECT_EQ(slow.calls() - calls_before, stats.list_calls);
    EXPECT_GE(stats.splits, 3);
    EXPECT_LE(stats.list_calls, 50 + stats.splits + 1);  // no page listed twice
    EXPECT_GE(slow.peak_in_flight(), 4);
    EXPECT_EQ(slow.in_flight(), 0);
    // Information only: tests never assert speed.
    std::cout << "prefix " << Esc(range.prefix) << ": sequential " << sequential.list_calls
              << " calls in " << sequential.wall << "; parallel (16 workers) " << stats.list_calls
              << " calls, " << stats.splits << " splits, peak " << stats.peak_in_flight
              << " in flight, " << stats.wall << "\n";
  }
}

// A listing of a few pages under a prefix whose keys all start far past the prefix itself
// ("train/shard-3/" then "sample-..."): the splits must extrapolate from where the pages'
// keys lie, not from the prefix, or they land past every key and hand out empty ranges (5
// empty pages of 9 splits before; 2 of 10 now, the fan-out's ranges past the last key).
TEST_F(LocalListTest, AShortListingUnderAPrefixSpreadsOverWorkersFromItsFirstPage) {
  const std::vector<std::string>& keys = *keys_;
  std::vector<std::string> want;
  for (const std::string& k : keys) {
    if (absl::StartsWith(k, "train/shard-3/")) want.push_back(k);
  }
  SlowListStore slow(*store_, absl::Milliseconds(20));
  ParallelListOptions options;
  options.page_size = 60;  // 715 keys: 12 pages
  ParallelListStats stats;
  auto listed = ParallelListAll(slow, ListOptions{.prefix = "train/shard-3/"}, options, &stats);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(KeysOf(*listed), want);
  EXPECT_LE(stats.list_calls, 12 + stats.splits + 1);  // no page listed twice
  // By the time the first worker has listed its second page, others list beside it.
  EXPECT_GE(slow.peak_in_flight(), 3);
  EXPECT_LT(slow.empty_pages(), stats.splits / 2);
  std::cout << "12 pages: " << slow.empty_pages() << " empty, " << stats.list_calls << " calls, "
            << stats.splits << " splits, peak " << stats.peak_in_flight << " in flight, "
            << stats.wall << "\n";
}

// Ten pages of numbered keys under a prefix ("k10/f00000".."k10/f09999"): the splits land
// among the keys (the relay this replaced kept an empty lower range at every split: one empty
// page per split, and one worker listing at a time, peak 3 calls in flight), and the first
// page fans out to several workers at once. Empty pages: only ranges of the fan-out that lie
// past the last key.
TEST(ParallelListShapeTest, NumberedKeysSplitAmongTheKeys) {
  store_testing::MemoryStore store;
  std::vector<std::string> want;
  for (int i = 0; i < 10000; ++i) {
    want.push_back(absl::StrCat("k10/f", absl::Dec(i, absl::kZeroPad5)));
    ASSERT_TRUE(store.Put(want.back(), absl::Cord("x")).ok());
  }
  SlowListStore slow(store, absl::Milliseconds(20));
  ParallelListStats stats;
  auto listed = ParallelListAll(slow, ListOptions{.prefix = "k10/"}, {}, &stats);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(KeysOf(*listed), want);
  EXPECT_GE(stats.splits, 3);
  EXPECT_LE(slow.empty_pages(), internal::kSplitsPerPage);
  EXPECT_LT(slow.empty_pages(), stats.splits / 2);
  EXPECT_GE(slow.peak_in_flight(), 5);
  std::cout << "10 pages: " << stats.list_calls << " calls, " << stats.splits << " splits, "
            << slow.empty_pages() << " empty, peak " << stats.peak_in_flight << " in flight, "
            << stats.wall << "\n";
}

// ---------------------------------------------------------------- contract and errors

TEST_F(LocalListTest, PagesReachOnPageOnTheCallingThreadOneAtATime) {
  SlowListStore slow(*store_, absl::Milliseconds(1));
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> inside{0};
  int64_t seen = 0;
  ParallelListOptions options;
  options.page_size = 10;
  options.max_pending_pages = 2;  // on_page is slower than the listing: workers pause
  auto by_key = [](const ObjectMeta& a, const ObjectMeta& b) { return a.key < b.key; };
  ASSERT_TRUE(ParallelList(slow, {}, options, [&](std::vector<ObjectMeta> page) {
                EXPECT_EQ(std::this_thread::get_id(), caller);
                EXPECT_EQ(inside.fetch_add(1), 0);
                EXPECT_FALSE(page.empty());
                EXPECT_TRUE(std::is_sorted(page.begin(), page.end(), by_key));
                seen += static_cast<int64_t>(page.size());
                std::this_thread::sleep_for(std::chrono::microseconds(200));
                inside.fetch_sub(1);
                return absl::OkStatus();
              }).ok());
  EXPECT_EQ(seen, 5000);
  EXPECT_EQ(slow.in_flight(), 0);
}

TEST_F(LocalListTest, AListErrorStopsTheListingAndNamesTheRange) {
  SlowListStore slow(*store_, absl::Milliseconds(2));
  slow.FailCall(6, absl::UnavailableError("list file:///x: injected failure"));
  ParallelListOptions options;
  options.page_size = 10;
  int64_t seen = 0;
  const absl::Status status = ParallelList(slow, {}, options, [&](std::vector<ObjectMeta> page) {
    seen += static_cast<int64_t>(page.size());
    return absl::OkStatus();
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()), HasSubstr("listing keys in ("));
  EXPECT_THAT(std::string(status.message()), HasSubstr("injected failure"));
  EXPECT_LT(seen, 5000);
  EXPECT_LT(slow.calls(), 300);  // stopped early: 5,000 keys take 500+ calls
  // A missing bucket is the whole bucket's problem: no key range in front of it.
  SlowListStore missing(*store_, absl::Milliseconds(0));
  missing.FailCall(1, absl::NotFoundError("list file:///x: no such bucket"));
  const absl::Status gone =
      ParallelList(missing, {}, options, [](std::vector<ObjectMeta>) { return absl::OkStatus(); });
  EXPECT_EQ(gone.message(), "list file:///x: no such bucket");
  EXPECT_EQ(slow.in_flight(), 0);  // and waited for the calls in flight
}

TEST_F(LocalListTest, AnOnPageErrorStopsTheListingAndIsReturned) {
  SlowListStore slow(*store_, absl::Milliseconds(2));
  ParallelListOptions options;
  options.page_size = 10;
  int pages = 0;
  const absl::Status status = ParallelList(slow, {}, options, [&](std::vector<ObjectMeta>) {
    return ++pages == 3 ? absl::DataLossError("consumer failed") : absl::OkStatus();
  });
  EXPECT_EQ(status, absl::DataLossError("consumer failed"));
  EXPECT_EQ(pages, 3);
  EXPECT_LT(slow.calls(), 200);
  EXPECT_EQ(slow.in_flight(), 0);
}

TEST_F(LocalListTest, RefusesDelimitersAndBadOptions) {
  ListOptions with_delimiter;
  with_delimiter.delimiter = "/";
  auto status = ParallelList(*store_, with_delimiter, {}, [](auto) { return absl::OkStatus(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("delimiter"));
  ParallelListOptions no_workers;
  no_workers.workers = 0;
  EXPECT_EQ(ParallelListAll(*store_, {}, no_workers).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ParallelListTest, EmptyStoreAndEmptyRanges) {
  const std::string root = MakeTempDir();
  auto store = LocalStore::Open(root, Runtime::Default());
  ASSERT_TRUE(store.ok()) << store.status();
  ParallelListStats stats;
  auto listed = ParallelListAll(**store, {}, {}, &stats);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
  EXPECT_EQ(stats.list_calls, 1);
  PutAll(**store, {"a", "b", "c"});
  listed = ParallelListAll(**store, ListOptions{.start_after = "c", .end_before = "a"}, {}, &stats);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  EXPECT_EQ(stats.list_calls, 0);
  listed = ParallelListAll(**store, ListOptions{.prefix = "b"});
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(KeysOf(*listed), std::vector<std::string>{"b"});
  fs::remove_all(root);
}

}  // namespace
}  // namespace wharf
