// MeteredStore: a decorator that records every request a store makes in the runtime's metrics
// (docs/design/metrics.md): requests by scheme, operation and status class, their latency,
// time to first byte and retries of reads, requests in flight, bytes read and written.
//
// The registry puts one in front of every backend it opens (store/registry.h), below the tier
// decorator, so the numbers are the requests that reached the store (a tier hit is not one).
// Labels are the URL scheme, the operation (list, head, get, put, write, delete, delete_many,
// copy, compose) and the status class (ok, not_found, precondition, cancelled, error); never
// a key, bucket or URI.
//
// Cost: per request two clock reads and a few relaxed atomic adds; handles are looked up once,
// when the store is opened.
// Thread-safety: as the inner store's.
#pragma once

#include <memory>
#include <string>

#include "base/runtime.h"
#include "store/forwarding_store.h"

namespace wharf {

namespace internal {
struct StoreMeters;
}  // namespace internal

class MeteredStore : public ForwardingStore {
 public:
  // `scheme`: the label (the store's URL scheme).
  MeteredStore(std::shared_ptr<ObjectStore> inner, const std::string& scheme,
               std::shared_ptr<Runtime> runtime);
  ~MeteredStore() override;

  void ListAsync(ListOptions options, std::string continuation, Callback<ListPage> done) override;
  void HeadAsync(std::string key, Callback<ObjectMeta> done) override;
  void GetAsync(GetRequest request, Callback<GetResult> done) override;
  using ForwardingStore::PutAsync;
  void PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                Callback<ObjectMeta> done) override;
  void DeleteAsync(std::string key, StatusCallback done) override;
  void DeleteManyAsync(std::vector<std::string> keys, StatusCallback done) override;
  void CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) override;
  // Between two metered stores: the backends decide (the metering changes no data).
  bool CanCopyFrom(const ObjectStore& src) const override;
  void CopyFromAsync(const ObjectStore& src, std::string src_key, std::string dst_key,
                     Callback<ObjectMeta> done) override;
  void ComposeAsync(std::vector<std::string> sources, std::string dst_key,
                    Callback<ObjectMeta> done) override;
  // The blocking forms go to the inner store's (a backend may run them inline, cheaper than
  // waiting for its asynchronous form), metered the same way.
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
  using ForwardingStore::NewWriter;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key,
                                                          const PutOptions& options) override;

 private:
  // The backend of a metered store, else the store itself.
  static const ObjectStore& Unmetered(const ObjectStore& store);

  // Shared with callbacks that may run after the store is gone.
  std::shared_ptr<internal::StoreMeters> meters_;
};

}  // namespace wharf
