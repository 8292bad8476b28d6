#include "formats/testing/record_objects.h"

#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/status.h"
#include "formats/registry.h"
#include "formats/tfrecord.h"

namespace wharf::formats_testing {

std::string TarOctal(uint64_t v, size_t width) {
  std::string s(width, '0');
  for (size_t i = width; i-- > 0; v >>= 3) s[i] = static_cast<char>('0' + (v & 7));
  return s + '\0';
}

std::string TarHeader(const std::string& name, uint64_t size, char type, const std::string& prefix,
                      bool base256_size) {
  std::string h(512, '\0');
  h.replace(0, std::min<size_t>(name.size(), 100), name.substr(0, 100));
  h.replace(100, 8, TarOctal(0644, 7));
  h.replace(108, 8, TarOctal(0, 7));
  h.replace(116, 8, TarOctal(0, 7));
  if (base256_size) {
    h[124] = static_cast<char>(0x80);
    for (int i = 0; i < 8; ++i) h[135 - i] = static_cast<char>((size >> (8 * i)) & 0xff);
  } else {
    h.replace(124, 12, TarOctal(size, 11));
  }
  h.replace(136, 12, TarOctal(1700000000, 11));
  h[156] = type;
  h.replace(257, 6, std::string("ustar\0", 6));
  h.replace(263, 2, "00");
  h.replace(345, prefix.size(), prefix);
  h.replace(148, 8, "        ");
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  h.replace(148, 8, TarOctal(sum, 6) + " ");
  return h;
}

std::string TarPadded(const std::string& data) {
  return data + std::string((512 - data.size() % 512) % 512, '\0');
}

std::string TarEntry(const std::string& name, const std::string& data, char type) {
  return TarHeader(name, data.size(), type) + TarPadded(data);
}

std::string TarEndOfArchive() { return std::string(1024, '\0'); }

std::string Deflate(absl::string_view data, Deflated wrapper, int level) {
  z_stream z;
  std::memset(&z, 0, sizeof(z));
  const int bits = wrapper == Deflated::kGzip ? 15 + 16 : 15;
  if (deflateInit2(&z, level, Z_DEFLATED, bits, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::abort();
  std::string out(deflateBound(&z, data.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) std::abort();
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

namespace {

void AppendLength32(uint64_t n, std::string* out) {
  for (int i = 0; i < 4; ++i, n >>= 8) out->push_back(static_cast<char>(n & 0xff));
}

// kTestFormat's reader: written only against record_reader.h, as a new format would be.
class Len32Reader : public RecordReader {
 public:
  explicit Len32Reader(std::unique_ptr<ObjectReader> reader) : reader_(std::move(reader)) {}

  absl::StatusOr<std::optional<Record>> Next() override {
    if (!status_.ok()) return status_;
    const uint64_t at = reader_->position();
    if (reader_->remaining() == 0) return std::nullopt;
    unsigned char length[4];
    absl::Status s = reader_->ReadExact(absl::MakeSpan(reinterpret_cast<char*>(length), 4));
    absl::StatusOr<absl::Cord> data;
    if (s.ok()) {
      const uint64_t n = length[0] | (length[1] << 8) | (length[2] << 16) |
                         (static_cast<uint64_t>(length[3]) << 24);
      data = reader_->ReadCord(n);
      s = data.status();
    }
    if (!s.ok()) {
      status_ =
          Annotate(s, absl::StrCat("read ", kTestFormat, " ", reader_->uri(), " at byte ", at));
      return status_;
    }
    return Record::Payload(at, *std::move(data));
  }
  uint64_t offset() const override { return reader_->position(); }
  const ObjectReader& reader() const override { return *reader_; }

 private:
  const std::unique_ptr<ObjectReader> reader_;
  absl::Status status_;
};

std::string CsvQuoted(const std::string& s) {
  return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\"", "\"\""}}), "\"");
}

}  // namespace

absl::StatusOr<absl::Cord> EncodeRecords(absl::string_view format,
                                         const std::vector<std::string>& payloads, bool header) {
  if (format == "tfrecord") {
    absl::Cord out;
    for (const std::string& p : payloads) AppendTFRecord(absl::Cord(p), &out);
    return out;
  }
  std::string out;
  if (format == "tar") {
    for (size_t i = 0; i < payloads.size(); ++i) {
      out += TarEntry(absl::StrCat("r", i, ".cls"), payloads[i]);
      out += TarEntry(absl::StrCat("r", i, ".txt"), payloads[i] + "!");
    }
    out += TarEndOfArchive();
  } else if (format == "csv" || format == "jsonl") {
    if (header) out += "name,value\n";
    for (size_t i = 0; i < payloads.size(); ++i) {
      if (format == "csv") {
        absl::StrAppend(&out, CsvQuoted(payloads[i] + "\nmore"), ",", i, "\n");
      } else {
        absl::StrAppend(&out, "{\"v\":\"",
                        absl::StrReplaceAll(payloads[i], {{"\\", "\\\\"}, {"\"", "\\\""}}),
                        "\"}\n");
      }
    }
  } else if (format == kTestFormat) {
    for (const std::string& p : payloads) {
      AppendLength32(p.size(), &out);
      out += p;
    }
  } else {
    return absl::NotFoundError(
        absl::StrCat("formats_testing::EncodeRecords cannot write \"", format,
                     "\" yet: add a writer for it in formats/testing/record_objects.cc"));
  }
  return absl::Cord(std::move(out));
}

absl::Status RegisterTestFormat() {
  absl::Status s = RegisterRecordFormat(
      {std::string(kTestFormat),
       {".len32"},
       RecordShape::kPayload,
       false,
       [](const RecordObject& object,
          const RecordReaderOptions& options) -> absl::StatusOr<std::unique_ptr<RecordReader>> {
         WHARF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> reader, object.Open(options.io));
         return std::make_unique<Len32Reader>(std::move(reader));
       }});
  return absl::IsAlreadyExists(s) ? absl::OkStatus() : s;  // registered by an earlier call
}

}  // namespace wharf::formats_testing
