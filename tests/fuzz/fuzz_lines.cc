// libFuzzer target: CSV and JSON-lines objects (formats/lines.h). The input's first byte picks
// the options (format, header, skipping empty rows, CSV delimiter); the rest is the object.
// Every input is read row by row and in batches, each with two chunk sizes, and all four
// passes must agree. CSV rows are also split into fields (SplitCsvFields).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "formats/lines.h"
#include "tests/fuzz/format_fuzz.h"

namespace wharf::fuzz {
namespace {

LineReaderOptions OptionsFrom(uint8_t config) {
  static constexpr char kDelimiters[] = {',', ';', '\t', '|'};
  LineReaderOptions options;
  options.format = config & 1 ? LineFormat::kCsv : LineFormat::kJsonLines;
  options.header = config & 2;
  options.skip_empty_rows = config & 4;
  options.delimiter = kDelimiters[(config >> 3) & 3];
  options.quote = config & 32 ? '\'' : '"';
  options.max_row_bytes = uint64_t{64} << 10;
  return options;
}

void AddRow(const LineReaderOptions& options, uint64_t offset, uint64_t number,
            absl::string_view text, Transcript* t) {
  std::string line = absl::StrCat(offset, "#", number, "=", text);
  if (options.format == LineFormat::kCsv) {
    auto fields = SplitCsvFields(text, options.delimiter, options.quote);
    absl::StrAppend(&line, " -> ",
                    fields.ok() ? absl::StrJoin(*fields, "|")
                                : absl::StatusCodeToString(fields.status().code()));
  }
  t->records.push_back(std::move(line));
}

Transcript ReadRows(std::shared_ptr<ObjectStore> store, LineReaderOptions options,
                    size_t batch_rows) {
  Transcript t;
  auto reader = LineReader::Open(std::move(store), "rows", options);
  if (!reader.ok()) {
    t.end = reader.status().code();
    return t;
  }
  if ((*reader)->header().has_value()) t.records.push_back("header=" + *(*reader)->header());
  while (t.records.size() <= kMaxRecords) {
    if (batch_rows == 0) {
      auto row = (*reader)->Next();
      if (!row.ok()) {
        t.end = row.status().code();
        break;
      }
      if (!row->has_value()) break;
      AddRow(options, (*row)->offset, (*row)->number, (*row)->text, &t);
    } else {
      auto batch = (*reader)->NextBatch(batch_rows);
      if (!batch.ok()) {
        t.end = batch.status().code();
        break;
      }
      if (batch->empty()) break;
      for (size_t i = 0; i < batch->size(); ++i) {
        AddRow(options, batch->offsets[i], batch->first_number + i, batch->row(i), &t);
      }
    }
  }
  return t;
}

}  // namespace
}  // namespace wharf::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wharf::fuzz;
  if (size == 0) return 0;
  const wharf::LineReaderOptions base = OptionsFrom(data[0]);
  auto store = StoreHolding(data + 1, size - 1, "rows");
  // Row by row and one row per batch, each with both chunk sizes: the same transcript.
  std::vector<Transcript> passes;
  for (size_t batch_rows : {size_t{0}, size_t{1}}) {
    for (const auto& io : ReadPlans()) {
      wharf::LineReaderOptions options = base;
      options.io = io;
      passes.push_back(ReadRows(store, options, batch_rows));
      RequireBounded(passes.back());
    }
  }
  RequireSameTranscripts(passes);
  // Batches of three: a batch that fails drops the rows it had read, so the rows are those
  // of whole batches before the error, and the error is the same.
  wharf::LineReaderOptions options = base;
  options.io = ReadPlans()[0];
  const Transcript batched = ReadRows(store, options, 3);
  const auto& rows = passes[0].records;
  const size_t n = batched.records.size();
  const bool same = batched.end == passes[0].end && n <= rows.size() &&
                    std::equal(batched.records.begin(), batched.records.end(), rows.begin()) &&
                    (batched.end == absl::StatusCode::kOk ? n == rows.size() : rows.size() - n < 3);
  if (!same) {
    std::fprintf(stderr, "fuzz: batches of 3 read %zu rows ending in %s; rows: %zu ending in %s\n",
                 n, absl::StatusCodeToString(batched.end).c_str(), rows.size(),
                 absl::StatusCodeToString(passes[0].end).c_str());
    std::abort();
  }
  return 0;
}
