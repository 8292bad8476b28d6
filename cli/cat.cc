// wharf cat: streams an object (or a byte range of it) to stdout.
#include <unistd.h>

#include <cerrno>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "cli/common.h"
#include "cli/store_flags.h"
#include "cli/verbs.h"
#include "store/registry.h"

namespace wharf::cli {
namespace {

// Writes each chunk straight to a file descriptor, unbuffered: memory stays at one chunk
// whatever the object's size, and the store's back-pressure reaches a slow reader.
class FdSink : public ReadSink {
 public:
  explicit FdSink(int fd) : fd_(fd) {}

  absl::Status Append(absl::string_view chunk) override {
    while (!chunk.empty()) {
      const ssize_t n = write(fd_, chunk.data(), chunk.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EPIPE) {
        reader_gone_ = true;
        return absl::CancelledError("stdout closed");
      }
      if (n < 0) return ErrnoToStatus(errno, "writing to stdout");
      chunk.remove_prefix(n);
    }
    return absl::OkStatus();
  }

  // The reader closed the pipe (`wharf cat x | head`): not a failure of the command.
  bool reader_gone() const { return reader_gone_; }

 private:
  const int fd_;
  bool reader_gone_ = false;
};

}  // namespace

void AddCat(CLI::App& app, CatArgs& args) {
  CLI::App* cat = app.add_subcommand("cat", "Write an object (or a byte range of it) to stdout");
  cat->add_option("--range", args.range,
                  "Bytes to read, as in HTTP: START-END (inclusive), START- (to the end), "
                  "-LENGTH (the last LENGTH bytes)")
      ->check([](const std::string& text) -> std::string {
        auto range = ParseRange(text);
        return range.ok() ? "" : std::string(range.status().message());
      });
  cat->add_option("--inflight,-j,--jobs", args.inflight,
                  "Requests in flight (the runtime's setting)")
      ->check(CLI::Range(1, 65536));
  AddEngineFlags(cat, args.engine, /*budget_mb_alias=*/true);
  cat->add_option("URI", args.uri, "The object: a URI or a local path")->required();
}

absl::Status RunCat(const CatArgs& args) {
  ByteRange range;
  if (!args.range.empty()) {
    WHARF_ASSIGN_OR_RETURN(range, ParseRange(args.range));
  }
  WHARF_RETURN_IF_ERROR(ApplyEngineArgs(args.engine, args.inflight));
  WHARF_ASSIGN_OR_RETURN(OpenedUri opened, OpenCliUri(args.uri));
  // Whatever else was printed must precede the bytes written with write(2).
  WHARF_RETURN_IF_ERROR(FlushStdout());
  // The size and version first (as `aws s3 cp s3://... -`): a reply's own Content-Length
  // cannot tell a complete body from a truncated one that a broken proxy re-framed, the HEAD
  // can. The GET is not pinned to it (a tier in front may answer the HEAD from an entry its
  // ttl still trusts): a reply of the same version must bring the HEAD's count of bytes.
  // A failed HEAD is left to the GET to report: its error body names the cause (NoSuchKey or
  // NoSuchBucket), where a HEAD's 404 has none.
  // But a HEAD that the network failed (retried until it gave up) is the answer: a GET would
  // wait as long again for the same end.
  const absl::StatusOr<ObjectMeta> head = opened.store->Head(opened.uri.key);
  if (!head.ok() && (absl::IsUnavailable(head.status()) || absl::IsCancelled(head.status()) ||
                     absl::IsDeadlineExceeded(head.status()))) {
    return head.status();
  }
  const std::string uri = opened.store->Uri(opened.uri.key);
  FdSink sink(STDOUT_FILENO);
  GetRequest request;
  request.key = opened.uri.key;
  request.range = range;
  request.sink = &sink;
  absl::StatusOr<GetResult> result = opened.store->Get(request);
  if (sink.reader_gone()) return absl::OkStatus();
  if (!result.ok()) return result.status();
  if (head.ok() && !head->etag.empty() && result->meta.etag == head->etag) {
    const ObjectMeta& meta = *head;
    absl::StatusOr<std::pair<uint64_t, uint64_t>> extent = range.Resolve(meta.size);
    const uint64_t want = extent.ok() ? extent->second - extent->first : 0;
    if (result->bytes != want) {
      return absl::DataLossError(absl::StrCat("cat ", uri, ": received ", result->bytes,
                                              " bytes of version ", meta.etag, ", of which ", want,
                                              " were wanted (a truncated reply)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace wharf::cli
