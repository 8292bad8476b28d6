// SampleIndex: the samples of a dataset, in a canonical order, as object keys of one store.
//
// Sample i of a dataset is entry i of its index. Everything above (the sampler's
// permutation, the partition across ranks and workers, resume positions) is defined on
// these positions, so the index order must not depend on how the index was built:
//  - from a listing of a prefix: the keys sorted byte-wise (the store's listing order),
//    whatever the listing's parallelism;
//  - from a manifest object: the manifest's line order;
//  - from an explicit list: the list's order.
// Each entry carries the object's size and ETag when known, so the fetch engine needs no
// HEAD before reading it and can detect an object replaced since indexing.
//
// Memory. An index is a view over compact columns (key bytes with an offsets array, sizes,
// ETags likewise; dataset/index_file.h), held either in this process's memory (~24 bytes of
// arrays a sample plus the key bytes) or in an index file mapped read-only and shared
// (MAP_SHARED): then every rank and DataLoader worker of a node reads the same page-cache
// pages and an index of 10^8 samples costs a process no anonymous memory. Entries are
// therefore not stored as objects: Ref(i) returns views into the columns (SampleRef, valid
// while the index or a copy of it lives: no allocation), operator[] an owning copy
// (SampleEntry). Copying a SampleIndex is cheap (the columns are shared).
//
// Thread-safety: a SampleIndex is immutable once built; const methods may be called
// concurrently. The builders are thread-safe (they share nothing); one SampleIndexBuilder is
// used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/fetch_scheduler.h"
#include "io/parallel_list.h"
#include "store/object_store.h"

namespace wharf {

// One sample: one whole object (an owning copy; SampleRef is the view an index hands out).
struct SampleEntry {
  std::string key;
  // The object's size when known (listings and JSON-lines manifests give it): saves the
  // engine a HEAD and lets a reader notice an object that changed since indexing.
  std::optional<uint64_t> size;
  // The object's ETag when known (listings): pins the version across ranged parts.
  std::string etag;

  // The engine's read of the whole object.
  FetchItem ToFetchItem() const;
};

// Entry i of an index, as views into its columns: valid while the index lives.
struct SampleRef {
  absl::string_view key;
  std::optional<uint64_t> size;
  absl::string_view etag;

  FetchItem ToFetchItem() const;
  SampleEntry ToEntry() const;
};

// Where index files are kept. An empty `dir` keeps the index in this process's memory.
struct IndexCacheOptions {
  // A directory (created if missing, mode 0700). DefaultIndexCacheDir() is the usual choice.
  std::string dir;
  // Added to the cache key: what identifies the store beyond its URIs (e.g. its spec with the
  // endpoint), so two stores with the same bucket names never share an index file.
  std::string scope;
};

struct ListingIndexOptions {
  // Only keys ending in one of these (e.g. {".jpg", ".png"}); empty keeps every key.
  std::vector<std::string> suffixes;
  // Empty objects whose key ends in '/' (directory markers some tools create) are skipped
  // unless this is set; a non-empty object whose key ends in '/' is always kept.
  bool keep_directory_markers = false;
  ParallelListOptions list;
  // With a cache dir, the listing is written to an index file named after the listing's
  // parameters and contents (a listing is always taken again: only its result is shared, by
  // the ranks and workers that list the same objects) and mapped.
  IndexCacheOptions cache;
};

// How a manifest's lines are read.
enum class ManifestFormat {
  // JSON lines when the first non-blank line starts with '{', plain keys otherwise.
  kAuto,
  // One key per line.
  kKeys,
  // One JSON object per line: {"key": "...", "size": 123, "etag": "..."}; "key" is
  // required, "size" and "etag" optional, other fields ignored.
  kJsonLines,
};

struct ManifestOptions {
  ManifestFormat format = ManifestFormat::kAuto;
  // With a cache dir, the index file of this manifest version (its URI, ETag and size) is
  // built once, by one process at a time (a lock file beside it), and mapped by every
  // process that asks for the same version afterwards.
  IndexCacheOptions cache;
};

class SampleIndex;

// Collects entries into the compact columns (dataset/index_file.h) of an index in memory or
// of an index file, as they come: nothing per entry but the column bytes is held, and a file
// builder streams them to disk, so an index of 10^8 keys is built in O(1) memory.
class SampleIndexBuilder {
 public:
  // An index in this process's memory.
  SampleIndexBuilder();
  // An index file, written to a temporary file (mode 0600, named `name_prefix` + "tmp-...")
  // in `dir` and published by FinishFile. REQUIRES: `dir` exists.
  static absl::StatusOr<SampleIndexBuilder> ToFile(const std::string& dir,
                                                   absl::string_view name_prefix = "");
  ~SampleIndexBuilder();
  SampleIndexBuilder(SampleIndexBuilder&&) noexcept;
  SampleIndexBuilder& operator=(SampleIndexBuilder&&) noexcept;
  SampleIndexBuilder(const SampleIndexBuilder&) = delete;
  SampleIndexBuilder& operator=(const SampleIndexBuilder&) = delete;

  // Appends entry size(). An empty etag means unknown.
  absl::Status Add(absl::string_view key, std::optional<uint64_t> size, absl::string_view etag);
  uint64_t size() const;

  // The index (a memory builder; FailedPrecondition for a file builder).
  absl::StatusOr<SampleIndex> Finish();
  // A file builder's index: the file is completed, synced and published at
  // path_for(content digest) (a hex digest of every key, size and ETag in order), then mapped.
  // `replace`: over any file there (rename). Otherwise a valid index file already at that path
  // (the same listing published by another process: same digest, same bytes) is kept and
  // mapped instead, so the processes of a node share one file.
  absl::StatusOr<SampleIndex> FinishFile(
      const std::function<std::string(absl::string_view content_digest)>& path_for, bool replace);

  struct Impl;  // internal: the memory and file implementations (index.cc)

 private:
  explicit SampleIndexBuilder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

namespace internal_index {
struct Columns;
}  // namespace internal_index

class SampleIndex {
 public:
  // No samples.
  SampleIndex();
  // An explicit list, in the order given.
  explicit SampleIndex(const std::vector<SampleEntry>& entries);
  // An explicit list of keys (sizes unknown), in the order given.
  static SampleIndex FromKeys(const std::vector<std::string>& keys);

  // Every object under `prefix` (a string prefix, as object stores mean it: pass "train/"
  // for a "folder"), listed in parallel (work stealing) and sorted byte-wise, so the order
  // is canonical. Sizes and ETags come from the listing. Errors name the prefix's URI.
  static absl::StatusOr<SampleIndex> FromListing(ObjectStore& store, absl::string_view prefix,
                                                 const ListingIndexOptions& options = {});

  // Reads the manifest object `manifest_key` (streamed: one GET pinned to the ETag a HEAD
  // gave, parsed as it arrives) and parses it (see ParseManifest), resolving relative keys
  // against the manifest's prefix (its key up to and including the last '/').
  static absl::StatusOr<SampleIndex> FromManifest(ObjectStore& store,
                                                  const std::string& manifest_key,
                                                  const ManifestOptions& options = {});

  // Parses manifest text. Lines end in "\n" or "\r\n"; blank lines are skipped. In a plain
  // manifest, leading and trailing ASCII whitespace of each line is dropped. A key is
  //  - relative: resolved as `base_prefix` + key (plain concatenation: object stores have
  //    no directories, so "." and ".." are not interpreted);
  //  - absolute when it starts with '/': the key below the store's root ("/a/b" is "a/b");
  //  - a URI inside `store_root_uri` (the store's Uri(""), e.g. "s3://bucket/"): the rest of
  //    the URI is the key. A URI of any other store is an error.
  // Errors are InvalidArgument and name `manifest_name` and the 1-based line number, e.g.
  //   "manifest s3://b/train.jsonl line 7: \"size\" must be a non-negative integer".
  static absl::StatusOr<SampleIndex> ParseManifest(absl::string_view text,
                                                   absl::string_view base_prefix,
                                                   absl::string_view store_root_uri,
                                                   absl::string_view manifest_name,
                                                   const ManifestOptions& options = {});

  // The index file at `path` (dataset/index_file.h), mapped read-only and shared. Checks
  // its header and layout (O(1): nothing per entry is read); a file that is not an index
  // file, of another format version, truncated or inconsistent is InvalidArgument naming
  // the path and what is wrong. Entries are read in place, always within the mapping: a
  // corrupted offset inside the file yields a wrong (never an out-of-bounds) key, which
  // Verify() finds.
  static absl::StatusOr<SampleIndex> OpenFile(const std::string& path);
  // An index file's bytes (Serialize()), held in memory: e.g. a pickled index. Checked as
  // OpenFile checks a file.
  static absl::StatusOr<SampleIndex> FromBytes(std::string bytes);
  // This index in the index file format.
  std::string Serialize() const;

  // O(N): every offset in bounds and increasing, and the keys' fingerprint equal to the
  // one recorded. InvalidArgument naming the first bad entry otherwise.
  absl::Status Verify() const;

  size_t size() const;
  bool empty() const { return size() == 0; }
  // Entry i, as views into the columns. REQUIRES: i < size().
  SampleRef Ref(size_t i) const;
  // Entry i, copied. REQUIRES: i < size().
  SampleEntry operator[](size_t i) const { return Ref(i).ToEntry(); }

  // The entries in order, copied one at a time, for range-for loops
  // (`for (const SampleEntry& e : index.entries())`). Loops that need no copy use Ref(i).
  class Entries {
   public:
    class iterator {
     public:
      using iterator_category = std::input_iterator_tag;
      using value_type = SampleEntry;
      using difference_type = std::ptrdiff_t;
      using pointer = void;
      using reference = SampleEntry;
      SampleEntry operator*() const { return (*index_)[i_]; }
      iterator& operator++() {
        ++i_;
        return *this;
      }
      bool operator==(const iterator& o) const { return i_ == o.i_; }
      bool operator!=(const iterator& o) const { return i_ != o.i_; }

     private:
      friend class Entries;
      iterator(const SampleIndex* index, size_t i) : index_(index), i_(i) {}
      const SampleIndex* index_;
      size_t i_;
    };
    iterator begin() const { return iterator(index_, 0); }
    iterator end() const { return iterator(index_, index_->size()); }

   private:
    friend class SampleIndex;
    explicit Entries(const SampleIndex* index) : index_(index) {}
    const SampleIndex* index_;
  };
  Entries entries() const { return Entries(this); }
  // Owning copies of every entry (O(N) memory: for tests and small indexes).
  std::vector<SampleEntry> ToEntries() const;

  // A stable digest of the keys in order (hex MD5 over length-prefixed keys), the same for
  // the same keys however the index was built. A sampler state records it, so a job never
  // resumes onto a different dataset of the same size. Recorded when the index is built:
  // O(1).
  std::string Fingerprint() const;

  // The index file this index maps; empty when it is held in memory.
  const std::string& path() const;
  // Bytes of this process's heap the index holds (0 for a mapped file).
  uint64_t memory_bytes() const;

 private:
  friend class SampleIndexBuilder;
  explicit SampleIndex(std::shared_ptr<const internal_index::Columns> columns);
  std::shared_ptr<const internal_index::Columns> columns_;
};

// Where index files go by default: $WHARF_INDEX_CACHE, else $XDG_CACHE_HOME/wharf/index,
// else $HOME/.cache/wharf/index (empty when none of them is set).
std::string DefaultIndexCacheDir();

}  // namespace wharf
