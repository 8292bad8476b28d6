// The conformance suite and live tests against the real S3 server that ./run test starts
// (scripts/s3-server: a single-node Ceph RGW on 127.0.0.1 that verifies SigV4 signatures).
// Without a server every test here fails: a missing server is never a silent skip.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "http/curl_transport.h"
#include "store/conformance/object_store_conformance.h"
#include "store/s3/s3_store.h"

namespace wharf::s3 {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<HttpTransport> SharedTransport() {
  static auto* transport = new std::shared_ptr<HttpTransport>(NewCurlTransport());
  return *transport;
}

absl::StatusOr<S3ClientConfig> ServerConfig() {
  if (std::getenv("WHARF_S3_ENDPOINT") == nullptr) {
    return absl::FailedPreconditionError(
        "WHARF_S3_ENDPOINT is not set: start the server with `scripts/s3-server start` and "
        "`eval \"$(scripts/s3-server env)\"`, or run `./run test`");
  }
  S3ClientOverrides overrides;
  overrides.endpoint_url = std::getenv("WHARF_S3_ENDPOINT");
  return ResolveS3ClientConfig(overrides);
}

std::string RandomBucketName(absl::string_view prefix) {
  static std::mt19937_64 rng(std::random_device{}());
  return absl::StrCat(prefix, "-", absl::Hex(rng(), absl::kZeroPad16));
}

absl::StatusOr<std::unique_ptr<S3Store>> NewBucket(S3StoreOptions options = {}) {
  auto config = ServerConfig();
  if (!config.ok()) return config.status();
  auto store = S3Store::Open(RandomBucketName("wharf-test"), *config, SharedTransport(), options);
  if (!store.ok()) return store.status();
  if (auto s = (*store)->CreateBucket(); !s.ok()) return s;
  return store;
}

void EmptyAndDeleteBucket(ObjectStore& store) {
  auto& s3 = static_cast<S3Store&>(store);
  auto listed = s3.ListAll({});
  if (listed.ok()) {
    std::vector<std::string> keys;
    for (const auto& o : listed->objects) keys.push_back(o.key);
    (void)s3.DeleteMany(keys);
  }
  EXPECT_TRUE(s3.DeleteBucket().ok());
}

absl::StatusOr<std::shared_ptr<ObjectStore>> MakeFreshStore() {
  auto store = NewBucket();
  if (!store.ok()) return store.status();
  return std::shared_ptr<ObjectStore>(*std::move(store));
}

INSTANTIATE_TEST_SUITE_P(S3, ObjectStoreConformance,
                         testing::Values(ConformanceBackend{"ceph_rgw", MakeFreshStore,
                                                            EmptyAndDeleteBucket}),
                         ConformanceBackendName);

class S3LiveTest : public testing::Test {
 protected:
  void SetUp() override {
    S3StoreOptions options;
    options.part_size = 5 << 20;
    auto store = NewBucket(options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void TearDown() override {
    if (store_) EmptyAndDeleteBucket(*store_);
  }
  std::unique_ptr<S3Store> store_;
};

TEST_F(S3LiveTest, MultipartUploadRoundTripsAndLeavesOneObject) {
  std::string data(17 << 20, '\0');  // 4 parts of 5 MiB, the last one short
  std::mt19937 rng(5);
  for (auto& c : data) c = static_cast<char>(rng());
  auto writer = store_->NewWriter("big/object.bin");
  ASSERT_TRUE(writer.ok());
  for (size_t off = 0; off < data.size(); off += 3 << 20) {
    ASSERT_TRUE((*writer)->Write(absl::Cord(data.substr(off, 3 << 20))).ok());
  }
  auto meta = (*writer)->Close();
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->size, data.size());
  EXPECT_TRUE(absl::EndsWith(meta->etag, "-4")) << meta->etag;
  EXPECT_EQ(*store_->Read("big/object.bin"), data);
  EXPECT_EQ(*store_->Read("big/object.bin", ByteRange::Of(5 << 20, 10)), data.substr(5 << 20, 10));
}

TEST_F(S3LiveTest, WrongSecretIsPermissionDeniedWithAHint) {
  S3ClientConfig bad = store_->config();
  bad.credentials.secret_access_key = "definitely-not-the-secret";
  auto store = S3Store::Open(store_->bucket(), bad, SharedTransport());
  ASSERT_TRUE(store.ok());
  auto listed = (*store)->List({});
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(listed.status().message()), HasSubstr("SignatureDoesNotMatch"));
  EXPECT_THAT(std::string(listed.status().message()), HasSubstr("AWS_SECRET_ACCESS_KEY"));
  EXPECT_THAT(std::string(listed.status().message()),
              testing::Not(HasSubstr("definitely-not-the-secret")));
}

TEST_F(S3LiveTest, WrongAccessKeyIsPermissionDenied) {
  S3ClientConfig bad = store_->config();
  bad.credentials.access_key_id = "NOSUCHACCESSKEY00000";
  auto store = S3Store::Open(store_->bucket(), bad, SharedTransport());
  auto listed = (*store)->List({});
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(listed.status().message()), HasSubstr("AWS_ACCESS_KEY_ID"));
}

// End to end: the credentials come from a credential_process script (printing the server's
// keys), through the chain, the store's credentials cache and SigV4.
TEST_F(S3LiveTest, CredentialProcessCredentialsListTheBucket) {
  ASSERT_TRUE(store_->Put("from-process", absl::Cord("x")).ok());
  const Credentials keys = store_->config().credentials;
  ASSERT_FALSE(keys.empty());
  const std::string home = absl::StrCat(testing::TempDir(), "/wharf_credential_process_", getpid());
  ASSERT_EQ(mkdir(home.c_str(), 0700), 0) << home;
  ASSERT_EQ(mkdir((home + "/.aws").c_str(), 0700), 0);
  const std::string script = home + "/creds.sh";
  const std::string config_path = home + "/.aws/config";
  {
    std::ofstream out(script);
    out << "#!/bin/sh\nprintf '{\"Version\": 1, \"AccessKeyId\": \"%s\", "
           "\"SecretAccessKey\": \"%s\", \"Expiration\": \"%s\"}' '"
        << keys.access_key_id << "' '" << keys.secret_access_key << "' '"
        << absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now() + absl::Hours(1), absl::UTCTimeZone())
        << "'\n";
  }
  chmod(script.c_str(), 0700);
  {
    std::ofstream out(config_path);
    out << "[default]\ncredential_process = " << script << "\n";
  }
  // Only HOME: no keys in the environment, so the chain reaches credential_process.
  const EnvLookup env = [&](absl::string_view name) -> std::optional<std::string> {
    if (name == "HOME") return home;
    return std::nullopt;
  };
  S3ClientOverrides overrides;
  overrides.endpoint_url = std::getenv("WHARF_S3_ENDPOINT");
  overrides.region = store_->config().region;
  auto config = ResolveS3ClientConfig(overrides, env);
  unlink(config_path.c_str());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->credentials.empty());
  EXPECT_EQ(config->credentials_source,
            absl::StrCat("credential_process of profile 'default' in ", config_path));

  auto store = S3Store::Open(store_->bucket(), *config, SharedTransport());
  ASSERT_TRUE(store.ok()) << store.status();
  auto listed = (*store)->List({});
  unlink(script.c_str());
  rmdir((home + "/.aws").c_str());
  rmdir(home.c_str());
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->objects.size(), 1u);
  EXPECT_EQ(listed->objects[0].key, "from-process");
}

TEST_F(S3LiveTest, MissingBucketIsNotFound) {
  auto config = ServerConfig();
  auto store = S3Store::Open("wharf-no-such-bucket", *config, SharedTransport());
  auto listed = (*store)->List({});
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(listed.status().message()), HasSubstr("NoSuchBucket"));
}

TEST_F(S3LiveTest, DeleteManyBeyondOneBatch) {
  std::vector<std::string> keys;
  for (int i = 0; i < 1100; ++i) keys.push_back(absl::StrCat("batch/", i));
  absl::BlockingCounter puts(keys.size());
  std::atomic<int> failed{0};
  for (const auto& k : keys) {
    store_->PutAsync(k, absl::Cord("x"), [&](absl::StatusOr<ObjectMeta> r) {
      if (!r.ok()) failed++;
      puts.DecrementCount();
    });
  }
  puts.Wait();
  ASSERT_EQ(failed.load(), 0);
  ASSERT_TRUE(store_->DeleteMany(keys).ok());
  EXPECT_TRUE(store_->ListAll({.prefix = "batch/"})->objects.empty());
}

}  // namespace
}  // namespace wharf::s3
