#include "formats/tfrecord.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "formats/testing/record_objects.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/testing/temp_store.h"

namespace wharf {
namespace {

using store_testing::TempStore;

std::vector<std::string> SomeRecords() {
  std::mt19937 rng(3);
  std::vector<std::string> records = {"", "a", std::string(100'000, 'z')};
  for (int i = 0; i < 200; ++i) {
    std::string r(rng() % 3000, '\0');
    for (auto& c : r) c = static_cast<char>(rng());
    records.push_back(std::move(r));
  }
  return records;
}

absl::Status WriteFile(const std::shared_ptr<ObjectStore>& store, const std::string& key,
                       const std::vector<std::string>& records) {
  auto writer = TFRecordWriter::Open(store, key, {.buffer_bytes = 10'000});
  if (!writer.ok()) return writer.status();
  for (const auto& r : records) {
    if (absl::Status s = (*writer)->Write(r); !s.ok()) return s;
  }
  return (*writer)->Close().status();
}

// Reads every record; returns them and the first error.
std::pair<std::vector<TFRecord>, absl::Status> ReadFile(const std::shared_ptr<ObjectStore>& store,
                                                        const std::string& key,
                                                        uint64_t chunk_size = 4096) {
  std::vector<TFRecord> out;
  TFRecordReaderOptions options;
  options.io.chunk_size = chunk_size;
  auto reader = TFRecordReader::Open(store, key, options);
  if (!reader.ok()) return {out, reader.status()};
  while (true) {
    auto record = (*reader)->Next();
    if (!record.ok()) return {out, record.status()};
    if (!*record) return {out, absl::OkStatus()};
    out.push_back(**std::move(record));
  }
}

TEST(TFRecordTest, WriterAndReaderRoundTripAtManyChunkSizes) {
  TempStore tmp;
  const auto records = SomeRecords();
  ASSERT_TRUE(WriteFile(tmp.store(), "x.tfrecord", records).ok());
  for (uint64_t chunk : {1ul, 13ul, 4096ul, uint64_t{8} << 20}) {
    if (chunk == 1) {  // one-byte GETs: only a short prefix of the file
      auto reader = TFRecordReader::Open(tmp.store(), "x.tfrecord",
                                         {.io = {.chunk_size = 1, .read_ahead = 8}});
      ASSERT_TRUE(reader.ok());
      for (int i = 0; i < 2; ++i) {
        auto r = (*reader)->Next();
        ASSERT_TRUE(r.ok() && r->has_value()) << r.status();
        EXPECT_EQ(std::string((*r)->data), records[i]);
      }
      continue;
    }
    auto [got, status] = ReadFile(tmp.store(), "x.tfrecord", chunk);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_EQ(got.size(), records.size());
    uint64_t offset = 0;
    for (size_t i = 0; i < records.size(); ++i) {
      EXPECT_EQ(std::string(got[i].data), records[i]) << i;
      EXPECT_EQ(got[i].offset, offset);
      offset += 16 + records[i].size();
    }
  }
}

TEST(TFRecordTest, FramingMatchesTheFormat) {
  absl::Cord framed;
  AppendTFRecord(absl::Cord("abc"), &framed);
  const std::string s(framed);
  ASSERT_EQ(s.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(s.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  auto le32 = [&](size_t at) {
    return static_cast<uint32_t>(static_cast<unsigned char>(s[at])) |
           static_cast<uint32_t>(static_cast<unsigned char>(s[at + 1])) << 8 |
           static_cast<uint32_t>(static_cast<unsigned char>(s[at + 2])) << 16 |
           static_cast<uint32_t>(static_cast<unsigned char>(s[at + 3])) << 24;
  };
  EXPECT_EQ(le32(8), MaskCrc32c(Crc32c(s.substr(0, 8))));
  EXPECT_EQ(s.substr(12, 3), "abc");
  EXPECT_EQ(le32(15), MaskCrc32c(Crc32c("abc")));
}

class TFRecordCorruptionTest : public testing::Test {
 protected:
  void SetUp() override {
    records_ = {"first record", std::string(5000, 'q'), "third"};
    for (const auto& r : records_) AppendTFRecord(absl::Cord(r), &file_);
    second_ = 16 + records_[0].size();
  }
  // Stores the file with `edit` applied, reads it, returns the status of the first failure
  // and checks the records before it came back intact.
  absl::Status ReadEdited(const std::string& bytes, size_t good_records) {
    EXPECT_TRUE(tmp_.store()->Put("x.tfrecord", absl::Cord(bytes)).ok());
    auto [got, status] = ReadFile(tmp_.store(), "x.tfrecord", 1000);
    EXPECT_EQ(got.size(), good_records);
    return status;
  }
  std::string Prefix() const {
    return absl::StrCat("read tfrecord ", tmp_.store()->Uri("x.tfrecord"), " at byte ");
  }

  TempStore tmp_;
  std::vector<std::string> records_;
  absl::Cord file_;
  size_t second_ = 0;
};

TEST_F(TFRecordCorruptionTest, AFlippedDataByteIsADataCrcError) {
  std::string bytes(file_);
  bytes[second_ + 12 + 4321] ^= 1;
  const absl::Status status = ReadEdited(bytes, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(
      absl::StartsWith(status.message(), absl::StrCat(Prefix(), second_, ": data CRC mismatch")))
      << status;
}

TEST_F(TFRecordCorruptionTest, AFlippedLengthByteIsALengthCrcError) {
  std::string bytes(file_);
  bytes[second_ + 1] ^= 0x10;
  const absl::Status status = ReadEdited(bytes, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(
      absl::StartsWith(status.message(), absl::StrCat(Prefix(), second_, ": length CRC mismatch")))
      << status;
  // A flipped length CRC byte reads the same.
  bytes = std::string(file_);
  bytes[second_ + 9] ^= 0x01;
  EXPECT_TRUE(absl::StrContains(ReadEdited(bytes, 1).message(), "length CRC mismatch"));
  // So does a flipped data CRC byte, as a data CRC error.
  bytes = std::string(file_);
  bytes[second_ + 12 + records_[1].size() + 2] ^= 0x01;
  EXPECT_TRUE(absl::StrContains(ReadEdited(bytes, 1).message(), "data CRC mismatch"));
}

TEST_F(TFRecordCorruptionTest, TruncationAnywhereIsAnError) {
  const std::string bytes(file_);
  const size_t third = second_ + 16 + records_[1].size();
  for (size_t cut : {second_ + 5, second_ + 12, second_ + 100, third - 1}) {
    const absl::Status status = ReadEdited(bytes.substr(0, cut), 1);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << cut;
    EXPECT_TRUE(
        absl::StartsWith(status.message(), absl::StrCat(Prefix(), second_, ": truncated record")))
        << status;
  }
  // Cut exactly at a record boundary: a shorter, valid file.
  EXPECT_TRUE(ReadEdited(bytes.substr(0, third), 2).ok());
}

TEST_F(TFRecordCorruptionTest, OversizedRecordsAreRefusedBeforeAllocation) {
  ASSERT_TRUE(tmp_.store()->Put("x.tfrecord", file_).ok());
  auto reader = TFRecordReader::Open(tmp_.store(), "x.tfrecord", {.max_record_bytes = 100});
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE((*reader)->Next().ok());
  auto second = (*reader)->Next();
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_EQ((*reader)->Next().status(), second.status());  // sticky
}

TEST(TFRecordTest, ReadsFromAGivenRecordOffset) {
  TempStore tmp;
  const auto records = SomeRecords();
  ASSERT_TRUE(WriteFile(tmp.store(), "x.tfrecord", records).ok());
  const uint64_t third = 16 * 2 + records[0].size() + records[1].size();
  auto io = ObjectReader::Open(tmp.store(), "x.tfrecord", {.chunk_size = 777, .offset = third});
  ASSERT_TRUE(io.ok());
  TFRecordReader reader(ByteStream::Stored(*std::move(io)));
  auto r = reader.Next();
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->offset, third);
  EXPECT_EQ(std::string((*r)->data), records[2]);
}

// ---- Compressed files, as tf.data's TFRecordOptions(compression_type=...) writes them ----

using formats_testing::Deflate;
using formats_testing::Deflated;

std::string FileBytes(const std::shared_ptr<ObjectStore>& store, const std::string& key) {
  auto bytes = store->Read(key);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? std::string(*bytes) : "";
}

TEST(TFRecordTest, ReadsGzipAndZlibFilesByNameOrByOption) {
  TempStore tmp;
  const auto records = SomeRecords();
  ASSERT_TRUE(WriteFile(tmp.store(), "plain.tfrecord", records).ok());
  const std::string plain = FileBytes(tmp.store(), "plain.tfrecord");
  for (const auto& [key, bytes] : std::vector<std::pair<std::string, std::string>>{
           {"x.tfrecord.gz", Deflate(plain, Deflated::kGzip)},
           {"x.tfrecord.zlib", Deflate(plain, Deflated::kZlib)},
       }) {
    ASSERT_TRUE(tmp.store()->Put(key, absl::Cord(bytes)).ok());
    for (uint64_t chunk : {1ul, 13ul, 4096ul, uint64_t{8} << 20}) {
      auto [got, status] = ReadFile(tmp.store(), key, chunk);
      ASSERT_TRUE(status.ok()) << key << " chunk " << chunk << ": " << status;
      ASSERT_EQ(got.size(), records.size());
      uint64_t offset = 0;
      for (size_t i = 0; i < records.size(); ++i) {
        EXPECT_EQ(std::string(got[i].data), records[i]) << i;
        EXPECT_EQ(got[i].offset, offset);  // offsets in the decompressed stream
        offset += 16 + records[i].size();
      }
    }
  }
  // tf.data names no suffix: the option says it.
  ASSERT_TRUE(tmp.store()->Put("data-00000", absl::Cord(Deflate(plain, Deflated::kZlib))).ok());
  TFRecordReaderOptions options;
  options.compression = Compression::kZlib;
  auto reader = TFRecordReader::Open(tmp.store(), "data-00000", options);
  ASSERT_TRUE(reader.ok());
  size_t n = 0;
  while (true) {
    auto r = (*reader)->Next();
    ASSERT_TRUE(r.ok()) << r.status();
    if (!*r) break;
    EXPECT_EQ(std::string((*r)->data), records[n++]);
  }
  EXPECT_EQ(n, records.size());
  EXPECT_TRUE((*reader)->stream().compressed());
}

TEST(TFRecordTest, ACompressedFileReadAsPlainNamesItsCompression) {
  TempStore tmp;
  const auto records = SomeRecords();
  ASSERT_TRUE(WriteFile(tmp.store(), "plain.tfrecord", records).ok());
  const std::string plain = FileBytes(tmp.store(), "plain.tfrecord");
  ASSERT_TRUE(tmp.store()->Put("g.tfrecord", absl::Cord(Deflate(plain, Deflated::kGzip))).ok());
  ASSERT_TRUE(tmp.store()->Put("z.tfrecord", absl::Cord(Deflate(plain, Deflated::kZlib))).ok());
  auto [got, status] = ReadFile(tmp.store(), "g.tfrecord");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(),
              testing::HasSubstr("starts like a GZIP stream, not a TFRecord frame"));
  EXPECT_THAT(status.message(), testing::HasSubstr("compression_type=\"GZIP\""));
  std::tie(got, status) = ReadFile(tmp.store(), "z.tfrecord");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), testing::HasSubstr("ZLIB"));
  ASSERT_TRUE(tmp.store()->Put("b.tfrecord", absl::Cord("BZh91AY&SY" + plain)).ok());
  std::tie(got, status) = ReadFile(tmp.store(), "b.tfrecord");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
  EXPECT_THAT(status.message(), testing::HasSubstr("bzip2-compressed"));
}

TEST(TFRecordTest, CompressedFilesResumeAtADecompressedOffsetAndReportDamage) {
  TempStore tmp;
  const auto records = SomeRecords();
  ASSERT_TRUE(WriteFile(tmp.store(), "plain.tfrecord", records).ok());
  const std::string plain = FileBytes(tmp.store(), "plain.tfrecord");
  const std::string gz = Deflate(plain, Deflated::kGzip);
  ASSERT_TRUE(tmp.store()->Put("x.tfrecord.gz", absl::Cord(gz)).ok());
  const uint64_t third = 16 * 2 + records[0].size() + records[1].size();
  TFRecordReaderOptions options;
  options.io.chunk_size = 777;
  options.io.offset = third;
  auto reader = TFRecordReader::Open(tmp.store(), "x.tfrecord.gz", options);
  ASSERT_TRUE(reader.ok());
  auto r = (*reader)->Next();
  ASSERT_TRUE(r.ok() && r->has_value()) << r.status();
  EXPECT_EQ((*r)->offset, third);
  EXPECT_EQ(std::string((*r)->data), records[2]);

  // Cut: the frames end early (the stream is cut short) or inside a frame.
  ASSERT_TRUE(tmp.store()->Put("cut.tfrecord.gz", absl::Cord(gz.substr(0, gz.size() / 2))).ok());
  auto [got, status] = ReadFile(tmp.store(), "cut.tfrecord.gz");
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), testing::HasSubstr("gzip stream is cut short"));
  EXPECT_LT(got.size(), records.size());
  const std::string cut_frame = Deflate(plain.substr(0, third + 20), Deflated::kGzip);
  ASSERT_TRUE(tmp.store()->Put("frame.tfrecord.gz", absl::Cord(cut_frame)).ok());
  std::tie(got, status) = ReadFile(tmp.store(), "frame.tfrecord.gz");
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(),
              testing::HasSubstr(absl::StrCat(" at byte ", third, ": truncated record")));
  EXPECT_THAT(status.message(), testing::HasSubstr("the gzip-decompressed stream ends at byte"));
  EXPECT_EQ(got.size(), 2u);
}

TEST(TFRecordTest, AnAbandonedWriterLeavesNothing) {
  TempStore tmp;
  {
    auto writer = TFRecordWriter::Open(tmp.store(), "y.tfrecord");
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Write("x").ok());
  }
  EXPECT_EQ(tmp.store()->Head("y.tfrecord").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace wharf
