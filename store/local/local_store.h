// LocalStore: the file:// backend. A directory tree presented with object-store semantics:
//  - a key "a/b/c" is the file <root>/a/b/c; listings return keys in byte-wise lexicographic
//    order (exactly S3's order, which a plain directory walk does not give: "a.txt" < "a/b");
//  - puts are atomic: bytes go to a private temporary file (mode 0600, named ".wharf-tmp-*",
//    never listed) in the target directory, which is renamed over the key when complete;
//  - ETags are the MD5 of the content, computed while writing and kept in the extended
//    attribute "user.wharf.etag" with the size and mtime they belong to; files written by
//    other programs are hashed on first use (and the attribute cached when possible);
//  - keys are validated so no key can name a path outside the root: no empty, "." or ".."
//    components, no leading or trailing '/', no NUL, valid UTF-8;
//  - deleting the last object of a directory removes the empty directories above it, so a
//    listing never shows an empty "directory" as a common prefix;
//  - PutOptions::mtime sets the file's modification time before the rename (so the object
//    appears with it); the other PutOptions fields are ignored.
//  - read options: if_match / if_none_match compare the etag above; max_staleness is met by
//    reading the file; a cancel token is checked before the file is opened and between
//    chunks (1 MiB into a sink, 8 MiB into a buffer);
// File-system limits surface as FailedPrecondition: "a" and "a/b" cannot both be objects
// (capabilities().nested_keys_conflict), and keys cannot end in '/'.
//
// Thread-safety: thread-safe; every method may be called concurrently. Asynchronous calls
// run on the runtime's blocking pool; blocking calls run inline on the caller's thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"
#include "base/md5_many.h"
#include "base/runtime.h"
#include "store/object_store.h"

namespace wharf {

struct LocalStoreOptions {
  // fsync each object (and its directory) before it becomes visible. Off by default: the
  // rename already makes puts atomic for readers; fsync adds crash durability at the cost
  // of one disk flush per object.
  bool fsync = false;
};

class LocalStore : public ObjectStore {
 public:
  // `root` is an absolute directory path (created if missing). REQUIRES: runtime != nullptr.
  static absl::StatusOr<std::unique_ptr<LocalStore>> Open(std::string root,
                                                          std::shared_ptr<Runtime> runtime,
                                                          LocalStoreOptions options = {});

  // Directories that deletes never remove, nor any directory above them. A delete prunes the
  // empty directories it leaves (so a delimiter listing never shows an empty prefix), and a
  // file:// store is rooted at "/": without these, `rm dir/a/b/f` removed dir/a/b, dir/a and
  // dir when empty, and `sync --delete` its destination. The CLI keeps each local path it is
  // given, the Python Store its folder. Process-wide; absolute paths.
  static void KeepDirectory(absl::string_view path);

  // How many entries listings of local folders have left out in this process, each with a
  // warning line: links to nothing or to a folder they are in, FIFOs, sockets, devices, names
  // that are not UTF-8 (the runtime's `wharf_local_list_skipped_total`). `cp -r` and `sync`
  // exit 2 when theirs left any out, as `aws s3` does: the rest was copied, not all.
  static uint64_t SkippedEntries();

  // InvalidArgument (naming the key and the rule) unless `key` is a valid file:// key.
  static absl::Status ValidateKey(absl::string_view key);

  std::string Uri(absl::string_view key) const override;
  const Capabilities& capabilities() const override;

  void ListAsync(ListOptions options, std::string continuation, Callback<ListPage> done) override;
  void HeadAsync(std::string key, Callback<ObjectMeta> done) override;
  void GetAsync(GetRequest request, Callback<GetResult> done) override;
  void PutAsync(std::string key, absl::Cord data, Callback<ObjectMeta> done) override;
  void PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                Callback<ObjectMeta> done) override;
  void DeleteAsync(std::string key, StatusCallback done) override;
  void DeleteManyAsync(std::vector<std::string> keys, StatusCallback done) override;
  void CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) override;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key) override;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key,
                                                          const PutOptions& options) override;

  absl::StatusOr<ListPage> List(const ListOptions& options,
                                const std::string& continuation = "") override;
  absl::StatusOr<ObjectMeta> Head(const std::string& key) override;
  absl::StatusOr<GetResult> Get(const GetRequest& request) override;
  absl::StatusOr<ObjectMeta> Put(const std::string& key, absl::Cord data) override;
  absl::StatusOr<ObjectMeta> Put(const std::string& key, absl::Cord data,
                                 const PutOptions& options) override;
  absl::Status Delete(const std::string& key) override;
  absl::Status DeleteMany(std::vector<std::string> keys) override;
  absl::StatusOr<ObjectMeta> Copy(const std::string& src_key, const std::string& dst_key) override;

  const std::string& root() const { return root_; }

 private:
  LocalStore(std::string root, std::shared_ptr<Runtime> runtime, LocalStoreOptions options);

  // Put with the MD5 of `data` already computed (by the runtime's Md5Batcher), or null.
  absl::StatusOr<ObjectMeta> Put(const std::string& key, absl::Cord data, const PutOptions& options,
                                 const Md5Digest* md5);
  std::string PathOf(absl::string_view key) const;
  // Whether `key` may be written: a valid key (ValidateKey), not in a tier's own folder (a
  // '.wharf' holding tier.json: InvalidArgument), and no link to a folder on its way below
  // the root (RefuseLinksBelow: FailedPrecondition).
  absl::Status CheckWriteTarget(const std::string& key) const;
  // Removes now-empty directories from `key`'s parent up to (not including) the root or a
  // kept directory (KeepDirectory) or one above it.
  void PruneEmptyParents(absl::string_view key) const;

  const std::string root_;  // absolute, no trailing '/' (except the file system root "/")
  const std::shared_ptr<Runtime> runtime_;
  const LocalStoreOptions options_;
  // Hashes PutAsync's objects many at a time (base/md5_many.h).
  const std::shared_ptr<Md5Batcher> md5_batcher_;
};

}  // namespace wharf
