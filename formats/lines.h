// Line-oriented records from one (possibly very large) object: JSON lines and CSV.
//
// LineReader streams the object through an ObjectReader (chunked ranged GETs with
// read-ahead) and yields rows one at a time or in batches, never holding the whole object:
// the bytes it holds are the reader's chunk bound plus the row being assembled (a row longer
// than max_row_bytes is an error, ResourceExhausted). stats().peak_buffered_bytes reports it.
//
// Rows end at '\n'; a '\r' just before it is dropped (CRLF files), and a last row without a
// newline is still a row (an object ending in '\n' has no empty last row). A UTF-8 byte-order
// mark at the object's start is dropped (pandas and Python's utf-8-sig do the same); a UTF-16
// or UTF-32 one is refused (InvalidArgument). In kCsv mode a newline inside a quoted field
// does not end the row: the quote state (RFC 4180: a field opened by a quote runs to the next
// lone quote; "" is an escaped quote) is tracked byte by byte, across chunk boundaries. An
// object that ends inside a quoted field is DataLoss. SplitCsvFields() splits one row into
// fields.
//
// CSV that pandas would read otherwise than as RFC 4180 rows is refused rather than read
// wrong: InvalidArgument naming the object, the row's byte offset, the line (when reading
// started at the object's start) and the variant:
//  - a backslash-escaped quote inside a quoted field ("a\"b", written by escapechar='\\'
//    with doublequote=False): "backslash-escaped quote; wharf reads RFC 4180 quoting ("")";
//  - text after a quoted field's closing quote ("a"b);
//  - a bare '\r' line end outside quotes (pandas ends a row there; wharf reads LF and CRLF).
// Detected when the quote is followed by more of the field: a backslash just before a quote
// that closes the field ("C:\dir\",next) is RFC 4180 data and stays so.
// Errors name the object and the byte offset of the row, e.g.
//   "read csv file:///data/x.csv at byte 123: row exceeds max_row_bytes (...)". Sticky.
//
// Thread-safety: a reader is used by one thread at a time; SplitCsvFields is pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/record_reader.h"
#include "io/object_reader.h"
#include "store/object_store.h"

namespace wharf {

enum class LineFormat {
  kJsonLines,  // every '\n' ends a row (JSON strings cannot hold a raw newline); plain text too
  kCsv,        // '\n' inside a quoted field stays in the row
};

struct LineReaderOptions {
  ObjectReaderOptions io;
  LineFormat format = LineFormat::kJsonLines;
  // The first row is a header: returned by header(), not by Next().
  bool header = false;
  // kCsv: field delimiter and quote character.
  char delimiter = ',';
  char quote = '"';
  // Empty rows are not returned (the header row is never skipped).
  bool skip_empty_rows = false;
  // Nor rows of only spaces, tabs and CRs (JSON lines records: such a line holds no value;
  // pandas, pyarrow and the jsonlines package skip it). Implies skip_empty_rows.
  bool skip_blank_rows = false;
  // A longer row is an error (ResourceExhausted): bounds what one row can make the reader hold.
  uint64_t max_row_bytes = uint64_t{64} << 20;
};

struct Row {
  uint64_t offset = 0;  // byte offset of the row's first byte in the object
  uint64_t number = 0;  // 0-based among the rows returned (the header not counted)
  std::string text;     // without the line end
};

// Rows packed in one buffer: row i is data[begin(i), ends[i]).
struct RowBatch {
  std::string data;
  std::vector<size_t> ends;
  std::vector<uint64_t> offsets;  // byte offset of each row in the object
  uint64_t first_number = 0;      // Row::number of row 0

  size_t size() const { return ends.size(); }
  bool empty() const { return ends.empty(); }
  absl::string_view row(size_t i) const {
    const size_t begin = i == 0 ? 0 : ends[i - 1];
    return absl::string_view(data).substr(begin, ends[i] - begin);
  }
};

struct LineReaderStats {
  uint64_t rows = 0;
  // Upper bound on the bytes the reader held at once: the ObjectReader's peak plus the
  // longest row assembled.
  uint64_t peak_buffered_bytes = 0;
  ObjectReaderStats io;
};

class LineReader {
 public:
  // Opens the object and, with options.header, reads the header row.
  // REQUIRES: store != nullptr.
  static absl::StatusOr<std::unique_ptr<LineReader>> Open(std::shared_ptr<ObjectStore> store,
                                                          std::string key,
                                                          LineReaderOptions options = {});
  // Reads from an opened reader (e.g. opened with meta from a listing). REQUIRES: reader.
  static absl::StatusOr<std::unique_ptr<LineReader>> Create(std::unique_ptr<ObjectReader> reader,
                                                            LineReaderOptions options = {});
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The header row (options.header), nullopt for an empty object or without the option.
  const std::optional<std::string>& header() const { return header_; }

  // The next row; nullopt at the end.
  absl::StatusOr<std::optional<Row>> Next();
  // Up to max_rows rows (fewer only at the end; empty at the end). REQUIRES: max_rows > 0.
  absl::StatusOr<RowBatch> NextBatch(size_t max_rows);

  LineReaderStats stats() const;
  const ObjectReader& reader() const { return *reader_; }

 private:
  LineReader(std::unique_ptr<ObjectReader> reader, LineReaderOptions options);
  // Appends the next row's bytes to *out and sets *offset; false at the end.
  absl::StatusOr<bool> ScanRow(std::string* out, uint64_t* offset);
  // ScanRow, skipping empty rows when asked to.
  absl::StatusOr<bool> NextRow(std::string* out, uint64_t* offset);
  // At the object's start: drops a UTF-8 byte-order mark, refuses a UTF-16/32 one.
  absl::Status SkipByteOrderMark();
  absl::Status Fail(absl::StatusCode code, uint64_t at, absl::string_view what);

  const std::unique_ptr<ObjectReader> reader_;
  const LineReaderOptions options_;
  const char* const kind_;  // "csv" or "jsonl", for messages
  std::optional<std::string> header_;
  uint64_t rows_ = 0;
  uint64_t peak_row_bytes_ = 0;
  bool bom_checked_ = false;
  // Line numbers (for errors) are known when reading started at the object's start; newlines_
  // counts the '\n's consumed so far (quoted ones included in CSV).
  const bool lines_known_;
  uint64_t newlines_ = 0;
  absl::Status status_;
};

// The registry's "csv" and "jsonl" readers (registry.h): a Record per row, its text as "data";
// batches share one buffer. With options.header and io.offset > 0 (a resume) the header row
// is read first from the object's start, with a small chunk.
absl::StatusOr<std::unique_ptr<RecordReader>> OpenCsvRecordReader(
    const RecordObject& object, const RecordReaderOptions& options);
absl::StatusOr<std::unique_ptr<RecordReader>> OpenJsonLinesRecordReader(
    const RecordObject& object, const RecordReaderOptions& options);

// Splits one CSV row into fields (RFC 4180): fields separated by `delimiter`; a field that
// starts with `quote` runs to the matching quote, "" inside it being one quote, and may hold
// delimiters and newlines. A quote inside an unquoted field is an ordinary character. An
// empty row is one empty field. InvalidArgument (with the column) for an unterminated quoted
// field or text after a closing quote.
absl::StatusOr<std::vector<std::string>> SplitCsvFields(absl::string_view row, char delimiter = ',',
                                                        char quote = '"');

}  // namespace wharf
