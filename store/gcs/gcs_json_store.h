// GcsJsonStore: the gs:// backend over GCS's JSON API
// (https://cloud.google.com/storage/docs/json_api) on an HttpTransport (docs/design/gcs.md).
//
// Every operation is one or more HTTP exchanges driven asynchronously by the transport's event
// loop. Requests carry "Authorization: Bearer <token>" from a CredentialsCache over the
// config's provider (application-default credentials, store/gcs/gcs_credentials.h), or nothing
// when the config is anonymous (the emulator, public buckets).
//
// Semantics on the store contract:
//   etag      the object's generation (decimal); if_match travels as ifGenerationMatch and
//             if_none_match as ifGenerationNotMatch, and the generation of every response is
//             checked against them too (a server that ignores preconditions still never hands
//             out the wrong generation).
//   get       alt=media with Range; an interrupted read resumes from the next byte with
//             ifGenerationMatch of the generation first seen; whole-object reads are checked
//             against x-goog-hash's crc32c when the server sends it.
//   list      prefix, delimiter, maxResults, pageToken; start_after as startOffset and
//             end_before as endOffset, and both bounds applied to what comes back.
//   put       one multipart upload (JSON metadata with the MD5, then the bytes); the returned
//             md5Hash is checked.
//   writer    a resumable upload in chunks (a multiple of 256 KiB); visible only once the last
//             chunk is in; a dropped connection resumes from the session's persisted offset;
//             Abort/destruction cancels the session.
//   copy      rewriteTo, looped on rewriteToken; compose: up to 32 sources.
//
// Retries: 408, 429, 5xx and transport failures, with exponential backoff and full jitter,
// bounded by attempts and total time; a 401 drops the cached token and retries once.
//
// Thread-safety: thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/credentials.h"
#include "base/metrics.h"
#include "http/transport.h"
#include "store/object_store.h"
#include "store/retry_meter.h"

namespace wharf {
class Runtime;
}  // namespace wharf

namespace wharf::gcs {

struct GcsJsonConfig {
  // "https://storage.googleapis.com", or an emulator's "http://127.0.0.1:9023". No trailing '/'.
  std::string endpoint = "https://storage.googleapis.com";
  // Where tokens come from; null: requests are sent without Authorization (anonymous).
  std::shared_ptr<CredentialsProvider> credentials;
  // For messages and hints: "service account a@b (key /k.json)", "anonymous", ...
  std::string credentials_source = "anonymous";
  // The project of bucket listings and creations (GOOGLE_CLOUD_PROJECT, the key's project_id).
  std::string project;
  // Resumable upload chunk size. REQUIRES: a positive multiple of 256 KiB.
  uint64_t chunk_size = uint64_t{8} << 20;
  RetryPolicy retry;  // http/transport.h
};

class GcsJsonStore : public ObjectStore {
 public:
  // InvalidArgument for a malformed endpoint or chunk size.
  static absl::StatusOr<std::unique_ptr<GcsJsonStore>> Open(
      std::string bucket, GcsJsonConfig config, std::shared_ptr<HttpTransport> transport);
  ~GcsJsonStore() override;

  std::string Uri(absl::string_view key) const override;
  const Capabilities& capabilities() const override;

  void ListAsync(ListOptions options, std::string continuation, Callback<ListPage> done) override;
  void HeadAsync(std::string key, Callback<ObjectMeta> done) override;
  void GetAsync(GetRequest request, Callback<GetResult> done) override;
  void PutAsync(std::string key, absl::Cord data, Callback<ObjectMeta> done) override;
  void PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                Callback<ObjectMeta> done) override;
  void DeleteAsync(std::string key, StatusCallback done) override;
  void DeleteManyAsync(std::vector<std::string> keys, StatusCallback done) override;
  void CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) override;
  // Another bucket of the same endpoint reached with the same credentials: copied on the
  // server (rewriteTo), keeping Content-Type and metadata, as within one bucket.
  bool CanCopyFrom(const ObjectStore& src) const override;
  void CopyFromAsync(const ObjectStore& src, std::string src_key, std::string dst_key,
                     Callback<ObjectMeta> done) override;
  // REQUIRES (else InvalidArgument): 1 to 32 sources, as GCS allows.
  void ComposeAsync(std::vector<std::string> sources, std::string dst_key,
                    Callback<ObjectMeta> done) override;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key) override;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key,
                                                          const PutOptions& options) override;

  // The project's buckets (GET /storage/v1/b?project=...), by name. FailedPrecondition without
  // a project.
  absl::StatusOr<std::vector<BucketInfo>> ListBuckets();
  // Bucket administration (tests and benchmarks).
  absl::Status CreateBucket();
  // REQUIRES: the bucket is empty.
  absl::Status DeleteBucket();

  const std::string& bucket() const { return bucket_; }
  const GcsJsonConfig& config() const { return config_; }

  // ---- Internal, shared with the resumable writer. ----
  struct Call;
  using ResponseCallback = absl::AnyInvocable<void(absl::StatusOr<HttpResponse>) &&>;
  // Authorizes and sends `call`, retrying what is retryable; `done` gets a 2xx (or an accepted
  // 304/308) response or the error as a Status naming the call's operation and URI.
  void Execute(std::shared_ptr<Call> call, ResponseCallback done);
  // "{endpoint}/storage/v1/b/{bucket}/o/{name}" (name percent-encoded as one segment).
  std::string ObjectUrl(absl::string_view key) const;
  std::string UploadUrl() const;

 private:
  GcsJsonStore(std::string bucket, GcsJsonConfig config, std::shared_ptr<HttpTransport> transport);

  void Attempt(std::shared_ptr<Call> call, ResponseCallback done);
  void SendAttempt(std::shared_ptr<Call> call, ResponseCallback done, const std::string& token);
  absl::Duration Backoff(int attempt);
  // One rewriteTo round; loops on rewriteToken.
  // `src_url` is the source object's URL (this bucket's or another's, CopyFromAsync),
  // `src_uri` its URI for messages.
  void RewriteRound(std::string src_url, std::string src_uri, std::string dst_key,
                    std::string token, int rounds, Callback<ObjectMeta> done);

  const std::string bucket_;
  const GcsJsonConfig config_;
  const std::shared_ptr<HttpTransport> transport_;
  // Tokens from config_.credentials, shared by the runtime's stores of the same source. Null
  // when anonymous.
  std::shared_ptr<Runtime> runtime_;
  std::shared_ptr<CredentialsCache> credentials_cache_;

  RetryMeter retries_{"wharf_gcs_retries_total",
                      "Requests of GCS's JSON API (gs://) sent again, by cause: throttled, "
                      "timeout, server_error, connection, credentials"};

  friend class GcsResumableWriter;
};

// What a gs:// store does over the JSON API: compose, native end bound, upload options, pages
// of up to 1,000; no parallel multipart writer (resumable uploads are sequential).
const Capabilities& JsonCapabilities();

// Percent-encodes `s` for one URL path segment or a query value: everything but
// A-Z a-z 0-9 - . _ ~ (so '/' becomes %2F).
std::string EncodeComponent(absl::string_view s);

// The Status for a non-2xx JSON API response to `op` on `uri`, e.g.
//   "get gs://b/k: 404 notFound: No such object: b/k".
// `endpoint`, when given, is named where a bodyless 404 may mean a missing bucket.
absl::Status ErrorFromJsonResponse(const HttpResponse& response, absl::string_view op,
                                   absl::string_view uri, absl::string_view credentials_source,
                                   absl::string_view endpoint = "");

// True when a JSON API response should be retried (408, 429, 5xx).
bool IsRetryableJsonResponse(const HttpResponse& response);

}  // namespace wharf::gcs
