#include "io/parallel_list.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"

namespace wharf {
namespace {

using Digits = std::vector<uint32_t>;

bool DigitsLess(absl::Span<const uint32_t> a, absl::Span<const uint32_t> b) {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
}

// The midpoint of `a` and `b` (nullptr: +infinity) as digit strings in base `radix`,
// compared lexicographically. After their common prefix, the tails are read as fractions
// 0.d1d2d3... (missing digits are 0) and averaged exactly, which needs one digit more than
// the longer tail. Whenever the fractions differ, the average lies strictly between them,
// and then the digit string lies strictly between the strings: it exceeds the zero-padded
// `a` tail (so it exceeds `a`, a prefix of that) and is below the zero-padded `b` tail at a
// position where `b` has a digit (padding digits are 0, and nothing is below 0). The
// fractions are equal only when `b` is `a` followed by k zero digits; strings strictly
// between are then `a` followed by 1..k-1 zeros.
// REQUIRES: every digit < radix; b == nullptr or a < *b.
std::optional<Digits> MidpointDigits(const Digits& a, const Digits* b, uint32_t radix) {
  size_t common = 0;
  if (b != nullptr) {
    while (common < a.size() && common < b->size() && a[common] == (*b)[common]) ++common;
  }
  const size_t na = a.size() - common;
  const size_t nb = b == nullptr ? 0 : b->size() - common;
  auto a_digit = [&](size_t i) -> uint64_t { return i < na ? a[common + i] : 0; };
  auto b_digit = [&](size_t i) -> uint64_t { return i < nb ? (*b)[common + i] : 0; };

  if (b != nullptr && na == 0 &&
      std::all_of(b->begin() + common, b->end(), [](uint32_t d) { return d == 0; })) {
    if (nb < 2) return std::nullopt;  // b == a + one zero digit: adjacent
    return Digits(b->begin(), b->begin() + common + nb / 2);
  }

  const size_t n = std::max(na, nb);
  Digits sum(n);
  uint64_t carry = 0;
  for (size_t i = n; i-- > 0;) {
    uint64_t s = a_digit(i) + b_digit(i) + carry;
    carry = s >= radix ? 1 : 0;
    sum[i] = static_cast<uint32_t>(s - carry * radix);
  }
  // The integer part of a + b: +infinity counts as 1.0, and a < 1.0, so it is 0 or 1.
  uint64_t rem = carry + (b == nullptr ? 1 : 0);
  Digits mid(n + 1);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t cur = rem * radix + sum[i];
    mid[i] = static_cast<uint32_t>(cur / 2);
    rem = cur % 2;
  }
  mid[n] = static_cast<uint32_t>(rem * radix / 2);

  // Shorter keys are kinder to stores and logs: drop the half digit when the n-digit value
  // already exceeds `a`, then trailing zeros (which do not change the value) while it does.
  const absl::Span<const uint32_t> a_tail(a.data() + common, na);
  auto exceeds_a = [&](size_t len) {
    return DigitsLess(a_tail, absl::Span<const uint32_t>(mid.data(), len));
  };
  size_t len = n + 1;
  if (exceeds_a(n)) len = n;
  while (len > 0 && mid[len - 1] == 0 && exceeds_a(len - 1)) --len;

  Digits out(a.begin(), a.begin() + common);
  out.insert(out.end(), mid.begin(), mid.begin() + len);
  // Guaranteed by the argument above; checked so a broken precondition cannot yield a
  // split point outside the range.
  if (!DigitsLess(a, out) || (b != nullptr && !DigitsLess(out, *b))) return std::nullopt;
  return out;
}

// The digit string of value a + stride * (a - p) (all read as fractions, as above), or
// nullopt when that is not above `a` or reaches 1.0. After a page that held every key in
// (p, a], it is where `stride` more pages of the same density would end.
std::optional<Digits> ExtrapolateDigits(const Digits& p, const Digits& a, uint32_t radix,
                                        uint64_t stride) {
  const size_t n = std::max(p.size(), a.size());
  auto digit = [](const Digits& d, size_t i) -> uint64_t { return i < d.size() ? d[i] : 0; };
  Digits diff(n);
  uint64_t borrow = 0;
  for (size_t i = n; i-- > 0;) {
    const uint64_t sub = digit(p, i) + borrow;
    borrow = digit(a, i) < sub ? 1 : 0;
    diff[i] = static_cast<uint32_t>(digit(a, i) + borrow * radix - sub);
  }
  if (borrow != 0 || std::all_of(diff.begin(), diff.end(), [](uint32_t d) { return d == 0; })) {
    return std::nullopt;  // p >= a as fractions: no density to go by
  }
  Digits est(n);
  uint64_t carry = 0;
  for (size_t i = n; i-- > 0;) {
    const uint64_t v = digit(a, i) + diff[i] * stride + carry;  // < 2^21 * 2^31 + 2^53
    est[i] = static_cast<uint32_t>(v % radix);
    carry = v / radix;
  }
  if (carry != 0) return std::nullopt;  // past the end of the key space
  size_t len = n;
  auto exceeds_a = [&](size_t l) {
    return DigitsLess(a, absl::Span<const uint32_t>(est.data(), l));
  };
  while (len > 0 && est[len - 1] == 0 && exceeds_a(len - 1)) --len;
  est.resize(len);
  return est;
}

// The split point for (a, b) after a page that held every key in (p, a]: the midpoint, or
// the extrapolation when that is smaller (then the bound is loose, as when `b` is
// unbounded, and the midpoint would lie far past the keys).
std::optional<Digits> SplitDigits(const Digits* p, const Digits& a, const Digits* b, uint32_t radix,
                                  uint64_t stride) {
  std::optional<Digits> mid = MidpointDigits(a, b, radix);
  if (p == nullptr || stride == 0) return mid;
  std::optional<Digits> est = ExtrapolateDigits(*p, a, radix, stride);
  if (est.has_value() && DigitsLess(a, *est) && (b == nullptr || DigitsLess(*est, *b)) &&
      (!mid.has_value() || DigitsLess(*est, *mid))) {
    return est;
  }
  return mid;
}

// Strict UTF-8 decoding (no overlong forms, surrogates or code points past U+10FFFF).
bool DecodeUtf8(absl::string_view s, std::vector<char32_t>* out) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    char32_t cp;
    size_t len;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      cp = c & 0x1F;
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      cp = c & 0x0F;
      len = 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      cp = c & 0x07;
      len = 4;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    out->push_back(cp);
    i += len;
  }
  return true;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValidUtf8(absl::string_view s) {
  std::vector<char32_t> ignored;
  return DecodeUtf8(s, &ignored);
}

// Code points as indices into `digits` (sorted, holding every one of them). UTF-8 byte
// order is code point order, so digit strings compare as the keys do.
Digits ToAlphabetDigits(const std::vector<char32_t>& cps, const std::vector<char32_t>& digits) {
  Digits d;
  d.reserve(cps.size());
  for (char32_t cp : cps) {
    d.push_back(
        static_cast<uint32_t>(std::lower_bound(digits.begin(), digits.end(), cp) - digits.begin()));
  }
  return d;
}

Digits BytesToDigits(absl::string_view s) {
  Digits d;
  d.reserve(s.size());
  for (char c : s) d.push_back(static_cast<unsigned char>(c));
  return d;
}

}  // namespace

namespace internal {

std::optional<std::string> MidpointKey(absl::string_view lower, absl::string_view upper) {
  const Digits a = BytesToDigits(lower);
  const Digits b = BytesToDigits(upper);
  auto mid = MidpointDigits(a, upper.empty() ? nullptr : &b, 256);
  if (!mid.has_value()) return std::nullopt;
  return std::string(mid->begin(), mid->end());
}

std::optional<std::string> Utf8MidpointKey(absl::string_view lower, absl::string_view upper,
                                           absl::Span<const char32_t> alphabet) {
  std::vector<char32_t> lo, hi;
  if (!DecodeUtf8(lower, &lo) || !DecodeUtf8(upper, &hi)) return std::nullopt;
  std::vector<char32_t> digits(alphabet.begin(), alphabet.end());
  digits.insert(digits.end(), lo.begin(), lo.end());
  digits.insert(digits.end(), hi.begin(), hi.end());
  std::sort(digits.begin(), digits.end());
  digits.erase(std::unique(digits.begin(), digits.end()), digits.end());
  if (digits.empty()) return std::nullopt;
  const Digits a = ToAlphabetDigits(lo, digits);
  const Digits b = ToAlphabetDigits(hi, digits);
  auto mid = MidpointDigits(a, upper.empty() ? nullptr : &b, static_cast<uint32_t>(digits.size()));
  if (!mid.has_value()) return std::nullopt;
  std::string out;
  for (uint32_t d : *mid) AppendUtf8(digits[d], &out);
  return out;
}

// Keys numbered with zero padding ("shard-000123.tar", "k/f00999") differ in one run of
// decimal digits. Read as a number, the run extrapolates exactly where `stride` more pages
// of the same density end: "k/f00000".."k/f00999" gives "k/f01998". Over the alphabet of
// every character seen in the keys, 'f' and 'k' are digits above '9', so the same estimate
// came out as "k/f00kkk", in the gap below "k/f01000" where no key is: the lower part of
// every split was empty and the workers relayed one range instead of sharing it (ten pages
// listed no faster than one after another). nullopt when the keys do not differ in such a
// run of the same length (at most 18 digits) or the number would outgrow it.
std::optional<std::string> ExtrapolateNumbered(absl::string_view from, absl::string_view lower,
                                               uint64_t stride) {
  if (stride == 0) return std::nullopt;
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  size_t c = 0;
  while (c < from.size() && c < lower.size() && from[c] == lower[c]) ++c;
  if (c == from.size() || c == lower.size() || !digit(from[c]) || !digit(lower[c])) {
    return std::nullopt;
  }
  while (c > 0 && digit(lower[c - 1])) --c;
  size_t e = c;
  while (e < lower.size() && digit(lower[e])) ++e;
  if (e - c > 18 || e > from.size()) return std::nullopt;
  for (size_t i = c; i < e; ++i) {
    if (!digit(from[i])) return std::nullopt;
  }
  if (e < from.size() && digit(from[e])) return std::nullopt;  // runs of different lengths
  uint64_t f = 0, l = 0, limit = 1;
  for (size_t i = c; i < e; ++i) {
    f = f * 10 + static_cast<uint64_t>(from[i] - '0');
    l = l * 10 + static_cast<uint64_t>(lower[i] - '0');
    limit *= 10;
  }
  if (l <= f) return std::nullopt;
  const uint64_t span = l - f;
  if (span > (limit - 1 - l) / stride) return std::nullopt;  // past the run's last number
  std::string digits = std::to_string(l + span * stride);
  return absl::StrCat(lower.substr(0, c), std::string(e - c - digits.size(), '0'), digits);
}

std::optional<std::string> SplitKey(absl::string_view listed_from, absl::string_view lower,
                                    absl::string_view upper, uint64_t stride,
                                    absl::Span<const char32_t> alphabet) {
  stride = std::min<uint64_t>(stride, uint64_t{1} << 31);
  if (auto numbered = ExtrapolateNumbered(listed_from, lower, stride);
      numbered.has_value() && lower < *numbered && (upper.empty() || *numbered < upper)) {
    // Unless the midpoint is nearer (a tight bound).
    auto mid = SplitKey(absl::string_view(), lower, upper, 0, alphabet);
    return mid.has_value() && *mid < *numbered ? mid : numbered;
  }
  if (!IsValidUtf8(lower)) {
    const Digits p = BytesToDigits(listed_from), a = BytesToDigits(lower), b = BytesToDigits(upper);
    auto mid = SplitDigits(&p, a, upper.empty() ? nullptr : &b, 256, stride);
    if (!mid.has_value()) return std::nullopt;
    return std::string(mid->begin(), mid->end());
  }
  // Below a bound "m\0" (the kept half of an earlier split) lies nothing above "m" but "m"
  // itself, so splitting below "m" is as good and keeps NUL out of the digits. Likewise
  // below a bound that is not UTF-8 (PrefixSuccessor("a\x7f") == "a\x80"), splitting below
  // its longest UTF-8 prefix is exact, if coarser.
  const bool bounded = !upper.empty();
  while (!upper.empty() && (upper.back() == '\0' || !IsValidUtf8(upper))) {
    upper.remove_suffix(1);
  }
  if (bounded && (upper.empty() || upper <= lower)) return std::nullopt;  // "": no bound
  std::vector<char32_t> lo, hi, from;
  DecodeUtf8(lower, &lo);
  DecodeUtf8(upper, &hi);
  const bool has_from = DecodeUtf8(listed_from, &from);
  std::vector<char32_t> digits(alphabet.begin(), alphabet.end());
  digits.insert(digits.end(), lo.begin(), lo.end());
  digits.insert(digits.end(), hi.begin(), hi.end());
  if (has_from) digits.insert(digits.end(), from.begin(), from.end());
  std::sort(digits.begin(), digits.end());
  digits.erase(std::unique(digits.begin(), digits.end()), digits.end());
  if (digits.empty()) return std::nullopt;
  const Digits p = ToAlphabetDigits(from, digits), a = ToAlphabetDigits(lo, digits),
               b = ToAlphabetDigits(hi, digits);
  auto mid = SplitDigits(has_from ? &p : nullptr, a, bounded ? &b : nullptr,
                         static_cast<uint32_t>(digits.size()), stride);
  if (!mid.has_value()) return std::nullopt;
  std::string out;
  for (uint32_t d : *mid) AppendUtf8(digits[d], &out);
  return out;
}

std::string PrefixSuccessor(absl::string_view prefix) {
  std::string s(prefix);
  while (!s.empty() && static_cast<unsigned char>(s.back()) == 0xFF) s.pop_back();
  if (!s.empty()) s.back() = static_cast<char>(static_cast<unsigned char>(s.back()) + 1);
  return s;
}

}  // namespace internal

namespace {

std::string Quote(absl::string_view key) { return absl::StrCat("\"", absl::CHexEscape(key), "\""); }

std::string DescribeRange(absl::string_view lower, absl::string_view upper) {
  return absl::StrCat("listing keys in (", Quote(lower), ", ", upper.empty() ? "end" : Quote(upper),
                      ")");
}

// A list call's failure, naming the key range it listed when that helps: not for a missing
// bucket or refused credentials, whose cause is the whole bucket's (the range is then an
// internal detail in front of the one thing the user must fix).
absl::Status RangeFailure(const absl::Status& failure, absl::string_view lower,
                          absl::string_view upper) {
  switch (failure.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return failure;
    default:
      return Annotate(failure, DescribeRange(lower, upper));
  }
}

absl::Status ValidateOptions(ObjectStore& store, const ListOptions& range,
                             const ParallelListOptions& options) {
  if (!range.delimiter.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("list ", store.Uri(range.prefix),
                     ": a delimiter is not supported by parallel listing (flat listings only)"));
  }
  if (options.workers < 1 || options.page_size < 1 || options.max_pending_pages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("list ", store.Uri(range.prefix), ": workers (", options.workers,
                     "), page_size (", options.page_size, ") and max_pending_pages (",
                     options.max_pending_pages, ") must be at least 1"));
  }
  return absl::OkStatus();
}

// One worker's remaining key range. Bounds are exclusive, as in ListOptions.
struct Task {
  std::string lower;  // start_after: the last key listed, or the range's start
  std::string upper;  // end_before; "" for none
  // Set only after a full page that held no objects (never seen from flat listings of
  // S3 or file://): the next call must resume by token since `lower` cannot advance.
  std::string continuation;
  // The last full page held its keys in [listed_from, lower]: the density that SplitKey
  // extrapolates from when the upper bound is loose.
  std::string listed_from;
  // How many pages' worth a split keeps when it extrapolates; doubles with each split
  // along a chain of ranges, so a range of any size is covered in logarithmically many.
  uint64_t stride = 1;
  // The range runs to the listing's end, whose distance is unknown: its pages fan out to
  // several idle workers (ContinueLocked). Bounded ranges split in two.
  bool tail = true;
};

// The shared state of one ParallelList call. Owned by a shared_ptr that every pending
// callback also holds, so a callback that finishes after Run() returns touches live memory.
class Lister : public std::enable_shared_from_this<Lister> {
 public:
  Lister(ObjectStore& store, std::string prefix, const ParallelListOptions& options)
      : store_(store), prefix_(std::move(prefix)), options_(options) {}

  absl::Status Run(Task first, ListPageFn on_page, ParallelListStats* stats) {
    const absl::Time start = absl::Now();
    std::vector<Task> tasks;
    tasks.push_back(std::move(first));
    {
      absl::MutexLock lock(&mu_);
      CountLaunchesLocked(1);
    }
    Launch(std::move(tasks));

    mu_.Lock();
    while (true) {
      AwaitInterruptibly(mu_, absl::Condition(
                                  +[](Lister* l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(l->mu_) {
                                    return !l->pages_.empty() || !l->status_.ok() ||
                                           l->QuiescentLocked();
                                  },
                                  this));
      // Quiescent with no page waiting means done: workers pause only while pages wait.
      if (!status_.ok() || pages_.empty()) break;
      std::vector<ObjectMeta> page = std::move(pages_.front());
      pages_.pop_front();
      std::vector<Task> resumed;
      while (!paused_.empty() && static_cast<int>(pages_.size()) < options_.max_pending_pages) {
        Task task = std::move(paused_.back());
        paused_.pop_back();
        for (Task& t : ContinueLocked(std::move(task))) resumed.push_back(std::move(t));
      }
      stats_.objects += static_cast<int64_t>(page.size());
      mu_.Unlock();
      Launch(std::move(resumed));
      absl::Status status = on_page(std::move(page));
      mu_.Lock();
      if (!status.ok() && status_.ok()) FailLocked(std::move(status));
    }
    // Calls in flight still reference the store, which the caller may destroy once we return.
    AwaitInterruptibly(mu_, absl::Condition(
                                +[](Lister* l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(l->mu_) {
                                  return l->QuiescentLocked();
                                },
                                this));
    absl::Status result = status_;
    stats_.wall = absl::Now() - start;
    if (stats != nullptr) *stats = stats_;
    mu_.Unlock();
    return result;
  }

 private:
  bool QuiescentLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_ == 0 && launching_ == 0;
  }

  void CountLaunchesLocked(int n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    in_flight_ += n;
    launching_ += n;
    stats_.list_calls += n;
    stats_.peak_in_flight = std::max(stats_.peak_in_flight, in_flight_);
  }

  // Split points are built from the code points of keys seen so far, as Dataflux does, so
  // they fall among real keys rather than in empty stretches of the code space.
  void AddToAlphabetLocked(absl::string_view key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t old_size = alphabet_.size();
    if (!DecodeUtf8(key, &alphabet_)) {
      alphabet_.resize(old_size);
      return;
    }
    std::sort(alphabet_.begin(), alphabet_.end());
    alphabet_.erase(std::unique(alphabet_.begin(), alphabet_.end()), alphabet_.end());
  }

  void FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    status_ = std::move(status);
    pages_.clear();
    paused_.clear();
  }

  // Issues one call per task. REQUIRES: counted by CountLaunchesLocked; mu_ not held (a
  // store may run the callback before ListAsync returns).
  void Launch(std::vector<Task> tasks) ABSL_LOCKS_EXCLUDED(mu_) {
    if (tasks.empty()) return;
    const int n = static_cast<int>(tasks.size());
    for (Task& task : tasks) {
      ListOptions options;
      options.prefix = prefix_;
      options.start_after = task.lower;
      options.end_before = task.upper;
      options.page_size = options_.page_size;
      std::string continuation = task.continuation;
      store_.ListAsync(std::move(options), std::move(continuation),
                       [self = shared_from_this(),
                        task = std::move(task)](absl::StatusOr<ListPage> page) mutable {
                         self->OnListed(std::move(task), std::move(page));
                       });
    }
    absl::MutexLock lock(&mu_);
    launching_ -= n;
  }

  // Runs on a store thread: must not block beyond the mutex.
  void OnListed(Task task, absl::StatusOr<ListPage> page) ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<Task> next;
    {
      absl::MutexLock lock(&mu_);
      --in_flight_;
      if (!status_.ok()) return;  // cancelled: the worker stops
      if (!page.ok()) {
        FailLocked(RangeFailure(page.status(), task.lower, task.upper));
        return;
      }
      const bool more = !page->continuation.empty();
      if (!page->objects.empty()) {
        std::string last = page->objects.back().key;
        if (last <= task.lower) {  // would list the same page forever
          FailLocked(absl::InternalError(
              absl::StrCat(DescribeRange(task.lower, task.upper), " on ", store_.Uri(prefix_),
                           ": the store returned key ", Quote(last), " out of order")));
          return;
        }
        // The page's keys lie in [first, last]: the density to extrapolate from. Not from
        // the range's start: the first page of a prefix begins at the prefix, and keys
        // usually start far past it ("k/" then "f00000"), so a span measured from there put
        // the first split past every key.
        task.listed_from = std::max({task.lower, prefix_, page->objects.front().key});
        task.lower = std::move(last);
        task.continuation.clear();
        pages_.push_back(std::move(page->objects));
      } else if (more) {
        task.continuation = std::move(page->continuation);
      }
      if (!more) return;  // the range is exhausted: this worker idles
      if (static_cast<int>(pages_.size()) >= options_.max_pending_pages) {
        paused_.push_back(std::move(task));
        return;
      }
      next = ContinueLocked(std::move(task));
    }
    Launch(std::move(next));
  }

  // The calls a worker makes after a full page: its next page, and when a worker idles and
  // the range can be split, the idle worker's first page.
  std::vector<Task> ContinueLocked(Task task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Task> tasks;
    // Busy workers: calls in flight, paused ones, and this one.
    const int idle = options_.workers - in_flight_ - static_cast<int>(paused_.size()) - 1;
    if (idle > 0 && task.continuation.empty()) {
      AddToAlphabetLocked(task.lower);
      // A range that runs to the listing's end gives up to internal::kSplitsPerPage idle workers a
      // range each, cut at p1 < p2 < ... < pk. Each point extrapolates from the page as the
      // first does, from the point before it, so the ranges after the kept one hold about 2,
      // 4, 8... times its pages, and the last runs on to the end: a listing of a few dozen
      // pages is spread over the workers after its first page, where one split per page
      // added one worker per round trip. A bounded range splits in two (its midpoint, or the
      // extrapolation when nearer).
      std::vector<std::string> points;
      const int most = task.tail ? std::min(idle, internal::kSplitsPerPage) : 1;
      while (static_cast<int>(points.size()) < most) {
        const std::string& cut = points.empty() ? task.lower : points.back();
        std::optional<std::string> mid =
            internal::SplitKey(task.listed_from, cut, task.upper, task.stride, alphabet_);
        if (!mid.has_value() || *mid <= cut || (!task.upper.empty() && *mid >= task.upper) ||
            *mid + '\0' == task.upper) {  // the last: (mid, upper) would be empty
          break;
        }
        points.push_back(*std::move(mid));
      }
      // Exactness: (lower, upper) = (lower, p1] + (p1, p2] + ... + (pk, upper), and (a, b] is
      // (a, b + '\0') since no string lies strictly between b and b + '\0'.
      if (!points.empty()) {
        task.stride *= 2;
        std::string upper = std::move(task.upper);
        for (size_t i = points.size(); i-- > 0;) {
          tasks.push_back(Task{.lower = points[i],
                               .upper = std::move(upper),
                               .stride = task.stride,
                               .tail = task.tail && i + 1 == points.size()});
          upper = points[i] + '\0';
          ++stats_.splits;
        }
        task.upper = std::move(upper);
        task.tail = false;
      }
    }
    tasks.push_back(std::move(task));
    CountLaunchesLocked(static_cast<int>(tasks.size()));
    return tasks;
  }

  ObjectStore& store_;
  const std::string prefix_;
  const ParallelListOptions options_;

  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // calls whose callback has not run
  int launching_ ABSL_GUARDED_BY(mu_) = 0;  // calls whose ListAsync() has not returned
  std::deque<std::vector<ObjectMeta>> pages_ ABSL_GUARDED_BY(mu_);  // for on_page
  std::vector<Task> paused_ ABSL_GUARDED_BY(mu_);                   // workers waiting for on_page
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<char32_t> alphabet_ ABSL_GUARDED_BY(mu_);  // code points of keys split at
  ParallelListStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status ParallelList(ObjectStore& store, const ListOptions& range,
                          const ParallelListOptions& options, ListPageFn on_page,
                          ParallelListStats* stats) {
  if (stats != nullptr) *stats = {};
  WHARF_RETURN_IF_ERROR(ValidateOptions(store, range, options));
  // Keys under the prefix end before its successor; a bound there keeps split points in
  // the key space the prefix selects instead of past it.
  std::string upper = range.end_before;
  const std::string successor = internal::PrefixSuccessor(range.prefix);
  if (!successor.empty() && (upper.empty() || successor < upper)) upper = successor;
  if (!upper.empty() && upper <= range.start_after) return absl::OkStatus();
  auto lister = std::make_shared<Lister>(store, range.prefix, options);
  return lister->Run(Task{.lower = range.start_after, .upper = std::move(upper)}, on_page, stats);
}

absl::StatusOr<std::vector<ObjectMeta>> ParallelListAll(ObjectStore& store,
                                                        const ListOptions& range,
                                                        const ParallelListOptions& options,
                                                        ParallelListStats* stats) {
  std::vector<std::vector<ObjectMeta>> pages;
  size_t total = 0;
  WHARF_RETURN_IF_ERROR(ParallelList(
      store, range, options,
      [&](std::vector<ObjectMeta> page) {
        total += page.size();
        pages.push_back(std::move(page));
        return absl::OkStatus();
      },
      stats));
  // Each page holds every key of an interval and the intervals are disjoint, so ordering
  // pages by first key orders the keys; the check guards against a store breaking that.
  std::sort(pages.begin(), pages.end(),
            [](const auto& a, const auto& b) { return a.front().key < b.front().key; });
  std::vector<ObjectMeta> all;
  all.reserve(total);
  for (auto& page : pages) {
    std::move(page.begin(), page.end(), std::back_inserter(all));
  }
  auto by_key = [](const ObjectMeta& a, const ObjectMeta& b) { return a.key < b.key; };
  if (!std::is_sorted(all.begin(), all.end(), by_key)) std::sort(all.begin(), all.end(), by_key);
  return all;
}

absl::Status SequentialList(ObjectStore& store, const ListOptions& range,
                            const ParallelListOptions& options, ListPageFn on_page,
                            ParallelListStats* stats) {
  if (stats != nullptr) *stats = {};
  WHARF_RETURN_IF_ERROR(ValidateOptions(store, range, options));
  const absl::Time start = absl::Now();
  ListOptions list_options = range;
  list_options.page_size = options.page_size;
  ParallelListStats local;
  absl::Status status;
  std::string continuation;
  while (true) {
    ++local.list_calls;
    local.peak_in_flight = 1;
    absl::StatusOr<ListPage> page = store.List(list_options, continuation);
    if (!page.ok()) {
      status = RangeFailure(page.status(), range.start_after, range.end_before);
      break;
    }
    if (!page->objects.empty()) {
      local.objects += static_cast<int64_t>(page->objects.size());
      status = on_page(std::move(page->objects));
      if (!status.ok()) break;
    }
    if (page->continuation.empty()) break;
    continuation = std::move(page->continuation);
  }
  local.wall = absl::Now() - start;
  if (stats != nullptr) *stats = local;
  return status;
}

}  // namespace wharf
