// Model loading for serving: the tensors of safetensors files (one file, several, or the
// Hugging Face sharded layout's `model.safetensors.index.json`) read straight into the
// caller's memory by parallel ranged GETs (docs/design/serve.md).
//
// Open() resolves the files (an index names its shards relative to itself), then reads each
// file's header with one ranged GET of its first `header_probe_bytes` (a second GET only
// for a header longer than that), which also yields the file's size and ETag. Read() then
// reads every tensor through io/read_ranges.h: sorted by file and offset, small neighbours
// coalesced into one GET, large tensors split into parallel GETs of the part size the
// store's measured latency and bandwidth suggest, each GET pinned to the header's ETag
// (If-Match) so a file replaced during a load fails instead of mixing versions. Bytes land in
// the destinations directly (no staging copy); tensors that lie inside the header probe are
// copied from it. Each tensor is reported as soon as its bytes are complete, so a caller can
// hand it on (to an accelerator) while the rest is in flight.
//
// Every URI is opened with the same store options (endpoint, credentials profile, the tier
// as `cache=`), so a model in a bucket is read through a tier like any other reader's data.
//
// Thread-safety: a SafetensorsModel is immutable after Open; Read may be called from any
// thread (one at a time per destination set) and blocks until every request has ended.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/cancel.h"
#include "base/runtime.h"
#include "io/read_ranges.h"
#include "serve/safetensors.h"
#include "store/object_store.h"
#include "store/spec.h"

namespace wharf::serve {

struct ModelLoadOptions {
  StoreOptions store;  // applied to every URI (over options in the URI itself)
  // Bytes of each file fetched to read its header (and the tensors inside them).
  uint64_t header_probe_bytes = uint64_t{256} << 10;
  // Ranged GETs in flight; 0: the runtime's inflight setting if set, else 64.
  int max_in_flight = 0;
  // Longest GET; 0: the store's link estimate (LinkEstimator::PartSize()).
  uint64_t max_request_bytes = 0;
  std::shared_ptr<Runtime> runtime;  // null: Runtime::Default()
};

struct ModelFile {
  std::string uri;
  std::shared_ptr<ObjectStore> store;
  std::string key;
  uint64_t size = 0;
  std::string etag;
  SafetensorsHeader header;
  std::string head;  // the file's first bytes, as the header probe read them
};

// Bytes [offset, offset + size) of files()[file], to land at dst.
struct ModelSpan {
  size_t file = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  char* dst = nullptr;  // REQUIRES: valid for `size` bytes until ReadSpans returns
};

struct ModelTensor {
  size_t file = 0;  // index into files()
  const SafetensorsTensor* tensor = nullptr;
};

class SafetensorsModel {
 public:
  SafetensorsModel(const SafetensorsModel&) = delete;
  SafetensorsModel& operator=(const SafetensorsModel&) = delete;

  // `uris`: safetensors files and/or index JSON files (a URI ending in ".json"), in any mix;
  // a file named twice is read once. Errors: an index that is not one (or names a shard
  // outside its folder), a missing file, a malformed header, a tensor name in two files;
  // each names the file (and the tensor).
  static absl::StatusOr<std::unique_ptr<SafetensorsModel>> Open(
      const std::vector<std::string>& uris, const ModelLoadOptions& options = {});

  const std::vector<ModelFile>& files() const { return files_; }
  // Every tensor, file by file in the order the files were named, by offset within a file
  // (the order safetensors.torch.load_file returns).
  const std::vector<ModelTensor>& tensors() const { return tensors_; }
  uint64_t total_bytes() const { return total_bytes_; }

  // Reads tensor i's bytes into dsts[i], calling on_tensor(i) (when set) as each is complete,
  // on a transport thread (it must be short and not block). REQUIRES: dsts.size() ==
  // tensors().size(), dsts[i] valid for tensors()[i].tensor->size bytes until Read returns.
  absl::StatusOr<ReadRangesStats> Read(absl::Span<char* const> dsts,
                                       std::function<void(size_t)> on_tensor = nullptr,
                                       CancelToken cancel = nullptr) const;

  // Reads arbitrary spans of the files (pieces of tensors, for a caller that stages a model
  // through a bounded buffer on its way to an accelerator), each GET pinned to the file's
  // ETag, neighbours coalesced and long spans split as Read does; on_span(i) as each is
  // complete (transport thread). Read is ReadSpans over one span per tensor. Errors name the
  // file. May run concurrently with other ReadSpans calls on disjoint destinations.
  absl::StatusOr<ReadRangesStats> ReadSpans(absl::Span<const ModelSpan> spans,
                                            std::function<void(size_t)> on_span = nullptr,
                                            CancelToken cancel = nullptr) const;

 private:
  explicit SafetensorsModel(ModelLoadOptions options) : options_(std::move(options)) {}

  ModelLoadOptions options_;
  std::vector<ModelFile> files_;
  std::vector<ModelTensor> tensors_;
  uint64_t total_bytes_ = 0;
};

}  // namespace wharf::serve
