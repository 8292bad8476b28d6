#include "formats/lines.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "formats/byte_stream.h"

namespace wharf {
namespace {

// Where the CSV scanner is within a row.
enum class CsvState {
  kFieldStart,     // at the start of a field: a quote opens a quoted field
  kUnquoted,       // inside an unquoted field
  kQuoted,         // inside a quoted field: newlines and delimiters are data
  kQuoteInQuoted,  // just saw a quote inside a quoted field: "" or the closing quote
};

// What the scanner refuses: CSV that pandas reads some other way than RFC 4180 rows, and
// that would otherwise come out as wrong rows or fields without an error.
enum class CsvProblem {
  kNone,
  kBackslashQuote,  // "a\"b": a quote escaped with a backslash, then more of the field
  kTextAfterQuote,  // "a"b: a quoted field's closing quote followed by more text
  kBareCr,          // a '\r' outside quotes not followed by '\n' (pandas ends the row there)
};

// The scanner's state, carried across chunks.
struct CsvScan {
  CsvState state = CsvState::kFieldStart;
  bool quote_after_backslash = false;  // kQuoteInQuoted: the quote followed a backslash
  bool last_was_backslash = false;     // the previous chunk ended with a backslash
  bool pending_cr = false;             // the previous byte was a '\r' outside quotes
  CsvProblem problem = CsvProblem::kNone;
  size_t problem_at = 0;  // index in the chunk of the byte the problem is about
};

// Returns the index of the '\n' that ends the row in `data`, scanning from `scan` and
// updating it; npos when the row does not end within `data`, or when a problem is found
// (scan->problem set, scan->problem_at the offending byte's index; it may be -1 as size_t
// when the byte was the previous chunk's last).
size_t FindCsvRowEnd(absl::string_view data, char delimiter, char quote, CsvScan* scan) {
  CsvState s = scan->state;
  const auto problem = [&](CsvProblem p, size_t at) {
    scan->state = s;
    scan->problem = p;
    scan->problem_at = at;
    return absl::string_view::npos;
  };
  for (size_t i = 0; i < data.size(); ++i) {
    const char c = data[i];
    if (scan->pending_cr) {
      scan->pending_cr = false;
      if (c != '\n') return problem(CsvProblem::kBareCr, i - 1);
      scan->state = CsvState::kFieldStart;
      return i;
    }
    switch (s) {
      case CsvState::kQuoted: {
        // Fast path: nothing but a quote matters here.
        const void* q = std::memchr(data.data() + i, quote, data.size() - i);
        if (q == nullptr) {
          scan->state = s;
          scan->last_was_backslash = data.back() == '\\';
          return absl::string_view::npos;
        }
        i = static_cast<const char*>(q) - data.data();
        scan->quote_after_backslash = i > 0 ? data[i - 1] == '\\' : scan->last_was_backslash;
        s = CsvState::kQuoteInQuoted;
        break;
      }
      case CsvState::kQuoteInQuoted:
        if (c == quote) {
          s = CsvState::kQuoted;  // "" : an escaped quote
          break;
        }
        if (c != delimiter && c != '\n' && c != '\r') {
          return problem(scan->quote_after_backslash ? CsvProblem::kBackslashQuote
                                                     : CsvProblem::kTextAfterQuote,
                         i - 1);
        }
        [[fallthrough]];  // the closing quote: c is the byte after the field
      case CsvState::kUnquoted:
      case CsvState::kFieldStart:
        if (c == '\n') {
          scan->state = CsvState::kFieldStart;
          return i;
        }
        if (c == '\r') {
          scan->pending_cr = true;  // a row end only with the '\n' after it
          s = CsvState::kUnquoted;
          break;
        }
        if (s == CsvState::kFieldStart && c == quote) {
          s = CsvState::kQuoted;
          break;
        }
        s = c == delimiter ? CsvState::kFieldStart : CsvState::kUnquoted;
        break;
    }
  }
  scan->state = s;
  if (!data.empty()) scan->last_was_backslash = data.back() == '\\';
  return absl::string_view::npos;
}

std::string DescribeCsvProblem(CsvProblem p, char quote) {
  const std::string q(1, quote);
  switch (p) {
    case CsvProblem::kBackslashQuote:
      return absl::StrCat("backslash-escaped quote; wharf reads RFC 4180 quoting (", q, q,
                          "), not backslash escapes");
    case CsvProblem::kTextAfterQuote:
      return absl::StrCat(
          "text after the closing quote of a quoted field; wharf reads RFC 4180 "
          "quoting, where a quoted field ends at its closing quote (a quote "
          "inside it is doubled: ",
          q, q, ")");
    case CsvProblem::kBareCr:
      return "a bare CR line end (\\r without \\n); wharf reads rows ended by LF or CRLF";
    case CsvProblem::kNone:
      break;
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<LineReader>> LineReader::Open(std::shared_ptr<ObjectStore> store,
                                                             std::string key,
                                                             LineReaderOptions options) {
  const std::string uri = store->Uri(key);
  auto reader = ObjectReader::Open(std::move(store), std::move(key), options.io);
  if (!reader.ok()) {
    return Annotate(
        reader.status(),
        absl::StrCat("read ", options.format == LineFormat::kCsv ? "csv " : "jsonl ", uri));
  }
  return Create(*std::move(reader), options);
}

absl::StatusOr<std::unique_ptr<LineReader>> LineReader::Create(std::unique_ptr<ObjectReader> reader,
                                                               LineReaderOptions options) {
  auto lines = std::unique_ptr<LineReader>(new LineReader(std::move(reader), options));
  if (options.header) {
    std::string header;
    uint64_t offset = 0;
    WHARF_ASSIGN_OR_RETURN(const bool found, lines->ScanRow(&header, &offset));
    if (found) lines->header_ = std::move(header);
  }
  return lines;
}

LineReader::LineReader(std::unique_ptr<ObjectReader> reader, LineReaderOptions options)
    : reader_(std::move(reader)),
      options_(options),
      kind_(options.format == LineFormat::kCsv ? "csv" : "jsonl"),
      lines_known_(reader_->position() == 0) {}

absl::Status LineReader::Fail(absl::StatusCode code, uint64_t at, absl::string_view what) {
  status_ = absl::Status(
      code, absl::StrCat("read ", kind_, " ", reader_->uri(), " at byte ", at, ": ", what));
  return status_;
}

absl::Status LineReader::SkipByteOrderMark() {
  bom_checked_ = true;
  if (reader_->position() != 0) return absl::OkStatus();  // a resume: past the start
  char head[4];
  const size_t n = static_cast<size_t>(std::min<uint64_t>(sizeof(head), reader_->remaining()));
  const auto io_error = [&](const absl::Status& s) {
    status_ = Annotate(s, absl::StrCat("read ", kind_, " ", reader_->uri(), " at byte 0"));
    return status_;
  };
  if (absl::Status s = reader_->ReadExact(absl::MakeSpan(head, n)); !s.ok()) return io_error(s);
  const absl::string_view h(head, n);
  if (absl::StartsWith(h, "\xef\xbb\xbf")) {  // UTF-8's: dropped, as pandas and utf-8-sig do
    if (absl::Status s = reader_->Seek(3); !s.ok()) return io_error(s);
    return absl::OkStatus();
  }
  if (absl::StartsWith(h, "\xff\xfe") || absl::StartsWith(h, "\xfe\xff") ||
      absl::StartsWith(h, absl::string_view("\0\0\xfe\xff", 4))) {
    return Fail(absl::StatusCode::kInvalidArgument, 0,
                "the object starts with a UTF-16 or UTF-32 byte-order mark; wharf reads "
                "UTF-8 text (convert it, e.g. with iconv)");
  }
  // A compressed object read as text would be rows of compressed bytes (a .csv.gz shard given
  // to from_shards); refused, naming what it holds. Only signatures no UTF-8 text starts with.
  if (auto kind = SniffCompression(h, /*zlib_too=*/false); kind.has_value() && *kind != "bzip2") {
    return Fail(absl::StatusCode::kInvalidArgument, 0,
                absl::StrCat("the object is ", *kind,
                             "-compressed; rows are read as stored (IterableDataset.from_files "
                             "inflates .csv.gz and .jsonl.gz files as they stream)"));
  }
  if (absl::Status s = reader_->Seek(0); !s.ok()) return io_error(s);
  return absl::OkStatus();
}

absl::StatusOr<bool> LineReader::ScanRow(std::string* out, uint64_t* offset) {
  if (!status_.ok()) return status_;
  if (!bom_checked_) WHARF_RETURN_IF_ERROR(SkipByteOrderMark());
  const uint64_t start = reader_->position();
  const size_t base = out->size();
  *offset = start;
  const bool csv = options_.format == LineFormat::kCsv;
  CsvScan scan;
  while (true) {
    auto view = reader_->Peek();
    if (!view.ok()) {
      status_ = Annotate(view.status(),
                         absl::StrCat("read ", kind_, " ", reader_->uri(), " at byte ", start));
      return status_;
    }
    if (view->empty()) {  // end of the object
      if (reader_->position() == start) return false;
      if (scan.state == CsvState::kQuoted) {
        return Fail(absl::StatusCode::kDataLoss, start,
                    "the object ends inside a quoted field (unbalanced quotes)");
      }
      break;
    }
    const size_t end =
        csv ? FindCsvRowEnd(*view, options_.delimiter, options_.quote, &scan) : view->find('\n');
    if (scan.problem != CsvProblem::kNone) {
      // Where: the byte, and its line when the reader started at the object's start.
      const uint64_t at = reader_->position() + scan.problem_at;  // (problem_at may be -1)
      std::string where = absl::StrCat("byte ", at);
      if (lines_known_) {
        const absl::string_view before =
            view->substr(0, scan.problem_at == static_cast<size_t>(-1) ? 0 : scan.problem_at);
        const uint64_t line = newlines_ + 1 + std::count(out->begin() + base, out->end(), '\n') +
                              std::count(before.begin(), before.end(), '\n');
        where = absl::StrCat("line ", line, " (byte ", at, ")");
      }
      return Fail(absl::StatusCode::kInvalidArgument, start,
                  absl::StrCat(where, ": ", DescribeCsvProblem(scan.problem, options_.quote)));
    }
    const size_t take = end == absl::string_view::npos ? view->size() : end;
    if (out->size() - base + take > options_.max_row_bytes) {
      return Fail(absl::StatusCode::kResourceExhausted, start,
                  absl::StrCat("row exceeds max_row_bytes (", options_.max_row_bytes,
                               "); wrong format, or unbalanced quotes?"));
    }
    out->append(view->data(), take);
    peak_row_bytes_ = std::max<uint64_t>(peak_row_bytes_, out->size() - base);
    if (end != absl::string_view::npos) {
      reader_->Consume(end + 1);
      ++newlines_;
      break;
    }
    reader_->Consume(view->size());
  }
  // Newlines inside quoted fields count as lines too (for the line numbers of errors).
  if (csv && lines_known_) newlines_ += std::count(out->begin() + base, out->end(), '\n');
  if (out->size() > base && out->back() == '\r') out->pop_back();
  return true;
}

absl::StatusOr<bool> LineReader::NextRow(std::string* out, uint64_t* offset) {
  while (true) {
    const size_t base = out->size();
    WHARF_ASSIGN_OR_RETURN(const bool found, ScanRow(out, offset));
    if (!found) return false;
    if (options_.skip_blank_rows) {
      const bool blank = std::all_of(out->begin() + base, out->end(),
                                     [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
      if (!blank) return true;
      out->resize(base);
      continue;
    }
    if (!options_.skip_empty_rows || out->size() > base) return true;
  }
}

absl::StatusOr<std::optional<Row>> LineReader::Next() {
  Row row;
  WHARF_ASSIGN_OR_RETURN(const bool found, NextRow(&row.text, &row.offset));
  if (!found) return std::nullopt;
  row.number = rows_++;
  return row;
}

absl::StatusOr<RowBatch> LineReader::NextBatch(size_t max_rows) {
  RowBatch batch;
  batch.first_number = rows_;
  while (batch.size() < max_rows) {
    uint64_t offset = 0;
    WHARF_ASSIGN_OR_RETURN(const bool found, NextRow(&batch.data, &offset));
    if (!found) break;
    batch.ends.push_back(batch.data.size());
    batch.offsets.push_back(offset);
    ++rows_;
  }
  return batch;
}

LineReaderStats LineReader::stats() const {
  LineReaderStats stats;
  stats.rows = rows_;
  stats.io = reader_->stats();
  stats.peak_buffered_bytes = stats.io.peak_buffered_bytes + peak_row_bytes_;
  return stats;
}

namespace {

// A resumed reader reads the header row with chunks of this size: it is usually short.
constexpr uint64_t kHeaderChunk = uint64_t{64} << 10;

class LineRecordReader : public RecordReader {
 public:
  LineRecordReader(std::unique_ptr<LineReader> lines, std::optional<std::string> header)
      : lines_(std::move(lines)), header_(std::move(header)) {}

  absl::StatusOr<std::optional<Record>> Next() override {
    WHARF_ASSIGN_OR_RETURN(std::optional<Row> row, lines_->Next());
    if (!row) return std::nullopt;
    return Record::Payload(row->offset, absl::Cord(std::move(row->text)));
  }

  // Rows as slices of one shared buffer (zero-copy).
  absl::StatusOr<std::vector<Record>> NextBatch(size_t n) override {
    WHARF_ASSIGN_OR_RETURN(RowBatch batch, lines_->NextBatch(n));
    std::vector<Record> out;
    out.reserve(batch.size());
    auto shared = std::make_shared<RowBatch>(std::move(batch));
    for (size_t i = 0; i < shared->size(); ++i) {
      out.push_back(Record::Payload(shared->offsets[i],
                                    absl::MakeCordFromExternal(shared->row(i), [shared] {})));
    }
    return out;
  }

  uint64_t offset() const override { return lines_->reader().position(); }
  std::optional<std::string> header() const override { return header_; }
  const ObjectReader& reader() const override { return lines_->reader(); }

 private:
  const std::unique_ptr<LineReader> lines_;
  const std::optional<std::string> header_;
};

absl::StatusOr<std::unique_ptr<RecordReader>> OpenLineRecordReader(
    LineFormat format, const RecordObject& object, const RecordReaderOptions& options) {
  LineReaderOptions lo;
  lo.format = format;
  lo.delimiter = options.delimiter;
  lo.quote = options.quote;
  lo.skip_empty_rows = options.skip_empty_rows;
  lo.skip_blank_rows = format == LineFormat::kJsonLines;  // never a record
  RecordObject rows = object;
  std::optional<std::string> header;
  if (options.header && options.io.offset > 0) {
    // A resume: the header is at the start of the object; read just it. The rows are then
    // read from the same version (its meta: same ETag, no second HEAD).
    // (Never a larger chunk than the caller asked for: it may be bounding memory.)
    ObjectReaderOptions io = options.io;
    io.offset = 0;
    io.length.reset();
    io.chunk_size = io.chunk_size == 0 ? kHeaderChunk : std::min(io.chunk_size, kHeaderChunk);
    io.read_ahead = 0;
    WHARF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> r, object.Open(io));
    rows.meta = r->meta();
    LineReaderOptions with_header = lo;
    with_header.header = true;
    WHARF_ASSIGN_OR_RETURN(std::unique_ptr<LineReader> first,
                           LineReader::Create(std::move(r), with_header));
    header = first->header();
  }  // (its reader closed here, before the rows' reader opens)
  lo.header = options.header && options.io.offset == 0;
  WHARF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> reader, rows.Open(options.io));
  WHARF_ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines,
                         LineReader::Create(std::move(reader), lo));
  if (lo.header) header = lines->header();
  return std::make_unique<LineRecordReader>(std::move(lines), std::move(header));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RecordReader>> OpenCsvRecordReader(
    const RecordObject& object, const RecordReaderOptions& options) {
  return OpenLineRecordReader(LineFormat::kCsv, object, options);
}

absl::StatusOr<std::unique_ptr<RecordReader>> OpenJsonLinesRecordReader(
    const RecordObject& object, const RecordReaderOptions& options) {
  return OpenLineRecordReader(LineFormat::kJsonLines, object, options);
}

absl::StatusOr<std::vector<std::string>> SplitCsvFields(absl::string_view row, char delimiter,
                                                        char quote) {
  std::vector<std::string> fields;
  size_t i = 0;
  while (true) {
    std::string field;
    if (i < row.size() && row[i] == quote) {
      const size_t open = i++;
      while (true) {
        const size_t q = row.find(quote, i);
        if (q == absl::string_view::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat("csv row: quoted field opened at column ", open, " is not closed"));
        }
        field.append(row.data() + i, q - i);
        if (q + 1 < row.size() && row[q + 1] == quote) {
          field.push_back(quote);
          i = q + 2;
          continue;
        }
        i = q + 1;
        break;
      }
      if (i < row.size() && row[i] != delimiter) {
        return absl::InvalidArgumentError(
            absl::StrCat("csv row: text after the closing quote at column ", i));
      }
    } else {
      const size_t d = row.find(delimiter, i);
      const size_t end = d == absl::string_view::npos ? row.size() : d;
      field.assign(row.data() + i, end - i);
      i = end;
    }
    fields.push_back(std::move(field));
    if (i >= row.size()) break;
    ++i;  // the delimiter
    if (i == row.size()) {
      fields.emplace_back();  // a trailing delimiter: one more, empty, field
      break;
    }
  }
  return fields;
}

}  // namespace wharf
