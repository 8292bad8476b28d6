#include "store/forwarding_store.h"

#include <atomic>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/conformance/object_store_conformance.h"
#include "store/local/local_store.h"
#include "store/testing/temp_store.h"

namespace wharf {
namespace {

namespace fs = std::filesystem;

// A decorator that changes nothing, over a LocalStore in a fresh directory.
class ForwardedLocal : public ForwardingStore {
 public:
  ForwardedLocal(std::shared_ptr<LocalStore> inner, std::string root)
      : ForwardingStore(std::move(inner)), root_(std::move(root)) {}
  const std::string& root() const { return root_; }

 private:
  const std::string root_;
};

absl::StatusOr<std::shared_ptr<ObjectStore>> MakeForwardedStore() {
  std::string tmpl = (fs::temp_directory_path() / "wharf-forwarding-test-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("mkdtemp failed");
  auto local = LocalStore::Open(tmpl, Runtime::Default());
  if (!local.ok()) return local.status();
  return std::shared_ptr<ObjectStore>(
      std::make_shared<ForwardedLocal>(std::shared_ptr<LocalStore>(*std::move(local)), tmpl));
}

void DestroyForwardedStore(ObjectStore& store) {
  fs::remove_all(static_cast<ForwardedLocal&>(store).root());
}

// A decorator passes the whole contract as its inner store does: read options, cancellation,
// put options and writers included.
INSTANTIATE_TEST_SUITE_P(Forwarded, ObjectStoreConformance,
                         testing::Values(ConformanceBackend{"local_forwarded", MakeForwardedStore,
                                                            DestroyForwardedStore}),
                         ConformanceBackendName);

// Records what reaches it and counts the calls of the forms a decorator overrides.
class Recorder : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  using ForwardingStore::NewWriter;  // the overloads not overridden stay callable
  using ForwardingStore::PutAsync;

  void GetAsync(GetRequest request, Callback<GetResult> done) override {
    {
      absl::MutexLock lock(&mu_);
      last_if_match = request.if_match;
      last_if_none_match = request.if_none_match;
      last_max_staleness = request.max_staleness;
      last_cancel = request.cancel;
    }
    ++gets;
    ForwardingStore::GetAsync(std::move(request), std::move(done));
  }
  void PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                Callback<ObjectMeta> done) override {
    ++puts;
    ForwardingStore::PutAsync(std::move(key), std::move(data), options, std::move(done));
  }
  void ComposeAsync(std::vector<std::string> sources, std::string dst_key,
                    Callback<ObjectMeta> done) override {
    ++composes;
    ForwardingStore::ComposeAsync(std::move(sources), std::move(dst_key), std::move(done));
  }
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key,
                                                          const PutOptions& options) override {
    ++writers;
    return ForwardingStore::NewWriter(std::move(key), options);
  }

  absl::Mutex mu_;
  std::string last_if_match, last_if_none_match;
  absl::Duration last_max_staleness;
  CancelToken last_cancel;
  std::atomic<int> gets{0}, puts{0}, writers{0}, composes{0};
};

TEST(ForwardingStoreTest, ReadOptionsCrossEveryDecoratorUnchanged) {
  store_testing::TempStore temp;
  auto recorder = std::make_shared<Recorder>(temp.store());
  ForwardingStore outer(recorder);  // a second decorator in front
  auto put = outer.Put("k", absl::Cord("content"));
  ASSERT_TRUE(put.ok()) << put.status();

  std::string buffer(7, '\0');
  GetRequest request{.key = "k",
                     .buffer = absl::MakeSpan(buffer),
                     .if_match = put->etag,
                     .if_none_match = "another-etag"};
  request.max_staleness = absl::Minutes(3);
  request.cancel = NewCancelToken();
  auto got = outer.Get(request);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(buffer, "content");
  absl::MutexLock lock(&recorder->mu_);
  EXPECT_EQ(recorder->last_if_match, put->etag);
  EXPECT_EQ(recorder->last_if_none_match, "another-etag");
  EXPECT_EQ(recorder->last_max_staleness, absl::Minutes(3));
  EXPECT_EQ(recorder->last_cancel, request.cancel);  // the same token, not a copy
}

TEST(ForwardingStoreTest, BlockingAndPlainFormsGoThroughTheOverriddenForms) {
  store_testing::TempStore temp;
  Recorder recorder(*temp.store());  // borrowed inner store
  ASSERT_TRUE(recorder.Put("a", absl::Cord("1")).ok());
  ASSERT_TRUE(recorder.Put("b", absl::Cord("2"), PutOptions{}).ok());
  absl::Notification put_done;
  recorder.PutAsync("c", absl::Cord("3"), [&](absl::StatusOr<ObjectMeta> r) {
    EXPECT_TRUE(r.ok()) << r.status();
    put_done.Notify();
  });
  put_done.WaitForNotification();
  EXPECT_EQ(recorder.puts.load(), 3);
  EXPECT_EQ(*recorder.Read("a"), "1");
  EXPECT_EQ(recorder.gets.load(), 1);
  auto writer = recorder.NewWriter("d");
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Write(absl::Cord("4")).ok());
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_EQ(recorder.writers.load(), 1);
  EXPECT_EQ(recorder.Uri("d"), temp.store()->Uri("d"));
  EXPECT_EQ(&recorder.capabilities(), &temp.store()->capabilities());
}

TEST(ForwardingStoreTest, ComposeIsForwarded) {
  store_testing::TempStore temp;
  auto recorder = std::make_shared<Recorder>(temp.store());
  ForwardingStore outer(recorder);
  // The local store has no compose and says so; what matters is that the call got through.
  EXPECT_EQ(outer.Compose({"a", "b"}, "ab").status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(recorder->composes.load(), 1);
}

}  // namespace
}  // namespace wharf
