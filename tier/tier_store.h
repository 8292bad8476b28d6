// TierStore: the tier as a read-through cache in front of any store (docs/design/tier.md).
//
// A read of key K is served from the tier when a complete, fresh entry for K exists: first
// in an imported tree whose source prefix covers K's URI, else in the read-through area
// `<tier>/.wharf/objects/<scheme>/<bucket>/<key>`. Fresh: always in `immutable` mode; in `ttl`
// mode when the entry was filled (or last revalidated) at most max(ttl, request.max_staleness)
// ago; an older one is revalidated with a conditional GET (If-None-Match on its ETag), and
// only a changed object is fetched again. A miss fills
// the read-through area with the whole object and serves the read from it:
//  - one filler per object across threads, processes and nodes: the filler holds an
//    exclusive flock on the lock stripe of the object's path, tried without blocking and
//    retried on the runtime's timer (so waiting readers hold no thread); it re-checks the
//    entry once it has the lock, because another filler may have finished meanwhile. A
//    filler killed with -9 releases the stripe with its process;
//  - the object streams from the backing store into a private temporary file, is checked
//    (its size is the backing store's), sealed with its entry attribute (source URI and ETag)
//    and published by rename. Fills are not fsynced: an entry a crash truncated fails the
//    size check and is fetched again.
// Objects larger than the tier's block_threshold are cached in blocks of block_size bytes
// instead (`<fill path>.blocks/<hash of the ETag>/<index>`, each an entry of its own whose
// attribute names the object, its ETag and size, and the block's offset), so a ranged read
// of a big object fetches and keeps only the blocks it covers:
//  - the object's size and ETag come from its blocks already in the tier (fresh ones, in ttl
//    mode), else from a HEAD of the source (ranged reads, and whole reads of an object that
//    has blocks); a whole read of an object the tier knows nothing of is one GET, and when
//    the object turns out to be big the part of it before the first block boundary above
//    the threshold is cut into blocks (the rest streamed into blocks) before it is served;
//  - a missing block is fetched with a ranged GET carrying If-Match on the object's ETag,
//    filled like a whole object (private file, size check, attribute, rename) under the lock
//    stripe of the block's path, so N readers of one block fetch it once; the blocks of one
//    read are fetched in parallel, a window of at most kBlockWindow at a time (each streams
//    into its file: no memory is held for them);
//  - blocks of one version are never mixed with another's: each ETag has its directory; a
//    source changed under an immutable tier's blocks (If-Match fails) makes the read look the
//    object up again once; a fill into a new version's directory removes the old versions'
//    blocks that nobody reads or pinned, and `tier gc` the rest;
//  - a block filled for an object whose `.blocks` directory is pinned is pinned too.
// Keys that cannot be paths (a ".." segment, "//", a trailing '/', a segment ending in
// ".blocks", which names blocks) bypass the tier.
// Requests carry their read options: if_match other than the entry's ETag refills (then
// fails as the backing store would); if_none_match is answered from the entry.
// A HEAD of a key with a fresh entry (or fresh blocks) is answered from the entry (size, the
// source's ETag).
// A listing within the source of a complete import (tier.h: every object the import listed
// is in the tree) is answered from the imported tree while the import is fresh (immutable
// mode; in ttl mode for ttl after the import completed): the process's first such listing
// walks the tree once, and the tree serves only when it still holds as many entries of that
// source as the import listed (an evicted or deleted file sends listings to the bucket).
// Trees above kMaxListedImport objects are not held in memory: they list from the bucket.
// Puts, copies and deletes go to the backing store; each also removes the key's copy from
// the read-through area, so this process never reads its own write stale.
//
// Thread-safety: thread-safe, as every ObjectStore.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/fork.h"
#include "base/runtime.h"
#include "store/forwarding_store.h"
#include "store/registry.h"
#include "tier/tier.h"

namespace wharf {

class TierStore : public ForwardingStore, public std::enable_shared_from_this<TierStore> {
 public:
  // `inner` seen through `tier`. REQUIRES: inner, tier and runtime non-null.
  static absl::StatusOr<std::shared_ptr<TierStore>> Open(std::shared_ptr<ObjectStore> inner,
                                                         std::shared_ptr<Tier> tier,
                                                         std::shared_ptr<Runtime> runtime);
  ~TierStore() override;

  // The backing store's, without `compose`: a read through the tier is per object, so that
  // each object is filled and found again (the fetch engine composes small objects into one
  // temporary read where the store composes, and the tier would cache the temporary).
  const Capabilities& capabilities() const override { return capabilities_; }

  void ListAsync(ListOptions options, std::string continuation, Callback<ListPage> done) override;
  absl::StatusOr<ListPage> List(const ListOptions& options,
                                const std::string& continuation = "") override;
  void HeadAsync(std::string key, Callback<ObjectMeta> done) override;
  void GetAsync(GetRequest request, Callback<GetResult> done) override;
  absl::StatusOr<GetResult> Get(const GetRequest& request) override;
  void PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                Callback<ObjectMeta> done) override;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key,
                                                          const PutOptions& options) override;
  void DeleteAsync(std::string key, StatusCallback done) override;
  void DeleteManyAsync(std::vector<std::string> keys, StatusCallback done) override;
  void CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) override;

  struct Stats {
    uint64_t hits = 0;    // reads served from the tier
    uint64_t misses = 0;  // reads that found no fresh entry
    uint64_t fills = 0;   // objects (or blocks) this process fetched into the tier
    uint64_t fill_bytes = 0;
    uint64_t block_fills = 0;  // of which blocks of big objects
    uint64_t bypassed = 0;     // reads around the tier: keys that cannot be paths, and fills
                               // the file system could not keep (those also count as misses)
    uint64_t evicted = 0;      // entries this process's eviction passes removed
    uint64_t revalidated = 0;  // stale copies the source confirmed unchanged (304)
    uint64_t listed = 0;       // listing pages answered from imported trees
  };
  static constexpr uint64_t kMaxListedImport = uint64_t{1} << 20;
  Stats stats() const;
  // What exit does for the cache stores and tiers of this process: the counters not yet
  // written go to their tiers' stats, then the temporary directories go. For processes that
  // end without exit handlers (multiprocessing children end with os._exit after their
  // finalizers: the Python package calls this from one). Idempotent.
  static void AtExit();

  const std::shared_ptr<Tier>& tier() const { return tier_; }
  // The copy of `key` in the read-through area (nullopt when the key bypasses the tier).
  std::optional<std::string> FillPath(const std::string& key) const;

  // Blocks of one read fetched at once.
  static constexpr int kBlockWindow = 8;

 private:
  struct PendingRead;
  struct TreeListing;  // a complete import's objects in key order
  struct BlockRead;
  struct BlockSlot;
  // A version of a big object: its size and ETag. `confirmed`: the source said so during
  // this read (a HEAD), so its blocks are current whatever their age.
  struct Version {
    uint64_t size = 0;
    std::string etag;
    bool confirmed = false;
  };
  TierStore(std::shared_ptr<ObjectStore> inner, std::shared_ptr<Tier> tier,
            std::shared_ptr<Runtime> runtime, std::vector<TierImport> imports);

  std::optional<std::string> FillPathOfUri(const std::string& uri) const;
  // Paths that may hold `key`'s entry, in lookup order, the read-through copy last; empty
  // when the key bypasses the tier.
  std::vector<std::string> Candidates(const std::string& key) const;
  // Serves `read` from the first candidate holding a fresh entry; false when none does.
  bool ServeLocal(PendingRead& read, bool after_fill);
  void Acquire(std::shared_ptr<PendingRead> read);
  // `read` waits for this process's fill of its object (in filling_), or for its own
  // cancellation; Unpark drops the cancellation callbacks Park registered.
  void Park(std::shared_ptr<PendingRead> read);
  static void Unpark(PendingRead& read, uint64_t on_request, uint64_t on_scope);
  // The end of this process's fill of `fill_path` on `stripe`: the stripe's flock is given
  // back with its last holder, and the reads waiting for the object look again.
  void ReleaseFill(uint64_t stripe, const std::string& fill_path);
  void Fill(std::shared_ptr<PendingRead> read);
  // Seals and publishes a filled object, then serves the read from it.
  void Publish(const std::shared_ptr<PendingRead>& read, const absl::StatusOr<GetResult>& got);
  // A fill that fetched the object but could not keep it (a file where the key needs a
  // folder, or the reverse; a full disk): the read is answered all the same, from the bytes
  // in memory or by ReadAround.
  void FillFailed(const std::shared_ptr<PendingRead>& read, const GetResult& got,
                  const absl::Status& why);
  // Sends the read to the backing store as it was asked (the tier cannot hold the object).
  void ReadAround(const std::shared_ptr<PendingRead>& read, const absl::Status& why);
  void WarnReadAround(const absl::Status& why);  // one line per TierStore
  // Answers a read that just filled `entry` from the bytes it kept in memory.
  void ServeFilled(PendingRead& read, const TierEntry& entry, absl::Time mtime,
                   absl::string_view data);
  void Forget(const std::string& key);
  // The listing of the complete, fresh import whose source covers `prefix`, or null when
  // the bucket must answer. Walks the tree the first time (blocking I/O).
  std::shared_ptr<const TreeListing> ListingFor(const std::string& prefix);
  // The listing of `import` kept by an earlier walk, or null (see tier_store.cc).
  static std::shared_ptr<const TreeListing> ReadKeptListing(const Tier& tier,
                                                            const TierImport& import,
                                                            const std::string& key_prefix);
  static void KeepListing(Tier& tier, const TierImport& import, const std::string& key_prefix,
                          const std::vector<ObjectMeta>& objects);

  // ---- Blocks of big objects ----
  // The newest version of the object at `fill_path` whose blocks are in the tier (fresh ones
  // in ttl mode, with `if_match` its ETag when given); `hint`: a block index to look at first.
  std::optional<Version> FindBlocks(const std::string& fill_path, const std::string& uri,
                                    const std::string& if_match, absl::Duration max_staleness,
                                    uint64_t hint) const;
  // What a read that found no whole entry does: blocks it knows of, else a HEAD (ranged
  // reads, objects with blocks), else a whole fill. Counts the miss or, for blocks, later.
  void ReadUncached(std::shared_ptr<PendingRead> read);
  // Looks the object up at the source and reads it as blocks when it is big, whole if not.
  void Discover(std::shared_ptr<PendingRead> read, bool retried);
  // Serves `read` from the blocks of `version`, filling the missing ones.
  void ReadBlocks(std::shared_ptr<PendingRead> read, Version version, bool retried);
  void StartWindow(std::shared_ptr<BlockRead> br);
  // One block of the window: local, or filled under its stripe lock. The step that makes the
  // window's last block local serves the window.
  void StepBlock(const std::shared_ptr<BlockRead>& br, BlockSlot& slot);
  bool OpenBlock(const BlockRead& br, BlockSlot& slot);
  void FillBlock(std::shared_ptr<BlockRead> br, BlockSlot* slot);
  void PublishBlock(const std::shared_ptr<BlockRead>& br, BlockSlot& slot,
                    const absl::StatusOr<GetResult>& got);
  void SlotDone(const std::shared_ptr<BlockRead>& br);
  void ServeWindow(const std::shared_ptr<BlockRead>& br);
  // A block the tier could not keep (`why`): bytes [from, end) of the read are fetched around
  // the tier, into the read's sink after what it has or into its buffer at their place.
  void ReadRestAround(const std::shared_ptr<BlockRead>& br, uint64_t from, const absl::Status& why);
  // Cuts a whole object just fetched (a big one) into blocks and serves the read from them.
  void PublishAsBlocks(std::shared_ptr<PendingRead> read, const GetResult& got);
  // Sizes and ETags the source just reported to HEADs through this store, kept for
  // kHeadMemo (at most the ttl), so a ranged read right after a HEAD (ObjectReader's) need not
  // ask again. A memo gone stale is harmless: blocks are fetched with If-Match (a changed
  // object is looked up again) and a whole fill of a small object that grew is cut into
  // blocks.
  void RememberHead(const std::string& key, const ObjectMeta& meta);
  std::optional<Version> RecentHead(const std::string& key);
  // The block at `index` of `version` of the object at `fill_path`.
  std::string BlockPath(const std::string& fill_path, const std::string& etag,
                        uint64_t index) const;
  // After a fill: when the tier may be over its bounds, eviction passes until it is not.
  void MaybeEvict(uint64_t filled);
  // True when the tier's file system has less free space than its min_free (statvfs, not at
  // every fill: see the .cc).
  bool FreeSpaceLow();
  // Counters: what was not yet written goes to the tier's stats (tier.h) kStatsFlushDelay
  // after a change (so `wharf tier status` sees a live process's reads), and when the store
  // is destroyed or the process exits, whichever comes first.
  void Register();
  static void FlushStatsAtExit();
  void FlushStatsLocked(bool with_usage = true);
  void Count(std::atomic<uint64_t>& counter, uint64_t n = 1);
  void StatsChanged();
  static constexpr absl::Duration kStatsFlushDelay = absl::Milliseconds(10);
  std::atomic<bool> flush_pending_{false};

  const std::shared_ptr<ObjectStore> inner_;
  Capabilities capabilities_;
  const std::shared_ptr<Tier> tier_;
  const std::shared_ptr<Runtime> runtime_;
  const uint64_t generation_ = ForkGeneration();  // the process (fork.h) that counts here
  const std::vector<TierImport> imports_;         // source URI prefixes, longest first

  std::atomic<uint64_t> hits_{0}, misses_{0}, fills_{0}, fill_bytes_{0}, bypassed_{0};
  std::atomic<uint64_t> block_fills_{0};
  struct HeadMemo {
    Version version;
    absl::Time at;
  };
  absl::Mutex heads_mu_;
  std::unordered_map<std::string, HeadMemo> heads_ ABSL_GUARDED_BY(heads_mu_);
  std::atomic<int64_t> usage_{-1};       // bytes of entries after this process's last pass
  std::atomic<bool> usage_read_{false};  // the tier's recorded usage was looked up
  // Disk bytes this process filled that no pass of its own measured: added to the tier's
  // recorded usage when its counters are flushed (Tier::AddUsage).
  std::atomic<uint64_t> unrecorded_{0};
  std::atomic<bool> evicting_{false};
  // After a pass that could evict nothing (all that is left is being read, pinned or local),
  // the next one waits until this process filled this many more bytes: else every fill
  // would walk the whole tier again, and a read holding more than the bound would never end.
  std::atomic<uint64_t> fruitless_skip_{0};
  std::atomic<bool> warned_over_bound_{false};
  std::atomic<bool> warned_read_around_{false};
  std::atomic<uint64_t> filled_since_pass_{0};
  // FreeSpaceLow's statvfs is skipped until this process has filled free_check_skip_ bytes.
  std::atomic<uint64_t> filled_since_free_check_{0};
  std::atomic<uint64_t> free_check_skip_{0};
  std::atomic<uint64_t> evictions_{0};
  std::atomic<uint64_t> revalidated_{0};
  std::atomic<uint64_t> listed_{0};
  // This process's fills: the stripes whose flock it holds (shared by its fills on them) and
  // the reads waiting for an object it is filling.
  struct StripeLock {
    int fd = -1;
    int holders = 0;
  };
  absl::Mutex fill_mu_;
  std::map<uint64_t, StripeLock> stripes_ ABSL_GUARDED_BY(fill_mu_);
  std::map<std::string, std::vector<std::shared_ptr<PendingRead>>> filling_
      ABSL_GUARDED_BY(fill_mu_);
  // Objects this process could not keep (their fill failed on the tier's side), by fill path,
  // until when their reads go straight around the tier instead of filling again: readers
  // that waited for the failed fill, and later reads, fetch once each instead of twice. At
  // most kMaxUnkeepable, for kUnkeepableFor (a full disk may have room again by then).
  std::map<std::string, absl::Time> unkeepable_ ABSL_GUARDED_BY(fill_mu_);
  static constexpr size_t kMaxUnkeepable = 4096;
  static constexpr absl::Duration kUnkeepableFor = absl::Seconds(60);
  void RememberUnkeepable(const std::string& fill_path);
  bool Unkeepable(const std::string& fill_path);
  absl::Mutex listings_mu_;
  // By import source; null once a tree was found not to serve.
  std::map<std::string, std::shared_ptr<const TreeListing>> listings_ ABSL_GUARDED_BY(listings_mu_);
  // One flush at a time; taken under the live-store lock (never the other way round) and
  // held, without that lock, for the file work, so a slow tier holds up no other store.
  absl::Mutex flush_mu_;
  Stats flushed_;  // what FlushStatsLocked already wrote (guarded by flush_mu_)
  // The runtime's metrics (wharf_tier_*): stats() published as counters at each snapshot.
  void PublishMetrics();
  struct Meters;
  std::unique_ptr<Meters> meters_;
  uint64_t collector_ = 0;
};

// Makes `registry` open the `cache` store option (and WHARF_CACHE) as a TierStore over the
// tier at that directory (created with default settings when it is in no tier). Programs
// that link the tier call it once at start (the CLI's main, the Python module).
void RegisterTierCache(StoreRegistry& registry);

}  // namespace wharf
