// The conformance suite and live tests of the JSON API backend against the local GCS
// emulator that ./run test starts (scripts/gcs-server: gcp-storage-emulator on 127.0.0.1).
// The emulator answers every listing in one page, so the suite runs with page-size checks off
// for it; paging, offsets and preconditions on the wire are covered by gcs_json_store_test.cc
// (docs/design/gcs.md). Without a server every test here fails: never a silent skip.
#include <cstdlib>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "http/curl_transport.h"
#include "store/conformance/object_store_conformance.h"
#include "store/gcs/gcs_json_store.h"
#include "store/gcs/gcs_store.h"
#include "store/spec.h"

namespace wharf::gcs {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<HttpTransport> SharedTransport() {
  static auto* transport = new std::shared_ptr<HttpTransport>(NewCurlTransport());
  return *transport;
}

absl::StatusOr<std::string> EmulatorEndpoint() {
  const char* host = std::getenv("STORAGE_EMULATOR_HOST");
  if (host == nullptr || *host == '\0') {
    return absl::FailedPreconditionError(
        "STORAGE_EMULATOR_HOST is not set: start the emulator with `scripts/gcs-server start` "
        "and `eval \"$(scripts/gcs-server env)\"`, or run `./run test`");
  }
  return std::string(host);
}

std::string RandomBucketName() {
  static std::mt19937_64 rng(std::random_device{}());
  return absl::StrCat("wharf-test-", absl::Hex(rng(), absl::kZeroPad16));
}

absl::StatusOr<std::unique_ptr<GcsJsonStore>> NewBucket(GcsJsonConfig config = {}) {
  auto endpoint = EmulatorEndpoint();
  if (!endpoint.ok()) return endpoint.status();
  config.endpoint = *endpoint;
  config.project = "wharf-test";
  auto store = GcsJsonStore::Open(RandomBucketName(), config, SharedTransport());
  if (!store.ok()) return store.status();
  if (auto s = (*store)->CreateBucket(); !s.ok()) return s;
  return store;
}

void EmptyAndDeleteBucket(ObjectStore& store) {
  auto& gcs = static_cast<GcsJsonStore&>(store);
  auto listed = gcs.ListAll({});
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::vector<std::string> keys;
  for (const auto& o : listed->objects) keys.push_back(o.key);
  EXPECT_TRUE(gcs.DeleteMany(keys).ok());
  EXPECT_TRUE(gcs.DeleteBucket().ok());
}

absl::StatusOr<std::shared_ptr<ObjectStore>> MakeFreshStore() {
  auto store = NewBucket();
  if (!store.ok()) return store.status();
  return std::shared_ptr<ObjectStore>(*std::move(store));
}

INSTANTIATE_TEST_SUITE_P(GcsJson, ObjectStoreConformance,
                         testing::Values(ConformanceBackend{.name = "gcp_storage_emulator",
                                                            .make_store = MakeFreshStore,
                                                            .destroy_store = EmptyAndDeleteBucket,
                                                            .server_honours_page_size = false,
                                                            .server_checks_preconditions = false}),
                         ConformanceBackendName);

class GcsLiveTest : public testing::Test {
 protected:
  void SetUp() override {
    GcsJsonConfig config;
    config.chunk_size = 256 << 10;  // several chunks per test object
    auto store = NewBucket(config);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void TearDown() override {
    if (store_) EmptyAndDeleteBucket(*store_);
  }
  std::unique_ptr<GcsJsonStore> store_;
};

TEST_F(GcsLiveTest, ResumableWriterOfManyChunksRoundTrips) {
  std::string data;
  for (int i = 0; i < (1 << 20) + 12345; ++i) data += static_cast<char>(i * 7 % 251);
  auto writer = store_->NewWriter("big/obj");
  ASSERT_TRUE(writer.ok());
  for (size_t i = 0; i < data.size(); i += 70000) {
    ASSERT_TRUE((*writer)->Write(absl::Cord(data.substr(i, 70000))).ok());
  }
  // Invisible until Close.
  EXPECT_EQ(store_->Head("big/obj").status().code(), absl::StatusCode::kNotFound);
  auto meta = (*writer)->Close();
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->size, data.size());
  auto head = store_->Head("big/obj");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->etag, meta->etag);
  EXPECT_EQ(*store_->Read("big/obj"), data);
  EXPECT_EQ(*store_->Read("big/obj", ByteRange::Of(1000000, 10)), data.substr(1000000, 10));
}

TEST_F(GcsLiveTest, GenerationsAreTheEtagsOfEveryOperation) {
  auto v1 = store_->Put("g", absl::Cord("one"));
  ASSERT_TRUE(v1.ok()) << v1.status();
  uint64_t generation = 0;
  EXPECT_TRUE(absl::SimpleAtoi(v1->etag, &generation)) << v1->etag;
  auto v2 = store_->Put("g", absl::Cord("two"));
  ASSERT_TRUE(v2.ok());
  EXPECT_NE(v1->etag, v2->etag);
  auto listed = store_->List({.prefix = "g"});
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->objects.size(), 1u);
  EXPECT_EQ(listed->objects[0].etag, v2->etag);
  auto head = store_->Head("g");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->etag, v2->etag);
  // A copy and a composition are new generations too.
  auto copied = store_->Copy("g", "g2");
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_TRUE(absl::SimpleAtoi(copied->etag, &generation)) << copied->etag;
  EXPECT_EQ(*store_->Read("g2"), "two");
}

TEST_F(GcsLiveTest, ComposeOfThirtyTwoSources) {
  std::vector<std::string> sources;
  std::string expected;
  for (int i = 0; i < 32; ++i) {
    const std::string key = absl::StrCat("parts/", absl::Dec(i, absl::kZeroPad2));
    const std::string value = absl::StrCat("part ", i, ";");
    ASSERT_TRUE(store_->Put(key, absl::Cord(value)).ok());
    sources.push_back(key);
    expected += value;
  }
  auto composed = store_->Compose(sources, "composed");
  ASSERT_TRUE(composed.ok()) << composed.status();
  EXPECT_EQ(composed->size, expected.size());
  EXPECT_EQ(*store_->Read("composed"), expected);
}

TEST_F(GcsLiveTest, MissingBucketIsNotFoundAndNamed) {
  auto endpoint = EmulatorEndpoint();
  ASSERT_TRUE(endpoint.ok());
  GcsJsonConfig config;
  config.endpoint = *endpoint;
  auto missing = GcsJsonStore::Open("wharf-no-such-bucket", config, SharedTransport());
  ASSERT_TRUE(missing.ok());
  auto listed = (*missing)->List({});
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kNotFound) << listed.status();
  EXPECT_THAT(listed.status().message(), HasSubstr("gs://wharf-no-such-bucket/"));
}

TEST_F(GcsLiveTest, SpecOpensTheJsonApiOnTheEmulator) {
  // STORAGE_EMULATOR_HOST is set (./run test): gs:// with no HMAC key is the JSON API there.
  auto parsed = ParseStoreUri(absl::StrCat("gs://", store_->bucket(), "/"));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto store = OpenGcsSpec(parsed->spec);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE(store_->Put("via/spec", absl::Cord("hi")).ok());
  EXPECT_EQ(*(*store)->Read("via/spec"), "hi");
  EXPECT_TRUE((*store)->capabilities().compose);
}

}  // namespace
}  // namespace wharf::gcs
