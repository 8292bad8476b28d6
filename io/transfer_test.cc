// The transfer engine between local stores: objects many times the memory budget stream
// through it as ordered parts cut by one plan, the listing stays a bounded distance ahead of
// the copies however many objects there are, and standard input and output go through the
// same parts.
#include "io/transfer.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/forwarding_store.h"
#include "store/testing/random_bytes.h"
#include "store/testing/temp_store.h"

namespace wharf {
namespace {

using store_testing::RandomBytes;
using store_testing::TempStore;
using ::testing::ElementsAreArray;

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::shared_ptr<Runtime> RuntimeWithBudget(uint64_t bytes) {
  RuntimeOptions o;
  o.memory_budget = bytes;
  return std::make_shared<Runtime>(o);
}

// Records the size of every Write its writers receive, in order.
class RecordingStore : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  using ForwardingStore::NewWriter;

  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key,
                                                          const PutOptions& options) override {
    auto inner = ForwardingStore::NewWriter(std::move(key), options);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<ObjectWriter>(new Writer(*std::move(inner), this));
  }
  std::vector<uint64_t> writes() {
    absl::MutexLock lock(&mu_);
    return writes_;
  }

 private:
  class Writer : public ObjectWriter {
   public:
    Writer(std::unique_ptr<ObjectWriter> inner, RecordingStore* store)
        : inner_(std::move(inner)), store_(store) {}
    absl::Status Write(absl::Cord data) override {
      {
        absl::MutexLock lock(&store_->mu_);
        store_->writes_.push_back(data.size());
      }
      return inner_->Write(std::move(data));
    }
    absl::StatusOr<ObjectMeta> Close() override { return inner_->Close(); }
    void Abort() override { inner_->Abort(); }

   private:
    std::unique_ptr<ObjectWriter> inner_;
    RecordingStore* store_;
  };

  absl::Mutex mu_;
  std::vector<uint64_t> writes_ ABSL_GUARDED_BY(mu_);
};

// Delays every put by `delay` on the runtime's timer (a slow destination).
class SlowPutStore : public ForwardingStore {
 public:
  SlowPutStore(std::shared_ptr<ObjectStore> inner, absl::Duration delay)
      : ForwardingStore(std::move(inner)), delay_(delay) {}
  using ForwardingStore::PutAsync;
  void PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                Callback<ObjectMeta> done) override {
    Runtime::Default()->timer().After(delay_, [this, key = std::move(key), data = std::move(data),
                                               options, done = std::move(done)]() mutable {
      ForwardingStore::PutAsync(std::move(key), std::move(data), options, std::move(done));
    });
  }

 private:
  const absl::Duration delay_;
};

// A store whose server-side copies take objects up to `max_copy` bytes (as S3's CopyObject
// takes 5 GiB); counts them.
class CappedCopyStore : public ForwardingStore {
 public:
  CappedCopyStore(std::shared_ptr<ObjectStore> inner, uint64_t max_copy)
      : ForwardingStore(std::move(inner)), caps_(ForwardingStore::capabilities()) {
    caps_.max_copy_size = max_copy;
  }
  const Capabilities& capabilities() const override { return caps_; }
  void CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) override {
    copies_.fetch_add(1);
    ForwardingStore::CopyAsync(std::move(src_key), std::move(dst_key), std::move(done));
  }
  int copies() const { return copies_.load(); }

 private:
  Capabilities caps_;
  std::atomic<int> copies_{0};
};

// Counts objects planned (selected by the listing) and done, and the most planned and not
// yet done at any moment.
class CountingObserver : public TransferObserver {
 public:
  void OnPlanned(uint64_t objects, uint64_t) override {
    const uint64_t ahead = planned_.fetch_add(objects) + objects - done_.load();
    uint64_t seen = max_ahead_.load();
    while (ahead > seen && !max_ahead_.compare_exchange_weak(seen, ahead)) {
    }
  }
  void OnObjectDone(const std::string&, const std::string&) override { done_.fetch_add(1); }
  void OnError(const absl::Status& status) override { ADD_FAILURE() << status; }
  uint64_t max_ahead() const { return max_ahead_.load(); }
  uint64_t done() const { return done_.load(); }

 private:
  std::atomic<uint64_t> planned_{0}, done_{0}, max_ahead_{0};
};

TEST(TransferTest, ObjectTwelveTimesTheBudgetStreamsWithinIt) {
  TempStore src, dst;
  const std::string data = RandomBytes(24 * kMiB + 12345, 1);
  ASSERT_TRUE(src.store()->Put("big.bin", absl::Cord(data)).ok());
  TransferOptions options;
  options.runtime = RuntimeWithBudget(2 * kMiB);
  options.part_size = 256 * kKiB;
  auto summary = Transfer({src.store(), "big.bin"}, {dst.store(), "copy.bin"}, options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->objects, 1u);
  EXPECT_EQ(summary->bytes, data.size());
  EXPECT_EQ(ReadFile(dst.PathOf("copy.bin")), data);
  // Every part was charged to the budget, and the budget was never exceeded.
  EXPECT_GT(options.runtime->budget().peak(), 0u);
  EXPECT_LE(options.runtime->budget().peak(), 2 * kMiB);
}

TEST(TransferTest, WithinAStoreAnObjectAboveItsCopyLimitStreams) {
  TempStore temp;
  auto store = std::make_shared<CappedCopyStore>(temp.store(), 4096);
  const std::string big = RandomBytes(4097, 7), small = RandomBytes(4096, 8);
  ASSERT_TRUE(temp.store()->Put("p/big", absl::Cord(big)).ok());
  ASSERT_TRUE(temp.store()->Put("p/small", absl::Cord(small)).ok());
  TransferOptions options;
  options.recursive = true;
  auto summary = Transfer({store, "p/"}, {store, "q/"}, options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->objects, 2u);
  EXPECT_EQ(store->copies(), 1);  // the small one, server-side; the big one streamed
  EXPECT_EQ(ReadFile(temp.PathOf("q/big")), big);
  EXPECT_EQ(ReadFile(temp.PathOf("q/small")), small);
  options.recursive = false;
  ASSERT_TRUE(Transfer({store, "p/big"}, {store, "one"}, options).ok());
  EXPECT_EQ(store->copies(), 1);
  EXPECT_EQ(ReadFile(temp.PathOf("one")), big);
}

TEST(TransferTest, BudgetSmallerThanOnePartStillMovesTheObject) {
  TempStore src, dst;
  const std::string data = RandomBytes(8 * kMiB + 7, 2);
  ASSERT_TRUE(src.store()->Put("big.bin", absl::Cord(data)).ok());
  TransferOptions options;
  options.runtime = RuntimeWithBudget(256 * kKiB);
  options.part_size = 1 * kMiB;
  auto summary = Transfer({src.store(), "big.bin"}, {dst.store(), "copy.bin"}, options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(ReadFile(dst.PathOf("copy.bin")), data);
  // One part larger than the budget runs alone: never two at once.
  EXPECT_LE(options.runtime->budget().peak(), 1 * kMiB);
}

TEST(TransferTest, PartsArriveInOrderCutByOnePlan) {
  TempStore src, dst;
  // 1,000 parts of the base size, then the doubled size (as S3's multipart writer cuts).
  const std::string data = RandomBytes(1000 * kKiB + 5 * kKiB, 3);
  ASSERT_TRUE(src.store()->Put("obj", absl::Cord(data)).ok());
  auto recording = std::make_shared<RecordingStore>(dst.store());
  TransferOptions options;
  options.runtime = RuntimeWithBudget(64 * kMiB);
  options.part_size = 1 * kKiB;
  auto summary = Transfer({src.store(), "obj"}, {recording, "obj"}, options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(ReadFile(dst.PathOf("obj")), data);
  std::vector<uint64_t> expect(1000, kKiB);
  expect.push_back(2 * kKiB);
  expect.push_back(2 * kKiB);
  expect.push_back(1 * kKiB);
  EXPECT_THAT(recording->writes(), ElementsAreArray(expect));
}

TEST(TransferTest, PrefixOfBigAndSmallObjectsWithinTheBudget) {
  TempStore src, dst;
  std::vector<std::pair<std::string, std::string>> objects;
  for (int i = 0; i < 40; ++i) {
    objects.emplace_back(absl::StrCat("small/", i), RandomBytes(10 * kKiB + i, 100 + i));
  }
  for (int i = 0; i < 3; ++i) {
    objects.emplace_back(absl::StrCat("big/", i), RandomBytes(6 * kMiB + i, 200 + i));
  }
  for (const auto& [key, data] : objects) {
    ASSERT_TRUE(src.store()->Put(key, absl::Cord(data)).ok());
  }
  TransferOptions options;
  options.recursive = true;
  options.runtime = RuntimeWithBudget(2 * kMiB);
  options.stream_threshold = 1 * kMiB;
  options.part_size = 512 * kKiB;
  auto summary = Transfer({src.store(), ""}, {dst.store(), "out/"}, options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->objects, objects.size());
  for (const auto& [key, data] : objects) {
    EXPECT_EQ(ReadFile(dst.PathOf("out/" + key)), data) << key;
  }
  EXPECT_LE(options.runtime->budget().peak(), 2 * kMiB);
  // A rerun finds everything in place (same size and ETag) and copies nothing.
  auto again = Transfer({src.store(), ""}, {dst.store(), "out/"}, options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->objects, 0u);
  EXPECT_EQ(again->skipped, objects.size());
}

TEST(TransferTest, ListingStaysABoundedDistanceAheadOfTheCopies) {
  TempStore src, dst;
  constexpr int kObjects = 4000;
  for (int i = 0; i < kObjects; ++i) {
    ASSERT_TRUE(src.store()->Put(absl::StrCat("d", i / 1000, "/", i), absl::Cord("x")).ok());
  }
  // The destination is much slower than the local listing: without back-pressure the
  // listing would select every object long before most are copied.
  auto slow = std::make_shared<SlowPutStore>(dst.store(), absl::Milliseconds(2));
  CountingObserver observer;
  TransferOptions options;
  options.recursive = true;
  options.inflight = 8;
  auto summary = Transfer({src.store(), ""}, {slow, ""}, options, &observer);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->objects, static_cast<uint64_t>(kObjects));
  EXPECT_EQ(observer.done(), static_cast<uint64_t>(kObjects));
  // At most 256 selected objects ahead of the fetch, plus the page (1,000 keys) being
  // selected and the puts in flight.
  EXPECT_GT(observer.max_ahead(), 0u);
  EXPECT_LT(observer.max_ahead(), 1500u);
}

TEST(TransferTest, StandardInputAndOutputMoveAsParts) {
  TempStore store;
  const std::string data = RandomBytes(5 * kMiB + 123, 4);
  char in_path[] = "/tmp/wharf-transfer-in-XXXXXX";
  const int in = mkstemp(in_path);
  ASSERT_GE(in, 0);
  ASSERT_EQ(write(in, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  ASSERT_EQ(lseek(in, 0, SEEK_SET), 0);

  TransferOptions options;
  options.runtime = RuntimeWithBudget(1 * kMiB);
  options.part_size = 512 * kKiB;
  auto meta = TransferFromFd(in, {store.store(), "from-stdin"}, options);
  close(in);
  unlink(in_path);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(ReadFile(store.PathOf("from-stdin")), data);
  EXPECT_LE(options.runtime->budget().peak(), 1 * kMiB);

  char out_path[] = "/tmp/wharf-transfer-out-XXXXXX";
  const int out = mkstemp(out_path);
  ASSERT_GE(out, 0);
  absl::Status s = TransferToFd({store.store(), "from-stdin"}, out, options);
  close(out);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(ReadFile(out_path), data);
  unlink(out_path);
}

}  // namespace
}  // namespace wharf
