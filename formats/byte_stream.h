// ByteStream: the bytes a record format parses, as stored in the object or inflated from a
// GZIP or ZLIB stream on the fly.
//
// The tar and TFRecord readers read through it, so a compressed shard (`.tar.gz`, a TFRecord
// file written with tf.io.TFRecordOptions(compression_type="GZIP"/"ZLIB")) streams in the same
// bounded memory as a stored one: the ObjectReader's chunk bound, plus, when inflating,
// zlib's state (its 32 KiB window and tables, about 45 KiB) and one output buffer of
// kInflateBufferBytes. Nothing of the object is held beyond that.
//
// Offsets. position() counts bytes of the stream the format sees: object bytes when stored,
// decompressed bytes when inflating, so a format's record offsets (its resume points) are
// offsets in the decompressed stream. A compressed stream has no random access: opening one
// at a decompressed offset inflates from the object's first byte and discards the bytes
// before the offset (so resuming in a compressed shard costs reading the shard up to there).
//
// GZIP: members as RFC 1952 writes them, each one's CRC-32 and length verified; several
// members one after the other (pigz --independent, `cat a.gz b.gz`) are read as one stream, as
// gzip(1) and Python's gzip module do, and zero bytes after the last member are ignored. Any
// other byte after a member is DataLoss. ZLIB: one RFC 1950 stream, its Adler-32 verified;
// bytes after it are DataLoss. A stream cut short is DataLoss; a corrupt one is DataLoss with
// zlib's reason and the compressed byte where inflating stopped. Errors are sticky.
//
// Thread-safety: used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "formats/record_reader.h"
#include "io/object_reader.h"

namespace wharf {

// (Compression, the enum, is in record_reader.h: it is a reader option.)

// "auto", "none", "gzip", "zlib".
absl::string_view CompressionName(Compression c);
// The compression named `name`, case-insensitively: "" or "auto", "none", "gzip", "zlib" (so
// tf.data's compression_type values "", "GZIP" and "ZLIB" are accepted as they are).
// InvalidArgument naming the accepted values otherwise.
absl::StatusOr<Compression> ParseCompression(absl::string_view name);
// `requested` unless it is kAuto; then by the key's suffix: ".gz" or ".tgz" is kGzip, ".zlib"
// is kZlib, anything else kNone.
Compression ResolveCompression(Compression requested, absl::string_view key);
// The compressed format whose signature `head` (an object's first bytes) starts with: "gzip",
// "zlib" (only with `zlib_too`: its two-byte header is weak evidence), "bzip2", "xz" or
// "zstd"; nullopt when none. For the error of a format that found no record where the object
// starts: it names what the object holds.
std::optional<absl::string_view> SniffCompression(absl::string_view head, bool zlib_too);

class ByteStream {
 public:
  // Output buffer of an inflating stream: what one inflate() call may produce at most.
  static constexpr size_t kInflateBufferBytes = size_t{64} << 10;

  // The bytes of `object` under `compression` (kAuto: by the key, ResolveCompression()),
  // starting at `io.offset`: an object offset when stored, a decompressed offset when
  // compressed (the object is then read from its start, see the file comment). io.length is
  // for stored objects only (InvalidArgument with compression). Store errors keep their code
  // and message.
  static absl::StatusOr<std::unique_ptr<ByteStream>> Open(const RecordObject& object,
                                                          ObjectReaderOptions io,
                                                          Compression compression);
  // A stored stream over an opened reader, from its position. REQUIRES: reader.
  static std::unique_ptr<ByteStream> Stored(std::unique_ptr<ObjectReader> reader);
  // An inflating stream over a reader at the object's start, whose first `skip` decompressed
  // bytes are dropped (lazily, by the first read). REQUIRES: reader at its range's start,
  // compression is kGzip or kZlib.
  static std::unique_ptr<ByteStream> Inflating(std::unique_ptr<ObjectReader> reader,
                                               Compression compression, uint64_t skip);
  ~ByteStream();
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  // kNone, kGzip or kZlib.
  Compression compression() const { return compression_; }
  bool compressed() const { return compression_ != Compression::kNone; }
  // Offset of the next byte in the stream (decompressed when compressed).
  uint64_t position() const;
  // The bytes left, when known before reading them (stored streams); nullopt when compressed.
  std::optional<uint64_t> remaining() const;
  // "the object ends at byte N" / "the decompressed stream ends at byte N": for messages
  // about a stream found to end early, at `end` (its last position).
  std::string DescribeEnd(uint64_t end) const;

  // The next bytes, without consuming them; empty at the end. The view is valid until the
  // next non-const call.
  absl::StatusOr<absl::string_view> Peek();
  // Consumes `n` bytes of the last Peek(). REQUIRES: n <= its size.
  void Consume(size_t n);
  // Copies up to dst.size() bytes into dst; returns how many (fewer only at the end).
  absl::StatusOr<size_t> Read(absl::Span<char> dst);
  // Up to `n` bytes (fewer only at the end). Stored: ObjectReader::ReadCord (zero-copy where
  // large); inflated: copies, in pieces of up to 1 MiB, so memory grows only as bytes arrive.
  absl::StatusOr<absl::Cord> ReadCord(uint64_t n);
  // Skips up to `n` bytes; returns how many (fewer only at the end). Stored streams skip
  // without fetching what they pass over; compressed ones inflate it.
  absl::StatusOr<uint64_t> Skip(uint64_t n);

  // The object's reader under the stream (its URI, meta, stats; object offsets).
  const ObjectReader& object() const { return *reader_; }
  const std::string& uri() const { return reader_->uri(); }

 private:
  class Inflater;

  ByteStream(std::unique_ptr<ObjectReader> reader, Compression compression, uint64_t skip);
  // Inflating: makes the output buffer non-empty unless the stream has ended.
  absl::Status Fill();
  absl::Status Fail(absl::StatusCode code, absl::string_view what);

  const std::unique_ptr<ObjectReader> reader_;
  const Compression compression_;
  // Inflating only.
  std::unique_ptr<Inflater> inflater_;
  uint64_t pos_ = 0;   // decompressed bytes consumed (the skipped ones included)
  uint64_t skip_ = 0;  // decompressed bytes still to drop before the first read
  absl::Status status_;
};

}  // namespace wharf
