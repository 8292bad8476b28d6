// Tar shards, read as a stream, and their WebDataset grouping into samples.
//
// TarReader walks a tar archive from any ObjectStore through an ObjectReader (chunked ranged
// GETs with read-ahead), so a shard of any size is read in bounded memory: the reader's chunk
// bound plus the member being returned (members above max_member_bytes are refused). It
// understands what Python's tarfile and GNU tar write: ustar (name prefix), GNU long names and
// link names ('L'/'K' entries), pax extended headers ('x': path and size; 'g' ignored), octal
// and base-256 numbers. Every header checksum is verified (unsigned sum, or the signed sum of
// some old writers). It returns regular files only; directories, links, devices and FIFOs are
// skipped. A zero block (or the end of the object at a member boundary) ends the archive.
// GNU sparse members are refused (Unimplemented).
//
// Compressed shards: a shard named .tar.gz or .tgz (or opened with compression kGzip) is
// inflated as it streams (byte_stream.h); offsets are then offsets in the decompressed tar.
// An uncompressed read of a shard that starts with a compressed format's signature names it:
// gzip (InvalidArgument: name it .tar.gz/.tgz, or ask for gzip) or bzip2, xz, zstd
// (Unimplemented).
//
// TarSampleReader groups members exactly as WebDataset 1.0's reader does (tariterators.py:
// tar_file_iterator, base_plus_ext, group_by_keys with its defaults):
//  - regular files only (directories, links, devices are skipped, as tarfile's isreg());
//  - a member whose first path component is "__<...>__" (e.g. "__meta__/x.json") is skipped
//    (webdataset's skip_meta);
//  - the sample key and extension are webdataset's base_plus_ext, the regular expression
//    ^((?:.*/|)[^.]+)[.]([^/]*)$: normally the path up to the first '.' of its last component
//    and the rest ("a/b/s001.seg.png" -> "a/b/s001", "seg.png"); a last component that starts
//    with '.' gives the directory part as key when the regex allows it ("a/b/.x.txt" -> key
//    "a/b/", extension "x.txt"; ".x.txt" and "a.d/.x" have none); names with no '.' in their
//    last component are skipped. Nothing is stripped: "./s1.jpg" (tar -C dir .) has key "./s1";
//  - the extension is lower-cased (ASCII letters: webdataset lower-cases with Python's
//    str.lower(), which also folds non-ASCII letters; wharf leaves those as they are);
//  - consecutive members with the same key form one sample;
//  - two members of one sample with the same (lower-cased) extension are InvalidArgument, as
//    are the extensions "__key__", "__url__" and "__offset__", which name a sample's metadata
//    in webdataset and in wharf's Python samples (webdataset refuses the first two).
//
// Errors name the shard's URI and the byte offset of the header concerned, e.g.
//   "read tar file:///data/shard-0001.tar at byte 10240: header checksum mismatch (...)".
// Corruption and truncation are DataLoss. Errors are sticky.
//
// Thread-safety: readers are used by one thread at a time.
#pragma once

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
#include "formats/byte_stream.h"
#include "formats/record_reader.h"
#include "io/object_reader.h"
#include "store/object_store.h"

namespace wharf {

struct TarOptions {
  // io.offset: where to start (a member header's offset; decompressed when compressed).
  ObjectReaderOptions io;
  // kAuto: gzip for a key ending in .gz or .tgz, stored otherwise.
  Compression compression = Compression::kAuto;
  // Larger members are an error (ResourceExhausted) rather than an allocation.
  uint64_t max_member_bytes = uint64_t{1} << 30;
  // Largest GNU long-name or pax header accepted (a corrupt size would otherwise allocate).
  uint64_t max_extended_header_bytes = uint64_t{1} << 20;
};

// One regular file of the archive.
struct TarMember {
  std::string name;            // full path: pax path, else GNU long name, else prefix/name
  uint64_t header_offset = 0;  // first header of the member (its 'L'/'x' entries included)
  uint64_t data_offset = 0;    // first byte of its data
  absl::Cord data;             // zero-copy slices of the read chunks where large
};

class TarReader {
 public:
  // REQUIRES: store != nullptr.
  static absl::StatusOr<std::unique_ptr<TarReader>> Open(std::shared_ptr<ObjectStore> store,
                                                         std::string key, TarOptions options = {});
  // Reads from an opened stream (e.g. over a reader opened with meta from a listing).
  // options.io and options.compression are not used. REQUIRES: stream.
  explicit TarReader(std::unique_ptr<ByteStream> stream, TarOptions options = {});
  TarReader(const TarReader&) = delete;
  TarReader& operator=(const TarReader&) = delete;

  // The next regular file; nullopt at the end of the archive.
  absl::StatusOr<std::optional<TarMember>> Next();

  // Offset of the next header in the (decompressed) tar stream.
  uint64_t position() const { return stream_->position(); }
  const ByteStream& stream() const { return *stream_; }
  const ObjectReader& reader() const { return stream_->object(); }
  const std::string& uri() const { return stream_->uri(); }

 private:
  absl::Status Fail(absl::StatusCode code, uint64_t at, absl::string_view what);
  absl::Status IoError(const absl::Status& status, uint64_t at);
  // Reads an entry's data into `out` (for 'L' and 'x' entries), then its padding.
  absl::Status ReadSmall(uint64_t at, uint64_t size, std::string* out);
  absl::Status SkipData(uint64_t at, uint64_t size);
  // Skips the padding after `size` data bytes (an archive may end without it).
  absl::Status SkipPadding(uint64_t at, uint64_t size);
  // The error for a header at the start of an uncompressed object that fails its checksum:
  // names the compressed format the object holds, if it holds one; else DataLoss.
  absl::Status NotATarHeader(uint64_t at, const char* block, uint64_t unsigned_sum);

  const std::unique_ptr<ByteStream> stream_;
  const TarOptions options_;
  bool done_ = false;
  absl::Status status_;
};

// One WebDataset sample: the members sharing a key, in shard order.
struct TarSample {
  std::string key;                                         // e.g. "a/b/sample001"
  std::vector<std::pair<std::string, absl::Cord>> fields;  // extension -> bytes
  uint64_t offset = 0;                                     // header offset of its first member

  // The bytes for `extension`, or null.
  const absl::Cord* Find(absl::string_view extension) const;
};

// Splits a member name into (sample key, extension) as webdataset's base_plus_ext does (see
// the file comment; the extension as in the name, not lower-cased); nullopt when it has none.
std::optional<std::pair<absl::string_view, absl::string_view>> SplitSampleName(
    absl::string_view name);
// Whether webdataset skips the member as metadata: its first path component is "__...__".
bool IsTarMetadataName(absl::string_view name);

class TarSampleReader {
 public:
  // REQUIRES: store != nullptr.
  static absl::StatusOr<std::unique_ptr<TarSampleReader>> Open(std::shared_ptr<ObjectStore> store,
                                                               std::string key,
                                                               TarOptions options = {});
  // REQUIRES: tar != nullptr.
  explicit TarSampleReader(std::unique_ptr<TarReader> tar);
  TarSampleReader(const TarSampleReader&) = delete;
  TarSampleReader& operator=(const TarSampleReader&) = delete;

  // The next sample; nullopt at the end of the shard.
  absl::StatusOr<std::optional<TarSample>> Next();
  // Where the next sample's first header starts (or the end): a resume point.
  uint64_t offset() const { return pending_ ? pending_->header_offset : tar_->position(); }

  const TarReader& tar() const { return *tar_; }

 private:
  const std::unique_ptr<TarReader> tar_;
  std::optional<TarMember> pending_;  // first member of the next sample, read ahead
  absl::Status status_;
};

// The registry's "tar" reader (registry.h): a Record per sample, its key and one field per
// member, named by its extension.
absl::StatusOr<std::unique_ptr<RecordReader>> OpenTarRecordReader(
    const RecordObject& object, const RecordReaderOptions& options);

}  // namespace wharf
