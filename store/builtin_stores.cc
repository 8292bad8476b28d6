// The built-in backends. Registered explicitly (not by static initializers, which the linker
// drops from static libraries) the first time the registry is used.
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "store/gcs/gcs_store.h"
#include "store/local/local_store.h"
#include "store/registry.h"
#include "store/s3/s3_store.h"

namespace wharf::internal {

void RegisterBuiltinStores(StoreRegistry& registry) {
  registry.Register(
      "file",
      [](const StoreSpec& spec,
         std::shared_ptr<Runtime> runtime) -> absl::StatusOr<std::shared_ptr<ObjectStore>> {
        if (!spec.options.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("file:// takes no store options (got ",
                           absl::StrJoin(spec.options.SetNames(), ", "), ")"));
        }
        auto store = LocalStore::Open(spec.bucket, std::move(runtime));
        if (!store.ok()) return store.status();
        return std::shared_ptr<ObjectStore>(*std::move(store));
      });
  registry.Register(
      "s3", [](const StoreSpec& spec, std::shared_ptr<Runtime>) { return s3::OpenS3Spec(spec); });
  registry.RegisterBucketLister("s3", [](const StoreSpec& spec, std::shared_ptr<Runtime>) {
    return s3::ListS3Buckets(spec);
  });
  registry.Register(
      "gs", [](const StoreSpec& spec, std::shared_ptr<Runtime>) { return gcs::OpenGcsSpec(spec); });
  registry.RegisterBucketLister("gs", [](const StoreSpec& spec, std::shared_ptr<Runtime>) {
    return gcs::ListGcsBuckets(spec);
  });
}

}  // namespace wharf::internal
