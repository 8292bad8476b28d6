// libFuzzer target: the replies the GCS JSON API backend parses (store/gcs/gcs_json_store.cc):
// object listings (items, prefixes, page tokens), object resources (head, put, compose,
// rewrite with its token loop), error bodies, media downloads with their headers
// (Content-Range, x-goog-generation, x-goog-hash), and a resumable upload's session replies
// (Location, 308 with Range, the final resource).
//
// The input's first byte picks which operations run (one bit each, in the order below); the
// rest is the script of a ScriptedServer (scripted_server.h) whose responses carry header
// lines. Nothing is checked beyond the sanitizers and termination: a reply may be refused,
// never crash or hang the client.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/cord.h"
#include "http/canned_transport.h"
#include "store/gcs/gcs_json_store.h"
#include "tests/fuzz/scripted_server.h"

namespace wharf::fuzz {
namespace {

// Status letters: 'A'.. in order (scripted_server.h).
constexpr int kStatuses[] = {200, 201, 206, 304, 308, 400, 401, 403,
                             404, 409, 412, 416, 499, 500, 503};

enum Operation : uint8_t {
  kList = 1,          // one page of a delimited, bounded listing
  kListAll = 2,       // every page (follows page tokens)
  kGet = 4,           // a whole-object read
  kRanged = 8,        // a ranged read with if_match, and a suffix read with if_none_match
  kHead = 16,         // an object resource
  kCopyCompose = 32,  // rewrite (token loop), compose
  kPutWriter = 64,    // a put, and a resumable upload of three chunks
};

ScriptedServer& Server() {
  static auto* server = new ScriptedServer(kStatuses, /*with_headers=*/true);
  return *server;
}

void Run(uint8_t operations) {
  auto transport =
      std::make_shared<CannedTransport>([](const HttpRequest&) { return Server().Next(); });
  gcs::GcsJsonConfig config;
  config.endpoint = "http://127.0.0.1:9";
  config.chunk_size = 256 << 10;
  config.retry.max_attempts = 2;  // a retryable status is retried once: retry paths too
  config.retry.initial_backoff = absl::Microseconds(1);
  config.retry.max_backoff = absl::Microseconds(1);
  auto opened = gcs::GcsJsonStore::Open("bkt", config, transport);
  if (!opened.ok()) std::abort();
  gcs::GcsJsonStore& store = **opened;
  if (operations & kList) {
    (void)store.List({.prefix = "p/", .delimiter = "/", .start_after = "p/b", .end_before = "p/m"});
  }
  if (operations & kListAll) (void)store.ListAll({.prefix = "p/", .page_size = 2});
  if (operations & kGet) (void)store.Read("k");
  if (operations & kRanged) {
    std::string buffer(16, '\0');
    (void)store.Get({.key = "k",
                     .range = ByteRange::Of(3, 16),
                     .buffer = absl::MakeSpan(buffer),
                     .if_match = "12"});
    (void)store.Get({.key = "k",
                     .range = ByteRange::Last(8),
                     .buffer = absl::MakeSpan(buffer),
                     .if_none_match = "12"});
  }
  if (operations & kHead) (void)store.Head("k");
  if (operations & kCopyCompose) {
    (void)store.Copy("src", "dst");
    (void)store.Compose({"a", "b", "c"}, "all");
  }
  if (operations & kPutWriter) {
    (void)store.Put("k", absl::Cord("data"));
    static const absl::Cord* const chunk = new absl::Cord(std::string(300 << 10, 'x'));
    auto writer = store.NewWriter("big");
    if (writer.ok() && (*writer)->Write(*chunk).ok() && (*writer)->Write(*chunk).ok()) {
      (void)(*writer)->Close();
    }
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
