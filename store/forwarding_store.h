// ForwardingStore: the base of store decorators (as leveldb's EnvWrapper). A decorator wraps
// an inner ObjectStore and changes some calls (a cache tier, metrics, fault injection, test
// delays); everything it does not override reaches the inner store unchanged, so readers take
// an ObjectStore and never know whether decorators are in front.
//
// What is forwarded: Uri() and capabilities() (a decorator that cannot do what the inner
// store declares overrides capabilities()), every asynchronous call including ComposeAsync,
// the PutOptions forms of PutAsync and NewWriter, and the plain forms through them: the plain
// PutAsync(key, data, done) and NewWriter(key) call this decorator's PutOptions forms with
// PutOptions{}, so a decorator that changes puts overrides only those two. The blocking forms
// (Get, Put, List, ...) are ObjectStore's defaults, which wait on this decorator's
// asynchronous forms: one override of an asynchronous form covers its blocking form too. (A
// decorator overriding one overload of PutAsync or NewWriter adds `using
// ForwardingStore::PutAsync;` to keep the others callable on its own type.)
//
// What a decorator must keep: a GetRequest travels with every per-call read option intact
// (if_match, if_none_match, max_staleness, cancel), and a decorator that sends requests of its
// own for one call (a cache filling itself, a retry) passes the call's CancelToken on. One that
// answers a GET itself (a cache) honours the options as the contract defines them: the cached
// copy must satisfy max_staleness, not_modified when if_none_match equals its etag, Cancelled
// when the token fired. Errors keep naming the operation and Uri(key).
//
// Ownership: the decorator holds a share of the inner store (or borrows one that outlives it);
// like any store it must outlive the completion of every asynchronous call made on it.
//
// Thread-safety: as the inner store (every method may be called concurrently from any
// thread); state a decorator adds is its own to guard. Callbacks run on the inner store's
// threads and must not block, as ObjectStore requires.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "store/object_store.h"

namespace wharf {

class ForwardingStore : public ObjectStore {
 public:
  // Owns a share of `inner`. REQUIRES: inner != nullptr.
  explicit ForwardingStore(std::shared_ptr<ObjectStore> inner)
      : owner_(std::move(inner)), inner_(owner_.get()) {}
  // Borrows `inner`, which must outlive this store.
  explicit ForwardingStore(ObjectStore& inner) : inner_(&inner) {}
  ForwardingStore(const ForwardingStore&) = delete;
  ForwardingStore& operator=(const ForwardingStore&) = delete;

  std::string Uri(absl::string_view key) const override { return inner_->Uri(key); }
  const Capabilities& capabilities() const override { return inner_->capabilities(); }

  void ListAsync(ListOptions options, std::string continuation, Callback<ListPage> done) override {
    inner_->ListAsync(std::move(options), std::move(continuation), std::move(done));
  }
  void HeadAsync(std::string key, Callback<ObjectMeta> done) override {
    inner_->HeadAsync(std::move(key), std::move(done));
  }
  void GetAsync(GetRequest request, Callback<GetResult> done) override {
    inner_->GetAsync(std::move(request), std::move(done));
  }
  void PutAsync(std::string key, absl::Cord data, Callback<ObjectMeta> done) override {
    PutAsync(std::move(key), std::move(data), PutOptions{}, std::move(done));
  }
  void PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                Callback<ObjectMeta> done) override {
    inner_->PutAsync(std::move(key), std::move(data), options, std::move(done));
  }
  void DeleteAsync(std::string key, StatusCallback done) override {
    inner_->DeleteAsync(std::move(key), std::move(done));
  }
  void DeleteManyAsync(std::vector<std::string> keys, StatusCallback done) override {
    inner_->DeleteManyAsync(std::move(keys), std::move(done));
  }
  void CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) override {
    inner_->CopyAsync(std::move(src_key), std::move(dst_key), std::move(done));
  }
  void ComposeAsync(std::vector<std::string> sources, std::string dst_key,
                    Callback<ObjectMeta> done) override {
    inner_->ComposeAsync(std::move(sources), std::move(dst_key), std::move(done));
  }
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key) override {
    return NewWriter(std::move(key), PutOptions{});
  }
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key,
                                                          const PutOptions& options) override {
    return inner_->NewWriter(std::move(key), options);
  }

  absl::StatusOr<std::vector<PendingUpload>> ListUploads(const std::string& prefix) override {
    return inner_->ListUploads(prefix);
  }
  absl::Status AbortUpload(const std::string& key, const std::string& upload_id) override {
    return inner_->AbortUpload(key, upload_id);
  }

 protected:
  ObjectStore& inner() const { return *inner_; }

 private:
  std::shared_ptr<ObjectStore> owner_;  // null when borrowing
  ObjectStore* const inner_;
};

}  // namespace wharf
