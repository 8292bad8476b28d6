// libFuzzer target: the XML replies the S3 backend parses (store/s3/s3_store.cc): object
// listings (ListObjectsV2), error bodies, DeleteObjects results, CopyObject results (and
// errors inside a 200), bucket listings, multipart initiate / complete replies and the
// in-progress upload listing a retried create sweeps.
//
// The input's first byte picks which operations run (one bit each, in the order below); the
// rest is the script of a ScriptedServer (scripted_server.h) whose responses are a status
// letter and a body, and every reply gets an ETag and dates. The operations run one after
// another against an S3Store over a CannedTransport. Nothing is checked beyond the sanitizers
// and termination: a reply may be refused, never crash or hang the client.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/hash.h"
#include "http/canned_transport.h"
#include "store/s3/s3_store.h"
#include "tests/fuzz/scripted_server.h"

namespace wharf::fuzz {
namespace {

// Status letters: 'A'.. in order; any other first byte is 200 with the whole piece as body.
constexpr int kStatuses[] = {200, 204, 206, 304, 400, 403, 404, 409, 412, 416, 500, 503};

enum Operation : uint8_t {
  kList = 1,          // one page of a delimited listing
  kListAll = 2,       // every page (follows continuation tokens)
  kGet = 4,           // a whole-object GET: error bodies
  kDeleteMany = 8,    // DeleteObjects: its DeleteResult
  kCopy = 16,         // CopyObject: its result, or an error inside a 200
  kListBuckets = 32,  // ListBuckets, on a store opened without a bucket
  kMultipart = 64,    // a two-part upload: initiate, parts, complete, a retried create's sweep
};

// Every reply carries an ETag (an upload's is its MD5, which the client checks against its
// parts'; otherwise the body's) and dates.
class EtagServer {
 public:
  void Load(absl::string_view script) { responses_.Load(script); }

  absl::StatusOr<CannedResponse> Answer(const HttpRequest& request) {
    CannedResponse r = responses_.Next();
    const std::string md5 = request.body.empty() ? Md5Hex(r.body) : UploadMd5(request.body);
    r.headers = {{"etag", absl::StrCat("\"", md5, "\"")},
                 {"date", "Tue, 24 Nov 2026 10:00:00 GMT"},
                 {"last-modified", "Tue, 24 Nov 2026 09:00:00 GMT"}};
    return r;
  }

 private:
  // The parts of the multipart upload are the same every time: their MD5s are remembered.
  std::string UploadMd5(const absl::Cord& body) {
    if (body.size() < 4096) return Md5Hex(std::string(body));
    absl::MutexLock lock(&mu_);
    std::string& md5 = large_md5_[body.size()];
    if (md5.empty()) md5 = Md5Hex(std::string(body));
    return md5;
  }

  ScriptedServer responses_{kStatuses, /*with_headers=*/false};
  absl::Mutex mu_;
  std::map<size_t, std::string> large_md5_ ABSL_GUARDED_BY(mu_);
};

EtagServer& Server() {
  static auto* server = new EtagServer;
  return *server;
}

std::unique_ptr<s3::S3Store> OpenStore(std::string bucket,
                                       std::shared_ptr<HttpTransport> transport) {
  s3::S3ClientConfig config;
  config.credentials = {"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
  config.credentials_source = "explicit options";
  config.region = "us-east-1";
  config.endpoint = "http://127.0.0.1:9";
  config.path_style = true;
  s3::S3StoreOptions options;
  options.retry.max_attempts = 2;  // a retryable status is retried once: retry paths too
  options.retry.initial_backoff = absl::Microseconds(1);
  options.retry.max_backoff = absl::Microseconds(1);
  options.part_size = uint64_t{5} << 20;
  options.upload_concurrency = 1;  // parts take their responses in order
  auto store = s3::S3Store::Open(std::move(bucket), config, std::move(transport), options);
  if (!store.ok()) std::abort();
  return *std::move(store);
}

// A transport and stores of their own for each input (the transport records every request,
// and no state carries over from one input to the next).
void Run(uint8_t operations) {
  auto transport = std::make_shared<CannedTransport>(
      [](const HttpRequest& request) { return Server().Answer(request); });
  auto store = OpenStore("bkt", transport);
  auto endpoint = OpenStore("", transport);
  if (operations & kList) (void)store->List({.prefix = "p/", .delimiter = "/"});
  if (operations & kListAll) (void)store->ListAll({.prefix = "p/", .end_before = "p/m"});
  if (operations & kGet) (void)store->Read("k");
  if (operations & kDeleteMany) (void)store->DeleteMany({"a", "b", "c"});
  if (operations & kCopy) (void)store->Copy("src", "dst");
  if (operations & kListBuckets) (void)endpoint->ListBuckets();
  if (operations & kMultipart) {
    static const absl::Cord* const part = new absl::Cord(std::string((uint64_t{5} << 20) + 1, 'x'));
    auto writer = store->NewWriter("big");
    if (writer.ok() && (*writer)->Write(*part).ok()) (void)(*writer)->Close();
  }
}

}  // namespace
}  // namespace wharf::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wharf::fuzz;
  if (size == 0) return 0;
  Server().Load(absl::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  Run(data[0]);
  return 0;
}
