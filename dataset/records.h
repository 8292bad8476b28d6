// Record streams: the records (tar samples, TFRecords, CSV / JSON-lines rows: any format of
// the registry, formats/registry.h) of one (rank, worker) share of an epoch's shards,
// resumable mid-epoch. Readers are opened through the registry only: nothing here knows a
// format.
//
// Order:
//  - the shard order of epoch e is EpochOrder(order, kShards, n, seed, e) (dataset/order.h:
//    computed per position under order 2), the identity without shuffle; the same on every
//    rank, so ranks agree without talking;
//  - position p of that order goes to rank p % world_size, and the rank's j-th shard to
//    worker j % num_workers (shards are partitioned across ranks, then workers);
//  - records are read shard after shard, the next shard opened (its first chunks requested)
//    while the current one is read, and optionally mixed by a bounded ShuffleBuffer seeded
//    from (seed, epoch, rank, worker).
// Counts per rank depend on the shards' sizes: give every rank the same number of records by
// making the shards equal and their number a multiple of world_size * num_workers.
//
// Resume: State() says where the share stands after the records yielded so far:
//  - how many of its shards were read to the end;
//  - in the shard being read, the byte offset of the last record taken from it;
//  - the (shard, offset) of each record held in the shuffle buffer, and the buffer's
//    generator state.
// Create() with that state continues exactly: it reopens the current shard at the saved
// offset (re-reading one record, which must still be there), re-reads the buffered records
// by offset (ranged GETs, a group of them in flight at a time; those of a compressed shard,
// which has no random access, in one pass over the shard from the first of them), and
// restores the generator.
// The rest of the share is then the same records in the same order as without the stop.
// The state is a small JSON object whatever the shard sizes: O(shuffle_buffer) entries.
// A state only continues the share it was taken from (same shards, seed, epoch, partition,
// order version).
//
// Thread-safety: a RecordStream is not thread-safe (one thread at a time); calls block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "dataset/index.h"
#include "dataset/order.h"
#include "formats/record_reader.h"
#include "io/object_reader.h"
#include "store/object_store.h"

namespace wharf {

struct RecordStreamOptions {
  // A format of the registry: "tar", "tfrecord", "csv", "jsonl", ...
  std::string format = "tar";
  uint64_t seed = 0;
  uint64_t epoch = 0;
  bool shuffle = true;
  // Records held to mix neighbouring shards' records; 0 keeps shard order.
  size_t shuffle_buffer = 0;
  int rank = 0;
  int world_size = 1;
  int worker = 0;
  int num_workers = 1;
  // The order version of the shard order (dataset/order.h); resuming a state needs the
  // state's.
  uint64_t order = kCurrentOrder;
  // How shards are read. chunk_size 0 and read_ahead -1 (the defaults) derive them from the
  // runtime's link estimate of the store (io/object_reader.h).
  ObjectReaderOptions io;
  // This stream's cap inside the runtime's one memory budget: the bytes its readers hold at
  // once (chunks in flight and fetched, not yet consumed; records the caller keeps are the
  // caller's, as for ObjectReader). Shared by the two readers open at a time (the current
  // shard's and the next one's, read ahead), or by a group of record reads while restoring;
  // chunks are made no larger than a reader's share (4 KiB at least), so read-ahead, not the
  // cap, gives way. 0: no cap of its own (each reader's bound is io.max_buffered_bytes).
  uint64_t memory_budget = 0;
  // Row formats (csv, jsonl); see RecordReaderOptions.
  bool header = false;
  char delimiter = ',';
  char quote = '"';
  bool skip_empty_rows = false;

  // InvalidArgument unless 0 <= rank < world_size, 0 <= worker < num_workers and the order
  // version is supported.
  absl::Status Validate() const;
};

// Records are formats/record_reader.h's Record, with `shard` their position in the shard
// list and `offset` the byte offset of the record in it.

// Where a share stands (see the file comment).
struct RecordStreamState {
  // Which share: checked against the stream's options and shard list on restore.
  std::string format = "tar";
  uint64_t num_shards = 0;
  std::string fingerprint;  // SampleIndex::Fingerprint() of the shard list
  uint64_t seed = 0;
  uint64_t epoch = 0;
  bool shuffle = true;
  uint64_t shuffle_buffer = 0;
  int rank = 0;
  int world_size = 1;
  int worker = 0;
  int num_workers = 1;
  uint64_t order = kCurrentOrder;  // the order version of the shard order
  // The position.
  uint64_t yielded = 0;      // records yielded so far
  uint64_t shards_done = 0;  // assigned shards read to the end
  // The last record taken from the next assigned shard; nullopt: none taken from it.
  std::optional<uint64_t> last_offset;
  std::vector<std::pair<uint64_t, uint64_t>> buffered;  // (shard, offset), in buffer order
  uint64_t rng = 0;                                     // the shuffle buffer's generator
  // The ETag each shard above (the current one, the buffered records' ones) had when it was
  // read: a shard rewritten since is refused on restore, even with the same layout.
  std::vector<std::pair<uint64_t, std::string>> etags;

  // A JSON object, e.g. {"version":2,"order":2,"format":"tar","num_shards":64,...,"yielded":1000,
  // "shards_done":3,"last_offset":81920,"buffered":[[17,0],[17,10240]],"rng":"123...",
  // "etags":[[17,"9b2c..."]]}.
  // (rng is a decimal string: JSON readers differ on integers above 2^53.) A version 1
  // object, written before order versions, has no "order" and means order 1.
  std::string ToJson() const;
  // InvalidArgument naming the field for malformed JSON, a missing or mistyped field, an
  // unknown version or an unsupported order version.
  static absl::StatusOr<RecordStreamState> FromJson(absl::string_view json);
};

class RecordStream {
 public:
  // The share `options` names of `shards` (keys of `store`, in canonical order), from the
  // start of the epoch, or from `resume` when given. InvalidArgument for a bad partition or
  // a format the registry does not know (listing those it knows);
  // FailedPrecondition when `resume` is for another share (naming what differs) or a shard
  // changed since (its record at the saved offset is gone). Restoring reads the buffered
  // records and the current shard's next chunks before returning.
  // REQUIRES: store != nullptr, shards != nullptr.
  static absl::StatusOr<std::unique_ptr<RecordStream>> Create(
      std::shared_ptr<ObjectStore> store, std::shared_ptr<const SampleIndex> shards,
      RecordStreamOptions options, const RecordStreamState* resume = nullptr);
  ~RecordStream();
  RecordStream(const RecordStream&) = delete;
  RecordStream& operator=(const RecordStream&) = delete;

  // The next record; nullopt at the end of the share.
  absl::StatusOr<std::optional<Record>> Next();
  // Up to n records (fewer only at the end). Without a shuffle buffer they come from the shard's
  // reader in batches (rows: slices of one buffer, zero-copy). When an error stops a batch after
  // some records were taken, those are returned and the error comes with the next call: nothing
  // taken is lost.
  absl::StatusOr<std::vector<Record>> NextBatch(size_t n);

  // Where the share stands after the records yielded so far.
  RecordStreamState State() const;

  // The shard positions this share reads, in order.
  const std::vector<size_t>& assigned() const { return assigned_; }
  const SampleIndex& shards() const { return *shards_; }
  // Row formats with header: the current (or last read) shard's header row.
  std::optional<std::string> header() const;
  uint64_t yielded() const { return yielded_; }

 private:
  RecordStream(std::shared_ptr<ObjectStore> store, std::shared_ptr<const SampleIndex> shards,
               RecordStreamOptions options, const EpochOrder& shard_order);

  absl::Status Restore(const RecordStreamState& state);
  // Opens the next assigned shard when none is open; false when all were read.
  absl::StatusOr<bool> EnsureCurrent();
  // Starts reading the assigned shard after the current one (read-ahead across the
  // boundary); an error opening it is reported when its turn comes.
  void OpenAhead();
  absl::StatusOr<std::unique_ptr<RecordReader>> OpenShard(size_t shard, uint64_t offset = 0,
                                                          bool single_record = false);
  // The next record in shard order (before the shuffle buffer).
  absl::StatusOr<std::optional<Record>> NextInOrder();
  // NextBatch's loop: appends up to n records to *out, stopping at the first error.
  absl::Status FillBatch(size_t n, std::vector<Record>* out);

  const std::shared_ptr<ObjectStore> store_;
  const std::shared_ptr<const SampleIndex> shards_;
  const RecordStreamOptions options_;
  const std::string fingerprint_;
  // Shard positions this share reads, in order: at most the shard list's size (which the
  // index holds anyway), computed from the epoch's order position by position.
  std::vector<size_t> assigned_;
  size_t next_ = 0;  // next position in assigned_ to open
  size_t current_shard_ = 0;
  std::optional<uint64_t> last_offset_;  // last record taken from current_
  std::unique_ptr<RecordReader> current_;
  std::unique_ptr<RecordReader> ahead_;
  std::optional<std::string> last_header_;
  std::map<size_t, std::string> etags_;  // shard -> ETag when this stream opened it
  ShuffleBuffer<Record> buffer_;
  uint64_t yielded_ = 0;
  absl::Status pending_;  // an error that stopped a partly returned batch
};

}  // namespace wharf
