// The one shape every record format has: a reader of one object's records, and the record.
//
// A format (tar samples, TFRecord, CSV / JSON lines rows, ...) is a RecordReader over one
// object of any ObjectStore, read through an io/ObjectReader (so a tier or any decorator sits
// under every format), and an entry in the registry (registry.h) that says how to open one.
// Code above formats/ (dataset/, python/) knows only these two headers, never a format.
//
// Resume contract: a reader opened at a byte offset that one of its kind reported for the
// same object (a Record::offset, or offset() between two Next() calls) yields from there
// exactly the records an uninterrupted reader yields after that point. Errors are values,
// name the format, the object's URI and the byte offset of the record concerned, and are
// sticky (every later Next() returns the same error).
//
// Thread-safety: a reader is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "io/object_reader.h"
#include "store/object_store.h"

namespace wharf {

// The field of a record whose format has one payload per record.
inline constexpr absl::string_view kDataField = "data";

// One record of any format: a key plus named fields.
//  - formats with one payload per record (TFRecord; CSV and JSON lines rows) have no key and
//    one field, "data" (a row without its line end);
//  - tar samples have their WebDataset key and one field per member, named by its extension.
struct Record {
  uint64_t offset = 0;  // byte offset where the record starts in its object (a resume point)
  std::string key;
  std::vector<std::pair<std::string, absl::Cord>> fields;
  // Which object of a list the record came from. Readers of one object leave it 0; readers
  // of many (dataset/records.h) set it.
  size_t shard = 0;

  // A record of a one-payload format: no key, one field "data".
  static Record Payload(uint64_t offset, absl::Cord data);
  // The field named `name`, or null.
  const absl::Cord* Find(absl::string_view name) const;
};

// How a record object's bytes are stored (formats/byte_stream.h reads them).
enum class Compression {
  kAuto,  // by the object's name (ResolveCompression: ".gz"/".tgz" gzip, ".zlib" zlib)
  kNone,
  kGzip,  // RFC 1952 (gzip(1), Python's gzip, tf.data's "GZIP")
  kZlib,  // RFC 1950 (zlib.compress, tf.data's "ZLIB")
};

// How to read: the byte source, and the options of the formats that have some. A format
// ignores the options that are not its own.
struct RecordReaderOptions {
  // io.offset is where reading starts: 0, or a resume point this format reported for the
  // object (see the file comment). io.length is not for record readers (leave it unset).
  ObjectReaderOptions io;
  // tar, tfrecord: how the object is compressed; kAuto decides by its name. Offsets (io.offset,
  // Record::offset) of a compressed object count decompressed bytes.
  Compression compression = Compression::kAuto;
  // Row formats (csv, jsonl): the object's first row is a header, returned by header() and
  // not as a record; read from the start of the object whatever io.offset is.
  bool header = false;
  char delimiter = ',';  // csv
  char quote = '"';      // csv
  bool skip_empty_rows = false;
};

// One object of a store to read records from.
struct RecordObject {
  std::shared_ptr<ObjectStore> store;
  std::string key;
  // Its size (and ETag, when not empty) if known, e.g. from a listing: opened without a
  // request (by key, Open waits for the first chunk's GET, which tells them).
  std::optional<ObjectMeta> meta;

  // An ObjectReader over the object (with `meta` when given).
  absl::StatusOr<std::unique_ptr<ObjectReader>> Open(ObjectReaderOptions io) const;
};

class RecordReader {
 public:
  virtual ~RecordReader() = default;

  // The next record; nullopt at the end of the object.
  virtual absl::StatusOr<std::optional<Record>> Next() = 0;
  // Up to n records (fewer only at the end; empty at the end). When an error stops the batch
  // after some records were taken, those are returned and the (sticky) error comes with the
  // next call. The default calls Next(); formats that can batch cheaper override it (rows
  // share one buffer). REQUIRES: n > 0.
  virtual absl::StatusOr<std::vector<Record>> NextBatch(size_t n);

  // The byte offset a reader of this format can be reopened at to continue after the records
  // returned so far (where the next record starts, or the end).
  virtual uint64_t offset() const = 0;
  // Row formats opened with the header option: the object's header row (nullopt for an empty
  // object). Other formats: nullopt.
  virtual std::optional<std::string> header() const { return std::nullopt; }
  // The byte source (the object's URI, meta with its ETag, stats).
  virtual const ObjectReader& reader() const = 0;
};

}  // namespace wharf
