// ObjectStore: the one contract every storage backend (file://, s3://, gs://) implements.
//
// Semantics are those of an object store, not a file system: a flat namespace of keys
// (UTF-8 byte strings) listed in byte-wise lexicographic order, whole-object atomic puts
// (a reader sees the old or the new object, never a mix), ranged reads, and idempotent
// deletes (deleting a missing key succeeds, as on S3).
//
// Every operation has an asynchronous form that takes a completion callback. A backend
// runs the callback on one of its own threads (an event loop or a blocking pool); the
// callback must not block: hand long work to another executor. The blocking forms are
// conveniences built on the asynchronous ones (or the other way round, for backends whose
// work is blocking syscalls anyway). Thousands of asynchronous calls may be outstanding at
// once; backends bound their own concurrency and queue the rest.
//
// Thread-safety: every method of an ObjectStore may be called concurrently from any thread.
// A store must outlive the completion of every asynchronous call made on it.
//
// Errors: every Status names the operation and the object's URI, e.g.
//   "get file:///data/a.jpg: No such file or directory". Codes follow one mapping across
//   backends: NotFound (missing object or bucket), PermissionDenied (credentials, ACLs),
//   InvalidArgument (malformed key or request), OutOfRange (range starts past the end),
//   FailedPrecondition (if_match mismatch; a key that cannot coexist with another),
//   Unavailable (transient; retried by the backend before it is surfaced), Cancelled (the
//   request's CancelToken fired).
//
// Decorators (a cache tier, metrics, fault injection) derive from ForwardingStore
// (store/forwarding_store.h) and forward what they do not change, read options included.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/cancel.h"

namespace wharf {

// One object as listed or returned by head/get/put.
struct ObjectMeta {
  std::string key;
  uint64_t size = 0;
  // Opaque version tag without quotes: the MD5 hex of the content for single-part uploads
  // on S3-like stores and for the local store; GCS generation for gs:// JSON.
  std::string etag;
  absl::Time mtime = absl::InfinitePast();
  // The MD5 of the content (32 lowercase hex) where the store knows it and the etag is not it
  // (GCS's md5Hash beside its generation); empty otherwise. ContentMd5() gives either.
  std::string md5;
  // The etag looks like an MD5 but is not one: S3 says so for an object encrypted with
  // SSE-KMS or SSE-C (a GET's or HEAD's headers tell it; a listing cannot). ContentMd5()
  // then gives nothing, and nothing compares the content with it.
  bool etag_opaque = false;
};

// The MD5 of an object's content as its metadata tells it: `md5`, else an etag that is an MD5
// (S3 single-part uploads, local files), else empty (a multipart ETag, a GCS generation of a
// composite object).
std::string ContentMd5(const ObjectMeta& meta);

// A put whose bytes are not what their source's metadata says (PutOptions::source_md5, the
// tier's check of source_etag) fails as DataLoss carrying this payload: the bytes were damaged
// on the way, so fetching the object again may succeed (the transfer engine does, twice).
inline constexpr char kSourceMismatchPayloadUrl[] = "wharf.dev/store/source_mismatch";
inline absl::Status SourceMismatchError(absl::string_view message) {
  absl::Status s = absl::DataLossError(message);
  s.SetPayload(kSourceMismatchPayloadUrl, absl::Cord("1"));
  return s;
}
inline bool IsSourceMismatch(const absl::Status& s) {
  return absl::IsDataLoss(s) && s.GetPayload(kSourceMismatchPayloadUrl).has_value();
}

// An in-progress multipart upload (S3 ListMultipartUploads).
struct PendingUpload {
  std::string key;
  std::string upload_id;
  absl::Time initiated = absl::InfinitePast();  // the server's clock
};

// One bucket of an endpoint, as a bucket listing (S3 ListBuckets) returns it.
struct BucketInfo {
  std::string name;
  absl::Time creation_time = absl::InfinitePast();  // InfinitePast when the server omits it
};

// How an uploaded object is stored and described (per call, as leveldb's WriteOptions). A
// backend with capabilities().put_options honours the fields it has a use for and ignores the
// others, as noted on each; the defaults leave every choice to the store.
struct PutOptions {
  // The object's Content-Type (S3). Empty: the server's default (binary/octet-stream).
  // Ignored by the local store.
  std::string content_type;
  // The S3 storage class, e.g. "STANDARD", "STANDARD_IA", "INTELLIGENT_TIERING"; which ones a
  // server accepts is up to it (InvalidArgument from the server otherwise). Empty: the
  // bucket's default. Ignored by the local store.
  std::string storage_class;
  // Server-side encryption: "" (the bucket's default), "AES256" (SSE-S3) or "aws:kms"
  // (SSE-KMS). Ignored by the local store.
  std::string sse;
  // The KMS key of SSE-KMS (id, ARN or alias); empty: the account's default key.
  // REQUIRES: empty unless sse == "aws:kms".
  std::string sse_kms_key_id;
  // Local store: the file's modification time. Ignored by S3 (the server sets Last-Modified).
  std::optional<absl::Time> mtime;
  // Provenance: the object these bytes are a copy of (its URI and ETag or generation). A
  // store that keeps copies of other stores' objects (the tier) records them with the entry,
  // so a rerun can tell an unchanged copy from a stale one; every other store ignores them,
  // and they do not count as options (is_default). The transfer engine sets them.
  std::string source_uri;
  std::string source_etag;
  // The source's etag is no MD5 of its content (ObjectMeta::etag_opaque): not checked.
  bool source_etag_opaque = false;
  // The MD5 of the source's content as its metadata tells it (ContentMd5: an S3 single-part
  // ETag, a GCS md5Hash, a local file's), hex; empty when unknown. The file store, which
  // computes the MD5 of every file it writes, fails the put as DataLoss when they differ:
  // the bytes were damaged on the way, and no file is left.
  std::string source_md5;
  // Create only: the put fails with AlreadyExists when the key holds an object, decided
  // atomically by the store (S3: If-None-Match: * on PutObject and CompleteMultipartUpload;
  // GCS: ifGenerationMatch=0; file://: a rename that does not replace). A store that cannot
  // decide it refuses the option (Unimplemented) rather than overwrite. Caveat: Ceph RGW
  // before Squid honours the condition on PutObject only, so a multipart upload to it (an
  // object above one part) is not conditional.
  bool if_absent = false;

  // True when every field that changes how the object is stored has its default: the same
  // as not passing options at all (provenance aside).
  bool is_default() const {
    return content_type.empty() && storage_class.empty() && sse.empty() && sse_kms_key_id.empty() &&
           !mtime.has_value() && !if_absent;
  }
};

// The Content-Type that a key's extension names (case-insensitive): "application/json" for
// "a/b.json", "image/jpeg" for ".JPG", ...; empty for an extension not in wharf's table or
// none. A fixed table, so every machine uploads the same types (as aws s3 cp and rclone guess
// types from the extension on upload).
std::string ContentTypeOfKey(absl::string_view key);

// OK, or InvalidArgument naming the field: sse other than "", "AES256" or "aws:kms"; a KMS key
// without sse "aws:kms"; a text field with a control character (it travels as a header).
// Backends call it before anything is sent, so every backend refuses the same options.
absl::Status ValidatePutOptions(const PutOptions& options);

struct ListOptions {
  // Only keys starting with `prefix`.
  std::string prefix;
  // When non-empty, keys whose remainder after `prefix` contains `delimiter` are rolled up
  // into one common prefix (prefix + remainder up to and including the first delimiter).
  std::string delimiter;
  // Exclusive lower bound: only keys > start_after.
  std::string start_after;
  // Exclusive upper bound: only keys < end_before; empty means no bound. Parallel listing
  // splits the key space into [start_after, end_before) ranges.
  std::string end_before;
  // Most entries (objects + common prefixes) per page; a backend may return fewer.
  int page_size = 1000;
};

struct ListPage {
  std::vector<ObjectMeta> objects;           // in key order
  std::vector<std::string> common_prefixes;  // in key order
  // Opaque token for the next page; empty when this is the last page.
  std::string continuation;
};

// A byte range of an object. The default is the whole object.
struct ByteRange {
  uint64_t offset = 0;
  std::optional<uint64_t> length;  // nullopt: to the end of the object
  bool suffix = false;             // the last `*length` bytes (offset ignored)

  static ByteRange All() { return {}; }
  static ByteRange Of(uint64_t offset, uint64_t length) { return {offset, length, false}; }
  static ByteRange From(uint64_t offset) { return {offset, std::nullopt, false}; }
  static ByteRange Last(uint64_t length) { return {0, length, true}; }

  bool is_all() const { return !suffix && offset == 0 && !length.has_value(); }
  // Resolves against an object of `size` bytes: the [begin, end) actually read.
  // OutOfRange when the range starts at or past the end of a non-empty object,
  // or is non-trivial on an empty one (S3 answers 416 to both).
  absl::StatusOr<std::pair<uint64_t, uint64_t>> Resolve(uint64_t size) const;
  // HTTP form without the "bytes=" prefix: "0-99", "100-", "-100".
  std::string ToHttp() const;
};

// Receives a streamed read chunk by chunk, in order. Append may block (that back-pressures
// the transfer) and may be called on a backend thread; returning an error aborts the read.
class ReadSink {
 public:
  virtual ~ReadSink() = default;
  virtual absl::Status Append(absl::string_view chunk) = 0;
};

struct GetRequest {
  std::string key;
  ByteRange range;
  // Destination: either `sink` (streamed) or `buffer` (the bytes land at buffer[0..n)).
  // REQUIRES: exactly one is set. A buffer smaller than the range is an error
  // (OutOfRange), never a silent truncation.
  absl::Span<char> buffer;
  ReadSink* sink = nullptr;
  // ---- Per-call read options (as leveldb's ReadOptions). Decorators forward them. ----
  // When non-empty, fail with FailedPrecondition unless the object's etag equals it, so
  // parallel ranged parts of one object never mix two versions.
  std::string if_match;
  // When non-empty and equal to the object's current etag (ObjectMeta::etag, unquoted), the
  // read succeeds with GetResult::not_modified: no byte is delivered (the buffer or sink is
  // untouched), meta describes the object. Otherwise the read proceeds as without it. S3
  // sends If-None-Match and takes the 304 Not Modified; for gs:// over the XML API the
  // etag is GCS's ETag, the equivalent of its generation condition; the local store compares
  // its own etag. Evaluated after if_match and before the range (as HTTP does), so a
  // not-modified answer never fails on a range past the end.
  std::string if_none_match;
  // The oldest copy the caller accepts: a caching decorator (the tier) may serve a copy it
  // validated against the source at most this long ago. Zero (the default): the bytes must be
  // current, i.e. read from (or revalidated with) the source. Backends always read the
  // source, so they satisfy any bound and ignore it.
  absl::Duration max_staleness = absl::ZeroDuration();
  // When set and cancelled, the read stops: a request not yet sent is never sent, a transfer
  // in flight is aborted (the curl transport drops it; the local store stops between
  // chunks), retries stop, and `done` gets CancelledError naming the operation and the URI
  // ("get s3://b/k: cancelled"). Bytes already delivered to the buffer or sink stay there.
  // One token may be shared by many requests (a fetch batch cancels all of its own at once).
  CancelToken cancel;
};

struct GetResult {
  uint64_t offset = 0;  // where the returned bytes start in the object
  uint64_t bytes = 0;   // how many bytes were delivered
  ObjectMeta meta;      // meta.size is the size of the whole object
  // The object's etag equals GetRequest::if_none_match: nothing was delivered (bytes and
  // offset are 0) and meta.key and meta.etag describe the object (size and mtime too where
  // the backend learns them without the body: the local store always; S3 from the 304's
  // headers, where a server may leave Content-Length out, then size is 0).
  bool not_modified = false;
  // From sending the request to the first response byte (of the last attempt); zero for
  // stores without a network hop.
  absl::Duration time_to_first_byte = absl::ZeroDuration();
  int attempts = 1;  // 1 + retries
  // The server's id of the (last) request, where it sends one (S3's x-amz-request-id): for
  // debug logs and support tickets.
  std::string request_id;
};

// Writes one large object. Bytes become visible only at Close(), atomically; a writer that
// is destroyed or aborted without Close() leaves nothing behind (multipart uploads are
// aborted, temporary files removed).
// Thread-safety: one writer is used by one thread at a time.
class ObjectWriter {
 public:
  virtual ~ObjectWriter() = default;
  // May block while earlier parts upload (back-pressure under the memory budget).
  virtual absl::Status Write(absl::Cord data) = 0;
  virtual absl::StatusOr<ObjectMeta> Close() = 0;
  virtual void Abort() = 0;
};

// Where composed reads (io/composed_read.h) keep their temporary objects, under the root of
// a bucket that composes. A store that composes leaves the folder out of its listings unless
// the listing's prefix is inside it: a temporary is never a user's object (a killed reader's
// would be copied, fetched or fed to a dataset, and then swept away under it).
inline constexpr char kComposeTempRoot[] = ".wharf-compose/";

// What a backend can do, declared rather than probed (the conformance suite reads it too).
struct Capabilities {
  // ComposeAsync concatenates existing objects server-side (GCS compose).
  bool compose = false;
  // NewWriter uploads parts in parallel (S3 multipart); otherwise it streams one object.
  bool multipart_upload = false;
  // The store answers end_before itself; otherwise the backend trims pages client-side.
  bool native_end_before = false;
  // Keys "a" and "a/b" cannot coexist (stores backed by a file system tree).
  bool nested_keys_conflict = false;
  // Keys ending in '/' (directory markers) are ordinary objects.
  bool trailing_slash_keys = true;
  // Largest page ListAsync returns.
  int max_page_size = 1000;
  // PutAsync and NewWriter take PutOptions (each backend documents which fields it uses);
  // otherwise options other than the defaults fail with Unimplemented.
  bool put_options = false;
  // The largest object CopyAsync copies (S3's CopyObject: 5 GiB); 0: any size. A transfer
  // streams a larger object through a writer instead.
  uint64_t max_copy_size = 0;
};

template <typename T>
using Callback = absl::AnyInvocable<void(absl::StatusOr<T>) &&>;
using StatusCallback = absl::AnyInvocable<void(absl::Status) &&>;

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  // "s3://bucket/key", "file:///root/key": how errors and the CLI name an object.
  virtual std::string Uri(absl::string_view key) const = 0;
  virtual const Capabilities& capabilities() const = 0;

  // ---- Asynchronous forms (primary) ----
  // One page of a listing; pass the previous page's continuation ("" for the first).
  virtual void ListAsync(ListOptions options, std::string continuation,
                         Callback<ListPage> done) = 0;
  virtual void HeadAsync(std::string key, Callback<ObjectMeta> done) = 0;
  // REQUIRES: the request's buffer/sink stays valid until `done` runs.
  virtual void GetAsync(GetRequest request, Callback<GetResult> done) = 0;
  virtual void PutAsync(std::string key, absl::Cord data, Callback<ObjectMeta> done) = 0;
  // The same with upload options. The default runs the form above when `options` are the
  // defaults and fails with Unimplemented otherwise; a store with capabilities().put_options
  // overrides it (and forwards the form above to it with PutOptions{}). A decorator that
  // changes puts overrides this form and NewWriter(key, options) (store/forwarding_store.h).
  // InvalidArgument (nothing sent) unless ValidatePutOptions(options) is OK.
  virtual void PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                        Callback<ObjectMeta> done);
  virtual void DeleteAsync(std::string key, StatusCallback done) = 0;
  // Deletes many keys (in batches where the store has a batch call). OK only if every key
  // is gone; otherwise the first failure, annotated with how many failed.
  virtual void DeleteManyAsync(std::vector<std::string> keys, StatusCallback done) = 0;
  // Server-side copy within this store.
  virtual void CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) = 0;
  // Whether CopyFromAsync copies from `src` (another bucket of the same service, reached the
  // same way with the same credentials): false by default.
  virtual bool CanCopyFrom(const ObjectStore& /*src*/) const { return false; }
  // Server-side copy of `src_key` of `src` into `dst_key` here: no byte passes through this
  // machine, and the object keeps its metadata (Content-Type, user metadata), as CopyAsync.
  // Unimplemented unless CanCopyFrom(src).
  virtual void CopyFromAsync(const ObjectStore& src, std::string src_key, std::string dst_key,
                             Callback<ObjectMeta> done);
  // Concatenates `sources` into `dst_key`. Unimplemented unless capabilities().compose.
  virtual void ComposeAsync(std::vector<std::string> sources, std::string dst_key,
                            Callback<ObjectMeta> done);

  // Opens a writer for one (possibly very large) object.
  virtual absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key) = 0;
  // The same with upload options; the default is as for PutAsync with options.
  virtual absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key,
                                                                  const PutOptions& options);

  // ---- Blocking forms: wait for the asynchronous form. Backends whose work is blocking
  // anyway override these to run inline. ----
  virtual absl::StatusOr<ListPage> List(const ListOptions& options,
                                        const std::string& continuation = "");
  virtual absl::StatusOr<ObjectMeta> Head(const std::string& key);
  virtual absl::StatusOr<GetResult> Get(const GetRequest& request);
  virtual absl::StatusOr<ObjectMeta> Put(const std::string& key, absl::Cord data);
  virtual absl::StatusOr<ObjectMeta> Put(const std::string& key, absl::Cord data,
                                         const PutOptions& options);
  virtual absl::Status Delete(const std::string& key);
  virtual absl::Status DeleteMany(std::vector<std::string> keys);
  virtual absl::StatusOr<ObjectMeta> Copy(const std::string& src_key, const std::string& dst_key);
  absl::StatusOr<ObjectMeta> CopyFrom(const ObjectStore& src, const std::string& src_key,
                                      const std::string& dst_key);
  absl::StatusOr<ObjectMeta> Compose(std::vector<std::string> sources, const std::string& dst_key);

  // ---- Multipart uploads left behind ----
  // The in-progress multipart uploads of keys starting with `prefix`, and aborting one (gone
  // already is success). An upload a killed process left keeps its parts, billed, until it
  // is aborted; `wharf tier export` sweeps its destination with these. Stores without
  // multipart uploads answer Unimplemented (the default).
  virtual absl::StatusOr<std::vector<PendingUpload>> ListUploads(const std::string& prefix);
  virtual absl::Status AbortUpload(const std::string& key, const std::string& upload_id);

  // ---- Helpers built on the above ----
  // Every page of a listing, concatenated.
  absl::StatusOr<ListPage> ListAll(ListOptions options);
  // The whole object (or a range) as a string.
  absl::StatusOr<std::string> Read(const std::string& key, ByteRange range = ByteRange::All());
};

// Runs `start(callback)` and blocks until the callback fires; returns what it received.
template <typename T, typename Start>
absl::StatusOr<T> WaitFor(Start&& start);
absl::Status WaitForStatus(absl::AnyInvocable<void(StatusCallback) &&> start);

}  // namespace wharf

#include "store/object_store_inl.h"
