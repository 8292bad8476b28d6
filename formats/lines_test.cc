#include "formats/lines.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/testing/temp_store.h"

namespace wharf {
namespace {

using store_testing::TempStore;

using testing::ElementsAre;

std::vector<std::string> ReadRows(const std::shared_ptr<ObjectStore>& store, const std::string& key,
                                  LineReaderOptions options, absl::Status* status = nullptr,
                                  std::optional<std::string>* header = nullptr) {
  std::vector<std::string> rows;
  auto reader = LineReader::Open(store, key, options);
  if (!reader.ok()) {
    if (status != nullptr) *status = reader.status();
    return rows;
  }
  if (header != nullptr) *header = (*reader)->header();
  while (true) {
    auto row = (*reader)->Next();
    if (!row.ok()) {
      if (status != nullptr) *status = row.status();
      return rows;
    }
    if (!*row) break;
    EXPECT_EQ((*row)->number, rows.size());
    rows.push_back((*row)->text);
  }
  if (status != nullptr) *status = absl::OkStatus();
  return rows;
}

LineReaderOptions Csv(uint64_t chunk, bool header = false) {
  LineReaderOptions options;
  options.io.chunk_size = chunk;
  options.format = LineFormat::kCsv;
  options.header = header;
  return options;
}

LineReaderOptions Jsonl(uint64_t chunk) {
  LineReaderOptions options;
  options.io.chunk_size = chunk;
  return options;
}

TEST(LinesTest, JsonLinesWithCrlfAndNoFinalNewline) {
  TempStore tmp;
  ASSERT_TRUE(tmp.store()
                  ->Put("a.jsonl", absl::Cord("{\"a\":1}\r\n{\"b\":\"x\\ny\"}\n\r\n{\"c\":3}"))
                  .ok());
  for (uint64_t chunk : {1ul, 2ul, 3ul, 5ul, 8ul, 1024ul}) {
    EXPECT_THAT(ReadRows(tmp.store(), "a.jsonl", Jsonl(chunk)),
                ElementsAre("{\"a\":1}", "{\"b\":\"x\\ny\"}", "", "{\"c\":3}"))
        << chunk;
  }
  LineReaderOptions skip = Jsonl(4);
  skip.skip_empty_rows = true;
  EXPECT_THAT(ReadRows(tmp.store(), "a.jsonl", skip),
              ElementsAre("{\"a\":1}", "{\"b\":\"x\\ny\"}", "{\"c\":3}"));
  // A final newline adds no empty row; an empty object has no rows.
  ASSERT_TRUE(tmp.store()->Put("b.jsonl", absl::Cord("1\n2\n")).ok());
  EXPECT_THAT(ReadRows(tmp.store(), "b.jsonl", Jsonl(3)), ElementsAre("1", "2"));
  ASSERT_TRUE(tmp.store()->Put("empty.jsonl", absl::Cord()).ok());
  EXPECT_TRUE(ReadRows(tmp.store(), "empty.jsonl", Jsonl(3)).empty());
  ASSERT_TRUE(tmp.store()->Put("nl.jsonl", absl::Cord("\n")).ok());
  EXPECT_THAT(ReadRows(tmp.store(), "nl.jsonl", Jsonl(3)), ElementsAre(""));
  // skip_blank_rows (what JSON lines records use): whitespace-only rows hold no value.
  ASSERT_TRUE(tmp.store()->Put("blank.jsonl", absl::Cord("1\n\n \t\n2\r\n  \r\n 3 \n")).ok());
  LineReaderOptions blank = Jsonl(2);
  blank.skip_blank_rows = true;
  EXPECT_THAT(ReadRows(tmp.store(), "blank.jsonl", blank), ElementsAre("1", "2", " 3 "));
}

TEST(LinesTest, CsvQuotedNewlinesStayInTheirRowAndTheHeaderIsSeparate) {
  TempStore tmp;
  const std::string csv =
      "id,text,n\r\n"
      "1,\"line one\nline two\",3\r\n"
      "2,\"has \"\"quotes\"\" and, commas\",4\r\n"
      "3,\"crlf inside\r\nquotes\",5\n"
      "4,plain\"quote,6\n"
      "5,\"\",7";
  ASSERT_TRUE(tmp.store()->Put("a.csv", absl::Cord(csv)).ok());
  for (uint64_t chunk : {1ul, 2ul, 7ul, 16ul, 4096ul}) {
    std::optional<std::string> header;
    absl::Status status;
    auto rows = ReadRows(tmp.store(), "a.csv", Csv(chunk, true), &status, &header);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(header, "id,text,n");
    EXPECT_THAT(rows,
                ElementsAre("1,\"line one\nline two\",3", "2,\"has \"\"quotes\"\" and, commas\",4",
                            "3,\"crlf inside\r\nquotes\",5", "4,plain\"quote,6", "5,\"\",7"))
        << chunk;
  }
  auto fields = SplitCsvFields("3,\"crlf inside\r\nquotes\",5");
  ASSERT_TRUE(fields.ok());
  EXPECT_THAT(*fields, ElementsAre("3", "crlf inside\r\nquotes", "5"));
}

// A random CSV: fields with quotes, doubled quotes, delimiters, LF and CRLF inside quotes, and
// CRLF or LF row ends. Returns the object and the expected fields per row.
std::string RandomCsv(std::mt19937& rng, int rows, std::vector<std::vector<std::string>>* want) {
  const std::vector<std::string> pieces = {"a", "bc", ",", "\"", "\n", "\r\n", " ", "xyz", "\t"};
  std::string out;
  for (int r = 0; r < rows; ++r) {
    std::vector<std::string> fields;
    bool quoted = false;
    const int nf = 1 + rng() % 5;
    for (int f = 0; f < nf; ++f) {
      std::string value;
      const int np = rng() % 4;
      for (int p = 0; p < np; ++p) value += pieces[rng() % pieces.size()];
      const bool needs_quotes = value.find_first_of(",\"\r\n") != std::string::npos;
      if (f > 0) out += ',';
      if (needs_quotes || rng() % 4 == 0) {
        quoted = true;
        out += '"';
        for (char c : value) {
          if (c == '"') out += '"';
          out += c;
        }
        out += '"';
      } else {
        out += value;
      }
      fields.push_back(value);
    }
    // An unquoted lone empty field would be an empty line: keep rows non-empty.
    if (nf == 1 && fields[0].empty() && !quoted) out += "\"\"";
    want->push_back(fields);
    if (r + 1 < rows || rng() % 2 == 0) out += rng() % 2 ? "\r\n" : "\n";
  }
  return out;
}

TEST(LinesTest, CsvRowsAreTheSameForEveryChunkSize) {
  TempStore tmp;
  std::mt19937 rng(11);
  std::vector<std::vector<std::string>> want;
  const std::string csv = RandomCsv(rng, 150, &want);
  ASSERT_TRUE(tmp.store()->Put("r.csv", absl::Cord(csv)).ok());
  std::vector<std::string> reference;
  for (uint64_t chunk = 1; chunk <= 64; ++chunk) {
    LineReaderOptions options = Csv(chunk);
    options.io.read_ahead = 1 + chunk % 4;
    absl::Status status;
    auto rows = ReadRows(tmp.store(), "r.csv", options, &status);
    ASSERT_TRUE(status.ok()) << chunk << ": " << status;
    if (chunk == 1) {
      reference = rows;
      ASSERT_EQ(rows.size(), want.size());
      for (size_t i = 0; i < rows.size(); ++i) {
        auto fields = SplitCsvFields(rows[i]);
        ASSERT_TRUE(fields.ok()) << fields.status() << " in row " << i;
        EXPECT_EQ(*fields, want[i]) << "row " << i;
      }
    } else {
      ASSERT_EQ(rows, reference) << "chunk size " << chunk;
    }
  }
}

TEST(LinesTest, BatchesCarryOffsetsAndNumbers) {
  TempStore tmp;
  ASSERT_TRUE(tmp.store()->Put("b.csv", absl::Cord("h\nr0\nr1\nr2\nr3\nr4")).ok());
  auto reader = LineReader::Open(tmp.store(), "b.csv", Csv(3, true));
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->header(), "h");
  auto batch = (*reader)->NextBatch(2);
  ASSERT_TRUE(batch.ok());
  ASSERT_EQ(batch->size(), 2u);
  EXPECT_EQ(batch->row(0), "r0");
  EXPECT_EQ(batch->row(1), "r1");
  EXPECT_EQ(batch->offsets, (std::vector<uint64_t>{2, 5}));
  EXPECT_EQ(batch->first_number, 0u);
  auto row = (*reader)->Next();
  ASSERT_TRUE(row.ok() && row->has_value());
  EXPECT_EQ((*row)->text, "r2");
  EXPECT_EQ((*row)->offset, 8u);
  EXPECT_EQ((*row)->number, 2u);
  batch = (*reader)->NextBatch(10);
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(batch->size(), 2u);
  EXPECT_EQ(batch->first_number, 3u);
  EXPECT_EQ(batch->row(1), "r4");
  batch = (*reader)->NextBatch(10);
  ASSERT_TRUE(batch.ok());
  EXPECT_TRUE(batch->empty());
  EXPECT_EQ((*reader)->stats().rows, 5u);
}

TEST(LinesTest, ALargeObjectStreamsInBoundedMemory) {
  TempStore tmp;
  std::string data;
  std::mt19937 rng(5);
  size_t longest = 0, rows = 0;
  while (data.size() < (6u << 20)) {
    const size_t n = rng() % 300;
    std::string row = absl::StrCat(rows++, ",\"", std::string(n, 'v'), "\n", "\"");
    longest = std::max(longest, row.size());
    data += row + "\n";
  }
  ASSERT_TRUE(tmp.store()->Put("big.csv", absl::Cord(data)).ok());
  LineReaderOptions options = Csv(4096);
  options.io.read_ahead = 3;
  auto reader = LineReader::Open(tmp.store(), "big.csv", options);
  ASSERT_TRUE(reader.ok());
  size_t got = 0, bytes = 0;
  while (true) {
    auto batch = (*reader)->NextBatch(1000);
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (batch->empty()) break;
    got += batch->size();
    bytes += batch->data.size() + batch->size();
  }
  EXPECT_EQ(got, rows);
  EXPECT_EQ(bytes, data.size());
  const LineReaderStats stats = (*reader)->stats();
  EXPECT_LE(stats.peak_buffered_bytes, 4 * 4096 + longest);
  EXPECT_GT(stats.io.requests, data.size() / 4096);
}

TEST(LinesTest, UnbalancedQuotesAndOverlongRowsAreErrorsWithOffsets) {
  TempStore tmp;
  ASSERT_TRUE(tmp.store()->Put("u.csv", absl::Cord("a,b\nc,\"open\nd,e\n")).ok());
  absl::Status status;
  auto rows = ReadRows(tmp.store(), "u.csv", Csv(5), &status);
  EXPECT_THAT(rows, ElementsAre("a,b"));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StartsWith(
      status.message(), absl::StrCat("read csv ", tmp.store()->Uri("u.csv"), " at byte 4: ")))
      << status;

  ASSERT_TRUE(tmp.store()->Put("long.jsonl", absl::Cord("short\n" + std::string(5000, 'x'))).ok());
  LineReaderOptions options = Jsonl(100);
  options.max_row_bytes = 1000;
  rows = ReadRows(tmp.store(), "long.jsonl", options, &status);
  EXPECT_THAT(rows, ElementsAre("short"));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(status.message(), "long.jsonl at byte 6: row exceeds")) << status;

  rows = ReadRows(tmp.store(), "missing.csv", Csv(5), &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(status.message(), tmp.store()->Uri("missing.csv")));
}

TEST(LinesTest, AUtf8ByteOrderMarkIsDroppedAndUtf16IsRefused) {
  TempStore tmp;
  ASSERT_TRUE(tmp.store()
                  ->Put("bom.csv", absl::Cord("\xef\xbb\xbf"
                                              "a,b\n1,2\n"))
                  .ok());
  ASSERT_TRUE(tmp.store()->Put("bomq.csv", absl::Cord("\xef\xbb\xbf\"a\nx\",b\n1,2")).ok());
  ASSERT_TRUE(tmp.store()->Put("bom.jsonl", absl::Cord("\xef\xbb\xbf{\"a\":1}\n")).ok());
  ASSERT_TRUE(tmp.store()->Put("only.csv", absl::Cord("\xef\xbb\xbf")).ok());
  ASSERT_TRUE(tmp.store()->Put("short.csv", absl::Cord("\xef\xbb")).ok());
  for (uint64_t chunk : {1ul, 2ul, 3ul, 4ul, 4096ul}) {
    SCOPED_TRACE(chunk);
    std::optional<std::string> header;
    absl::Status status;
    EXPECT_THAT(ReadRows(tmp.store(), "bom.csv", Csv(chunk, true), &status, &header),
                ElementsAre("1,2"));
    EXPECT_EQ(header, "a,b");
    EXPECT_THAT(ReadRows(tmp.store(), "bom.csv", Csv(chunk)), ElementsAre("a,b", "1,2"));
    EXPECT_THAT(ReadRows(tmp.store(), "bomq.csv", Csv(chunk, true), &status, &header),
                ElementsAre("1,2"));
    EXPECT_EQ(header, "\"a\nx\",b");
    EXPECT_THAT(ReadRows(tmp.store(), "bom.jsonl", Jsonl(chunk)), ElementsAre("{\"a\":1}"));
    EXPECT_TRUE(ReadRows(tmp.store(), "only.csv", Csv(chunk), &status).empty());
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_THAT(ReadRows(tmp.store(), "short.csv", Csv(chunk)), ElementsAre("\xef\xbb"));
  }
  // The first row starts after the mark: offsets stay resume points.
  auto reader = LineReader::Open(tmp.store(), "bom.csv", Csv(2));
  ASSERT_TRUE(reader.ok());
  auto row = (*reader)->Next();
  ASSERT_TRUE(row.ok() && row->has_value());
  EXPECT_EQ((*row)->offset, 3u);

  ASSERT_TRUE(tmp.store()
                  ->Put("u16.csv", absl::Cord("\xff\xfe"
                                              "a\0,\0b\0"))
                  .ok());
  absl::Status status;
  EXPECT_TRUE(ReadRows(tmp.store(), "u16.csv", Csv(3), &status).empty());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "UTF-16 or UTF-32 byte-order mark")) << status;
}

TEST(LinesTest, ACompressedObjectIsRefusedNotReadAsRows) {
  // A .csv.gz / .jsonl.gz read as text came back as rows of gzip bytes, without an error.
  TempStore tmp;
  ASSERT_TRUE(tmp.store()
                  ->Put("a.jsonl.gz", absl::Cord(absl::string_view("\x1f\x8b\x08\x00\xdfw\x11k"
                                                                   "\x02\xff\nM\xd6",
                                                                   14)))
                  .ok());
  ASSERT_TRUE(tmp.store()->Put("a.csv.zst", absl::Cord("\x28\xb5\x2f\xfd rest\n")).ok());
  // Text that merely starts with letters of a signature is text.
  ASSERT_TRUE(tmp.store()->Put("bzh.csv", absl::Cord("BZh,x\n1,2\n")).ok());
  for (const auto& [key, kind] : {std::pair{"a.jsonl.gz", "gzip"}, {"a.csv.zst", "zstd"}}) {
    absl::Status status;
    EXPECT_TRUE(ReadRows(tmp.store(), key, Jsonl(4096), &status).empty()) << key;
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(status.message(), ::testing::HasSubstr(absl::StrCat(
                                      key, " at byte 0: the object is ", kind, "-compressed")));
    EXPECT_THAT(status.message(), ::testing::HasSubstr("from_files"));
  }
  EXPECT_THAT(ReadRows(tmp.store(), "bzh.csv", Csv(4096)), ElementsAre("BZh,x", "1,2"));
}

TEST(LinesTest, CsvVariantsPandasReadsOtherwiseAreRefusedByName) {
  TempStore tmp;
  // Backslash-escaped quotes (escapechar="\\", doublequote=False): row 3 (after the
  // header), on line 5 (the quoted newline in row 2 counts as a line).
  const std::string escaped = "id,text\n1,plain\n2,\"two\nlines\"\n3,\"say \\\"hi\\\" now\"\n4,x\n";
  ASSERT_TRUE(tmp.store()->Put("esc.csv", absl::Cord(escaped)).ok());
  const uint64_t row3 = escaped.find("3,");
  const uint64_t quote = escaped.find("\\\"") + 1;
  for (uint64_t chunk : {1ul, 2ul, 5ul, 16ul, 4096ul}) {
    SCOPED_TRACE(chunk);
    absl::Status status;
    auto rows = ReadRows(tmp.store(), "esc.csv", Csv(chunk, true), &status);
    EXPECT_THAT(rows, ElementsAre("1,plain", "2,\"two\nlines\""));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(status.message()),
              absl::StrCat("read csv ", tmp.store()->Uri("esc.csv"), " at byte ", row3,
                           ": line 5 (byte ", quote,
                           "): backslash-escaped quote; wharf reads RFC 4180 quoting (\"\"), not "
                           "backslash escapes"));
  }
  // Resumed past the start, the line is unknown: the byte still says where.
  LineReaderOptions resumed = Csv(7);
  resumed.io.offset = escaped.find("2,");
  absl::Status status;
  ReadRows(tmp.store(), "esc.csv", resumed, &status);
  EXPECT_TRUE(absl::StrContains(status.message(), absl::StrCat(": byte ", quote, ": backslash")))
      << status;

  // A backslash before a quote that closes the field is RFC 4180 data ("C:\dir\").
  ASSERT_TRUE(tmp.store()->Put("path.csv", absl::Cord("\"C:\\dir\\\",1\n")).ok());
  EXPECT_THAT(ReadRows(tmp.store(), "path.csv", Csv(2)), ElementsAre("\"C:\\dir\\\",1"));

  // Text after a closing quote.
  ASSERT_TRUE(tmp.store()->Put("after.csv", absl::Cord("a,b\n\"x\"y,2\n")).ok());
  ReadRows(tmp.store(), "after.csv", Csv(3), &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(),
                                "at byte 4: line 2 (byte 6): text after the "
                                "closing quote of a quoted field"))
      << status;

  // Bare CR line ends outside quotes; inside quotes a CR is data.
  ASSERT_TRUE(tmp.store()->Put("cr.csv", absl::Cord("a,b\r1,2\r")).ok());
  for (uint64_t chunk : {1ul, 3ul, 4096ul}) {
    ReadRows(tmp.store(), "cr.csv", Csv(chunk), &status);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << chunk;
    EXPECT_TRUE(
        absl::StrContains(status.message(), "at byte 0: line 1 (byte 3): a bare CR line end"))
        << status;
  }
  ASSERT_TRUE(tmp.store()->Put("crq.csv", absl::Cord("\"a\rb\",c\r\nd,e\r")).ok());
  EXPECT_THAT(ReadRows(tmp.store(), "crq.csv", Csv(2)), ElementsAre("\"a\rb\",c", "d,e"));
}

TEST(LinesTest, SplitCsvFields) {
  using V = std::vector<std::string>;
  EXPECT_EQ(*SplitCsvFields("a,b,c"), (V{"a", "b", "c"}));
  EXPECT_EQ(*SplitCsvFields(""), (V{""}));
  EXPECT_EQ(*SplitCsvFields(","), (V{"", ""}));
  EXPECT_EQ(*SplitCsvFields("a,"), (V{"a", ""}));
  EXPECT_EQ(*SplitCsvFields("\"a,b\",\"\"\"\",\"\""), (V{"a,b", "\"", ""}));
  EXPECT_EQ(*SplitCsvFields("x\"y,z"), (V{"x\"y", "z"}));  // a quote inside an unquoted field
  EXPECT_EQ(*SplitCsvFields("a;\"b;c\"", ';'), (V{"a", "b;c"}));
  EXPECT_EQ(SplitCsvFields("\"open").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitCsvFields("\"a\"b").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace wharf
