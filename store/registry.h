// The scheme registry: maps a URI scheme ("file", "s3", "gs") to the backend that opens it
// (exact scheme match). Built-in backends are registered on first use of Global().
// Thread-safety: all methods are thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/runtime.h"
#include "store/object_store.h"
#include "store/uri.h"

namespace wharf {

// Opens the store holding `uri.bucket`. Stores are shared (shared_ptr) because the
// asynchronous work of their users may outlive the code that opened them.
using StoreFactory = std::function<absl::StatusOr<std::shared_ptr<ObjectStore>>(
    const ObjectUri& uri, std::shared_ptr<Runtime> runtime)>;

// Lists the buckets of the endpoint a scheme's URIs resolve to (`wharf ls s3://`), configured
// as the scheme's factory configures a store.
using BucketLister = std::function<absl::StatusOr<std::vector<BucketInfo>>(
    std::shared_ptr<Runtime> runtime)>;

class StoreRegistry {
 public:
  static StoreRegistry& Global();

  // Replaces any factory registered for `scheme`.
  void Register(std::string scheme, StoreFactory factory);
  absl::StatusOr<std::shared_ptr<ObjectStore>> Open(const ObjectUri& uri,
                                                    std::shared_ptr<Runtime> runtime);
  std::vector<std::string> schemes() const;

  // Replaces any bucket lister registered for `scheme`.
  void RegisterBucketLister(std::string scheme, BucketLister lister);
  // The buckets of `scheme`'s endpoint ("s3", "gs"). InvalidArgument for an unknown scheme;
  // Unimplemented for a scheme without buckets to list (file://).
  absl::StatusOr<std::vector<BucketInfo>> ListBuckets(
      absl::string_view scheme, std::shared_ptr<Runtime> runtime = Runtime::Default());

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, StoreFactory> factories_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, BucketLister> bucket_listers_ ABSL_GUARDED_BY(mu_);
};

// A store together with the key (or prefix) a URI names in it.
struct OpenedUri {
  std::shared_ptr<ObjectStore> store;
  ObjectUri uri;
};

// Parses `uri_or_path` (a URI, or a local path taken as file://) and opens its store.
absl::StatusOr<OpenedUri> OpenUri(absl::string_view uri_or_path,
                                  std::shared_ptr<Runtime> runtime = Runtime::Default());

namespace internal {
// Defined in builtin_stores.cc: registers file://, s3:// and gs://.
void RegisterBuiltinStores(StoreRegistry& registry);
}  // namespace internal

}  // namespace wharf
