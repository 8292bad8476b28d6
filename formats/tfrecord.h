// TFRecord files: a sequence of records, each framed as
//   uint64 length | uint32 masked_crc32c(length) | data (length bytes) | uint32 masked_crc32c(data)
// (little-endian; masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8, see crc32c.h).
//
// TFRecordReader streams a file from any ObjectStore through an ObjectReader: memory is the
// reader's chunk bound plus the record being returned (records above max_record_bytes are
// refused, so a corrupt length cannot allocate gigabytes). Both CRCs are verified. Errors are
// DataLoss (bad length CRC, bad data CRC, truncated record) or ResourceExhausted (record too
// large) and name the object and the byte offset where the record starts, e.g.
//   "read tfrecord file:///data/x.tfrecord at byte 12345: data CRC mismatch ...".
// Errors are sticky.
//
// Compressed files, as tf.data reads them with TFRecordDataset(compression_type="GZIP" or
// "ZLIB"): the whole file is one GZIP (RFC 1952) or ZLIB (RFC 1950) stream of frames, inflated
// as it streams (byte_stream.h). tf.data needs compression_type spelled out; wharf takes it
// from the options (compression) or, left at kAuto, from the key: ".gz" is GZIP, ".zlib" is
// ZLIB, anything else uncompressed. Offsets (record offsets, resume points) are then offsets
// in the decompressed stream. An uncompressed read of a file whose first frame fails its
// length CRC and that starts like a compressed stream says so (InvalidArgument for GZIP and
// ZLIB: name the file or pass the compression; Unimplemented for bzip2, xz, zstd).
//
// TFRecordWriter writes a valid file through ObjectWriter (atomic on Close()).
//
// Thread-safety: readers and writers are used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "formats/byte_stream.h"
#include "formats/record_reader.h"
#include "io/object_reader.h"
#include "store/object_store.h"

namespace wharf {

struct TFRecord {
  uint64_t offset = 0;  // where the record's frame starts in the object
  absl::Cord data;      // its payload (zero-copy slices of the read chunks where large)
};

struct TFRecordReaderOptions {
  // io.offset: where to start (a frame's offset; decompressed when compressed).
  ObjectReaderOptions io;
  // kAuto: GZIP for a key ending in .gz, ZLIB for one ending in .zlib, stored otherwise.
  Compression compression = Compression::kAuto;
  // Larger records are an error (ResourceExhausted) rather than an allocation.
  uint64_t max_record_bytes = uint64_t{1} << 30;
};

class TFRecordReader {
 public:
  // REQUIRES: store != nullptr.
  static absl::StatusOr<std::unique_ptr<TFRecordReader>> Open(std::shared_ptr<ObjectStore> store,
                                                              std::string key,
                                                              TFRecordReaderOptions options = {});
  // Reads from an already opened stream (e.g. over a reader opened with meta from a listing,
  // or at a record boundary offset to resume). options.io and options.compression are not
  // used. REQUIRES: stream != nullptr.
  explicit TFRecordReader(std::unique_ptr<ByteStream> stream, TFRecordReaderOptions options = {});
  TFRecordReader(const TFRecordReader&) = delete;
  TFRecordReader& operator=(const TFRecordReader&) = delete;

  // The next record; nullopt at the end of the object.
  absl::StatusOr<std::optional<TFRecord>> Next();

  // Offset of the next record's frame (a resume point).
  uint64_t position() const { return stream_->position(); }
  const ByteStream& stream() const { return *stream_; }
  const ObjectReader& reader() const { return stream_->object(); }

 private:
  absl::Status Fail(absl::StatusCode code, uint64_t at, absl::string_view what);
  // The error for a first frame whose length CRC fails (names a compressed format the object
  // starts with, if any).
  absl::Status BadLengthCrc(uint64_t at, const char* header, uint64_t length);

  const std::unique_ptr<ByteStream> stream_;
  const TFRecordReaderOptions options_;
  absl::Status status_;
};

// The registry's "tfrecord" reader (registry.h): a Record per record, its payload as "data".
absl::StatusOr<std::unique_ptr<RecordReader>> OpenTFRecordRecordReader(
    const RecordObject& object, const RecordReaderOptions& options);

// Appends one framed record to `out` (a pure function: for tests and custom writers).
void AppendTFRecord(const absl::Cord& data, absl::Cord* out);

struct TFRecordWriterOptions {
  // Frames are gathered into writes of about this many bytes.
  uint64_t buffer_bytes = uint64_t{8} << 20;
};

class TFRecordWriter {
 public:
  // REQUIRES: store != nullptr.
  static absl::StatusOr<std::unique_ptr<TFRecordWriter>> Open(std::shared_ptr<ObjectStore> store,
                                                              std::string key,
                                                              TFRecordWriterOptions options = {});
  // Aborts (leaves nothing behind) unless Close() succeeded.
  ~TFRecordWriter();
  TFRecordWriter(const TFRecordWriter&) = delete;
  TFRecordWriter& operator=(const TFRecordWriter&) = delete;

  absl::Status Write(const absl::Cord& record);
  absl::Status Write(absl::string_view record) { return Write(absl::Cord(record)); }
  // Makes the object visible. REQUIRES: not closed yet.
  absl::StatusOr<ObjectMeta> Close();

  uint64_t records() const { return records_; }

 private:
  TFRecordWriter(std::shared_ptr<ObjectStore> store, std::unique_ptr<ObjectWriter> writer,
                 std::string uri, TFRecordWriterOptions options);
  absl::Status Flush();

  const std::shared_ptr<ObjectStore> store_;  // outlives the writer's uploads
  std::unique_ptr<ObjectWriter> writer_;
  const std::string uri_;
  const TFRecordWriterOptions options_;
  absl::Cord pending_;
  uint64_t records_ = 0;
  bool closed_ = false;
  absl::Status status_;
};

}  // namespace wharf
