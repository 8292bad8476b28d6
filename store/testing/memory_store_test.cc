#include "store/testing/memory_store.h"

#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/conformance/object_store_conformance.h"

namespace wharf::store_testing {
namespace {

using ::testing::ElementsAre;

absl::StatusOr<std::shared_ptr<ObjectStore>> MakeMemoryStore() {
  return std::shared_ptr<ObjectStore>(std::make_shared<MemoryStore>());
}

INSTANTIATE_TEST_SUITE_P(Memory, ObjectStoreConformance,
                         testing::Values(ConformanceBackend{"memory", MakeMemoryStore}),
                         ConformanceBackendName);

TEST(MemoryStoreTest, HoldsKeysNoFileSystemCould) {
  MemoryStore store;
  const std::string nul("p/nul\0x", 7);
  for (const std::string& key : {std::string("p/../x"), std::string("p//y"), nul}) {
    ASSERT_TRUE(store.Put(key, absl::Cord(key)).ok()) << key;
  }
  EXPECT_EQ(*store.Read(nul), nul);
  EXPECT_THAT(store.keys(), ElementsAre("p/../x", "p//y", nul));  // byte order: . < /
  EXPECT_EQ(store.Uri("p//y"), "mem://bkt/p//y");
}

TEST(MemoryStoreTest, AsyncCallbacksRunOnTheStoresThreads) {
  MemoryStore store;
  ASSERT_TRUE(store.Put("k", absl::Cord("v")).ok());
  absl::Notification done;
  std::thread::id ran_on;
  store.HeadAsync("k", [&](absl::StatusOr<ObjectMeta> meta) {
    EXPECT_TRUE(meta.ok());
    ran_on = std::this_thread::get_id();
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(MemoryStoreTest, StoreWithoutPutOptionsRefusesThem) {
  MemoryStoreOptions options;
  options.capabilities.put_options = false;
  MemoryStore store(options);
  PutOptions typed;
  typed.content_type = "text/plain";
  EXPECT_EQ(store.Put("k", absl::Cord("v"), typed).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(store.Put("k", absl::Cord("v"), PutOptions{}).ok());
}

}  // namespace
}  // namespace wharf::store_testing
