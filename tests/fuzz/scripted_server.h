// Shared by the fuzz targets of network replies (fuzz_s3_xml.cc, fuzz_gcs_json.cc): a server
// whose replies come from the fuzzer's input, answering a CannedTransport.
//
// A script is a sequence of responses separated by "\n--\n". A response whose first byte is
// a status letter ('A' is the first entry of the target's status table, 'B' the next, ...)
// has that status; with `with_headers`, header lines "name: value" follow up to an empty
// line, then the body. A piece that does not start with a status letter is a 200 whose whole
// piece is the body. Requests take the responses in order; once they run out the server
// answers 404 with no body.
//
// Thread-safety: Load() and Next() may be called from any thread (the transport's).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "http/canned_transport.h"

namespace wharf::fuzz {

class ScriptedServer {
 public:
  ScriptedServer(absl::Span<const int> statuses, bool with_headers)
      : statuses_(statuses.begin(), statuses.end()), with_headers_(with_headers) {}

  // Replaces the script; the next request gets its first response.
  void Load(absl::string_view script) {
    absl::MutexLock lock(&mu_);
    responses_.clear();
    next_ = 0;
    if (script.empty()) return;
    for (absl::string_view piece : absl::StrSplit(script, "\n--\n")) {
      CannedResponse r;
      const unsigned letter = piece.empty() ? ~0u : static_cast<unsigned char>(piece[0]) - 'A';
      if (letter < statuses_.size()) {
        r.status = statuses_[letter];
        piece.remove_prefix(1);
        if (with_headers_) TakeHeaders(piece, r);
      }
      r.body = std::string(piece);
      responses_.push_back(std::move(r));
    }
  }

  // The next scripted response, or a 404 with no body once they ran out.
  CannedResponse Next() {
    absl::MutexLock lock(&mu_);
    if (next_ < responses_.size()) return responses_[next_++];
    CannedResponse r;
    r.status = 404;
    return r;
  }

 private:
  // Moves header lines up to an empty line (or the piece's end) from `piece` into `r`.
  static void TakeHeaders(absl::string_view& piece, CannedResponse& r) {
    while (true) {
      const size_t eol = piece.find('\n');
      if (eol == absl::string_view::npos) return;
      absl::string_view line = piece.substr(0, eol);
      piece.remove_prefix(eol + 1);
      if (line.empty()) return;
      const size_t colon = line.find(':');
      if (colon == absl::string_view::npos || colon == 0) continue;
      r.headers.emplace_back(std::string(absl::StripAsciiWhitespace(line.substr(0, colon))),
                             std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))));
    }
  }

  const std::vector<int> statuses_;
  const bool with_headers_;
  absl::Mutex mu_;
  std::vector<CannedResponse> responses_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace wharf::fuzz
