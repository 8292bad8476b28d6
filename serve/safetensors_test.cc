// The safetensors header parser: well-formed headers give every tensor's place; each kind of
// malformed header is refused with an error naming the file and, where there is one, the
// tensor.
#include "serve/safetensors.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wharf::serve {
namespace {

using ::testing::HasSubstr;

// A file: the length prefix, `json`, then `data_bytes` bytes of data.
std::string File(const std::string& json, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json + std::string(data_bytes, 'x');
}

absl::StatusOr<SafetensorsHeader> Parse(const std::string& file) {
  return ParseSafetensors(file, file.size(), "s3://b/m.safetensors");
}

TEST(Safetensors, ParsesTensorsSortedByNameWithAbsoluteOffsets) {
  const std::string json = R"({"b":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                           R"("a":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},)"
                           R"("e":{"dtype":"I64","shape":[0,5],"data_offsets":[32,32]},)"
                           R"("s":{"dtype":"U8","shape":[],"data_offsets":[32,33]},)"
                           R"("__metadata__":{"format":"pt"}}  )";
  auto h = Parse(File(json, 33));
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->tensors.size(), 4u);
  EXPECT_EQ(h->data_start, 8 + json.size());
  EXPECT_EQ(h->tensors[0].name, "a");
  EXPECT_EQ(h->tensors[0].offset, h->data_start + 24);
  EXPECT_EQ(h->tensors[0].size, 8u);
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->tensors[1].shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(h->tensors[2].size, 0u);
  EXPECT_EQ(h->tensors[3].size, 1u);  // a scalar
  EXPECT_EQ(h->metadata.at("format"), "pt");
}

TEST(Safetensors, KnowsEveryDtypeOfTheFormat) {
  EXPECT_EQ(SafetensorsDtypeBits("F32"), 32);
  EXPECT_EQ(SafetensorsDtypeBits("BF16"), 16);
  EXPECT_EQ(SafetensorsDtypeBits("F8_E4M3"), 8);
  EXPECT_EQ(SafetensorsDtypeBits("F4"), 4);
  EXPECT_EQ(SafetensorsDtypeBits("C64"), 64);
  EXPECT_EQ(SafetensorsDtypeBits("f32"), 0);
  EXPECT_EQ(SafetensorsDtypeBits("Q4_K"), 0);
}

struct Bad {
  std::string name;
  std::string file;
  std::string says;
};

TEST(Safetensors, RefusesMalformedHeadersNamingFileAndTensor) {
  const std::string t = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::string huge_len(8, '\xff');
  std::vector<Bad> cases = {
      {"too short", "abc", "shorter than the 8-byte header length"},
      {"length past the end", huge_len + "{}", "beyond the end of the file"},
      {"not json", File("{nope", 0), "not valid JSON"},
      {"not an object", File("[1,2]", 0), "does not begin with '{'"},
      {"leading space", File(" {}", 0), "does not begin with '{'"},
      {"garbage after a NUL", File(std::string("{}") + '\0' + "GARBAGE{{{", 0), "NUL byte"},
      {"two metadata", File(R"({"__metadata__":{},"__metadata__":{}})", 0), "two __metadata__"},
      {"unknown dtype", File(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]}})", 2),
       "tensor 'w': unknown dtype 'Q4'"},
      {"size mismatch", File(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "tensor 'w': shape and dtype give 12 bytes"},
      {"out of range", File("{" + t + "}", 4), "tensor 'w': data_offsets [0, 8) go past"},
      {"backwards", File(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[5,0]}})", 8),
       "run backwards"},
      {"overlap", File("{" + t + R"(,"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
       "overlap tensor"},
      {"gap", File("{" + t + R"(,"v":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16),
       "tensor 'v': its data_offsets start 4 bytes after tensor 'w' ends"},
      {"gap at the start", File(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2),
       "tensor 'w': its data_offsets start 1 bytes after the data's start"},
      {"trailing bytes", File("{" + t + "}", 9), "1 bytes follow the last tensor's data"},
      {"empty tensor inside another",
       File("{" + t + R"(,"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})", 8),
       "overlap tensor"},
      {"negative shape", File(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0),
       "tensor 'w': \"shape\""},
      {"shape overflow",
       File(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
       "overflows"},
      {"no offsets", File(R"({"w":{"dtype":"U8","shape":[1]}})", 1), "data_offsets"},
      {"metadata not strings", File(R"({"__metadata__":{"a":1}})", 0), "__metadata__ 'a'"},
      {"sub-byte remainder", File(R"({"w":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})", 1),
       "not whole bytes"},
  };
  for (const Bad& c : cases) {
    auto h = Parse(c.file);
    ASSERT_FALSE(h.ok()) << c.name;
    EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss) << c.name;
    EXPECT_THAT(h.status().message(), HasSubstr("s3://b/m.safetensors")) << c.name;
    EXPECT_THAT(h.status().message(), HasSubstr(c.says)) << c.name << ": " << h.status();
  }
}

// `n` one-byte U8 tensors "t<i>" in order, plus `extra` (a JSON member, or "") after them.
std::string ManyTensors(int n, const std::string& extra) {
  std::string json = "{";
  for (int i = 0; i < n; ++i) {
    absl::StrAppend(&json, i > 0 ? "," : "", "\"t", i, R"(":{"dtype":"U8","shape":[1],)",
                    R"("data_offsets":[)", i, ",", i + 1, "]}");
  }
  return absl::StrCat(json, extra, "}");
}

TEST(Safetensors, FindsNamesAndFieldsGivenTwiceInAHeaderOfManyTensors) {
  // 50,000 entries: the check of names given twice is linear (the JSON parser's callback form
  // was quadratic here: minutes for 32,000 tensors).
  constexpr int kN = 50000;
  auto h = Parse(File(ManyTensors(kN, ""), kN));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->tensors.size(), static_cast<size_t>(kN));

  auto twice =
      Parse(File(ManyTensors(kN, R"(,"t7":{"dtype":"U8","shape":[1],"data_offsets":[0,1]})"), kN));
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(twice.status().message(), HasSubstr("tensor 't7': the header names it twice"));

  auto field = Parse(File(
      ManyTensors(kN, R"(,"u":{"dtype":"U8","shape":[1],"shape":[1],"data_offsets":[0,1]})"), kN));
  ASSERT_FALSE(field.ok());
  EXPECT_THAT(field.status().message(), HasSubstr("tensor 'u': its entry gives 'shape' twice"));

  // Keys deeper down (objects in arrays, the metadata's own fields) are not a tensor's fields.
  auto deep = Parse(File(R"({"__metadata__":{"a":"1","b":"2"},)"
                         R"("w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],)"
                         R"("x":[{"k":1},{"k":2}]}})",
                         1));
  EXPECT_TRUE(deep.ok()) << deep.status();
}

TEST(Safetensors, AcceptsNullMetadataAndTrailingSpaces) {
  // As safetensors does: "__metadata__": null is no metadata; the header may be padded.
  auto h = Parse(
      File(R"({"__metadata__":null,"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}   )", 1));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->metadata.empty());
  EXPECT_EQ(h->tensors.size(), 1u);
}

TEST(Safetensors, IndexMapsEachTensorToItsFile) {
  auto index = ParseSafetensorsIndex(
      R"({"metadata":{},"weight_map":{"a":"m-1.safetensors","b":"m-2.safetensors","c":"m-1.safetensors"}})",
      "s3://b/m.index.json");
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->files, (std::vector<std::string>{"m-1.safetensors", "m-2.safetensors"}));
  EXPECT_EQ(index->weight_map.at("b"), "m-2.safetensors");
  EXPECT_EQ(index->weight_map.size(), 3u);
}

TEST(Safetensors, AcceptsEmptyTensorsAtTheBoundaries) {
  // As the reference library: an empty tensor at a boundary (the start, between two
  // tensors, the end) shares no byte.
  auto h = Parse(File(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
                      R"("w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                      R"("b":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},)"
                      R"("v":{"dtype":"U8","shape":[1],"data_offsets":[2,3]},)"
                      R"("z":{"dtype":"U8","shape":[0],"data_offsets":[3,3]}})",
                      3));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->tensors.size(), 5u);
}

}  // namespace
}  // namespace wharf::serve
