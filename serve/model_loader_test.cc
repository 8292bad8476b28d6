// Model loading: every tensor of one file, several files or a sharded index lands in its
// destination with each reported once and only when complete; headers longer than the probe,
// tensors inside the probe, duplicates across shards and a file replaced under a load.
#include "serve/model_loader.h"

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/testing/random_bytes.h"
#include "store/testing/temp_store.h"

namespace wharf::serve {
namespace {

using store_testing::RandomBytes;
using store_testing::TempStore;
using ::testing::HasSubstr;

struct Tensor {
  std::string name;
  std::string bytes;  // U8, shape [size]
};

// A safetensors file of U8 tensors laid out back to back, with `pad` spaces in the header.
std::string File(const std::vector<Tensor>& tensors, size_t pad = 0) {
  std::string json = "{";
  std::string data;
  for (const Tensor& t : tensors) {
    absl::StrAppend(&json, json.size() > 1 ? "," : "", "\"", t.name,
                    "\":{\"dtype\":\"U8\",\"shape\":[", t.bytes.size(), "],\"data_offsets\":[",
                    data.size(), ",", data.size() + t.bytes.size(), "]}");
    data += t.bytes;
  }
  json += "}" + std::string(pad, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + data;
}

class ModelLoaderTest : public ::testing::Test {
 protected:
  void Write(const std::string& key, const std::string& bytes) {
    ASSERT_TRUE(temp_.store()->Put(key, absl::Cord(bytes)).ok());
  }
  std::string Uri(const std::string& key) { return "file://" + temp_.PathOf(key); }

  // Loads and checks every tensor against `want`; returns the model.
  std::unique_ptr<SafetensorsModel> LoadAndCheck(const std::vector<std::string>& uris,
                                                 const std::map<std::string, std::string>& want,
                                                 ModelLoadOptions options = {}) {
    auto model = SafetensorsModel::Open(uris, options);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return nullptr;
    const auto& tensors = (*model)->tensors();
    EXPECT_EQ(tensors.size(), want.size());
    std::vector<std::string> dst(tensors.size());
    std::vector<char*> ptrs;
    for (size_t i = 0; i < tensors.size(); ++i) {
      dst[i].assign(tensors[i].tensor->size, '\0');
      ptrs.push_back(dst[i].data());
    }
    std::vector<std::atomic<int>> done(tensors.size());
    std::atomic<int> early{0};
    auto stats = (*model)->Read(ptrs, [&](size_t i) {
      done[i].fetch_add(1);
      if (dst[i] != want.at(tensors[i].tensor->name)) early.fetch_add(1);
    });
    EXPECT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(early.load(), 0);
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_EQ(done[i].load(), 1) << tensors[i].tensor->name;
      EXPECT_EQ(dst[i], want.at(tensors[i].tensor->name)) << tensors[i].tensor->name;
    }
    return *std::move(model);
  }

  TempStore temp_;
};

TEST_F(ModelLoaderTest, LoadsOneFileSmallAndLargeTensors) {
  std::vector<Tensor> t = {{"big", RandomBytes(3 << 20, 1)},
                           {"small", RandomBytes(100, 2)},
                           {"empty", ""},
                           {"mid", RandomBytes(700000, 3)}};
  Write("m/model.safetensors", File(t));
  std::map<std::string, std::string> want;
  for (const Tensor& x : t) want[x.name] = x.bytes;
  ModelLoadOptions options;
  options.max_request_bytes = 1 << 20;  // the big one in several GETs
  auto model = LoadAndCheck({Uri("m/model.safetensors")}, want, options);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->total_bytes(), (3u << 20) + 100 + 700000);
  EXPECT_EQ(model->tensors()[0].tensor->name, "big");  // by offset within a file
  EXPECT_EQ(model->tensors()[1].tensor->name, "small");
}

TEST_F(ModelLoaderTest, LoadsAShardedIndexAndAHeaderLongerThanTheProbe) {
  std::map<std::string, std::string> want;
  std::vector<Tensor> a, b;
  for (int i = 0; i < 50; ++i) {
    Tensor x{absl::StrCat("layer.", i, ".weight"), RandomBytes(1000 + i * 100, 10 + i)};
    want[x.name] = x.bytes;
    (i % 2 ? a : b).push_back(x);
  }
  Write("m/model-00001-of-00002.safetensors", File(a, 9000));  // header > the 4 KiB probe
  Write("m/model-00002-of-00002.safetensors", File(b));
  std::string index = R"({"metadata":{"total_size":1},"weight_map":{)";
  for (const auto& [name, bytes] : want) {
    const bool in_a = std::find_if(a.begin(), a.end(),
                                   [&](const Tensor& t) { return t.name == name; }) != a.end();
    absl::StrAppend(&index, index.back() == '{' ? "" : ",", "\"", name, "\":\"",
                    in_a ? "model-00001-of-00002" : "model-00002-of-00002", ".safetensors\"");
  }
  index += "}}";
  Write("m/model.safetensors.index.json", index);
  ModelLoadOptions options;
  options.header_probe_bytes = 4096;
  auto model = LoadAndCheck({Uri("m/model.safetensors.index.json")}, want, options);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->files().size(), 2u);
}

TEST_F(ModelLoaderTest, RefusesADuplicateTensorAndAnIndexEscapingItsFolder) {
  Write("m/a.safetensors", File({{"w", "abc"}}));
  Write("m/b.safetensors", File({{"w", "xyz"}}));
  auto dup = SafetensorsModel::Open({Uri("m/a.safetensors"), Uri("m/b.safetensors")});
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(dup.status().message(), HasSubstr("tensor 'w' is in both"));
  Write("m/bad.index.json", R"({"weight_map":{"w":"../secret.safetensors"}})");
  auto escape = SafetensorsModel::Open({Uri("m/bad.index.json")});
  ASSERT_FALSE(escape.ok());
  EXPECT_THAT(escape.status().message(), HasSubstr("not a relative path inside"));
  auto missing = SafetensorsModel::Open({Uri("m/nope.safetensors")});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.safetensors"));
  Write("m/empty.safetensors", "");
  auto empty = SafetensorsModel::Open({Uri("m/empty.safetensors")});
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("empty.safetensors"));
}

TEST_F(ModelLoaderTest, AFileReplacedAfterItsHeaderWasReadFailsTheLoad) {
  Write("m/model.safetensors", File({{"w", RandomBytes(1 << 20, 4)}}));
  ModelLoadOptions options;
  options.header_probe_bytes = 4096;
  auto model = SafetensorsModel::Open({Uri("m/model.safetensors")}, options);
  ASSERT_TRUE(model.ok()) << model.status();
  Write("m/model.safetensors", File({{"w", RandomBytes(1 << 20, 5)}}));
  std::string dst(1 << 20, '\0');
  std::vector<char*> ptrs = {dst.data()};
  auto stats = (*model)->Read(ptrs);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kFailedPrecondition) << stats.status();
}

TEST_F(ModelLoaderTest, ReadsArbitrarySpansOfTheFilesAndRefusesOnesBeyondThem) {
  // What a load onto an accelerator reads: windows of the files' bytes that cut tensors in
  // pieces, including bytes inside the header probe, from several files at once.
  const std::string a = RandomBytes(3 << 20, 6), b = RandomBytes(5000, 7);
  const std::string file0 = File({{"a", a}, {"b", b}}), file1 = File({{"c", b}});
  Write("m/0.safetensors", file0);
  Write("m/1.safetensors", file1);
  ModelLoadOptions options;
  options.max_request_bytes = 1 << 20;
  auto model = SafetensorsModel::Open({Uri("m/0.safetensors"), Uri("m/1.safetensors")}, options);
  ASSERT_TRUE(model.ok()) << model.status();
  const uint64_t start = (*model)->tensors()[0].tensor->offset;
  std::string window(2 << 20, '\0'), tail(file0.size() - start - (2 << 20) + 10, '\0');
  std::string head(16, '\0');
  std::vector<ModelSpan> spans = {
      {0, start, window.size(), window.data()},  // the first 2 MiB of "a"
      {0, start + window.size(), file0.size() - start - window.size(), tail.data()},
      {1, file1.size() - 10, 10, tail.data() + tail.size() - 10},  // "c"'s last bytes
      {0, 0, head.size(), head.data()},                            // inside the header probe
      {1, 3, 0, nullptr}};                                         // empty
  std::vector<std::atomic<int>> done(spans.size());
  auto stats = (*model)->ReadSpans(spans, [&](size_t i) { done[i].fetch_add(1); });
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (auto& d : done) EXPECT_EQ(d.load(), 1);
  EXPECT_EQ(window, a.substr(0, window.size()));
  EXPECT_EQ(tail.substr(0, tail.size() - 10), a.substr(window.size()) + b);
  EXPECT_EQ(tail.substr(tail.size() - 10), b.substr(b.size() - 10));
  EXPECT_EQ(head, file0.substr(0, 16));

  std::string dst(100, '\0');
  std::vector<ModelSpan> beyond = {{1, file1.size() - 50, 100, dst.data()}};
  auto refused = (*model)->ReadSpans(beyond);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("1.safetensors: bytes"));
  std::vector<ModelSpan> no_file = {{2, 0, 1, dst.data()}};
  EXPECT_EQ((*model)->ReadSpans(no_file).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace wharf::serve
