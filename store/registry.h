// The scheme registry: maps a URI scheme ("file", "s3", "gs") to the backend that opens it
// (exact scheme match). Built-in backends are registered on first use of Global().
// Thread-safety: all methods are thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "base/runtime.h"
#include "store/object_store.h"
#include "store/spec.h"
#include "store/uri.h"

namespace wharf {

// Opens the store a spec names (`spec.bucket` of `spec.scheme`, with its options). A factory
// refuses, with InvalidArgument naming it, an option its backend does not take. Stores are
// shared (shared_ptr) because the asynchronous work of their users may outlive the code that
// opened them.
using StoreFactory = std::function<absl::StatusOr<std::shared_ptr<ObjectStore>>(
    const StoreSpec& spec, std::shared_ptr<Runtime> runtime)>;

// Lists the buckets of the endpoint a scheme's URIs resolve to (`wharf ls s3://`), configured
// as the scheme's factory configures a store from `spec` (whose bucket is empty).
using BucketLister = std::function<absl::StatusOr<std::vector<BucketInfo>>(
    const StoreSpec& spec, std::shared_ptr<Runtime> runtime)>;

class StoreRegistry {
 public:
  static StoreRegistry& Global();

  // Replaces any factory registered for `scheme`.
  void Register(std::string scheme, StoreFactory factory);
  // InvalidArgument naming the known schemes for an unknown one.
  absl::StatusOr<std::shared_ptr<ObjectStore>> Open(const StoreSpec& spec,
                                                    std::shared_ptr<Runtime> runtime);
  std::vector<std::string> schemes() const;

  // What the `cache` option (and WHARF_CACHE) opens over a store: the tier's read-through
  // decorator, registered by the programs that link the tier (the CLI, the Python module).
  using CacheDecorator = std::function<absl::StatusOr<std::shared_ptr<ObjectStore>>(
      std::shared_ptr<ObjectStore> store, const std::string& cache_dir,
      std::shared_ptr<Runtime> runtime)>;
  void SetCacheDecorator(CacheDecorator decorator);

  // Replaces any bucket lister registered for `scheme`.
  void RegisterBucketLister(std::string scheme, BucketLister lister);
  // The buckets of `scheme`'s endpoint ("s3", "gs"), configured by `options`. InvalidArgument
  // for an unknown scheme; Unimplemented for a scheme without buckets to list (file://).
  absl::StatusOr<std::vector<BucketInfo>> ListBuckets(
      absl::string_view scheme, const StoreOptions& options = {},
      std::shared_ptr<Runtime> runtime = Runtime::Default());

 private:
  // The scheme's factory over `spec` (without the cache option); InvalidArgument naming the
  // known schemes when `factory` is empty.
  absl::StatusOr<std::shared_ptr<ObjectStore>> OpenBackend(const StoreFactory& factory,
                                                           const StoreSpec& spec,
                                                           std::shared_ptr<Runtime> runtime);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, StoreFactory> factories_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, BucketLister> bucket_listers_ ABSL_GUARDED_BY(mu_);
  CacheDecorator cache_decorator_ ABSL_GUARDED_BY(mu_);
};

// A store together with the key (or prefix) a URI names in it, and the spec it was opened
// from (what to serialize to open it again elsewhere).
struct OpenedUri {
  std::shared_ptr<ObjectStore> store;
  ObjectUri uri;  // without query options
  StoreSpec spec;
};

// Parses `uri_or_path` (a URI, possibly with query options, or a local path taken as file://;
// see ParseStoreUri), applies `options` over the URI's, and opens its store.
absl::StatusOr<OpenedUri> OpenUri(absl::string_view uri_or_path,
                                  std::shared_ptr<Runtime> runtime = Runtime::Default());
absl::StatusOr<OpenedUri> OpenUri(absl::string_view uri_or_path, const StoreOptions& options,
                                  std::shared_ptr<Runtime> runtime = Runtime::Default());

// Opens the store of `spec` through the global registry.
absl::StatusOr<std::shared_ptr<ObjectStore>> OpenSpec(
    const StoreSpec& spec, std::shared_ptr<Runtime> runtime = Runtime::Default());

namespace internal {
// Defined in builtin_stores.cc: registers file://, s3:// and gs://.
void RegisterBuiltinStores(StoreRegistry& registry);
}  // namespace internal

}  // namespace wharf
