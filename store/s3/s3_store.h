// S3Store: the s3:// backend over an HttpTransport (also the request code of gs:// in XML
// mode, store/gcs/).
//
// Every operation is one or more signed HTTP exchanges driven asynchronously by the
// transport's event loop; nothing blocks a transport thread. Errors become Statuses naming
// the operation, the object's URI, the S3 error code, message and request id, plus a hint
// naming the setting to check (see ErrorFromResponse).
//
// Retries (RetryPolicy): 500/502/503/504, 429, SlowDown, RequestTimeout, InternalError and
// transport failures (connection reset, timeout, short body) are retried with exponential
// backoff and full jitter, bounded by attempts and total time. A GET interrupted after some
// bytes arrived resumes from the next byte with If-Match on the ETag first seen, so the
// bytes of two versions are never spliced together.
//
// Read options (GetRequest): if_match and if_none_match travel as If-Match / If-None-Match
// (a 304 Not Modified is GetResult::not_modified); max_staleness is satisfied by reading the
// source. A cancel token is checked before every attempt (a fired one sends nothing), handed
// to the transport (which aborts the transfer in flight), checked between the chunks of a
// sink, and cuts a retry's backoff short; the call then fails with "get <uri>: cancelled".
//
// Credentials: each attempt is signed with the config's static keys, or with credentials
// from a CredentialsCache over config.credentials_provider (refreshed in the background
// before they expire; docs/design/credentials.md). A 400/403 ExpiredToken or InvalidToken
// drops the cached credentials and retries the call once with fresh ones.
//
// Integrity: Content-Length is checked by the transport; a single-part PUT sends
// Content-MD5 and checks the returned ETag against the MD5 of what was sent; multipart
// parts send Content-MD5 too.
//
// Large objects: NewWriter() uploads parts in parallel (S3 multipart: part size 8 MiB by
// default, doubled every 1,000 parts so an object of any size stays under 10,000 parts;
// at most `upload_concurrency` parts in memory); a writer closed with less than one part
// becomes a single PutObject; failure or Abort() aborts the upload so nothing is left. A
// CreateMultipartUpload retried after an ambiguous failure (the connection dropped after the
// server created an upload) may have started uploads whose ids never arrived: the writer
// then lists the key's uploads and aborts those its creates started (see
// docs/design/transfer.md).
//
// Upload options (PutOptions): Content-Type, x-amz-storage-class, x-amz-server-side-encryption
// and x-amz-server-side-encryption-aws-kms-key-id go, signed, on PutObject and
// CreateMultipartUpload; PutOptions::mtime is ignored.
//
// Anonymous configs (S3ClientConfig::anonymous) send every request unsigned.
//
// Thread-safety: thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/metrics.h"
#include "http/transport.h"
#include "store/object_store.h"
#include "store/retry_meter.h"
#include "store/s3/aws_config.h"
#include "store/spec.h"

namespace wharf {
class Runtime;
}  // namespace wharf

namespace wharf::s3 {

using ::wharf::RetryPolicy;  // http/transport.h

struct S3StoreOptions {
  // "s3" or "gs": used in URIs and messages.
  std::string scheme = "s3";
  // The SigV4 service name ("s3" for both AWS and GCS's XML API).
  std::string service = "s3";
  uint64_t part_size = uint64_t{8} << 20;
  int upload_concurrency = 8;
  RetryPolicy retry;
  // What the backend declares it can do; null: S3's. Must outlive the store (gs:// passes a
  // static, store/gcs/).
  const Capabilities* capabilities = nullptr;
};

class S3Store : public ObjectStore {
 public:
  static absl::StatusOr<std::unique_ptr<S3Store>> Open(std::string bucket, S3ClientConfig config,
                                                       std::shared_ptr<HttpTransport> transport,
                                                       S3StoreOptions options = {});
  ~S3Store() override;

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
  // Another S3Store of the same scheme, endpoint, region, addressing, CA bundle and credentials
  // (profile, source and key id): CopyObject names the source bucket.
  bool CanCopyFrom(const ObjectStore& src) const override;
  void CopyFromAsync(const ObjectStore& src, std::string src_key, std::string dst_key,
                     Callback<ObjectMeta> done) override;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key) override;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(std::string key,
                                                          const PutOptions& options) override;

  // The buckets of this store's endpoint that its credentials own (S3 ListBuckets), in the
  // server's order (by name). FailedPrecondition unless the store was opened with an empty
  // bucket name, which addresses the endpoint itself (as ListS3Buckets does).
  absl::StatusOr<std::vector<BucketInfo>> ListBuckets();

  // ListMultipartUploads below `prefix` (every page), and AbortMultipartUpload.
  absl::StatusOr<std::vector<PendingUpload>> ListUploads(const std::string& prefix) override;
  absl::Status AbortUpload(const std::string& key, const std::string& upload_id) override;

  // Bucket administration (tests and benchmarks).
  absl::Status CreateBucket();
  // REQUIRES: the bucket is empty.
  absl::Status DeleteBucket();

  const std::string& bucket() const { return bucket_; }
  const S3ClientConfig& config() const { return config_; }

  // ---- Internal, shared with the multipart writer. ----
  struct Call;
  using ResponseCallback = absl::AnyInvocable<void(absl::StatusOr<HttpResponse>) &&>;
  // Signs and sends `call`, retrying what is retryable; `done` gets a 2xx response or the
  // error as a Status (annotated with the call's operation and URI).
  void Execute(std::shared_ptr<Call> call, ResponseCallback done);

 private:
  S3Store(std::string bucket, S3ClientConfig config, std::shared_ptr<HttpTransport> transport,
          S3StoreOptions options);

  // Gets credentials for the attempt (static keys, or the credentials cache), then sends.
  void Attempt(std::shared_ptr<Call> call, ResponseCallback done);
  // Signs the attempt with `credentials` (nullptr: unsigned) and sends it.
  void SendAttempt(std::shared_ptr<Call> call, ResponseCallback done,
                   const Credentials* credentials);
  absl::Duration Backoff(int attempt);

  // One DeleteObjects request of at most 1000 `keys`. Keys the reply lists with a retryable
  // error (SlowDown, InternalError, ...: S3 answers 200 and fails keys one by one when it is
  // busy) are sent again in a smaller request, with backoff, within the retry policy;
  // `done` gets the first lasting failure and how many keys failed (0 for none, or when the
  // whole request failed).
  struct DeleteBatch;
  void DeleteBatchAsync(std::shared_ptr<DeleteBatch> batch, std::vector<std::string> keys);

  // CopyObject of `src_bucket`/`src_key` (a bucket of this endpoint) into `dst_key`.
  void CopyObjectAsync(const std::string& src_bucket, std::string src_uri, std::string src_key,
                       std::string dst_key, Callback<ObjectMeta> done);

  const std::string bucket_;
  const S3ClientConfig config_;
  const std::shared_ptr<HttpTransport> transport_;
  const S3StoreOptions options_;
  std::string host_;       // Host header value
  std::string scheme_;     // "http" or "https"
  std::string base_path_;  // "/bucket" (path style) or "" (virtual-hosted)
  // Credentials from config_.credentials_provider when the config has no static keys: fetched
  // on the runtime's blocking pool, refreshed before they expire, and shared by the runtime's
  // stores whose sources have the same Describe(). Null when signing with static keys or not
  // at all. The runtime is held because its pool runs the fetches.
  std::shared_ptr<Runtime> runtime_;
  std::shared_ptr<CredentialsCache> credentials_cache_;

  RetryMeter retries_{"wharf_s3_retries_total",
                      "Requests of the S3 protocol (s3://, gs:// XML) sent again, by cause: "
                      "throttled, timeout, server_error, connection, credentials, clock_skew"};

  friend class S3Writer;
};

// The Status for a non-2xx S3 response to `op` on `uri`, e.g.
//   "get s3://b/k: NoSuchKey: The specified key does not exist. (request id tx00..)".
absl::Status ErrorFromResponse(const HttpResponse& response, absl::string_view op,
                               absl::string_view uri, const S3ClientConfig& config);

// True when an S3 error response should be retried.
bool IsRetryableResponse(const HttpResponse& response);

// WHARF_NO_SIGN_REQUEST (the CLI's --no-sign-request before store specs): 1/true/yes/on or
// 0/false/no/off (any case); unset or empty is false; anything else InvalidArgument.
absl::StatusOr<bool> NoSignRequestFromEnv();

// Applies a spec's options to `overrides`: endpoint, region, profile, addressing_style (auto
// leaves the resolver's choice) and anonymous; an unset anonymous comes from
// NoSignRequestFromEnv(). InvalidArgument for `api`, which is gs:// only.
absl::Status ApplySpecOptions(const StoreSpec& spec, S3ClientOverrides& overrides);

// Opens `bucket` ("" for the endpoint itself) of an S3-compatible service: `overrides` over
// the environment and the shared AWS files (ResolveS3ClientConfig), on the default runtime's
// curl transport for the config's CA bundle. Shared by s3:// and gs:// (store/gcs/).
absl::StatusOr<std::unique_ptr<S3Store>> OpenS3Endpoint(const std::string& bucket,
                                                        const S3ClientOverrides& overrides,
                                                        S3StoreOptions options);

// The s3:// store of a spec (the scheme registry's factory). Options: endpoint, region,
// anonymous, profile, addressing_style; each unset one resolves as ResolveS3ClientConfig says.
absl::StatusOr<std::shared_ptr<ObjectStore>> OpenS3Spec(const StoreSpec& spec);

// The buckets of the endpoint that `spec` (with an empty bucket) resolves to, configured as
// OpenS3Spec configures a store: `wharf ls s3://`. The scheme registry's bucket lister.
absl::StatusOr<std::vector<BucketInfo>> ListS3Buckets(const StoreSpec& spec);

}  // namespace wharf::s3
