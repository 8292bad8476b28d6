// libFuzzer target: the replies the GCS JSON API backend parses (store/gcs/gcs_json_store.cc):
// object listings (items, prefixes, page tokens), object resources (head, put, compose,
// rewrite with its token loop), error bodies, media downloads with their headers
// (Content-Range, x-goog-generation, x-goog-hash), and a resumable upload's session replies
// (Location, 308 with Range, the final resource).
//
// The input is a scripted server: its first byte picks which operations run (one bit each, in
// the order below), the rest is a sequence of responses separated by "\n--\n". Each response
// is a status letter (see kStatuses), then header lines "name: value" up to an empty line,
// then the body; a piece that does not start with a status letter is a 200 whose whole piece
// is the body. Requests take the responses in order; once they run out the server answers 404
// with no body. Nothing is checked beyond the sanitizers and termination: a reply may be
// refused, never crash or hang the client.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "http/canned_transport.h"
#include "store/gcs/gcs_json_store.h"

namespace wharf::fuzz {
namespace {

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

class ScriptedServer {
 public:
  void Load(absl::string_view script) {
    absl::MutexLock lock(&mu_);
    responses_.clear();
    next_ = 0;
    if (script.empty()) return;
    for (absl::string_view piece : absl::StrSplit(script, "\n--\n")) {
      CannedResponse r;
      const unsigned letter = piece.empty() ? ~0u : static_cast<unsigned char>(piece[0]) - 'A';
      if (letter < std::size(kStatuses)) {
        r.status = kStatuses[letter];
        piece.remove_prefix(1);
        // Header lines up to an empty line.
        while (true) {
          const size_t eol = piece.find('\n');
          if (eol == absl::string_view::npos) break;
          absl::string_view line = piece.substr(0, eol);
          piece.remove_prefix(eol + 1);
          if (line.empty()) break;
          const size_t colon = line.find(':');
          if (colon == absl::string_view::npos || colon == 0) continue;
          r.headers.emplace_back(std::string(absl::StripAsciiWhitespace(line.substr(0, colon))),
                                 std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))));
        }
      }
      r.body = std::string(piece);
      responses_.push_back(std::move(r));
    }
  }

  absl::StatusOr<CannedResponse> Answer(const HttpRequest&) {
    absl::MutexLock lock(&mu_);
    if (next_ < responses_.size()) return responses_[next_++];
    CannedResponse r;
    r.status = 404;
    return r;
  }

 private:
  absl::Mutex mu_;
  std::vector<CannedResponse> responses_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
};

ScriptedServer& Server() {
  static auto* server = new ScriptedServer;
  return *server;
}

void Run(uint8_t operations) {
  auto transport = std::make_shared<CannedTransport>(
      [](const HttpRequest& request) { return Server().Answer(request); });
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
