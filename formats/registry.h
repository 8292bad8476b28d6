// The record formats wharf reads, by name: what each one's objects are called (suffixes),
// what its records hold, and how to open a reader over one object (record_reader.h).
//
// Code above formats/ (dataset/records.h, the Python binding) opens readers and names formats
// only through this registry, so a new format is one folder: its reader in formats/ and one
// line in the builtin table of registry.cc (see docs/design/formats.md). Formats can also be
// registered at run time (tests, embedders).
//
// Thread-safety: every function is thread-safe; specs never move or go away once registered,
// so the pointers returned stay valid for the life of the process.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/record_reader.h"

namespace wharf {

// What a format's records hold (Record's comment).
enum class RecordShape {
  kPayload,  // no key, one field "data"
  kFields,   // a key and fields named by the format (tar: one per member, by extension)
};

using RecordReaderOpener = std::function<absl::StatusOr<std::unique_ptr<RecordReader>>(
    const RecordObject& object, const RecordReaderOptions& options)>;

struct RecordFormatSpec {
  std::string name;                   // e.g. "tfrecord"
  std::vector<std::string> suffixes;  // object names ending so hold this format (".tfrecord")
  RecordShape shape = RecordShape::kPayload;
  // Records are rows of a text object: the row options (header, delimiter, quote,
  // skip_empty_rows) apply, and rows can be taken in lists.
  bool rows = false;
  RecordReaderOpener open;
  // Object names ending so hold this format compressed ("shard.tar.gz"): the reader inflates
  // them by their name (byte_stream.h). Shards too, when a prefix is listed: list `suffixes`
  // and these.
  std::vector<std::string> compressed_suffixes;
};

// Every format: the builtins in table order, then those registered, in registration order.
std::vector<const RecordFormatSpec*> RecordFormats();
// InvalidArgument naming `name` and listing the known formats when there is none so called.
absl::StatusOr<const RecordFormatSpec*> FindRecordFormat(absl::string_view name);
// Adds a format. InvalidArgument without a name or an opener; AlreadyExists for a name taken.
absl::Status RegisterRecordFormat(RecordFormatSpec spec);

// A reader of `format` over `object` (FindRecordFormat's error for an unknown name).
absl::StatusOr<std::unique_ptr<RecordReader>> OpenRecordReader(absl::string_view format,
                                                               const RecordObject& object,
                                                               const RecordReaderOptions& options);

}  // namespace wharf
