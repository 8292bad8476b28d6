#include "store/conformance/object_store_conformance.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/cancel.h"
#include "gmock/gmock.h"
#include "store/testing/random_bytes.h"

namespace wharf {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::string Pattern(size_t n, uint32_t seed = 1) { return store_testing::RandomBytes(n, seed); }

// Awkward but valid on every backend: none is a "directory" of another.
std::vector<std::string> AwkwardKeys() {
  return {"dir/a b",
          "dir/a+b",
          "dir/a%2Bb",
          "dir/a=b",
          "dir/a&b",
          "dir/a~b",
          "dir/a*b",
          "dir/é.txt",
          "dir/日本/語.bin",
          "dir/A",
          "dir/a.txt",
          "dir/a-b",
          "dir/a/b",
          "dir/a0",
          "dir/a!",
          "dir/a(1)",
          "dir/'q'",
          "dir/z",
          "dir/Z~",
          "dir/ä/x",
          "dir/deep/1/2/3/4/5/6/leaf",
          "dir/deep/1/2/x",
          "dir/a,b",
          "dir/a;b",
          "dir/a@b",
          "dir/ ",
          "dir/  "};  // whitespace-only names: S3 continuation tokens can be " "
}

std::vector<std::string> Sorted(std::vector<std::string> keys) {
  std::sort(keys.begin(), keys.end());  // std::string compares bytes as unsigned: S3 order
  return keys;
}

std::vector<std::string> KeysOf(const ListPage& page) {
  std::vector<std::string> out;
  for (const auto& o : page.objects) out.push_back(o.key);
  return out;
}

// Whether ListPaged checks the size of pages (ConformanceBackend::server_honours_page_size);
// set by SetUp for the test about to run.
bool check_page_size = true;
// ConformanceBackend::server_checks_preconditions of the test about to run.
bool check_preconditions = true;

// Pages through a listing with a small page size, checking each page respects it.
ListPage ListPaged(ObjectStore& store, ListOptions options) {
  ListPage all;
  std::string token;
  int pages = 0;
  do {
    auto page = store.List(options, token);
    EXPECT_TRUE(page.ok()) << page.status();
    if (!page.ok()) return all;
    if (check_page_size) {
      EXPECT_LE(static_cast<int>(page->objects.size() + page->common_prefixes.size()),
                options.page_size);
    }
    for (auto& o : page->objects) all.objects.push_back(o);
    for (auto& p : page->common_prefixes) all.common_prefixes.push_back(p);
    token = page->continuation;
    EXPECT_LT(++pages, 10000) << "listing does not terminate";
  } while (!token.empty() && pages < 10000);
  return all;
}

void PutAll(ObjectStore& store, const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    auto meta = store.Put(k, absl::Cord(absl::StrCat("content of ", k)));
    ASSERT_TRUE(meta.ok()) << meta.status();
  }
}

}  // namespace

void ObjectStoreConformance::SetUp() {
  check_page_size = GetParam().server_honours_page_size;
  check_preconditions = GetParam().server_checks_preconditions;
  auto store = GetParam().make_store();
  ASSERT_TRUE(store.ok()) << store.status();
  store_ = *std::move(store);
}

void ObjectStoreConformance::TearDown() {
  if (store_ && GetParam().destroy_store) GetParam().destroy_store(*store_);
}

TEST_P(ObjectStoreConformance, PutGetHeadRoundTrip) {
  const std::string data = Pattern(12345);
  auto put = store().Put("obj/one.bin", absl::Cord(data));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->key, "obj/one.bin");
  EXPECT_EQ(put->size, data.size());
  EXPECT_FALSE(put->etag.empty());

  auto read = store().Read("obj/one.bin");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, data);

  auto head = store().Head("obj/one.bin");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->size, data.size());
  EXPECT_EQ(head->etag, put->etag);
  EXPECT_GT(head->mtime, absl::Now() - absl::Hours(1));

  auto listed = store().ListAll({.prefix = "obj/"});
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->objects.size(), 1u);
  EXPECT_EQ(listed->objects[0].etag, put->etag);
  EXPECT_EQ(listed->objects[0].size, data.size());
}

TEST_P(ObjectStoreConformance, EmptyObject) {
  auto put = store().Put("empty", absl::Cord());
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->size, 0u);
  auto head = store().Head("empty");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->size, 0u);
  auto read = store().Read("empty");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "");
  EXPECT_EQ(store().Read("empty", ByteRange::Of(0, 1)).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST_P(ObjectStoreConformance, OverwriteReplacesContentAndEtag) {
  auto v1 = store().Put("k", absl::Cord("version one"));
  ASSERT_TRUE(v1.ok()) << v1.status();
  auto v2 = store().Put("k", absl::Cord("v2"));
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_NE(v1->etag, v2->etag);
  EXPECT_EQ(*store().Read("k"), "v2");
  EXPECT_EQ(store().Head("k")->size, 2u);
}

TEST_P(ObjectStoreConformance, MissingObjectIsNotFoundAndNamed) {
  auto read = store().Read("no/such/key");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.status().message(), HasSubstr(store().Uri("no/such/key")));
  auto head = store().Head("no/such/key");
  EXPECT_EQ(head.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(head.status().message(), HasSubstr("no/such/key"));
}

TEST_P(ObjectStoreConformance, DeleteIsIdempotent) {
  EXPECT_TRUE(store().Delete("never/existed").ok());
  ASSERT_TRUE(store().Put("d/x", absl::Cord("x")).ok());
  EXPECT_TRUE(store().Delete("d/x").ok());
  EXPECT_EQ(store().Head("d/x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store().Delete("d/x").ok());
}

TEST_P(ObjectStoreConformance, DeleteManyRemovesAllAndToleratesMissing) {
  std::vector<std::string> keys;
  for (int i = 0; i < 25; ++i) keys.push_back(absl::StrCat("many/", i));
  PutAll(store(), keys);
  keys.push_back("many/missing");
  ASSERT_TRUE(store().DeleteMany(keys).ok());
  auto listed = store().ListAll({.prefix = "many/"});
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->objects.empty());
}

TEST_P(ObjectStoreConformance, RangesAtTheEdges) {
  const std::string data = Pattern(1000, 7);
  ASSERT_TRUE(store().Put("r", absl::Cord(data)).ok());
  struct Case {
    ByteRange range;
    std::string expect;
  };
  const Case cases[] = {
      {ByteRange::Of(0, 1), data.substr(0, 1)},      // first byte
      {ByteRange::Of(999, 1), data.substr(999, 1)},  // last byte
      {ByteRange::Of(10, 90), data.substr(10, 90)},  // middle
      {ByteRange::Of(990, 100), data.substr(990)},   // length past the end: truncated
      {ByteRange::From(500), data.substr(500)},      // open-ended
      {ByteRange::Last(10), data.substr(990)},       // suffix
      {ByteRange::Last(5000), data},                 // suffix longer than the object
      {ByteRange::All(), data},
  };
  for (const auto& c : cases) {
    auto got = store().Read("r", c.range);
    ASSERT_TRUE(got.ok()) << c.range.ToHttp() << ": " << got.status();
    EXPECT_EQ(*got, c.expect) << c.range.ToHttp();
  }
  EXPECT_EQ(store().Read("r", ByteRange::Of(1000, 1)).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(store().Read("r", ByteRange::From(5000)).status().code(),
            absl::StatusCode::kOutOfRange);
  // A zero-length range is refused the same way by every store, before any request.
  for (const ByteRange& empty : {ByteRange::Of(0, 0), ByteRange::Of(5, 0)}) {
    auto got = store().Read("r", empty);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kOutOfRange) << empty.offset;
    EXPECT_THAT(got.status().message(), HasSubstr("empty range")) << empty.offset;
  }
}

TEST_P(ObjectStoreConformance, GetIntoCallerBuffer) {
  const std::string data = Pattern(4096, 3);
  auto put = store().Put("buf", absl::Cord(data));
  ASSERT_TRUE(put.ok()) << put.status();
  std::string buffer(100, '\0');
  GetRequest request{
      .key = "buf", .range = ByteRange::Of(4000, 100), .buffer = absl::MakeSpan(buffer)};
  auto got = store().Get(request);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->offset, 4000u);
  EXPECT_EQ(got->bytes, 96u);
  // A ranged answer describes the whole object, as a HEAD would (ObjectReader opens by key
  // on it): its size, and its ETag where the server says which version it served.
  EXPECT_EQ(got->meta.size, 4096u);
  if (check_preconditions) {
    EXPECT_EQ(got->meta.etag, put->etag);
  }
  EXPECT_EQ(buffer.substr(0, 96), data.substr(4000));

  std::string small(10, '\0');
  GetRequest too_small{.key = "buf", .buffer = absl::MakeSpan(small)};
  EXPECT_EQ(store().Get(too_small).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_P(ObjectStoreConformance, IfMatchGuardsAgainstChangedObjects) {
  auto put = store().Put("v", absl::Cord("hello"));
  ASSERT_TRUE(put.ok());
  std::string buffer(5, '\0');
  GetRequest ok_request{.key = "v", .buffer = absl::MakeSpan(buffer), .if_match = put->etag};
  EXPECT_TRUE(store().Get(ok_request).ok());
  GetRequest stale{
      .key = "v", .buffer = absl::MakeSpan(buffer), .if_match = "0123456789abcdef0123456789abcdef"};
  EXPECT_EQ(store().Get(stale).status().code(), absl::StatusCode::kFailedPrecondition);
}

// ---- Per-call read options ----

// A sink that records what it got; optionally runs `on_chunk` after each chunk.
class RecordingSink : public ReadSink {
 public:
  absl::Status Append(absl::string_view chunk) override {
    bytes += chunk.size();
    ++chunks;
    if (on_chunk) on_chunk();
    return absl::OkStatus();
  }
  std::atomic<uint64_t> bytes{0};
  std::atomic<int> chunks{0};
  std::function<void()> on_chunk;
};

// The last N bytes of an empty object are none: every store answers 0 bytes (an HTTP server
// refuses the range with 416; the store asks what the object is). A range from an offset is
// past the end of it, refused the same everywhere.
TEST_P(ObjectStoreConformance, SuffixRangeOfAnEmptyObjectIsEmpty) {
  auto put = store().Put("empty", absl::Cord());
  ASSERT_TRUE(put.ok()) << put.status();
  auto got = store().Read("empty", ByteRange::Last(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "");
  RecordingSink sink;
  auto result = store().Get({.key = "empty", .range = ByteRange::Last(5), .sink = &sink});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->bytes, 0u);
  EXPECT_EQ(sink.bytes.load(), 0u);
  EXPECT_EQ(result->meta.size, 0u);
  EXPECT_FALSE(result->not_modified);
  if (check_preconditions) {
    EXPECT_EQ(result->meta.etag, put->etag);
    // Pinned to another version: still refused.
    auto stale = store().Get(
        {.key = "empty", .range = ByteRange::Last(5), .sink = &sink, .if_match = "0123"});
    EXPECT_FALSE(stale.ok());
  }
  EXPECT_EQ(store().Read("empty", ByteRange::Of(0, 5)).status().code(),
            absl::StatusCode::kOutOfRange);
  // Of an object that is not empty, a suffix past its start is the whole object (above), and
  // of a missing one it is NotFound.
  EXPECT_EQ(store().Read("no-such-object", ByteRange::Last(5)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_P(ObjectStoreConformance, IfNoneMatchOfTheCurrentEtagIsNotModifiedWithoutBytes) {
  const std::string data = Pattern(3000, 11);
  auto put = store().Put("inm/obj", absl::Cord(data));
  ASSERT_TRUE(put.ok()) << put.status();
  std::string buffer(data.size(), 'x');
  GetRequest request{
      .key = "inm/obj", .buffer = absl::MakeSpan(buffer), .if_none_match = put->etag};
  auto got = store().Get(request);
  ASSERT_TRUE(got.ok()) << got.status();
  if (!check_preconditions) {  // the server cannot tell: the read is answered in full
    EXPECT_EQ(got->bytes, data.size());
    EXPECT_EQ(buffer, data);
    return;
  }
  EXPECT_TRUE(got->not_modified);
  EXPECT_EQ(got->bytes, 0u);
  EXPECT_EQ(got->meta.key, "inm/obj");
  EXPECT_EQ(got->meta.etag, put->etag);
  EXPECT_EQ(buffer, std::string(data.size(), 'x'));  // untouched
  // Into a sink, and with if_match of the same version: still nothing delivered.
  RecordingSink sink;
  GetRequest to_sink{
      .key = "inm/obj", .sink = &sink, .if_match = put->etag, .if_none_match = put->etag};
  auto streamed = store().Get(to_sink);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_TRUE(streamed->not_modified);
  EXPECT_EQ(sink.bytes.load(), 0u);
}

TEST_P(ObjectStoreConformance, IfNoneMatchOfAnotherEtagReadsTheObject) {
  auto v1 = store().Put("inm/changing", absl::Cord("version one"));
  ASSERT_TRUE(v1.ok()) << v1.status();
  const std::string data = Pattern(5000, 12);
  auto v2 = store().Put("inm/changing", absl::Cord(data));
  ASSERT_TRUE(v2.ok()) << v2.status();
  std::string buffer(data.size(), '\0');
  GetRequest request{
      .key = "inm/changing", .buffer = absl::MakeSpan(buffer), .if_none_match = v1->etag};
  auto got = store().Get(request);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->not_modified);
  EXPECT_EQ(got->bytes, data.size());
  if (check_preconditions) {
    EXPECT_EQ(got->meta.etag, v2->etag);
  }
  EXPECT_EQ(buffer, data);
  // A range with a stale if_none_match: the range, as without the option.
  std::string part(100, '\0');
  GetRequest ranged{.key = "inm/changing",
                    .range = ByteRange::Of(10, 100),
                    .buffer = absl::MakeSpan(part),
                    .if_none_match = v1->etag};
  auto got_range = store().Get(ranged);
  ASSERT_TRUE(got_range.ok()) << got_range.status();
  EXPECT_FALSE(got_range->not_modified);
  EXPECT_EQ(part, data.substr(10, 100));
}

TEST_P(ObjectStoreConformance, IfMatchMismatchFailsEvenWithIfNoneMatch) {
  auto put = store().Put("inm/guarded", absl::Cord("guarded"));
  ASSERT_TRUE(put.ok()) << put.status();
  std::string buffer(7, '\0');
  GetRequest request{.key = "inm/guarded",
                     .buffer = absl::MakeSpan(buffer),
                     .if_match = "0123456789abcdef0123456789abcdef",
                     .if_none_match = "fedcba9876543210fedcba9876543210"};
  auto got = store().Get(request);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr(store().Uri("inm/guarded")));
}

TEST_P(ObjectStoreConformance, AnyStalenessBoundReadsTheCurrentObject) {
  // A backend reads the source, so every bound is met with the current bytes.
  ASSERT_TRUE(store().Put("stale/k", absl::Cord("first")).ok());
  for (absl::Duration bound : {absl::ZeroDuration(), absl::Hours(1), absl::InfiniteDuration()}) {
    std::string buffer(6, '\0');
    GetRequest request{.key = "stale/k", .buffer = absl::MakeSpan(buffer)};
    request.max_staleness = bound;
    auto got = store().Get(request);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(buffer.substr(0, got->bytes), "first");
  }
  ASSERT_TRUE(store().Put("stale/k", absl::Cord("second")).ok());
  std::string buffer(6, '\0');
  GetRequest request{.key = "stale/k", .buffer = absl::MakeSpan(buffer)};
  request.max_staleness = absl::Hours(1);
  auto got = store().Get(request);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(buffer.substr(0, got->bytes), "second");
}

TEST_P(ObjectStoreConformance, PreCancelledGetDoesNothing) {
  ASSERT_TRUE(store().Put("cancel/small", absl::Cord("bytes")).ok());
  CancelToken cancel = NewCancelToken();
  cancel->Cancel();
  RecordingSink sink;
  GetRequest request{.key = "cancel/small", .sink = &sink};
  request.cancel = cancel;
  auto got = store().Get(request);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled) << got.status();
  EXPECT_THAT(got.status().message(),
              HasSubstr(absl::StrCat("get ", store().Uri("cancel/small"), ": cancelled")));
  EXPECT_EQ(sink.chunks.load(), 0);
  // Not even looked up: a missing key is Cancelled too, not NotFound.
  GetRequest missing{.key = "cancel/missing", .sink = &sink};
  missing.cancel = cancel;
  EXPECT_EQ(store().Get(missing).status().code(), absl::StatusCode::kCancelled);
  // Through the asynchronous form as well.
  absl::Notification done;
  absl::Status async_status;
  GetRequest async_request{.key = "cancel/small", .sink = &sink};
  async_request.cancel = cancel;
  store().GetAsync(std::move(async_request), [&](absl::StatusOr<GetResult> r) {
    async_status = r.status();
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_EQ(async_status.code(), absl::StatusCode::kCancelled) << async_status;
  EXPECT_EQ(sink.chunks.load(), 0);
}

constexpr size_t kLargeObject = size_t{64} << 20;

TEST_P(ObjectStoreConformance, CancelInsideTheSinkStopsALargeGetAndTheStoreStaysUsable) {
  const std::string data = Pattern(kLargeObject, 13);
  ASSERT_TRUE(store().Put("cancel/large", absl::Cord(data)).ok());
  CancelToken cancel = NewCancelToken();
  RecordingSink sink;
  sink.on_chunk = [&] { cancel->Cancel(); };  // after the first chunk
  GetRequest request{.key = "cancel/large", .sink = &sink};
  request.cancel = cancel;
  auto got = store().Get(request);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr(store().Uri("cancel/large")));
  // Stopped near the first chunk, not after most of the object.
  EXPECT_LT(sink.bytes.load(), kLargeObject / 4);
  // The store (its connections, its pool) serves the next request.
  auto after = store().Read("cancel/large", ByteRange::Of(kLargeObject - 10, 10));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, data.substr(kLargeObject - 10));
}

TEST_P(ObjectStoreConformance, CancelFromAnotherThreadStopsAGetInFlight) {
  const std::string data = Pattern(kLargeObject, 14);
  ASSERT_TRUE(store().Put("cancel/large", absl::Cord(data)).ok());
  CancelToken cancel = NewCancelToken();
  absl::Notification first_chunk, cancelled;
  RecordingSink sink;
  // The first chunk waits (back-pressure, as a slow consumer would) until the test thread
  // has cancelled: the transfer is certainly in flight when the token fires.
  sink.on_chunk = [&] {
    if (!first_chunk.HasBeenNotified()) first_chunk.Notify();
    cancelled.WaitForNotification();
  };
  absl::Notification done;
  absl::StatusOr<GetResult> result;
  GetRequest request{.key = "cancel/large", .sink = &sink};
  request.cancel = cancel;
  store().GetAsync(std::move(request), [&](absl::StatusOr<GetResult> r) {
    result = std::move(r);
    done.Notify();
  });
  first_chunk.WaitForNotification();
  cancel->Cancel();
  cancelled.Notify();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  EXPECT_LT(sink.bytes.load(), kLargeObject / 4);
  // Other requests, with their own tokens, are unaffected.
  std::string buffer(10, '\0');
  GetRequest next{
      .key = "cancel/large", .range = ByteRange::Of(0, 10), .buffer = absl::MakeSpan(buffer)};
  next.cancel = NewCancelToken();
  auto got = store().Get(next);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(buffer, data.substr(0, 10));
}

TEST_P(ObjectStoreConformance, ListOrderIsByteWiseWithAwkwardKeys) {
  const auto keys = AwkwardKeys();
  PutAll(store(), keys);
  ASSERT_TRUE(store().Put("dis", absl::Cord("outside the prefix")).ok());
  ASSERT_TRUE(store().Put("dir0", absl::Cord("outside the prefix")).ok());
  auto listed = store().ListAll({.prefix = "dir/"});
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_THAT(KeysOf(*listed), ElementsAreArray(Sorted(keys)));
  // Small pages give the same sequence.
  EXPECT_THAT(KeysOf(ListPaged(store(), {.prefix = "dir/", .page_size = 3})),
              ElementsAreArray(Sorted(keys)));
  // No prefix: everything, still in order.
  auto everything = keys;
  everything.push_back("dis");
  everything.push_back("dir0");
  EXPECT_THAT(KeysOf(ListPaged(store(), {.page_size = 4})), ElementsAreArray(Sorted(everything)));
}

TEST_P(ObjectStoreConformance, ListPrefixEndingMidComponent) {
  const auto keys = AwkwardKeys();
  PutAll(store(), keys);
  std::vector<std::string> expect;
  for (const auto& k : Sorted(keys)) {
    if (absl::StartsWith(k, "dir/a")) expect.push_back(k);
  }
  auto listed = store().ListAll({.prefix = "dir/a"});
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_THAT(KeysOf(*listed), ElementsAreArray(expect));
  auto none = store().ListAll({.prefix = "dir/nothing-here"});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->objects.empty());
}

TEST_P(ObjectStoreConformance, ListWithDelimiterRollsUpCommonPrefixes) {
  PutAll(store(), AwkwardKeys());
  for (int page_size : {1000, 1, 2, 3}) {
    auto listed = ListPaged(store(), {.prefix = "dir/", .delimiter = "/", .page_size = page_size});
    EXPECT_THAT(listed.common_prefixes,
                ElementsAreArray(Sorted({"dir/a/", "dir/deep/", "dir/日本/", "dir/ä/"})))
        << "page_size " << page_size;
    std::vector<std::string> flat;
    for (const auto& k : Sorted(AwkwardKeys())) {
      if (k.find('/', 4) == std::string::npos) flat.push_back(k);
    }
    EXPECT_THAT(KeysOf(listed), ElementsAreArray(flat)) << "page_size " << page_size;
  }
  // A non-'/' delimiter.
  auto dashes = store().ListAll({.prefix = "dir/a", .delimiter = "-"});
  ASSERT_TRUE(dashes.ok());
  EXPECT_THAT(dashes->common_prefixes, ElementsAreArray({"dir/a-"}));
}

TEST_P(ObjectStoreConformance, ListBoundsMatchFilteredSortedKeys) {
  const auto keys = Sorted(AwkwardKeys());
  PutAll(store(), keys);
  // Bounds: every key, plus strings between and around them.
  std::vector<std::string> bounds = {"", "dir/", "dir/a", "dir/a/", "dir/b", "dir/zz", "e"};
  for (const auto& k : keys) {
    bounds.push_back(k);
    bounds.push_back(k + "\x01");
  }
  std::mt19937 rng(42);
  for (int trial = 0; trial < 60; ++trial) {
    std::string lo = bounds[rng() % bounds.size()];
    std::string hi = bounds[rng() % bounds.size()];
    if (trial % 5 == 0) hi.clear();  // open upper bound
    std::vector<std::string> expect;
    for (const auto& k : keys) {
      if (k > lo && (hi.empty() || k < hi)) expect.push_back(k);
    }
    auto got = ListPaged(store(), {.start_after = lo, .end_before = hi, .page_size = 4});
    EXPECT_THAT(KeysOf(got), ElementsAreArray(expect))
        << "start_after='" << lo << "' end_before='" << hi << "'";
  }
}

TEST_P(ObjectStoreConformance, DeletedPrefixesDisappearFromDelimitedListings) {
  PutAll(store(), {"t/sub/x", "t/sub/deeper/y", "t/keep"});
  ASSERT_TRUE(store().DeleteMany({"t/sub/x", "t/sub/deeper/y"}).ok());
  auto listed = store().ListAll({.prefix = "t/", .delimiter = "/"});
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->common_prefixes.empty());
  EXPECT_THAT(KeysOf(*listed), ElementsAreArray({"t/keep"}));
}

TEST_P(ObjectStoreConformance, ServerSideCopy) {
  const std::string data = Pattern(70000, 9);
  auto put = store().Put("src/a", absl::Cord(data));
  ASSERT_TRUE(put.ok());
  auto copied = store().Copy("src/a", "dst/b c");
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(copied->size, data.size());
  EXPECT_EQ(*store().Read("dst/b c"), data);
  EXPECT_EQ(store().Copy("src/missing", "dst/x").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(ObjectStoreConformance, WriterIsInvisibleUntilCloseAndAbortLeavesNothing) {
  auto writer = store().NewWriter("big/object");
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::string expect;
  for (int i = 0; i < 3; ++i) {
    std::string part = Pattern(300000 + i, i);
    expect += part;
    ASSERT_TRUE((*writer)->Write(absl::Cord(part)).ok());
  }
  EXPECT_EQ(store().Head("big/object").status().code(), absl::StatusCode::kNotFound);
  auto meta = (*writer)->Close();
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->size, expect.size());
  EXPECT_EQ(*store().Read("big/object"), expect);

  auto aborted = store().NewWriter("big/aborted");
  ASSERT_TRUE(aborted.ok());
  ASSERT_TRUE((*aborted)->Write(absl::Cord("partial")).ok());
  (*aborted)->Abort();
  EXPECT_EQ(store().Head("big/aborted").status().code(), absl::StatusCode::kNotFound);
  {
    auto dropped = store().NewWriter("big/dropped");
    ASSERT_TRUE(dropped.ok());
  }
  auto listed = store().ListAll({.prefix = "big/"});
  ASSERT_TRUE(listed.ok());
  EXPECT_THAT(KeysOf(*listed), ElementsAreArray({"big/object"}));
}

TEST_P(ObjectStoreConformance, ManyConcurrentAsyncCalls) {
  constexpr int kN = 200;
  absl::BlockingCounter puts(kN);
  std::atomic<int> put_errors{0};
  for (int i = 0; i < kN; ++i) {
    store().PutAsync(absl::StrCat("async/", i), absl::Cord(Pattern(1000 + i, i)),
                     [&](absl::StatusOr<ObjectMeta> r) {
                       if (!r.ok()) put_errors++;
                       puts.DecrementCount();
                     });
  }
  puts.Wait();
  ASSERT_EQ(put_errors.load(), 0);
  std::vector<std::string> buffers(kN, std::string(2000, '\0'));
  absl::BlockingCounter gets(kN);
  std::atomic<int> mismatches{0};
  for (int i = 0; i < kN; ++i) {
    GetRequest request{.key = absl::StrCat("async/", i), .buffer = absl::MakeSpan(buffers[i])};
    store().GetAsync(std::move(request), [&, i](absl::StatusOr<GetResult> r) {
      if (!r.ok() || buffers[i].substr(0, r->bytes) != Pattern(1000 + i, i)) mismatches++;
      gets.DecrementCount();
    });
  }
  gets.Wait();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_P(ObjectStoreConformance, NestedKeysFollowDeclaredCapability) {
  ASSERT_TRUE(store().Put("n", absl::Cord("file")).ok());
  auto nested = store().Put("n/x", absl::Cord("nested"));
  if (store().capabilities().nested_keys_conflict) {
    EXPECT_EQ(nested.status().code(), absl::StatusCode::kFailedPrecondition) << nested.status();
    EXPECT_EQ(*store().Read("n"), "file");
  } else {
    ASSERT_TRUE(nested.ok()) << nested.status();
    EXPECT_EQ(*store().Read("n"), "file");
    EXPECT_EQ(*store().Read("n/x"), "nested");
  }
}

TEST_P(ObjectStoreConformance, TrailingSlashKeysFollowDeclaredCapability) {
  auto marker = store().Put("folder/", absl::Cord());
  if (store().capabilities().trailing_slash_keys) {
    EXPECT_TRUE(marker.ok()) << marker.status();
  } else {
    EXPECT_EQ(marker.status().code(), absl::StatusCode::kInvalidArgument) << marker.status();
  }
}

TEST_P(ObjectStoreConformance, ComposeFollowsDeclaredCapability) {
  PutAll(store(), {"c/1", "c/2"});
  auto composed = store().Compose({"c/1", "c/2"}, "c/all");
  if (store().capabilities().compose) {
    ASSERT_TRUE(composed.ok()) << composed.status();
    EXPECT_EQ(*store().Read("c/all"), "content of c/1content of c/2");
  } else {
    EXPECT_EQ(composed.status().code(), absl::StatusCode::kUnimplemented);
  }
}

TEST_P(ObjectStoreConformance, CreateOnlyPutsNeverReplaceAnObject) {
  PutOptions create;
  create.if_absent = true;
  if (!store().capabilities().put_options) {
    EXPECT_EQ(store().Put("x/a", absl::Cord("one"), create).status().code(),
              absl::StatusCode::kUnimplemented);
    EXPECT_EQ(store().Head("x/a").status().code(), absl::StatusCode::kNotFound);
    return;
  }
  auto first = store().Put("x/a", absl::Cord("one"), create);
  ASSERT_TRUE(first.ok()) << first.status();
  if (!GetParam().server_checks_preconditions) return;  // covered by canned responses
  auto second = store().Put("x/a", absl::Cord("two"), create);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
  EXPECT_THAT(std::string(second.status().message()), testing::HasSubstr("x/a"));
  EXPECT_EQ(*store().Read("x/a"), "one");
  // Through a writer: refused at Close, the object unchanged; a new key is created.
  auto writer = store().NewWriter("x/a", create);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Write(absl::Cord("three")).ok());
  EXPECT_EQ((*writer)->Close().status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(*store().Read("x/a"), "one");
  auto fresh = store().NewWriter("x/b", create);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ASSERT_TRUE((*fresh)->Write(absl::Cord("four")).ok());
  ASSERT_TRUE((*fresh)->Close().ok());
  EXPECT_EQ(*store().Read("x/b"), "four");
  // Writers racing for one new key: exactly one creates it, and its bytes are what it holds.
  constexpr int kRacers = 8;
  std::vector<absl::Status> results(kRacers);
  std::vector<std::thread> racers;
  for (int i = 0; i < kRacers; ++i) {
    racers.emplace_back([&, i] {
      results[i] = store().Put("x/race", absl::Cord(absl::StrCat("racer ", i)), create).status();
    });
  }
  for (std::thread& t : racers) t.join();
  int won = -1;
  for (int i = 0; i < kRacers; ++i) {
    if (results[i].ok()) {
      EXPECT_EQ(won, -1) << "two create-only puts of one key succeeded";
      won = i;
    } else {
      EXPECT_EQ(results[i].code(), absl::StatusCode::kAlreadyExists) << results[i];
    }
  }
  ASSERT_NE(won, -1);
  EXPECT_EQ(*store().Read("x/race"), absl::StrCat("racer ", won));
}

TEST_P(ObjectStoreConformance, PutOptionsFollowDeclaredCapability) {
  PutOptions typed;
  typed.content_type = "text/plain";
  // Options left at their defaults are the same as none, for every store.
  auto plain = store().Put("o/plain", absl::Cord("plain"), PutOptions{});
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto put = store().Put("o/typed", absl::Cord("typed"), typed);
  auto writer = store().NewWriter("o/written", typed);
  if (!store().capabilities().put_options) {
    EXPECT_EQ(put.status().code(), absl::StatusCode::kUnimplemented) << put.status();
    EXPECT_EQ(writer.status().code(), absl::StatusCode::kUnimplemented) << writer.status();
    return;
  }
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(*store().Read("o/typed"), "typed");
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Write(absl::Cord("written")).ok());
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_EQ(*store().Read("o/written"), "written");
  // Options no store accepts are refused before anything is written.
  PutOptions bad_sse;
  bad_sse.sse = "aes256";
  PutOptions kms_key_without_kms;
  kms_key_without_kms.sse = "AES256";
  kms_key_without_kms.sse_kms_key_id = "key";
  for (const PutOptions& bad : {bad_sse, kms_key_without_kms}) {
    auto refused = store().Put("o/bad", absl::Cord("x"), bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()), testing::HasSubstr("o/bad"));
    EXPECT_EQ(store().NewWriter("o/bad", bad).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(store().Head("o/bad").status().code(), absl::StatusCode::kNotFound);
  }
}

}  // namespace wharf
