#include "io/fetch_scheduler.h"

#include <atomic>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/timer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/forwarding_store.h"
#include "store/testing/delayed_get_store.h"
#include "store/testing/random_bytes.h"
#include "store/testing/temp_store.h"

namespace wharf {
namespace {

using store_testing::RandomBytes;

// Wraps a store: delays every GET by `delay` and records concurrency, GETs and HEADs.
class Recorder : public store_testing::DelayedGetStore {
 public:
  using DelayedGetStore::DelayedGetStore;
  void HeadAsync(std::string k, Callback<ObjectMeta> d) override {
    heads_++;
    DelayedGetStore::HeadAsync(std::move(k), std::move(d));
  }

  struct Get {
    std::string key;
    uint64_t offset, length;
  };
  std::vector<Get> gets() {
    absl::MutexLock lock(&mu_);
    return gets_;
  }
  int peak() { return peak_in_flight(); }
  std::atomic<int> heads_{0};

 private:
  void OnGet(const GetRequest& r) override {
    absl::MutexLock lock(&mu_);
    gets_.push_back({r.key, r.range.offset, r.range.length.value_or(0)});
  }
  absl::Mutex mu_;
  std::vector<Get> gets_ ABSL_GUARDED_BY(mu_);
};

class FetchSchedulerTest : public testing::Test {
 protected:
  // Puts n objects; returns their listing.
  std::vector<ObjectMeta> PutObjects(int n, size_t size) {
    for (int i = 0; i < n; ++i) {
      EXPECT_TRUE(
          local_->Put(absl::StrCat("o/", 100000 + i), absl::Cord(RandomBytes(size, i))).ok());
    }
    return local_->ListAll({.prefix = "o/"})->objects;
  }
  // The listed objects as items with their sizes (no HEADs).
  static std::vector<FetchItem> SizedItems(const std::vector<ObjectMeta>& listed) {
    std::vector<FetchItem> items;
    for (const auto& o : listed) items.push_back({.key = o.key, .size = o.size});
    return items;
  }

  store_testing::TempStore temp_;
  const std::shared_ptr<ObjectStore> local_ = temp_.store();
};

TEST_F(FetchSchedulerTest, FetchesEverythingWithManyInFlight) {
  auto listed = PutObjects(300, 5000);
  auto slow = std::make_shared<Recorder>(local_, absl::Milliseconds(20));
  FetchScheduler scheduler(slow, {.max_in_flight = 64});
  std::vector<FetchItem> items;
  for (const auto& o : listed) items.push_back({.key = o.key, .size = o.size, .etag = o.etag});
  auto batch = scheduler.Fetch(items);
  std::set<size_t> seen;
  while (auto r = batch->Next()) {
    ASSERT_TRUE(r->data.ok()) << r->data.status();
    EXPECT_EQ(r->data->view(), RandomBytes(5000, static_cast<uint32_t>(r->index)));
    EXPECT_TRUE(seen.insert(r->index).second);
  }
  EXPECT_EQ(seen.size(), 300u);
  EXPECT_GE(slow->peak(), 32);        // concurrency really happened
  EXPECT_LE(slow->peak(), 64);        // and stayed under the limit
  EXPECT_EQ(slow->heads_.load(), 0);  // sizes from the listing: no HEADs
}

TEST_F(FetchSchedulerTest, OrderedDeliveryFollowsSubmissionOrder) {
  auto listed = PutObjects(50, 100);
  auto slow = std::make_shared<Recorder>(local_, absl::Milliseconds(1));
  FetchScheduler scheduler(slow, {.max_in_flight = 16, .ordered = true});
  std::vector<FetchItem> items;
  for (auto it = listed.rbegin(); it != listed.rend(); ++it) items.push_back({.key = it->key});
  auto batch = scheduler.Fetch(items);
  size_t expect = 0;
  while (auto r = batch->Next()) {
    EXPECT_EQ(r->index, expect++);
    EXPECT_EQ(r->key, items[r->index].key);
    ASSERT_TRUE(r->data.ok());
  }
  EXPECT_EQ(expect, 50u);
  // No sizes given: each object's first GET tells its size (no HEAD), and these end in it.
  EXPECT_EQ(slow->heads_.load(), 0);
  EXPECT_EQ(slow->gets().size(), 50u);
}

TEST_F(FetchSchedulerTest, ObjectsOfUnknownSizeCostOneGetUnlessLongerThanTheFirst) {
  const std::string small = RandomBytes(1000, 1);
  const std::string large = RandomBytes(600 << 10, 2);  // longer than the first GET reads
  auto put_small = local_->Put("u/small", absl::Cord(small));
  ASSERT_TRUE(put_small.ok());
  ASSERT_TRUE(local_->Put("u/large", absl::Cord(large)).ok());
  ASSERT_TRUE(local_->Put("u/empty", absl::Cord()).ok());
  auto slow = std::make_shared<Recorder>(local_, absl::Milliseconds(1));
  FetchScheduler scheduler(slow, {.max_in_flight = 8, .ordered = true});
  std::vector<FetchItem> items = {
      {.key = "u/small"},
      {.key = "u/large"},
      {.key = "u/empty"},
      {.key = "u/large", .range = ByteRange::From(500 << 10)},
      {.key = "u/small", .range = ByteRange::From(999)},
      {.key = "u/small", .range = ByteRange::From(1000)},  // at the end
      {.key = "u/small", .range = ByteRange::From(1001)},  // past it
      {.key = "u/missing"},
      {.key = "u/small", .etag = put_small->etag},
      {.key = "u/small", .etag = "0123456789abcdef0123456789abcdef"},  // another version
  };
  auto batch = scheduler.Fetch(items);
  std::vector<absl::StatusOr<std::string>> got;
  while (auto r = batch->Next()) {
    if (r->data.ok()) {
      got.push_back(std::string(r->data->view()));
    } else {
      got.push_back(r->data.status());
    }
  }
  ASSERT_EQ(got.size(), items.size());
  EXPECT_EQ(*got[0], small);
  EXPECT_EQ(*got[1], large);
  EXPECT_EQ(*got[2], "");
  EXPECT_EQ(*got[3], large.substr(500 << 10));
  EXPECT_EQ(*got[4], small.substr(999));
  EXPECT_EQ(got[5].status().code(), absl::StatusCode::kOutOfRange);  // as ByteRange::Resolve
  EXPECT_EQ(got[6].status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(got[7].status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(got[7].status().message(), local_->Uri("u/missing")))
      << got[7].status();
  EXPECT_EQ(*got[8], small);
  EXPECT_EQ(got[9].status().code(), absl::StatusCode::kFailedPrecondition);
  // HEADs only where the first GET could not describe the object: the empty one, and the
  // ranges that start at or past the small one's end.
  EXPECT_EQ(slow->heads_.load(), 3);
  // The large object's whole read took a second GET after the first; its last 100 KiB ended
  // inside the first.
  // The second GET of the whole read fetches only what the first did not: the first's bytes
  // are kept, never read twice.
  int large_gets = 0;
  uint64_t large_bytes = 0;
  for (const auto& g : slow->gets()) {
    if (g.key != "u/large") continue;
    ++large_gets;
    large_bytes += std::min<uint64_t>(g.length, large.size() - g.offset);
  }
  EXPECT_EQ(large_gets, 3);
  EXPECT_EQ(large_bytes, large.size() + (100 << 10));  // the whole object and its tail
  EXPECT_EQ(batch->stats().bytes, large.size() + (100 << 10) + small.size() * 2 + 1);
}

TEST_F(FetchSchedulerTest, AProbesBytesAreReadAgainWhenTheBudgetLacksThem) {
  // A budget that holds the object but not the object and the first GET's bytes at once:
  // the second GET reads the whole object (nothing waits for memory that never frees).
  const std::string large = RandomBytes(600 << 10, 3);
  ASSERT_TRUE(local_->Put("u/large", absl::Cord(large)).ok());
  auto slow = std::make_shared<Recorder>(local_, absl::Milliseconds(1));
  FetchScheduler scheduler(slow, {.max_in_flight = 8, .memory_budget = 700 << 10});
  auto batch = scheduler.Fetch({{.key = "u/large"}});
  auto r = batch->Next();
  ASSERT_TRUE(r.has_value());
  ASSERT_TRUE(r->data.ok()) << r->data.status();
  EXPECT_EQ(r->data->view(), large);
  EXPECT_FALSE(batch->Next().has_value());
}

TEST_F(FetchSchedulerTest, MemoryBudgetBoundsBytesHeld) {
  auto listed = PutObjects(40, 100000);
  auto slow = std::make_shared<Recorder>(local_, absl::Milliseconds(5));
  FetchScheduler scheduler(slow, {.max_in_flight = 64, .memory_budget = 350000});
  auto batch = scheduler.Fetch(SizedItems(listed));
  int n = 0;
  while (auto r = batch->Next()) {
    ASSERT_TRUE(r->data.ok()) << r->data.status();
    ++n;
  }  // each result is released before the next Next()
  EXPECT_EQ(n, 40);
  EXPECT_LE(batch->stats().peak_bytes_held, 350000u);
  EXPECT_LE(slow->peak(), 3);  // 3 x 100 KB fit the budget, 4 do not
}

// A consumer slower than the store (here a local one) does not make results pile up to the
// whole budget: once 64 MiB of them wait in completion order, no new object starts until the
// consumer takes some. Every result still arrives, intact.
TEST_F(FetchSchedulerTest, ResultsWaitingForASlowConsumerStayBounded) {
  constexpr size_t kSize = 1 << 20;
  auto listed = PutObjects(160, kSize);  // 160 MiB, far below the runtime's budget
  FetchScheduler scheduler(local_, {.max_in_flight = 16});
  auto batch = scheduler.Fetch(SizedItems(listed));
  int n = 0;
  while (auto r = batch->Next()) {
    ASSERT_TRUE(r->data.ok()) << r->data.status();
    EXPECT_EQ(r->data->view(), RandomBytes(kSize, static_cast<uint32_t>(r->index)));
    if (n++ < 40) absl::SleepFor(absl::Milliseconds(3));  // slower than the store
  }
  EXPECT_EQ(n, 160);
  // Below 64 MiB waiting when the last object started, then the 16 in flight completed; and
  // the one the consumer holds.
  EXPECT_LE(batch->stats().peak_bytes_held, (64 + 16 + 2) * kSize);
}

TEST_F(FetchSchedulerTest, HoldingEveryResultReportsExhaustedBudgetInsteadOfHanging) {
  auto listed = PutObjects(5, 1000);
  FetchScheduler scheduler(local_, {.max_in_flight = 4, .memory_budget = 2500});
  std::vector<FetchItem> items;
  for (const auto& o : listed) items.push_back({.key = o.key, .size = o.size});
  auto batch = scheduler.Fetch(items);
  std::vector<FetchResult> held;
  int exhausted = 0;
  while (auto r = batch->Next()) {
    if (!r->data.ok()) {
      EXPECT_EQ(r->data.status().code(), absl::StatusCode::kResourceExhausted);
      ++exhausted;
    }
    held.push_back(std::move(*r));
  }
  EXPECT_EQ(held.size(), 5u);
  EXPECT_EQ(exhausted, 3);
}

TEST_F(FetchSchedulerTest, LargeObjectsAreSplitIntoParallelParts) {
  const std::string big = RandomBytes(1 << 20, 77);
  ASSERT_TRUE(local_->Put("big", absl::Cord(big)).ok());
  auto meta = *local_->Head("big");
  auto slow = std::make_shared<Recorder>(local_, absl::Milliseconds(10));
  FetchScheduler scheduler(slow,
                           {.max_in_flight = 8, .part_size = 100000, .split_threshold = 200000});
  auto batch = scheduler.Fetch({{.key = "big", .size = meta.size, .etag = meta.etag}});
  auto r = batch->Next();
  ASSERT_TRUE(r.has_value());
  ASSERT_TRUE(r->data.ok()) << r->data.status();
  EXPECT_EQ(r->data->view(), big);
  EXPECT_EQ(r->requests, 11);
  EXPECT_EQ(slow->gets().size(), 11u);
  EXPECT_GE(slow->peak(), 8);
  EXPECT_FALSE(batch->Next().has_value());
}

TEST_F(FetchSchedulerTest, PartsOfOneObjectAreCappedWhileOthersProceed) {
  const std::string big = RandomBytes(1 << 20, 78);
  ASSERT_TRUE(local_->Put("big", absl::Cord(big)).ok());
  auto small = PutObjects(10, 100);
  auto slow = std::make_shared<Recorder>(local_, absl::Milliseconds(10));
  FetchScheduler scheduler(slow, {.max_in_flight = 64,
                                  .part_size = 100000,
                                  .split_threshold = 200000,
                                  .max_parts_per_object = 3});
  std::vector<FetchItem> items = {{.key = "big", .size = big.size()}};
  for (const auto& o : small) items.push_back({.key = o.key, .size = o.size});
  auto batch = scheduler.Fetch(items);
  int n = 0;
  while (auto r = batch->Next()) {
    ASSERT_TRUE(r->data.ok()) << r->data.status();
    if (r->key == "big") {
      EXPECT_EQ(r->data->view(), big);
    }
    ++n;
  }
  EXPECT_EQ(n, 11);
  EXPECT_LE(slow->peak(), 3 + 10);  // at most 3 parts of "big" beside the 10 small ones
  EXPECT_GE(slow->peak(), 4);       // the small ones did not wait for "big"
}

TEST_F(FetchSchedulerTest, NearbyRangesAreCoalescedIntoOneRequest) {
  const std::string data = RandomBytes(100000, 5);
  ASSERT_TRUE(local_->Put("shard.tar", absl::Cord(data)).ok());
  auto slow = std::make_shared<Recorder>(local_, absl::Milliseconds(1));
  FetchScheduler scheduler(slow, {.coalesce_gap = 1000});
  std::vector<FetchItem> items = {
      {.key = "shard.tar", .range = ByteRange::Of(0, 100)},
      {.key = "shard.tar", .range = ByteRange::Of(500, 100)},   // gap 400: joins
      {.key = "shard.tar", .range = ByteRange::Of(1000, 50)},   // gap 400: joins
      {.key = "shard.tar", .range = ByteRange::Of(50000, 10)},  // far: its own request
  };
  auto batch = scheduler.Fetch(items);
  int n = 0;
  while (auto r = batch->Next()) {
    ASSERT_TRUE(r->data.ok()) << r->data.status();
    const auto& range = items[r->index].range;
    EXPECT_EQ(r->data->view(), data.substr(range.offset, *range.length));
    ++n;
  }
  EXPECT_EQ(n, 4);
  EXPECT_EQ(slow->gets().size(), 2u);
}

// Released large buffers are reused for the next large objects (no new zero-filled mapping),
// and a reused buffer never shows bytes of the object it held before.
TEST_F(FetchSchedulerTest, LargeBlocksAreReusedWithinTheBudgetAndShowOnlyTheirObject) {
  const size_t kMiB = size_t{1} << 20;
  const std::vector<std::pair<std::string, size_t>> objects = {
      {"big/a", 6 * kMiB}, {"big/b", 5 * kMiB + 123}, {"big/c", 6 * kMiB}, {"big/d", 6 * kMiB}};
  std::vector<FetchItem> items;
  for (size_t i = 0; i < objects.size(); ++i) {
    const auto& [key, size] = objects[i];
    ASSERT_TRUE(local_->Put(key, absl::Cord(RandomBytes(size, static_cast<uint32_t>(i)))).ok());
    items.push_back({.key = key, .size = size});
  }
  // The budget holds one object at a time: each starts once the previous one is dropped.
  // A runtime of its own: the pool belongs to the runtime's budget.
  auto runtime = std::make_shared<Runtime>(RuntimeOptions{.memory_budget = 8 * kMiB});
  FetchScheduler scheduler(
      local_, {.runtime = runtime, .max_in_flight = 8, .memory_budget = 8 * kMiB, .ordered = true});
  auto batch = scheduler.Fetch(items);
  size_t n = 0;
  while (auto r = batch->Next()) {
    ASSERT_TRUE(r->data.ok()) << r->data.status();
    EXPECT_EQ(r->data->size(), objects[r->index].second);
    EXPECT_TRUE(r->data->view() ==
                RandomBytes(objects[r->index].second, static_cast<uint32_t>(r->index)))
        << objects[r->index].first;
    ++n;
  }
  EXPECT_EQ(n, objects.size());
  EXPECT_EQ(scheduler.pool_stats().reused, objects.size() - 1);
  EXPECT_LE(batch->stats().peak_bytes_held, 8 * kMiB);
  EXPECT_EQ(scheduler.pool_stats().pooled_bytes, 6 * kMiB);  // d's block, kept for reuse

  // Small objects held together need the room: the pooled block goes, so held + pooled stays
  // within the budget.
  auto listed = PutObjects(3, kMiB);
  std::vector<FetchItem> small;
  for (const auto& o : listed) small.push_back({.key = o.key, .size = o.size});
  auto second = scheduler.Fetch(small);
  std::vector<FetchResult> held;
  while (auto r = second->Next()) {
    ASSERT_TRUE(r->data.ok()) << r->data.status();
    held.push_back(*std::move(r));
  }
  EXPECT_EQ(held.size(), 3u);
  EXPECT_EQ(scheduler.pool_stats().pooled_bytes, 0u);
}

// A store that delivers one byte less than asked: the scheduler must not hand out the
// unfilled byte as data.
class ShortReads : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  void GetAsync(GetRequest r, Callback<GetResult> d) override {
    ForwardingStore::GetAsync(std::move(r),
                              [d = std::move(d)](absl::StatusOr<GetResult> res) mutable {
                                if (res.ok() && res->bytes > 0) --res->bytes;
                                std::move(d)(std::move(res));
                              });
  }
};

TEST_F(FetchSchedulerTest, ShortReadsAreDataLossNamingTheObject) {
  auto listed = PutObjects(3, 5000);
  FetchScheduler scheduler(std::make_shared<ShortReads>(local_), {.max_in_flight = 4});
  std::vector<FetchItem> items;
  for (const auto& o : listed) items.push_back({.key = o.key, .size = o.size});
  auto batch = scheduler.Fetch(items);
  int n = 0;
  while (auto r = batch->Next()) {
    ASSERT_FALSE(r->data.ok());
    EXPECT_EQ(r->data.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(r->data.status().message()),
                testing::HasSubstr("received 4999 of the 5000"));
    EXPECT_THAT(std::string(r->data.status().message()), testing::HasSubstr(items[r->index].key));
    ++n;
  }
  EXPECT_EQ(n, 3);
}

// Whole objects are read without a Range header (cheaper for servers); parts of a split
// object and ranges asked for keep theirs.
TEST_F(FetchSchedulerTest, WholeObjectsAreReadWithoutARange) {
  auto listed = PutObjects(3, 5000);
  ASSERT_TRUE(local_->Put("part/x", absl::Cord(RandomBytes(5000, 3))).ok());
  ASSERT_TRUE(local_->Put("big/x", absl::Cord(RandomBytes(40 << 20, 7))).ok());
  auto slow = std::make_shared<Recorder>(local_, absl::Milliseconds(1));
  FetchScheduler scheduler(slow, {.max_in_flight = 8});
  std::vector<FetchItem> items;
  for (const auto& o : listed) items.push_back({.key = o.key, .size = o.size});
  items.push_back({.key = "part/x", .range = ByteRange::Of(100, 50), .size = 5000});
  items.push_back({.key = "big/x", .size = uint64_t{40} << 20});
  auto batch = scheduler.Fetch(items);
  while (auto r = batch->Next()) ASSERT_TRUE(r->data.ok()) << r->data.status();
  int whole = 0, parts = 0, ranges = 0;
  for (const auto& g : slow->gets()) {
    if (g.key == "big/x") {
      EXPECT_GT(g.length, 0u);  // a part: ranged
      ++parts;
    } else if (g.key == "part/x") {
      EXPECT_EQ(g.offset, 100u);
      EXPECT_EQ(g.length, 50u);
      ++ranges;
    } else {
      EXPECT_EQ(g.length, 0u) << g.key;  // no Range header
      ++whole;
    }
  }
  EXPECT_EQ(whole, 3);
  EXPECT_EQ(parts, 5);  // 40 MiB in 8 MiB parts
  EXPECT_EQ(ranges, 1);
}

TEST_F(FetchSchedulerTest, ErrorsNameTheObjectAndOthersStillArrive) {
  auto listed = PutObjects(3, 10);
  FetchScheduler scheduler(local_);
  std::vector<FetchItem> items = {{.key = listed[0].key},
                                  {.key = "o/missing"},
                                  {.key = listed[1].key, .range = ByteRange::From(999)}};
  auto batch = scheduler.Fetch(items);
  int ok = 0, notfound = 0, range = 0;
  while (auto r = batch->Next()) {
    if (r->data.ok()) {
      ++ok;
    } else if (r->data.status().code() == absl::StatusCode::kNotFound) {
      EXPECT_THAT(std::string(r->data.status().message()), testing::HasSubstr("o/missing"));
      ++notfound;
    } else if (r->data.status().code() == absl::StatusCode::kOutOfRange) {
      ++range;
    }
  }
  EXPECT_EQ(ok, 1);
  EXPECT_EQ(notfound, 1);
  EXPECT_EQ(range, 1);
}

TEST_F(FetchSchedulerTest, CancelStopsDeliveryAndDestroyingABatchIsSafe) {
  auto listed = PutObjects(100, 1000);
  auto slow = std::make_shared<Recorder>(local_, absl::Milliseconds(20));
  FetchScheduler scheduler(slow, {.max_in_flight = 4});
  std::vector<FetchItem> items;
  for (const auto& o : listed) items.push_back({.key = o.key, .size = o.size});
  auto batch = scheduler.Fetch(items);
  ASSERT_TRUE(batch->Next().has_value());
  batch->Cancel();
  EXPECT_FALSE(batch->Next().has_value());
  EXPECT_LT(slow->gets().size(), 20u);
  auto another = scheduler.Fetch(items);
  another.reset();  // requests in flight complete in the background
  // ... and do complete, into nothing (a sanitizer build checks that they touch no freed
  // batch), and no request starts after the destruction.
  for (int i = 0; i < 1000 && slow->in_flight() > 0; ++i) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(slow->in_flight(), 0);
  const size_t issued = slow->gets().size();
  absl::SleepFor(absl::Milliseconds(60));  // three GET delays: a late request would show
  EXPECT_EQ(slow->gets().size(), issued);
  EXPECT_LT(issued, 2 * 20u);
}

// Holds every GET until its cancel token fires, then fails it as a backend would.
class ParkingStore : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  void GetAsync(GetRequest request, Callback<GetResult> done) override {
    if (request.cancel == nullptr) {
      return std::move(done)(absl::InternalError("GET without a cancel token"));
    }
    parked_.Enter();
    auto pending = std::make_shared<Callback<GetResult>>(std::move(done));
    request.cancel->OnCancel([this, pending, uri = Uri(request.key)] {
      // Off the canceller's thread, as a transport completes.
      Timer::Global().After(absl::ZeroDuration(), [this, pending, uri] {
        ++cancelled_;
        parked_.Leave();
        std::move (*pending)(absl::CancelledError(absl::StrCat("get ", uri, ": cancelled")));
      });
    });
  }
  int parked() { return parked_.in_flight(); }
  int gets() { return parked_.calls(); }
  // Waits (up to 5 s) until `n` GETs are parked; returns how many are.
  int WaitUntilParked(int n) {
    for (int i = 0; i < 1000 && parked() != n; ++i) absl::SleepFor(absl::Milliseconds(5));
    return parked();
  }
  std::atomic<int> cancelled_{0};

 private:
  store_testing::InFlightCounter parked_;
};

TEST_F(FetchSchedulerTest, CancelStopsTheRequestsInFlightThroughTheirToken) {
  auto listed = PutObjects(8, 1000);
  auto parking = std::make_shared<ParkingStore>(local_);
  FetchScheduler scheduler(parking, {.max_in_flight = 8});
  std::vector<FetchItem> items;
  for (const auto& o : listed) items.push_back({.key = o.key, .size = o.size});
  auto batch = scheduler.Fetch(items);
  ASSERT_EQ(parking->WaitUntilParked(8), 8);
  batch->Cancel();
  EXPECT_FALSE(batch->Next().has_value());
  EXPECT_EQ(parking->WaitUntilParked(0), 0);
  EXPECT_EQ(parking->cancelled_.load(), 8);
}

TEST_F(FetchSchedulerTest, DestroyingABatchCancelsItsRequestsInFlight) {
  auto listed = PutObjects(8, 1000);
  auto parking = std::make_shared<ParkingStore>(local_);
  FetchScheduler scheduler(parking, {.max_in_flight = 4});
  std::vector<FetchItem> items;
  for (const auto& o : listed) items.push_back({.key = o.key, .size = o.size});
  auto batch = scheduler.Fetch(items);
  ASSERT_EQ(parking->WaitUntilParked(4), 4);
  batch.reset();  // no Cancel(), no Next(): the destructor alone
  // The parked GETs complete only when their token fires.
  EXPECT_EQ(parking->WaitUntilParked(0), 0);
  EXPECT_EQ(parking->cancelled_.load(), 4);
  // The other four items were never requested.
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(parking->gets(), 4);
}

TEST_F(FetchSchedulerTest, OpenBatchTakesItemsWhileDelivering) {
  auto listed = PutObjects(30, 100);
  FetchScheduler scheduler(local_, {.max_in_flight = 4, .ordered = true});
  auto batch = scheduler.StartBatch();
  // The feeder adds the first group, then waits for its first result before adding the
  // rest: results must be delivered while Adds are still coming, not only after Close().
  absl::Notification first_result;
  std::atomic<bool> adds_done{false};
  std::thread feeder([&] {
    for (size_t i = 0; i < listed.size(); i += 7) {
      std::vector<FetchItem> items;
      for (size_t j = i; j < std::min(listed.size(), i + 7); ++j) {
        items.push_back({.key = listed[j].key, .size = listed[j].size});
      }
      batch->Add(std::move(items));
      if (i == 0) first_result.WaitForNotificationWithTimeout(absl::Seconds(30));
    }
    adds_done = true;
    batch->Close();
  });
  size_t n = 0, before_last_add = 0;
  while (auto r = batch->Next()) {
    ASSERT_TRUE(r->data.ok());
    EXPECT_EQ(r->index, n);
    EXPECT_EQ(r->key, listed[n].key);
    if (!adds_done) ++before_last_add;
    if (n == 0) first_result.Notify();
    ++n;
  }
  feeder.join();
  EXPECT_EQ(n, listed.size());
  EXPECT_TRUE(first_result.HasBeenNotified());
  EXPECT_GE(before_last_add, 1u);  // at least the first result overlapped the Adds
}

TEST(FetchOptionsTest, InFlightFollowsLittlesLaw) {
  FetchOptions o;
  o.expected_latency = absl::Milliseconds(25);
  o.target_bytes_per_second = 200e6;
  o.typical_object_bytes = 100 << 10;
  EXPECT_EQ(o.EffectiveMaxInFlight(), 49);  // 1953 objects/s x 25 ms
  o.max_in_flight = 7;
  EXPECT_EQ(o.EffectiveMaxInFlight(), 7);
}

}  // namespace
}  // namespace wharf
