// The format registry: every builtin is listed with its suffixes, an unknown name lists the
// known ones, formats can be registered, and every registered format (a test-only one
// included) keeps the RecordReader contract: one record per written payload in the declared
// shape, increasing offsets, batches equal to single reads, and a reader reopened at any
// offset() or Record::offset continues exactly.
#include "formats/registry.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "formats/testing/record_objects.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/testing/temp_store.h"

namespace wharf {
namespace {

using store_testing::TempStore;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::vector<std::string> Names() {
  std::vector<std::string> out;
  for (const RecordFormatSpec* spec : RecordFormats()) out.push_back(spec->name);
  return out;
}

TEST(RegistryTest, ListsTheBuiltinsWithTheirSuffixes) {
  const std::vector<std::string> names = Names();
  ASSERT_GE(names.size(), 4u);
  EXPECT_THAT(std::vector<std::string>(names.begin(), names.begin() + 4),
              ElementsAre("tar", "tfrecord", "csv", "jsonl"));
  auto suffixes = [](const char* name) {
    auto spec = FindRecordFormat(name);
    EXPECT_TRUE(spec.ok()) << spec.status();
    return spec.ok() ? (*spec)->suffixes : std::vector<std::string>{};
  };
  EXPECT_THAT(suffixes("tar"), ElementsAre(".tar"));
  EXPECT_THAT(suffixes("tfrecord"), ElementsAre(".tfrecord", ".tfrecords"));
  EXPECT_THAT((*FindRecordFormat("tar"))->compressed_suffixes, ElementsAre(".tar.gz", ".tgz"));
  EXPECT_THAT((*FindRecordFormat("tfrecord"))->compressed_suffixes,
              ElementsAre(".tfrecord.gz", ".tfrecords.gz", ".tfrecord.zlib", ".tfrecords.zlib"));
  for (const char* name : {"csv", "jsonl"}) {
    EXPECT_TRUE((*FindRecordFormat(name))->compressed_suffixes.empty()) << name;
  }
  EXPECT_THAT(suffixes("csv"), ElementsAre(".csv"));
  EXPECT_THAT(suffixes("jsonl"), ElementsAre(".jsonl", ".json", ".ndjson"));
  EXPECT_EQ((*FindRecordFormat("tar"))->shape, RecordShape::kFields);
  for (const char* name : {"tfrecord", "csv", "jsonl"}) {
    EXPECT_EQ((*FindRecordFormat(name))->shape, RecordShape::kPayload) << name;
  }
  EXPECT_FALSE((*FindRecordFormat("tar"))->rows);
  EXPECT_FALSE((*FindRecordFormat("tfrecord"))->rows);
  EXPECT_TRUE((*FindRecordFormat("csv"))->rows);
  EXPECT_TRUE((*FindRecordFormat("jsonl"))->rows);
}

TEST(RegistryTest, AnUnknownNameListsEveryKnownFormat) {
  auto spec = FindRecordFormat("zip");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              StartsWith("record format \"zip\": expected \"tar\", \"tfrecord\", \"csv\""));
  for (const std::string& name : Names()) {
    EXPECT_THAT(spec.status().message(), HasSubstr(absl::StrCat("\"", name, "\"")));
  }
  TempStore tmp;
  auto reader = OpenRecordReader("zip", RecordObject{tmp.store(), "x.zip", std::nullopt}, {});
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status(), spec.status());
}

TEST(RegistryTest, RegisteringChecksTheNameAndTheOpener) {
  ASSERT_TRUE(formats_testing::RegisterTestFormat().ok());
  ASSERT_TRUE(formats_testing::RegisterTestFormat().ok());  // once only
  EXPECT_THAT(Names(), testing::Contains(std::string(formats_testing::kTestFormat)));
  const RecordFormatSpec* tar = *FindRecordFormat("tar");
  absl::Status s = RegisterRecordFormat({"tar", {".x"}, RecordShape::kPayload, false, tar->open});
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(s.message(), HasSubstr("\"tar\""));
  EXPECT_EQ(RegisterRecordFormat({"", {}, RecordShape::kPayload, false, tar->open}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RegisterRecordFormat({"no-opener", {}, RecordShape::kPayload, false, nullptr}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(FindRecordFormat("no-opener").ok());
}

// ---- The contract, on every registered format ----

std::vector<std::string> AllFormats() {
  EXPECT_TRUE(formats_testing::RegisterTestFormat().ok());
  return Names();
}

std::vector<std::string> Payloads() {
  std::vector<std::string> out;
  for (int i = 0; i < 12; ++i) {
    out.push_back(absl::StrCat("p", i, "-", std::string((i * 37) % 300, 'a' + i % 26)));
  }
  return out;
}

// A record as a comparable string.
std::string Describe(const Record& r) {
  std::string out = absl::StrCat(r.offset, ":", r.key, ":");
  for (const auto& [name, bytes] : r.fields)
    absl::StrAppend(&out, name, "=", std::string(bytes), ";");
  return out;
}

class FormatContractTest : public testing::TestWithParam<std::string> {
 protected:
  // The parameter: a format's name, or "<name>@<suffix>" for its object compressed as the
  // suffix says (".gz"/".tgz": gzip, ".zlib": zlib) and read by that name.
  void SetUp() override {
    ASSERT_TRUE(formats_testing::RegisterTestFormat().ok());
    const std::string param = GetParam();
    const size_t at = param.find('@');
    auto spec = FindRecordFormat(param.substr(0, at));
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *spec;
    auto object = formats_testing::EncodeRecords(spec_->name, Payloads(), spec_->rows);
    ASSERT_TRUE(object.ok()) << object.status();
    if (at == std::string::npos) {
      key_ = absl::StrCat("object", spec_->suffixes.empty() ? "" : spec_->suffixes.front());
    } else {
      key_ = absl::StrCat("object", param.substr(at + 1));
      *object = absl::Cord(formats_testing::Deflate(
          std::string(*object), absl::EndsWith(key_, ".zlib") ? formats_testing::Deflated::kZlib
                                                              : formats_testing::Deflated::kGzip));
    }
    ASSERT_TRUE(tmp_.store()->Put(key_, *object).ok());
  }

  std::unique_ptr<RecordReader> Open(uint64_t offset, size_t chunk = 97) {
    RecordReaderOptions o;
    o.io.chunk_size = chunk;  // records straddle chunks
    o.io.offset = offset;
    o.header = spec_->rows;
    auto r = OpenRecordReader(spec_->name, RecordObject{tmp_.store(), key_, std::nullopt}, o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }

  // Every record left, with the reader's offset() before each.
  static std::vector<std::string> ReadAll(RecordReader& r, std::vector<uint64_t>* offsets) {
    std::vector<std::string> out;
    while (true) {
      if (offsets != nullptr) offsets->push_back(r.offset());
      auto next = r.Next();
      EXPECT_TRUE(next.ok()) << next.status();
      if (!next.ok() || !next->has_value()) break;
      out.push_back(Describe(**next));
    }
    return out;
  }

  TempStore tmp_;
  const RecordFormatSpec* spec_ = nullptr;
  std::string key_;
};

TEST_P(FormatContractTest, OneRecordPerPayloadInTheDeclaredShape) {
  auto reader = Open(0);
  ASSERT_NE(reader, nullptr);
  const std::vector<std::string> payloads = Payloads();
  uint64_t last = 0;
  for (size_t i = 0; i < payloads.size(); ++i) {
    auto r = reader->Next();
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->has_value()) << "record " << i;
    const Record& rec = **r;
    if (i > 0) {
      EXPECT_GT(rec.offset, last);
    }
    last = rec.offset;
    if (spec_->shape == RecordShape::kPayload) {
      EXPECT_EQ(rec.key, "");
      ASSERT_EQ(rec.fields.size(), 1u);
      EXPECT_EQ(rec.fields[0].first, std::string(kDataField));
      ASSERT_NE(rec.Find(kDataField), nullptr);
      EXPECT_THAT(std::string(*rec.Find(kDataField)), HasSubstr(payloads[i]));
    } else {
      EXPECT_NE(rec.key, "");
      ASSERT_FALSE(rec.fields.empty());
      bool found = false;
      for (const auto& [name, bytes] : rec.fields) found |= bytes == payloads[i];
      EXPECT_TRUE(found) << "record " << i << " holds its payload in some field";
    }
  }
  auto end = reader->Next();
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_FALSE(end->has_value());
  EXPECT_EQ(reader->reader().uri(), tmp_.store()->Uri(key_));
  if (spec_->rows) {
    EXPECT_EQ(reader->header(), std::optional<std::string>("name,value"));
  }
}

TEST_P(FormatContractTest, BatchesHoldTheSameRecords) {
  auto one = Open(0);
  auto batched = Open(0);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(batched, nullptr);
  const std::vector<std::string> all = ReadAll(*one, nullptr);
  std::vector<std::string> got;
  while (true) {
    auto batch = batched->NextBatch(5);
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (batch->empty()) break;
    EXPECT_LE(batch->size(), 5u);
    for (const Record& r : *batch) got.push_back(Describe(r));
  }
  EXPECT_EQ(got, all);
}

TEST_P(FormatContractTest, ReopenedAtAnyOffsetItContinuesExactly) {
  auto reader = Open(0);
  ASSERT_NE(reader, nullptr);
  std::vector<uint64_t> offsets;
  const std::vector<std::string> all = ReadAll(*reader, &offsets);
  ASSERT_EQ(all.size(), Payloads().size());
  ASSERT_EQ(offsets.size(), all.size() + 1);
  for (size_t k = 0; k < offsets.size(); ++k) {
    SCOPED_TRACE(absl::StrCat("after ", k, " records, at byte ", offsets[k]));
    auto resumed = Open(offsets[k], /*chunk=*/61);
    ASSERT_NE(resumed, nullptr);
    EXPECT_EQ(resumed->offset(), offsets[k]);
    if (spec_->rows) {
      EXPECT_EQ(resumed->header(), std::optional<std::string>("name,value"));
    }
    EXPECT_EQ(ReadAll(*resumed, nullptr),
              std::vector<std::string>(all.begin() + static_cast<long>(k), all.end()));
  }
  // At a record's own offset: that record, then the rest.
  auto again = Open(0);
  ASSERT_NE(again, nullptr);
  for (size_t k = 0; k < all.size(); ++k) {
    auto r = again->Next();
    ASSERT_TRUE(r.ok() && r->has_value());
    auto resumed = Open((*r)->offset);
    ASSERT_NE(resumed, nullptr);
    EXPECT_EQ(ReadAll(*resumed, nullptr),
              std::vector<std::string>(all.begin() + static_cast<long>(k), all.end()));
  }
}

std::string ParamName(const testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Registered, FormatContractTest, testing::ValuesIn(AllFormats()),
                         ParamName);
// Compressed objects keep the contract too, offsets counting decompressed bytes.
INSTANTIATE_TEST_SUITE_P(Compressed, FormatContractTest,
                         testing::Values("tar@.tar.gz", "tar@.tgz", "tfrecord@.tfrecord.gz",
                                         "tfrecord@.tfrecords.zlib"),
                         ParamName);

}  // namespace
}  // namespace wharf
