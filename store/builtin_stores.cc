// The built-in backends. Registered explicitly (not by static initializers, which the linker
// drops from static libraries) the first time the registry is used.
#include <memory>

#include "absl/strings/str_cat.h"
#include "store/local/local_store.h"
#include "store/registry.h"
#include "store/s3/s3_store.h"

namespace wharf::internal {

void RegisterBuiltinStores(StoreRegistry& registry) {
  registry.Register("file", [](const ObjectUri& uri, std::shared_ptr<Runtime> runtime)
                                -> absl::StatusOr<std::shared_ptr<ObjectStore>> {
    auto store = LocalStore::Open(uri.bucket, std::move(runtime));
    if (!store.ok()) return store.status();
    return std::shared_ptr<ObjectStore>(*std::move(store));
  });
  for (const char* scheme : {"s3", "gs"}) {
    registry.Register(scheme, [](const ObjectUri& uri, std::shared_ptr<Runtime>) {
      return s3::OpenS3Uri(uri.scheme, uri.bucket);
    });
    registry.RegisterBucketLister(scheme, [scheme](std::shared_ptr<Runtime>) {
      return s3::ListS3Buckets(scheme);
    });
  }
}

}  // namespace wharf::internal
