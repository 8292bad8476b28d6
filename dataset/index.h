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
// Thread-safety: a SampleIndex is immutable once built; const methods may be called
// concurrently. The builders are thread-safe (they share nothing).
#pragma once

#include <cstddef>
#include <cstdint>
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

// One sample: one whole object.
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

struct ListingIndexOptions {
  // Only keys ending in one of these (e.g. {".jpg", ".png"}); empty keeps every key.
  std::vector<std::string> suffixes;
  // Keys ending in '/' (directory markers some tools create) are skipped unless this is set.
  bool keep_directory_markers = false;
  ParallelListOptions list;
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
};

class SampleIndex {
 public:
  SampleIndex() = default;
  // An explicit list, in the order given.
  explicit SampleIndex(std::vector<SampleEntry> entries) : entries_(std::move(entries)) {}
  // An explicit list of keys (sizes unknown), in the order given.
  static SampleIndex FromKeys(std::vector<std::string> keys);

  // Every object under `prefix` (a string prefix, as object stores mean it: pass "train/"
  // for a "folder"), listed in parallel (work stealing) and sorted byte-wise, so the order
  // is canonical. Sizes and ETags come from the listing. Errors name the prefix's URI.
  static absl::StatusOr<SampleIndex> FromListing(ObjectStore& store, absl::string_view prefix,
                                                 const ListingIndexOptions& options = {});

  // Reads the manifest object `manifest_key` and parses it (see ParseManifest), resolving
  // relative keys against the manifest's prefix (its key up to and including the last '/').
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

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  // REQUIRES: i < size().
  const SampleEntry& operator[](size_t i) const { return entries_[i]; }
  const std::vector<SampleEntry>& entries() const { return entries_; }

  // A stable digest of the keys in order (hex MD5 over length-prefixed keys), the same for
  // the same keys however the index was built. A sampler state records it, so a job never
  // resumes onto a different dataset of the same size.
  std::string Fingerprint() const;

 private:
  std::vector<SampleEntry> entries_;
};

}  // namespace wharf
