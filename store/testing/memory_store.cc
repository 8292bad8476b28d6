#include "store/testing/memory_store.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/hash.h"

namespace wharf::store_testing {
namespace {

// Continuation tokens say what the previous page ended on: "k" + a key, or "p" + a common
// prefix (whose keys the next page skips).
constexpr char kKeyToken = 'k';
constexpr char kPrefixToken = 'p';

class MemoryWriter : public ObjectWriter {
 public:
  MemoryWriter(MemoryStore* store, std::string key, PutOptions options)
      : store_(store), key_(std::move(key)), options_(std::move(options)) {}

  absl::Status Write(absl::Cord data) override {
    if (done_)
      return absl::FailedPreconditionError(
          absl::StrCat("write ", store_->Uri(key_), ": writer already closed"));
    data_.Append(std::move(data));
    return absl::OkStatus();
  }
  absl::StatusOr<ObjectMeta> Close() override {
    if (done_)
      return absl::FailedPreconditionError(
          absl::StrCat("close ", store_->Uri(key_), ": writer already closed"));
    done_ = true;
    return store_->Put(key_, std::move(data_), options_);
  }
  void Abort() override {
    done_ = true;
    data_.Clear();
  }

 private:
  MemoryStore* const store_;
  const std::string key_;
  const PutOptions options_;
  absl::Cord data_;
  bool done_ = false;
};

}  // namespace

MemoryStore::MemoryStore(MemoryStoreOptions options)
    : options_(std::move(options)), pool_(std::max(1, options_.threads)) {}

MemoryStore::~MemoryStore() = default;

std::string MemoryStore::Uri(absl::string_view key) const {
  return absl::StrCat("mem://", options_.bucket, "/", key);
}

std::vector<std::string> MemoryStore::keys() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  out.reserve(objects_.size());
  for (const auto& [key, object] : objects_) out.push_back(key);
  return out;
}

absl::StatusOr<ListPage> MemoryStore::List(const ListOptions& options,
                                           const std::string& continuation) {
  const int limit = std::max(1, std::min(options.page_size, options_.capabilities.max_page_size));
  std::string after = options.start_after;
  std::string last_prefix;  // the common prefix the previous page (or this one) ended on
  if (!continuation.empty()) {
    if (continuation[0] != kKeyToken && continuation[0] != kPrefixToken) {
      return absl::InvalidArgumentError(
          absl::StrCat("list ", Uri(options.prefix), ": malformed continuation token"));
    }
    after = std::max(after, continuation.substr(1));
    if (continuation[0] == kPrefixToken) last_prefix = continuation.substr(1);
  }
  ListPage page;
  int entries = 0;
  std::string last_token;  // the token naming the last entry of this page
  absl::MutexLock lock(&mu_);
  auto it =
      after < options.prefix ? objects_.lower_bound(options.prefix) : objects_.upper_bound(after);
  for (; it != objects_.end(); ++it) {
    const std::string& key = it->first;
    // From the first key with the prefix on, the first key without it ends the listing.
    if (!absl::StartsWith(key, options.prefix)) break;
    if (!options.end_before.empty() && key >= options.end_before) break;
    std::string rolled_up;
    if (!options.delimiter.empty()) {
      const size_t at = key.find(options.delimiter, options.prefix.size());
      if (at != std::string::npos) rolled_up = key.substr(0, at + options.delimiter.size());
    }
    if (!rolled_up.empty() && rolled_up == last_prefix) continue;
    if (entries == limit) {
      page.continuation = last_token;
      break;
    }
    ++entries;
    if (!rolled_up.empty()) {
      page.common_prefixes.push_back(rolled_up);
      last_prefix = rolled_up;
      last_token = absl::StrCat(std::string(1, kPrefixToken), rolled_up);
    } else {
      page.objects.push_back(it->second.meta);
      last_token = absl::StrCat(std::string(1, kKeyToken), key);
    }
  }
  return page;
}

absl::StatusOr<ObjectMeta> MemoryStore::Head(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) {
    return absl::NotFoundError(absl::StrCat("head ", Uri(key), ": no such object"));
  }
  return it->second.meta;
}

absl::StatusOr<GetResult> MemoryStore::Get(const GetRequest& request) {
  const std::string op = absl::StrCat("get ", Uri(request.key));
  if ((request.sink == nullptr) == (request.buffer.data() == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": set exactly one of buffer and sink"));
  }
  if (IsCancelled(request.cancel)) return absl::CancelledError(absl::StrCat(op, ": cancelled"));
  GetResult result;
  std::shared_ptr<const std::string> data;
  {
    absl::MutexLock lock(&mu_);
    auto it = objects_.find(request.key);
    if (it == objects_.end()) return absl::NotFoundError(absl::StrCat(op, ": no such object"));
    data = it->second.data;
    result.meta = it->second.meta;
  }
  if (!request.if_match.empty() && request.if_match != result.meta.etag) {
    return absl::FailedPreconditionError(absl::StrCat(
        op, ": object changed (etag ", result.meta.etag, ", expected ", request.if_match, ")"));
  }
  if (!request.if_none_match.empty() && request.if_none_match == result.meta.etag) {
    result.not_modified = true;
    return result;
  }
  auto range = request.range.Resolve(data->size());
  if (!range.ok()) {
    return absl::Status(range.status().code(), absl::StrCat(op, ": ", range.status().message()));
  }
  const auto [begin, end] = *range;
  result.offset = begin;
  if (request.sink == nullptr) {
    if (request.buffer.size() < end - begin) {
      return absl::OutOfRangeError(absl::StrCat(op, ": buffer of ", request.buffer.size(),
                                                " bytes is smaller than the ", end - begin,
                                                "-byte range"));
    }
    if (end > begin) std::memcpy(request.buffer.data(), data->data() + begin, end - begin);
  } else {
    const size_t chunk = std::max<size_t>(1, options_.chunk_bytes);
    for (uint64_t pos = begin; pos < end; pos += chunk) {
      // Between chunks a cancel stops the read, as a backend stops a transfer.
      if (IsCancelled(request.cancel)) {
        return absl::CancelledError(absl::StrCat(op, ": cancelled"));
      }
      const absl::string_view piece(data->data() + pos, std::min<uint64_t>(chunk, end - pos));
      if (absl::Status s = request.sink->Append(piece); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat(op, ": ", s.message()));
      }
    }
  }
  result.bytes = end - begin;
  return result;
}

absl::Status MemoryStore::CheckPut(const std::string& key, const PutOptions& options) const {
  const std::string op = absl::StrCat("put ", Uri(key));
  if (absl::Status valid = ValidatePutOptions(options); !valid.ok()) {
    return absl::Status(valid.code(), absl::StrCat(op, ": ", valid.message()));
  }
  if (!options_.capabilities.put_options && !options.is_default()) {
    return absl::UnimplementedError(absl::StrCat(op, ": this store takes no put options"));
  }
  if (!options_.capabilities.trailing_slash_keys && absl::EndsWith(key, "/")) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": keys ending in '/' are refused"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ObjectMeta> MemoryStore::Put(const std::string& key, absl::Cord data) {
  return Put(key, std::move(data), PutOptions{});
}

absl::StatusOr<ObjectMeta> MemoryStore::Put(const std::string& key, absl::Cord data,
                                            const PutOptions& options) {
  if (absl::Status valid = CheckPut(key, options); !valid.ok()) return valid;
  Object object;
  object.data = std::make_shared<const std::string>(std::string(data));
  object.meta = {.key = key,
                 .size = object.data->size(),
                 .etag = Md5Hex(*object.data),
                 .mtime = options.mtime.value_or(absl::Now())};
  absl::MutexLock lock(&mu_);
  if (options.if_absent && objects_.count(key) > 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("put ", Uri(key), ": the object already exists (exclusive create)"));
  }
  return objects_.insert_or_assign(key, std::move(object)).first->second.meta;
}

absl::Status MemoryStore::Delete(const std::string& key) {
  absl::MutexLock lock(&mu_);
  objects_.erase(key);
  return absl::OkStatus();
}

absl::Status MemoryStore::DeleteMany(std::vector<std::string> keys) {
  absl::MutexLock lock(&mu_);
  for (const std::string& key : keys) objects_.erase(key);
  return absl::OkStatus();
}

absl::StatusOr<ObjectMeta> MemoryStore::Copy(const std::string& src_key,
                                             const std::string& dst_key) {
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(src_key);
  if (it == objects_.end()) {
    return absl::NotFoundError(
        absl::StrCat("copy ", Uri(src_key), " to ", Uri(dst_key), ": no such object"));
  }
  Object copy = it->second;
  copy.meta.key = dst_key;
  copy.meta.mtime = absl::Now();
  return objects_.insert_or_assign(dst_key, std::move(copy)).first->second.meta;
}

absl::StatusOr<std::unique_ptr<ObjectWriter>> MemoryStore::NewWriter(std::string key) {
  return NewWriter(std::move(key), PutOptions{});
}

absl::StatusOr<std::unique_ptr<ObjectWriter>> MemoryStore::NewWriter(std::string key,
                                                                     const PutOptions& options) {
  if (absl::Status valid = CheckPut(key, options); !valid.ok()) return valid;
  return std::make_unique<MemoryWriter>(this, std::move(key), options);
}

// ---- Asynchronous forms: the blocking ones, on the store's threads ----

void MemoryStore::ListAsync(ListOptions options, std::string continuation,
                            Callback<ListPage> done) {
  pool_.Schedule(
      [this, options = std::move(options), continuation = std::move(continuation),
       done = std::move(done)]() mutable { std::move(done)(List(options, continuation)); });
}

void MemoryStore::HeadAsync(std::string key, Callback<ObjectMeta> done) {
  pool_.Schedule([this, key = std::move(key), done = std::move(done)]() mutable {
    std::move(done)(Head(key));
  });
}

void MemoryStore::GetAsync(GetRequest request, Callback<GetResult> done) {
  pool_.Schedule([this, request = std::move(request), done = std::move(done)]() mutable {
    std::move(done)(Get(request));
  });
}

void MemoryStore::PutAsync(std::string key, absl::Cord data, Callback<ObjectMeta> done) {
  PutAsync(std::move(key), std::move(data), PutOptions{}, std::move(done));
}

void MemoryStore::PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                           Callback<ObjectMeta> done) {
  pool_.Schedule(
      [this, key = std::move(key), data = std::move(data), options,
       done = std::move(done)]() mutable { std::move(done)(Put(key, std::move(data), options)); });
}

void MemoryStore::DeleteAsync(std::string key, StatusCallback done) {
  pool_.Schedule([this, key = std::move(key), done = std::move(done)]() mutable {
    std::move(done)(Delete(key));
  });
}

void MemoryStore::DeleteManyAsync(std::vector<std::string> keys, StatusCallback done) {
  pool_.Schedule([this, keys = std::move(keys), done = std::move(done)]() mutable {
    std::move(done)(DeleteMany(std::move(keys)));
  });
}

void MemoryStore::CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) {
  pool_.Schedule([this, src_key = std::move(src_key), dst_key = std::move(dst_key),
                  done = std::move(done)]() mutable { std::move(done)(Copy(src_key, dst_key)); });
}

}  // namespace wharf::store_testing
