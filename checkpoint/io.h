// Checkpoint I/O: many tensors' bytes written straight from the caller's memory into objects,
// and read back by parallel ranged reads straight into the caller's memory (preallocated
// tensors). The byte movers under wharf.torch.checkpoint (the PyTorch Distributed Checkpoint
// backend) and the CheckpointManager (docs/design/checkpoint.md).
//
// Writes: each file is a list of memory regions (a rank's tensors, in order), written through
// the store's ObjectWriter: on S3 a multipart upload whose parts reference the regions (no
// staging copy: the writer keeps references to the Cords it is given, absl::Cord external
// memory), on a tier or a local directory a temporary file renamed into place. Files go up in
// parallel, each with its parts in parallel (the writer's upload_concurrency), so one save
// keeps files x parts requests in flight. A file appears whole or not at all (the writer's
// contract); when any file fails, the others are aborted and the files of this call that had
// completed are deleted, so a failed call leaves nothing it wrote.
//
// Reads: io/read_ranges.h ReadRanges (sorted, coalesced, split ranged GETs straight into the
// destinations, pinned with If-Match), shared with model loading (serve/).
//
// Memory: neither direction allocates buffers for the bytes it moves; the caller's memory is
// the buffer. What wharf holds is the requests' bookkeeping and the transport's own socket
// buffers, so the runtime's budget is not charged (as ObjectReader::ReadDirect); the bound on
// memory in flight is the caller's regions themselves, which must stay valid and unchanged
// until the call returns.
//
// Thread-safety: the functions may be called concurrently from any thread; each blocks its
// caller until every request it started has ended (never returning while a request could
// still touch the caller's memory).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/runtime.h"
#include "io/read_ranges.h"
#include "store/object_store.h"

namespace wharf::checkpoint {

// One object to write: the concatenation of `regions`, in order.
struct FileToWrite {
  std::string key;
  std::vector<absl::Span<const char>> regions;
  PutOptions put;  // provenance and upload options for the store's writer
};

struct WriteFilesOptions {
  // Files written at once (each with the store's own parallel parts). 0: min(files, 8).
  int max_files_in_flight = 0;
  // Bytes handed to a writer per Write() call: the regions are cut into slices of this size
  // (references, not copies), so a writer starts uploading before a huge region is done.
  uint64_t slice_bytes = uint64_t{8} << 20;
};

struct WrittenFile {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // as the store reports it after the write
};

// Writes every file; the results are in the order of `files`. On failure: the first error
// (naming the object), with every file of this call aborted or deleted.
absl::StatusOr<std::vector<WrittenFile>> WriteFiles(ObjectStore& store,
                                                    std::vector<FileToWrite> files,
                                                    const WriteFilesOptions& options = {});

}  // namespace wharf::checkpoint
