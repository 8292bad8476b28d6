// MeteredStore: passes the store conformance suite in front of a local store, counts each
// request by operation and outcome with its bytes, and every store the registry opens is
// metered.
#include "store/metered_store.h"

#include <filesystem>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/conformance/object_store_conformance.h"
#include "store/local/local_store.h"
#include "store/registry.h"

namespace wharf {
namespace {

namespace fs = std::filesystem;

class MeteredLocal : public MeteredStore {
 public:
  MeteredLocal(std::shared_ptr<LocalStore> inner, std::string root,
               std::shared_ptr<Runtime> runtime)
      : MeteredStore(std::move(inner), "file", std::move(runtime)), root_(std::move(root)) {}
  const std::string& root() const { return root_; }

 private:
  const std::string root_;
};

absl::StatusOr<std::shared_ptr<ObjectStore>> MakeMetered(std::shared_ptr<Runtime> runtime) {
  std::string tmpl = (fs::temp_directory_path() / "wharf-metered-test-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("mkdtemp failed");
  auto local = LocalStore::Open(tmpl, runtime);
  if (!local.ok()) return local.status();
  return std::shared_ptr<ObjectStore>(std::make_shared<MeteredLocal>(
      std::shared_ptr<LocalStore>(*std::move(local)), tmpl, std::move(runtime)));
}

void DestroyMetered(ObjectStore& store) {
  fs::remove_all(static_cast<MeteredLocal&>(store).root());
}

INSTANTIATE_TEST_SUITE_P(Metered, ObjectStoreConformance,
                         testing::Values(ConformanceBackend{
                             "local_metered", [] { return MakeMetered(Runtime::Default()); },
                             DestroyMetered}),
                         ConformanceBackendName);

double Value(Runtime& rt, const std::string& name, const MetricLabels& labels) {
  for (const MetricPoint& p : rt.MetricPoints()) {
    if (p.name == name && p.labels == labels) {
      return p.kind == MetricsRegistry::Kind::kHistogram ? p.counts.back() : p.value;
    }
  }
  return -1;
}

TEST(MeteredStore, CountsRequestsByOperationAndOutcomeWithTheirBytes) {
  auto runtime = std::make_shared<Runtime>();
  auto made = MakeMetered(runtime);
  ASSERT_TRUE(made.ok()) << made.status();
  std::shared_ptr<ObjectStore> store = *made;
  ASSERT_TRUE(store->Put("a", absl::Cord(std::string(1000, 'x'))).ok());
  std::string buf(1000, '\0');
  GetRequest get;
  get.key = "a";
  get.buffer = absl::MakeSpan(buf);
  ASSERT_TRUE(store->Get(get).ok());
  EXPECT_FALSE(store->Head("missing").ok());
  // A range past the end (the first read of an empty object of unknown size asks for one)
  // is an answer of its own, not an error.
  ASSERT_TRUE(store->Put("empty", absl::Cord()).ok());
  GetRequest past;
  past.key = "empty";
  past.range = ByteRange::Of(0, 100);
  past.buffer = absl::MakeSpan(buf);
  EXPECT_TRUE(absl::IsOutOfRange(store->Get(past).status()));
  auto writer = store->NewWriter("b");
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Write(absl::Cord(std::string(500, 'y'))).ok());
  ASSERT_TRUE((*writer)->Close().ok());
  Runtime& rt = *runtime;
  auto req = [&](const char* op, const char* status) {
    return Value(rt, "wharf_store_requests_total",
                 {{"scheme", "file"}, {"op", op}, {"status", status}});
  };
  EXPECT_EQ(req("put", "ok"), 2);
  EXPECT_EQ(req("get", "ok"), 1);
  EXPECT_EQ(req("get", "out_of_range"), 1);
  EXPECT_EQ(req("head", "not_found"), 1);
  EXPECT_EQ(req("write", "ok"), 1);
  EXPECT_EQ(req("get", "error"), 0);
  EXPECT_EQ(Value(rt, "wharf_store_read_bytes_total", {{"scheme", "file"}}), 1000);
  EXPECT_EQ(Value(rt, "wharf_store_written_bytes_total", {{"scheme", "file"}}), 1500);
  EXPECT_EQ(Value(rt, "wharf_store_request_seconds", {{"scheme", "file"}, {"op", "get"}}), 2);
  EXPECT_EQ(Value(rt, "wharf_store_requests_in_flight", {{"scheme", "file"}, {"op", "get"}}), 0);
  DestroyMetered(*store);
}

TEST(MeteredStore, EveryStoreTheRegistryOpensIsMetered) {
  std::string tmpl = (fs::temp_directory_path() / "wharf-metered-reg-XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  auto runtime = std::make_shared<Runtime>();
  auto opened = OpenUri("file://" + tmpl + "/", runtime);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_TRUE(opened->store->Put("k", absl::Cord("v")).ok());
  EXPECT_EQ(Value(*runtime, "wharf_store_requests_total",
                  {{"scheme", "file"}, {"op", "put"}, {"status", "ok"}}),
            1);
  fs::remove_all(tmpl);
}

}  // namespace
}  // namespace wharf
