#include "formats/tfrecord.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "base/status.h"

namespace wharf {
namespace {

constexpr size_t kHeaderBytes = 12;  // length + its CRC
constexpr size_t kFooterBytes = 4;   // data CRC

// The format is little-endian whatever the host.
uint64_t LoadLE(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
void StoreLE(uint64_t v, int bytes, char* p) {
  for (int i = 0; i < bytes; ++i, v >>= 8) p[i] = static_cast<char>(v & 0xff);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TFRecordReader>> TFRecordReader::Open(
    std::shared_ptr<ObjectStore> store, std::string key, TFRecordReaderOptions options) {
  const std::string uri = store->Uri(key);
  auto stream = ByteStream::Open(RecordObject{std::move(store), std::move(key), std::nullopt},
                                 options.io, options.compression);
  if (!stream.ok()) return Annotate(stream.status(), absl::StrCat("read tfrecord ", uri));
  return std::make_unique<TFRecordReader>(*std::move(stream), options);
}

TFRecordReader::TFRecordReader(std::unique_ptr<ByteStream> stream, TFRecordReaderOptions options)
    : stream_(std::move(stream)), options_(options) {}

absl::Status TFRecordReader::Fail(absl::StatusCode code, uint64_t at, absl::string_view what) {
  status_ = absl::Status(
      code, absl::StrCat("read tfrecord ", stream_->uri(), " at byte ", at, ": ", what));
  return status_;
}

absl::Status TFRecordReader::BadLengthCrc(uint64_t at, const char* header, uint64_t length) {
  if (at == 0 && !stream_->compressed()) {
    const auto kind = SniffCompression(absl::string_view(header, kHeaderBytes), /*zlib_too=*/true);
    if (kind == "gzip" || kind == "zlib") {
      const bool gzip = kind == "gzip";
      return Fail(absl::StatusCode::kInvalidArgument, at,
                  absl::StrCat("the file starts like a ", gzip ? "GZIP" : "ZLIB",
                               " stream, not a TFRecord frame: a compressed TFRecord file is "
                               "read with compression ",
                               *kind, " (tf.data: compression_type=\"", gzip ? "GZIP" : "ZLIB",
                               "\"), which a name ending in ", gzip ? ".gz" : ".zlib", " selects"));
    }
    if (kind) {
      return Fail(absl::StatusCode::kUnimplemented, at,
                  absl::StrCat("the file is ", *kind,
                               "-compressed; wharf reads TFRecord files uncompressed or with "
                               "GZIP or ZLIB compression, as tf.data does"));
    }
  }
  return Fail(absl::StatusCode::kDataLoss, at,
              absl::StrCat("length CRC mismatch (length field ", length, ")"));
}

absl::StatusOr<std::optional<TFRecord>> TFRecordReader::Next() {
  if (!status_.ok()) return status_;
  const uint64_t at = stream_->position();
  const auto io_error = [&](const absl::Status& s) {
    status_ = Annotate(s, absl::StrCat("read tfrecord ", stream_->uri(), " at byte ", at));
    return status_;
  };
  char header[kHeaderBytes];
  auto got = stream_->Read(absl::MakeSpan(header));
  if (!got.ok()) return io_error(got.status());
  if (*got == 0) return std::nullopt;
  if (*got < kHeaderBytes) {
    return Fail(
        absl::StatusCode::kDataLoss, at,
        absl::StrCat("truncated record: ", *got, " of the ", kHeaderBytes,
                     " header bytes before the end (", stream_->DescribeEnd(at + *got), ")"));
  }
  const uint64_t length = LoadLE(header, 8);
  const uint32_t length_crc = static_cast<uint32_t>(LoadLE(header + 8, 4));
  if (MaskCrc32c(Crc32cExtend(0, header, 8)) != length_crc) {
    return BadLengthCrc(at, header, length);
  }
  if (length > options_.max_record_bytes) {
    return Fail(absl::StatusCode::kResourceExhausted, at,
                absl::StrCat("record of ", length, " bytes exceeds max_record_bytes (",
                             options_.max_record_bytes, ")"));
  }
  const auto truncated = [&](uint64_t end) {
    return Fail(
        absl::StatusCode::kDataLoss, at,
        absl::StrCat("truncated record: its ", length, " data bytes and CRC need bytes [", at, ", ",
                     at + kHeaderBytes + length + kFooterBytes, "), ", stream_->DescribeEnd(end)));
  };
  if (const auto left = stream_->remaining(); left && *left < length + kFooterBytes) {
    return truncated(at + kHeaderBytes + *left);  // known before reading: nothing read
  }
  TFRecord record;
  record.offset = at;
  auto data = stream_->ReadCord(length);
  if (!data.ok()) return io_error(data.status());
  if (data->size() < length) return truncated(stream_->position());
  record.data = *std::move(data);
  char footer[kFooterBytes];
  auto footer_got = stream_->Read(absl::MakeSpan(footer));
  if (!footer_got.ok()) return io_error(footer_got.status());
  if (*footer_got < kFooterBytes) return truncated(stream_->position());
  const uint32_t stored = static_cast<uint32_t>(LoadLE(footer, 4));
  const uint32_t computed = MaskCrc32c(Crc32c(record.data));
  if (stored != computed) {
    return Fail(absl::StatusCode::kDataLoss, at,
                absl::StrCat("data CRC mismatch (", length, "-byte record, data at byte ",
                             at + kHeaderBytes, ")"));
  }
  return record;
}

namespace {

class TFRecordRecordReader : public RecordReader {
 public:
  explicit TFRecordRecordReader(std::unique_ptr<ByteStream> stream) : records_(std::move(stream)) {}

  absl::StatusOr<std::optional<Record>> Next() override {
    WHARF_ASSIGN_OR_RETURN(std::optional<TFRecord> t, records_.Next());
    if (!t) return std::nullopt;
    return Record::Payload(t->offset, std::move(t->data));
  }
  uint64_t offset() const override { return records_.position(); }
  const ObjectReader& reader() const override { return records_.reader(); }

 private:
  TFRecordReader records_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RecordReader>> OpenTFRecordRecordReader(
    const RecordObject& object, const RecordReaderOptions& options) {
  WHARF_ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> stream,
                         ByteStream::Open(object, options.io, options.compression));
  return std::make_unique<TFRecordRecordReader>(std::move(stream));
}

void AppendTFRecord(const absl::Cord& data, absl::Cord* out) {
  char header[kHeaderBytes];
  StoreLE(data.size(), 8, header);
  StoreLE(MaskCrc32c(Crc32cExtend(0, header, 8)), 4, header + 8);
  out->Append(absl::string_view(header, kHeaderBytes));
  out->Append(data);
  char footer[kFooterBytes];
  StoreLE(MaskCrc32c(Crc32c(data)), 4, footer);
  out->Append(absl::string_view(footer, kFooterBytes));
}

absl::StatusOr<std::unique_ptr<TFRecordWriter>> TFRecordWriter::Open(
    std::shared_ptr<ObjectStore> store, std::string key, TFRecordWriterOptions options) {
  std::string uri = store->Uri(key);
  auto writer = store->NewWriter(std::move(key));
  if (!writer.ok()) return Annotate(writer.status(), absl::StrCat("write tfrecord ", uri));
  return std::unique_ptr<TFRecordWriter>(
      new TFRecordWriter(std::move(store), *std::move(writer), std::move(uri), options));
}

TFRecordWriter::TFRecordWriter(std::shared_ptr<ObjectStore> store,
                               std::unique_ptr<ObjectWriter> writer, std::string uri,
                               TFRecordWriterOptions options)
    : store_(std::move(store)),
      writer_(std::move(writer)),
      uri_(std::move(uri)),
      options_(options) {}

TFRecordWriter::~TFRecordWriter() {
  if (!closed_) writer_->Abort();
}

absl::Status TFRecordWriter::Flush() {
  if (pending_.empty()) return absl::OkStatus();
  status_ = Annotate(writer_->Write(std::move(pending_)), absl::StrCat("write tfrecord ", uri_));
  pending_.Clear();
  return status_;
}

absl::Status TFRecordWriter::Write(const absl::Cord& record) {
  if (!status_.ok()) return status_;
  if (closed_) {
    return absl::FailedPreconditionError(absl::StrCat("write tfrecord ", uri_, ": closed"));
  }
  AppendTFRecord(record, &pending_);
  ++records_;
  if (pending_.size() >= options_.buffer_bytes) return Flush();
  return absl::OkStatus();
}

absl::StatusOr<ObjectMeta> TFRecordWriter::Close() {
  if (!status_.ok()) return status_;
  if (closed_) {
    return absl::FailedPreconditionError(absl::StrCat("write tfrecord ", uri_, ": closed"));
  }
  WHARF_RETURN_IF_ERROR(Flush());
  auto meta = writer_->Close();
  if (!meta.ok()) {
    status_ = Annotate(meta.status(), absl::StrCat("write tfrecord ", uri_));
    return status_;
  }
  closed_ = true;
  return meta;
}

}  // namespace wharf
