// TierTreeStore: the files of a tier below one directory, as a store whose puts become tier
// entries. It is the destination of `wharf tier import` (the transfer engine copies into it)
// and later of checkpoints written to the tier.
//
//  - Reads and listings are the file:// store's over the directory (the tier's own `.wharf`
//    folder is never listed), except that an object's ETag is the ETag of the source it was
//    copied from (its entry's provenance), so the transfer engine's rerun check (same size
//    and ETag) skips exactly the entries that are current. A file that is not a complete
//    entry lists with an empty ETag: a rerun copies it again.
//  - Reads answer with that same ETag, and take it in if_match / if_none_match (the transfer
//    engine reads big objects in ranges under the ETag it listed: `wharf tier export`).
//  - A put writes the bytes into the process's temporary directory in the tier, checks them
//    (the MD5 against a source ETag that is an MD5), seals the file with its entry attribute
//    (PutOptions' provenance; `local` when there is none) and queues it. A committer thread
//    publishes the queue in batches: one syncfs of the tier's file system, then one rename per
//    file, then one fsync per directory touched. A put completes when its file is published,
//    so a completed put is durable and visible; a process killed before that leaves only
//    temporary files, which garbage collection removes (tier.h).
//
// Thread-safety: thread-safe, as every ObjectStore.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/runtime.h"
#include "store/forwarding_store.h"
#include "store/local/local_store.h"
#include "store/local/temp_object.h"
#include "tier/tier.h"

namespace wharf {

struct TierTreeOptions {
  // A batch is published when it holds this many files or bytes, or when its oldest file
  // has waited `max_delay`.
  size_t batch_files = 256;
  uint64_t batch_bytes = uint64_t{256} << 20;
  absl::Duration max_delay = absl::Milliseconds(20);
  // Entries written without provenance (data that exists nowhere else) are marked `local`.

  // Bulk writers (import): a put completes once its file is sealed and queued, before it is
  // published, while at most `max_unpublished` files wait (beyond that a put completes when
  // published again, which holds the writer back); Flush() waits until everything queued is
  // published and reports what was not. Nothing is visible before its batch is durable
  // either way; what changes is that the writer does not wait for each batch's syncfs.
  bool complete_before_publish = false;
  size_t max_unpublished = 4096;
  // With complete_before_publish: called once for each file that was completed and then not
  // published ("put URI: cause"), from the publishing thread, so each is named as it fails.
  std::function<void(const absl::Status&)> on_unpublished;

  // The checksum of entries written without provenance (data that exists nowhere else):
  // kMd5 (the default) lists them with the MD5 of their content, which S3 reproduces for
  // single-part uploads; kCrc32c (~20x cheaper, for big files written at disk speed, such
  // as checkpoints) lists them with "crc32c-<crc>-<fill time in ns, hex>", an ETag of their
  // own that the file store's ETag cache also carries, so reads never hash the file.
  Checksum written_checksum = Checksum::kMd5;

  // Files that are not entries (the user's own) list with the file store's ETag, the MD5 of
  // their content, instead of none: an export compares them with the destination and skips
  // what is there. An import keeps none, so a user's file that happens to hold the source's
  // bytes is written again and becomes an entry.
  bool plain_file_etags = false;
};

class TierTreeStore : public ForwardingStore {
 public:
  // The tree below `dir` (absolute, inside `tier`; created when missing).
  static absl::StatusOr<std::shared_ptr<TierTreeStore>> Open(std::shared_ptr<Tier> tier,
                                                             const std::string& dir,
                                                             std::shared_ptr<Runtime> runtime,
                                                             TierTreeOptions options = {});
  ~TierTreeStore() override;

  void ListAsync(ListOptions options, std::string continuation, Callback<ListPage> done) override;
  void HeadAsync(std::string key, Callback<ObjectMeta> done) override;
  void GetAsync(GetRequest request, Callback<GetResult> done) override;
  absl::StatusOr<ListPage> List(const ListOptions& options,
                                const std::string& continuation = "") override;
  absl::StatusOr<ObjectMeta> Head(const std::string& key) override;
  void PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                Callback<ObjectMeta> done) override;
  using ForwardingStore::PutAsync;  // the plain form, which calls the one above
  absl::StatusOr<ObjectMeta> Put(const std::string& key, absl::Cord data,
                                 const PutOptions& options) override;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key,
                                                          const PutOptions& options) override;
  void CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) override;
  absl::StatusOr<ObjectMeta> Copy(const std::string& src_key, const std::string& dst_key) override;

  const std::shared_ptr<Tier>& tier() const { return tier_; }
  const std::string& dir() const { return dir_; }

  // Waits until every file queued so far is published. With complete_before_publish, the
  // error of the puts that completed before their publishing failed (how many, the first
  // one's cause); OK otherwise.
  absl::Status Flush();
  // How many puts completed before their publishing failed (so far).
  uint64_t FailedToPublish();

  // Not for callers: a sealed file queued for publishing (used by the writer).
  struct Sealed;
  void Enqueue(Sealed sealed);

 private:
  TierTreeStore(std::shared_ptr<Tier> tier, std::shared_ptr<LocalStore> local,
                std::shared_ptr<Runtime> runtime, TierTreeOptions options);
  // A temporary file for `key` in the process's temporary directory, after the checks
  // every put makes (key, options, not the tier's own folder); errors name the key's URI.
  absl::StatusOr<std::unique_ptr<TempObject>> NewTemp(const std::string& key,
                                                      const PutOptions& options);
  // Writes `data` as a sealed entry file for `key`; the error names the key's URI. `md5`:
  // the MD5 of `data` when already computed (by the runtime's Md5Batcher), else null.
  absl::StatusOr<Sealed> Seal(const std::string& key, const absl::Cord& data,
                              const PutOptions& options, const Md5Digest* md5 = nullptr);
  // PutAsync; `batch_hash`: an MD5 to compute goes through the runtime's Md5Batcher (for
  // puts whose caller does not wait for each one before the next).
  void PutAsync(std::string key, absl::Cord data, const PutOptions& options, bool batch_hash,
                Callback<ObjectMeta> done);
  // What a put's file is checked and listed by (see NewTemp).
  Checksum ChecksumFor(const PutOptions& options) const {
    return options.source_uri.empty() ? options_.written_checksum : Checksum::kMd5;
  }
  // Replaces each object's ETag by its entry's source ETag ("" when not an entry) and
  // drops the tier's own folder.
  void Describe(ListPage& page) const;
  absl::StatusOr<ObjectMeta> Describe(ObjectMeta meta) const;
  // GetAsync once the entry (nullopt: not an entry) and its file's ETag are known.
  void GetEntryAsync(GetRequest request, std::optional<TierEntry> entry, std::string file_etag,
                     Callback<GetResult> done);
  void CommitLoop();
  void PublishBatch(std::vector<Sealed> batch);

  const std::shared_ptr<Tier> tier_;
  const std::shared_ptr<LocalStore> local_;
  const std::shared_ptr<Runtime> runtime_;
  const std::string dir_;
  const bool at_root_;  // dir_ is the tier's root: hide .wharf
  const TierTreeOptions options_;
  // Hashes the MD5-checked puts of PutAsync many at a time (base/md5_many.h).
  const std::shared_ptr<Md5Batcher> md5_batcher_;

  absl::Mutex mu_;
  std::deque<Sealed> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t unpublished_ ABSL_GUARDED_BY(mu_) = 0;  // queued or being published
  int flushing_ ABSL_GUARDED_BY(mu_) = 0;        // Flush() calls waiting
  uint64_t unpublished_failures_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_unpublished_failure_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread committer_;
};

// Whether the file at `path` (`st`) is the user's own since it was sealed as `entry`: written
// since (its mtime is not the one the entry recorded: WrittenSinceSealed) and its size or
// content no longer the entry's. Outside the tier's own folder such a file is the user's data
// (docs/design/tier.md, "Files written after their fill"): listed and read as a plain file,
// exported as one, never evicted (`tier verify` names it as written since its fill; --repair,
// asked for, fetches the source over it). Other bytes with the mtime as sealed are damage. Hashes
// the file only when it was written since, its size is the entry's and the file store's ETag cache
// does not vouch for its content (a file only touched: the cache then takes the entry's checksum
// again).
bool UsersEdit(const std::string& path, const struct stat& st, const TierEntry& entry);

// The ETag an entry lists with: its source's, or for data written to the tier itself (no
// source), the MD5 of its content (or its own CRC32C-based ETag, TierTreeOptions).
std::string EntryEtag(const TierEntry& entry);

// Checks the content of an entry's file, open as `fd` with `st`, against the checksum the entry
// records (its MD5, or its CRC32C: ~20x cheaper than an MD5). When they agree, the file store's
// ETag cache takes the entry's ETag again for the file as it is now (its MD5, or a new ETag of
// its own), so later reads and listings need no hash; returns that ETag, "" when the file no
// longer holds the entry's data. `sum`, when given, receives the checksum found (or why none).
std::string RecheckEntry(int fd, const struct stat& st, const TierEntry& entry,
                         absl::StatusOr<std::string>* sum = nullptr);

}  // namespace wharf
