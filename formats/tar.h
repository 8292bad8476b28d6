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
// TarSampleReader groups members the WebDataset way: a member's sample key is its path up to
// the first '.' of the last path component, the extension is the rest ("a/b/s001.seg.png" ->
// key "a/b/s001", extension "seg.png"); consecutive members with the same key form one sample.
// A leading "./" (tar -C dir .) is dropped; members whose last component has no '.' after a
// non-empty stem (e.g. "README", ".hidden") are skipped, as WebDataset does. Two members of
// one sample with the same extension are an error.
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
#include "formats/record_reader.h"
#include "io/object_reader.h"
#include "store/object_store.h"

namespace wharf {

struct TarOptions {
  ObjectReaderOptions io;
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
  // Reads from an opened reader (e.g. opened with meta from a listing). REQUIRES: reader.
  explicit TarReader(std::unique_ptr<ObjectReader> reader, TarOptions options = {});
  TarReader(const TarReader&) = delete;
  TarReader& operator=(const TarReader&) = delete;

  // The next regular file; nullopt at the end of the archive.
  absl::StatusOr<std::optional<TarMember>> Next();

  const ObjectReader& reader() const { return *reader_; }
  const std::string& uri() const { return reader_->uri(); }

 private:
  absl::Status Fail(absl::StatusCode code, uint64_t at, absl::string_view what);
  absl::Status IoError(const absl::Status& status, uint64_t at);
  // Reads an entry's data into `out` (for 'L' and 'x' entries), then its padding.
  absl::Status ReadSmall(uint64_t at, uint64_t size, std::string* out);
  absl::Status SkipData(uint64_t at, uint64_t size);

  const std::unique_ptr<ObjectReader> reader_;
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

// Splits a member name into (sample key, extension); nullopt when it has no extension.
std::optional<std::pair<absl::string_view, absl::string_view>> SplitSampleName(
    absl::string_view name);

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
  uint64_t offset() const { return pending_ ? pending_->header_offset : tar_->reader().position(); }

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
