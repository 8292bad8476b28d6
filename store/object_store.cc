#include "store/object_store.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"

namespace wharf {

std::string ContentMd5(const ObjectMeta& meta) {
  if (!meta.md5.empty()) return meta.md5;
  if (meta.etag_opaque) return "";
  const bool md5 =
      meta.etag.size() == 32 && std::all_of(meta.etag.begin(), meta.etag.end(),
                                            [](char c) { return absl::ascii_isxdigit(c); });
  return md5 ? absl::AsciiStrToLower(meta.etag) : std::string();
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> ByteRange::Resolve(uint64_t size) const {
  if (suffix) {
    const uint64_t n = length.value_or(0);
    if (n == 0) return absl::OutOfRangeError("empty suffix range");
    return std::make_pair(size > n ? size - n : 0, size);
  }
  if (is_all()) return std::make_pair(uint64_t{0}, size);
  if (offset >= size) {
    return absl::OutOfRangeError(
        absl::StrCat("range starts at byte ", offset, " of a ", size, "-byte object"));
  }
  if (length.has_value() && *length == 0) return absl::OutOfRangeError("empty range");
  const uint64_t end = length.has_value() && *length < size - offset ? offset + *length : size;
  return std::make_pair(offset, end);
}

std::string ByteRange::ToHttp() const {
  if (suffix) return absl::StrCat("-", length.value_or(0));
  if (!length.has_value()) return absl::StrCat(offset, "-");
  return absl::StrCat(offset, "-", offset + *length - 1);
}

std::string ContentTypeOfKey(absl::string_view key) {
  static constexpr std::pair<absl::string_view, absl::string_view> kTypes[] = {
      {"avif", "image/avif"},
      {"bmp", "image/bmp"},
      {"bz2", "application/x-bzip2"},
      {"css", "text/css"},
      {"csv", "text/csv"},
      {"flac", "audio/flac"},
      {"gif", "image/gif"},
      {"gz", "application/gzip"},
      {"htm", "text/html"},
      {"html", "text/html"},
      {"ico", "image/vnd.microsoft.icon"},
      {"jpeg", "image/jpeg"},
      {"jpg", "image/jpeg"},
      {"js", "text/javascript"},
      {"json", "application/json"},
      {"jsonl", "application/jsonl"},
      {"md", "text/markdown"},
      {"mjs", "text/javascript"},
      {"mp3", "audio/mpeg"},
      {"mp4", "video/mp4"},
      {"ndjson", "application/x-ndjson"},
      {"npy", "application/octet-stream"},
      {"ogg", "audio/ogg"},
      {"parquet", "application/vnd.apache.parquet"},
      {"pdf", "application/pdf"},
      {"png", "image/png"},
      {"svg", "image/svg+xml"},
      {"tar", "application/x-tar"},
      {"tif", "image/tiff"},
      {"tiff", "image/tiff"},
      {"tsv", "text/tab-separated-values"},
      {"txt", "text/plain"},
      {"wav", "audio/wav"},
      {"webm", "video/webm"},
      {"webp", "image/webp"},
      {"xml", "application/xml"},
      {"yaml", "application/yaml"},
      {"yml", "application/yaml"},
      {"zip", "application/zip"},
      {"zst", "application/zstd"},
  };
  const size_t slash = key.rfind('/');
  const absl::string_view name = slash == absl::string_view::npos ? key : key.substr(slash + 1);
  const size_t dot = name.rfind('.');
  if (dot == absl::string_view::npos || dot == 0 || dot + 1 == name.size()) return "";
  const std::string ext = absl::AsciiStrToLower(name.substr(dot + 1));
  for (const auto& [e, type] : kTypes) {
    if (e == ext) return std::string(type);
  }
  return "";
}

absl::Status ValidatePutOptions(const PutOptions& options) {
  if (!options.sse.empty() && options.sse != "AES256" && options.sse != "aws:kms") {
    return absl::InvalidArgumentError(
        absl::StrCat("server-side encryption '", options.sse, "' is neither AES256 nor aws:kms"));
  }
  if (!options.sse_kms_key_id.empty() && options.sse != "aws:kms") {
    return absl::InvalidArgumentError("a KMS key id needs server-side encryption aws:kms");
  }
  // Each text field travels as a header value.
  for (const auto& [name, value] :
       {std::pair<absl::string_view, absl::string_view>{"content type", options.content_type},
        {"storage class", options.storage_class},
        {"KMS key id", options.sse_kms_key_id}}) {
    for (unsigned char c : value) {
      if (c < 0x20 || c == 0x7f) {
        return absl::InvalidArgumentError(
            absl::StrCat("the ", name, " contains a control character"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WaitForStatus(absl::AnyInvocable<void(StatusCallback) &&> start) {
  absl::Notification done;
  absl::Status result;
  std::move(start)([&](absl::Status s) {
    result = std::move(s);
    done.Notify();
  });
  WaitInterruptibly(done);  // base/cancel.h
  return result;
}

void ObjectStore::ComposeAsync(std::vector<std::string> sources, std::string dst_key,
                               Callback<ObjectMeta> done) {
  (void)sources;
  std::move(done)(absl::UnimplementedError(
      absl::StrCat("compose ", Uri(dst_key), ": this store has no server-side compose")));
}

namespace {

// For a store without capabilities().put_options, given options other than the defaults:
// InvalidArgument for options no store takes, else Unimplemented.
absl::Status NoPutOptions(const ObjectStore& store, absl::string_view key,
                          const PutOptions& options) {
  if (absl::Status valid = ValidatePutOptions(options); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("put ", store.Uri(key), ": ", valid.message()));
  }
  return absl::UnimplementedError(absl::StrCat(
      "put ", store.Uri(key),
      ": this store takes no upload options (content type, storage class, encryption, mtime, "
      "create-only)"));
}

}  // namespace

void ObjectStore::PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                           Callback<ObjectMeta> done) {
  if (!options.is_default()) return std::move(done)(NoPutOptions(*this, key, options));
  PutAsync(std::move(key), std::move(data), std::move(done));
}

absl::StatusOr<std::unique_ptr<ObjectWriter>> ObjectStore::NewWriter(std::string key,
                                                                     const PutOptions& options) {
  if (!options.is_default()) return NoPutOptions(*this, key, options);
  return NewWriter(std::move(key));
}

absl::StatusOr<ListPage> ObjectStore::List(const ListOptions& options,
                                           const std::string& continuation) {
  return WaitFor<ListPage>(
      [&](Callback<ListPage> cb) { ListAsync(options, continuation, std::move(cb)); });
}

absl::StatusOr<ObjectMeta> ObjectStore::Head(const std::string& key) {
  return WaitFor<ObjectMeta>([&](Callback<ObjectMeta> cb) { HeadAsync(key, std::move(cb)); });
}

absl::StatusOr<GetResult> ObjectStore::Get(const GetRequest& request) {
  return WaitFor<GetResult>([&](Callback<GetResult> cb) { GetAsync(request, std::move(cb)); });
}

absl::StatusOr<ObjectMeta> ObjectStore::Put(const std::string& key, absl::Cord data) {
  return WaitFor<ObjectMeta>(
      [&](Callback<ObjectMeta> cb) { PutAsync(key, std::move(data), std::move(cb)); });
}

absl::StatusOr<ObjectMeta> ObjectStore::Put(const std::string& key, absl::Cord data,
                                            const PutOptions& options) {
  return WaitFor<ObjectMeta>(
      [&](Callback<ObjectMeta> cb) { PutAsync(key, std::move(data), options, std::move(cb)); });
}

absl::Status ObjectStore::Delete(const std::string& key) {
  return WaitForStatus([&](StatusCallback cb) { DeleteAsync(key, std::move(cb)); });
}

absl::Status ObjectStore::DeleteMany(std::vector<std::string> keys) {
  return WaitForStatus([&](StatusCallback cb) { DeleteManyAsync(std::move(keys), std::move(cb)); });
}

absl::StatusOr<ObjectMeta> ObjectStore::Copy(const std::string& src_key,
                                             const std::string& dst_key) {
  return WaitFor<ObjectMeta>(
      [&](Callback<ObjectMeta> cb) { CopyAsync(src_key, dst_key, std::move(cb)); });
}

void ObjectStore::CopyFromAsync(const ObjectStore& src, std::string src_key, std::string dst_key,
                                Callback<ObjectMeta> done) {
  std::move(done)(absl::UnimplementedError(absl::StrCat(
      "copy ", src.Uri(src_key), " to ", Uri(dst_key), ": no server-side copy between them")));
}

absl::StatusOr<ObjectMeta> ObjectStore::CopyFrom(const ObjectStore& src, const std::string& src_key,
                                                 const std::string& dst_key) {
  return WaitFor<ObjectMeta>(
      [&](Callback<ObjectMeta> cb) { CopyFromAsync(src, src_key, dst_key, std::move(cb)); });
}

absl::StatusOr<std::vector<PendingUpload>> ObjectStore::ListUploads(const std::string& prefix) {
  return absl::UnimplementedError(
      absl::StrCat("list uploads ", Uri(prefix), ": the store has no multipart uploads"));
}

absl::Status ObjectStore::AbortUpload(const std::string& key, const std::string& /*upload_id*/) {
  return absl::UnimplementedError(
      absl::StrCat("abort upload ", Uri(key), ": the store has no multipart uploads"));
}

absl::StatusOr<ObjectMeta> ObjectStore::Compose(std::vector<std::string> sources,
                                                const std::string& dst_key) {
  return WaitFor<ObjectMeta>(
      [&](Callback<ObjectMeta> cb) { ComposeAsync(std::move(sources), dst_key, std::move(cb)); });
}

absl::StatusOr<ListPage> ObjectStore::ListAll(ListOptions options) {
  ListPage all;
  std::string token;
  do {
    auto page = List(options, token);
    if (!page.ok()) return page.status();
    for (auto& o : page->objects) all.objects.push_back(std::move(o));
    for (auto& p : page->common_prefixes) all.common_prefixes.push_back(std::move(p));
    token = std::move(page->continuation);
  } while (!token.empty());
  return all;
}

namespace {
class StringSink : public ReadSink {
 public:
  explicit StringSink(std::string* out) : out_(out) {}
  absl::Status Append(absl::string_view chunk) override {
    out_->append(chunk.data(), chunk.size());
    return absl::OkStatus();
  }

 private:
  std::string* out_;
};
}  // namespace

absl::StatusOr<std::string> ObjectStore::Read(const std::string& key, ByteRange range) {
  std::string out;
  StringSink sink(&out);
  GetRequest request;
  request.key = key;
  request.range = range;
  request.sink = &sink;
  auto result = Get(request);
  if (!result.ok()) return result.status();
  return out;
}

}  // namespace wharf
