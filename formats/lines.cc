#include "formats/lines.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace wharf {
namespace {

// Where the CSV scanner is within a row.
enum class CsvState {
  kFieldStart,     // at the start of a field: a quote opens a quoted field
  kUnquoted,       // inside an unquoted field
  kQuoted,         // inside a quoted field: newlines and delimiters are data
  kQuoteInQuoted,  // just saw a quote inside a quoted field: "" or the closing quote
};

// Returns the index of the '\n' that ends the row in `data`, scanning from `state` and
// updating it; npos when the row does not end within `data`.
size_t FindCsvRowEnd(absl::string_view data, char delimiter, char quote, CsvState* state) {
  CsvState s = *state;
  for (size_t i = 0; i < data.size(); ++i) {
    const char c = data[i];
    switch (s) {
      case CsvState::kQuoted: {
        // Fast path: nothing but a quote matters here.
        const void* q = std::memchr(data.data() + i, quote, data.size() - i);
        if (q == nullptr) {
          *state = s;
          return absl::string_view::npos;
        }
        i = static_cast<const char*>(q) - data.data();
        s = CsvState::kQuoteInQuoted;
        break;
      }
      case CsvState::kQuoteInQuoted:
        if (c == quote) {
          s = CsvState::kQuoted;  // "" : an escaped quote
          break;
        }
        [[fallthrough]];  // the closing quote: c is the byte after the field
      case CsvState::kUnquoted:
        if (c == '\n') {
          *state = CsvState::kFieldStart;
          return i;
        }
        s = c == delimiter ? CsvState::kFieldStart : CsvState::kUnquoted;
        break;
      case CsvState::kFieldStart:
        if (c == '\n') {
          *state = CsvState::kFieldStart;
          return i;
        }
        s = c == quote ? CsvState::kQuoted
                       : (c == delimiter ? CsvState::kFieldStart : CsvState::kUnquoted);
        break;
    }
  }
  *state = s;
  return absl::string_view::npos;
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
      kind_(options.format == LineFormat::kCsv ? "csv" : "jsonl") {}

absl::Status LineReader::Fail(absl::StatusCode code, uint64_t at, absl::string_view what) {
  status_ = absl::Status(
      code, absl::StrCat("read ", kind_, " ", reader_->uri(), " at byte ", at, ": ", what));
  return status_;
}

absl::StatusOr<bool> LineReader::ScanRow(std::string* out, uint64_t* offset) {
  if (!status_.ok()) return status_;
  const uint64_t start = reader_->position();
  const size_t base = out->size();
  *offset = start;
  CsvState state = CsvState::kFieldStart;
  while (true) {
    auto view = reader_->Peek();
    if (!view.ok()) {
      status_ = Annotate(view.status(),
                         absl::StrCat("read ", kind_, " ", reader_->uri(), " at byte ", start));
      return status_;
    }
    if (view->empty()) {  // end of the object
      if (reader_->position() == start) return false;
      if (state == CsvState::kQuoted) {
        return Fail(absl::StatusCode::kDataLoss, start,
                    "the object ends inside a quoted field (unbalanced quotes)");
      }
      break;
    }
    const size_t end = options_.format == LineFormat::kCsv
                           ? FindCsvRowEnd(*view, options_.delimiter, options_.quote, &state)
                           : view->find('\n');
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
      break;
    }
    reader_->Consume(view->size());
  }
  if (out->size() > base && out->back() == '\r') out->pop_back();
  return true;
}

absl::StatusOr<bool> LineReader::NextRow(std::string* out, uint64_t* offset) {
  while (true) {
    const size_t base = out->size();
    WHARF_ASSIGN_OR_RETURN(const bool found, ScanRow(out, offset));
    if (!found) return false;
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
