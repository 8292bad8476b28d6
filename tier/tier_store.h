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
// Keys that cannot be paths (a ".." segment, "//", a trailing '/') bypass the tier.
// Requests carry their read options: if_match other than the entry's ETag refills (then
// fails as the backing store would); if_none_match is answered from the entry.
// A HEAD of a key with a fresh entry is answered from the entry (size, the source's ETag).
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
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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
    uint64_t fills = 0;   // objects this process fetched into the tier
    uint64_t fill_bytes = 0;
    uint64_t bypassed = 0;     // reads of keys that cannot be paths
    uint64_t evicted = 0;      // entries this process's eviction passes removed
    uint64_t revalidated = 0;  // stale copies the source confirmed unchanged (304)
    uint64_t listed = 0;       // listing pages answered from imported trees
  };
  static constexpr uint64_t kMaxListedImport = uint64_t{1} << 20;
  Stats stats() const;

  const std::shared_ptr<Tier>& tier() const { return tier_; }
  // The copy of `key` in the read-through area (nullopt when the key bypasses the tier).
  std::optional<std::string> FillPath(const std::string& key) const;

 private:
  struct PendingRead;
  struct TreeListing;  // a complete import's objects in key order
  TierStore(std::shared_ptr<ObjectStore> inner, std::shared_ptr<Tier> tier,
            std::shared_ptr<Runtime> runtime, std::vector<TierImport> imports);

  std::optional<std::string> FillPathOfUri(const std::string& uri) const;
  // Paths that may hold `key`'s entry, in lookup order, the read-through copy last; empty
  // when the key bypasses the tier.
  std::vector<std::string> Candidates(const std::string& key) const;
  // Serves `read` from the first candidate holding a fresh entry; false when none does.
  bool ServeLocal(PendingRead& read, bool after_fill);
  void Acquire(std::shared_ptr<PendingRead> read);
  void Fill(std::shared_ptr<PendingRead> read);
  // Seals and publishes a filled object, then serves the read from it.
  void Publish(PendingRead& read, const absl::StatusOr<GetResult>& got);
  void Forget(const std::string& key);
  // The listing of the complete, fresh import whose source covers `prefix`, or null when
  // the bucket must answer. Walks the tree the first time (blocking I/O).
  std::shared_ptr<const TreeListing> ListingFor(const std::string& prefix);
  // After a fill: when the tier may be over its bounds, eviction passes until it is not.
  void MaybeEvict(uint64_t filled);
  // Counters: what was not yet written goes to the tier's stats (tier.h) when the store is
  // destroyed or the process exits, whichever comes first.
  void Register();
  static void FlushStatsAtExit();
  void FlushStatsLocked();

  const std::shared_ptr<ObjectStore> inner_;
  const std::shared_ptr<Tier> tier_;
  const std::shared_ptr<Runtime> runtime_;
  const std::vector<TierImport> imports_;  // source URI prefixes, longest first

  std::atomic<uint64_t> hits_{0}, misses_{0}, fills_{0}, fill_bytes_{0}, bypassed_{0};
  std::atomic<int64_t> usage_{-1};  // bytes of entries after this process's last pass
  std::atomic<bool> evicting_{false};
  std::atomic<uint64_t> filled_since_pass_{0};
  std::atomic<uint64_t> evictions_{0};
  std::atomic<uint64_t> revalidated_{0};
  std::atomic<uint64_t> listed_{0};
  absl::Mutex listings_mu_;
  // By import source; null once a tree was found not to serve.
  std::map<std::string, std::shared_ptr<const TreeListing>> listings_ ABSL_GUARDED_BY(listings_mu_);
  Stats flushed_;  // what FlushStatsLocked already wrote (guarded by the live-store lock)
};

// Makes `registry` open the `cache` store option (and WHARF_CACHE) as a TierStore over the
// tier at that directory (created with default settings when it is in no tier). Programs
// that link the tier call it once at start (the CLI's main, the Python module).
void RegisterTierCache(StoreRegistry& registry);

}  // namespace wharf
