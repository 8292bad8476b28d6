// MemoryStore: an ObjectStore that keeps every object in memory, for tests and fuzzers of the
// layers above the store (io/, formats/, dataset/, cli/). One shared implementation that
// passes the conformance suite (store/testing/memory_store_test.cc), instead of private
// copies in test files (Arrow's mockfs).
//
// Keys are arbitrary byte strings, as on S3: nothing is refused (a test can hold the hostile
// keys a foreign bucket may list, "p/../x", "p//y", a NUL byte). Listing is byte-wise
// ordered, with prefix, delimiter, start_after and end_before answered by the store itself
// (native_end_before). ETags are the content's MD5 hex (as S3 single-part uploads and the
// local store). PutOptions are accepted; only `mtime` is used.
//
// Asynchronous calls run on the store's own threads (never inline in the call), so callers
// see a backend's threading: a callback may block on the test thread without deadlock. The
// blocking forms run inline. A GET into a sink delivers `chunk_bytes` at a time and checks
// the request's cancel token between chunks.
//
// Thread-safety: every method may be called concurrently from any thread. The destructor
// runs every asynchronous call already made to completion.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/thread_pool.h"
#include "store/object_store.h"

namespace wharf::store_testing {

struct MemoryStoreOptions {
  // Uri(key) is "mem://<bucket>/<key>".
  std::string bucket = "bkt";
  // What the store declares; it answers end_before natively and takes put options.
  Capabilities capabilities = [] {
    Capabilities c;
    c.native_end_before = true;
    c.put_options = true;
    return c;
  }();
  // Threads running the asynchronous calls.
  int threads = 2;
  // A GET into a sink delivers at most this many bytes per Append.
  size_t chunk_bytes = size_t{64} << 10;
};

class MemoryStore : public ObjectStore {
 public:
  explicit MemoryStore(MemoryStoreOptions options = {});
  ~MemoryStore() override;
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  std::string Uri(absl::string_view key) const override;
  const Capabilities& capabilities() const override { return options_.capabilities; }

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

  // Every key held, in order (for assertions).
  std::vector<std::string> keys() const;

 private:
  struct Object {
    std::shared_ptr<const std::string> data;  // shared with GETs in progress
    ObjectMeta meta;
  };
  // What Put and NewWriter refuse before anything is stored.
  absl::Status CheckPut(const std::string& key, const PutOptions& options) const;

  const MemoryStoreOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, Object> objects_ ABSL_GUARDED_BY(mu_);
  ThreadPool pool_;  // last: drained and joined before the objects go
};

}  // namespace wharf::store_testing
