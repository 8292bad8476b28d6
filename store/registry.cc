#include "store/registry.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/status.h"
#include "store/metered_store.h"

namespace wharf {

StoreRegistry& StoreRegistry::Global() {
  static StoreRegistry* const registry = [] {
    auto* r = new StoreRegistry;
    internal::RegisterBuiltinStores(*r);
    return r;
  }();
  return *registry;
}

void StoreRegistry::Register(std::string scheme, StoreFactory factory) {
  absl::MutexLock lock(&mu_);
  factories_[std::move(scheme)] = std::move(factory);
}

void StoreRegistry::SetCacheDecorator(CacheDecorator decorator) {
  absl::MutexLock lock(&mu_);
  cache_decorator_ = std::move(decorator);
}

absl::StatusOr<std::shared_ptr<ObjectStore>> StoreRegistry::Open(const StoreSpec& spec,
                                                                 std::shared_ptr<Runtime> runtime) {
  StoreFactory factory;
  CacheDecorator cache_decorator;
  {
    absl::MutexLock lock(&mu_);
    auto it = factories_.find(spec.scheme);
    if (it != factories_.end()) factory = it->second;
    cache_decorator = cache_decorator_;
  }
  // The cache option is the registry's: the backend opens the spec without it.
  std::optional<std::string> cache = spec.options.cache;
  if (!cache && spec.scheme != "file") {
    if (const char* env = std::getenv("WHARF_CACHE"); env != nullptr && *env != '\0') {
      StoreOptions from_env;
      WHARF_RETURN_IF_ERROR(Annotate(from_env.Set("cache", env), "WHARF_CACHE"));
      cache = from_env.cache;
    }
  }
  if (cache) {
    if (!cache_decorator) {
      return absl::FailedPreconditionError(
          absl::StrCat("cache=", *cache,
                       ": this program has no tier to read through (the wharf CLI and the "
                       "Python module have)"));
    }
    StoreSpec inner = spec;
    inner.options.cache.reset();
    auto store = OpenBackend(factory, inner, runtime);
    if (!store.ok()) return store.status();
    return cache_decorator(*std::move(store), *cache, std::move(runtime));
  }
  return OpenBackend(factory, spec, std::move(runtime));
}

absl::StatusOr<std::shared_ptr<ObjectStore>> StoreRegistry::OpenBackend(
    const StoreFactory& factory, const StoreSpec& spec, std::shared_ptr<Runtime> runtime) {
  if (!factory) {
    auto known = schemes();
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported URI scheme '", spec.scheme, "://' (known: ", absl::StrJoin(known, ", "), ")"));
  }
  // Every backend is metered (store/metered_store.h); decorators such as the tier sit above.
  absl::StatusOr<std::shared_ptr<ObjectStore>> store = factory(spec, runtime);
  if (!store.ok()) return store;
  return std::shared_ptr<ObjectStore>(
      std::make_shared<MeteredStore>(*std::move(store), spec.scheme, std::move(runtime)));
}

void StoreRegistry::RegisterBucketLister(std::string scheme, BucketLister lister) {
  absl::MutexLock lock(&mu_);
  bucket_listers_[std::move(scheme)] = std::move(lister);
}

absl::StatusOr<std::vector<BucketInfo>> StoreRegistry::ListBuckets(
    absl::string_view scheme, const StoreOptions& options, std::shared_ptr<Runtime> runtime) {
  BucketLister lister;
  bool known;
  {
    absl::MutexLock lock(&mu_);
    known = factories_.contains(scheme);
    auto it = bucket_listers_.find(scheme);
    if (it != bucket_listers_.end()) lister = it->second;
  }
  if (lister) return lister(StoreSpec{std::string(scheme), "", options}, std::move(runtime));
  if (!known) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported URI scheme '", scheme, "://' (known: ", absl::StrJoin(schemes(), ", "), ")"));
  }
  return absl::UnimplementedError(
      absl::StrCat("list buckets: ", scheme, ":// has no buckets to list"));
}

std::vector<std::string> StoreRegistry::schemes() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [scheme, _] : factories_) out.push_back(scheme + "://");
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<OpenedUri> OpenUri(absl::string_view uri_or_path, std::shared_ptr<Runtime> runtime) {
  return OpenUri(uri_or_path, StoreOptions{}, std::move(runtime));
}

absl::StatusOr<OpenedUri> OpenUri(absl::string_view uri_or_path, const StoreOptions& options,
                                  std::shared_ptr<Runtime> runtime) {
  auto parsed = ParseStoreUri(uri_or_path, options);
  if (!parsed.ok()) return parsed.status();
  auto store = StoreRegistry::Global().Open(parsed->spec, std::move(runtime));
  if (!store.ok()) return store.status();
  return OpenedUri{*std::move(store), parsed->uri(), std::move(parsed->spec)};
}

absl::StatusOr<std::shared_ptr<ObjectStore>> OpenSpec(const StoreSpec& spec,
                                                      std::shared_ptr<Runtime> runtime) {
  return StoreRegistry::Global().Open(spec, std::move(runtime));
}

}  // namespace wharf
