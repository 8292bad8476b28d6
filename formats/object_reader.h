// ObjectReader: reads one object (or a byte range of it) sequentially, in chunks, with
// read-ahead, under a fixed bound on the bytes it holds. The byte source under every record
// format (tar.h, tfrecord.h, lines.h), so a shard of any size streams in bounded memory from
// any ObjectStore.
//
// The object is read as ranged GETs of `chunk_size` bytes. Up to `read_ahead` chunks beyond
// the one being consumed are requested at once through GetAsync, so while the consumer parses
// one chunk the next ones are already on the wire (one chunk per first-byte latency would cap
// a stream at chunk_size / latency, e.g. 8 MiB / 50 ms = 160 MiB/s). The bytes the reader
// holds (chunks in flight, fetched and not yet consumed) never exceed `max_buffered_bytes`,
// except that one chunk is always allowed so progress is possible.
//
// Every GET carries If-Match on the object's ETag (unless pin_version is off), so an object
// rewritten while it is read fails with FailedPrecondition instead of mixing two versions.
//
// Bytes handed out by ReadCord() share the chunk buffer (zero-copy) when they cover at least
// half of it and are copied otherwise, so bytes the caller keeps (e.g. samples in a shuffle
// buffer) pin at most about twice their own size. Shared bytes are the caller's: they are
// not counted in the reader's buffered bytes.
//
// Errors: store errors are returned as the store reports them (they name the object's URI);
// the format readers add the format and the byte offset. An error is sticky: every later call
// returns it.
//
// Thread-safety: not thread-safe; one thread at a time uses a reader. Completions arrive on the
// store's threads and touch only the shared chunk state, under a mutex. The reader keeps the
// store alive (shared_ptr); its destructor waits for the GETs still in flight (at most
// read_ahead + 1), whose buffers the completions own.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "store/object_store.h"

namespace wharf {

struct ObjectReaderOptions {
  // Bytes per ranged GET. 8 MiB keeps the per-request overhead (~50 ms to first byte on a
  // cloud store) small against the transfer time at ~1 GB/s.
  uint64_t chunk_size = uint64_t{8} << 20;
  // Chunks requested ahead of the one being consumed. With 2, one chunk is parsed while two
  // are in flight: enough to hide first-byte latency when a chunk takes longer to transfer
  // than to parse.
  int read_ahead = 2;
  // Most bytes held at once (in flight + fetched and unconsumed). 0: (read_ahead + 1) *
  // chunk_size. One chunk is always allowed, so a bound below chunk_size means no read-ahead.
  uint64_t max_buffered_bytes = 0;
  // The part of the object to read: [offset, offset + length), or to the end when length is
  // unset. Clipped to the object; an offset past the end is OutOfRange.
  uint64_t offset = 0;
  std::optional<uint64_t> length;
  // Guard every GET with If-Match on the object's ETag (from HEAD or the given meta).
  bool pin_version = true;

  uint64_t EffectiveMaxBufferedBytes() const;
};

struct ObjectReaderStats {
  uint64_t requests = 0;             // GETs issued
  uint64_t bytes_fetched = 0;        // bytes those GETs delivered
  uint64_t bytes_copied = 0;         // bytes ReadCord() copied rather than shared
  uint64_t peak_buffered_bytes = 0;  // most bytes held at once (<= the bound, or one chunk)
};

class ObjectReader {
 public:
  // Opens `key`, asking the store for its size and ETag (one HEAD). Starts the first GETs.
  // REQUIRES: store != nullptr, options.chunk_size > 0, options.read_ahead >= 0.
  static absl::StatusOr<std::unique_ptr<ObjectReader>> Open(std::shared_ptr<ObjectStore> store,
                                                            std::string key,
                                                            ObjectReaderOptions options = {});
  // Opens an object whose size (and ETag, if non-empty) are already known, e.g. from a
  // listing: no HEAD. `meta.size` must be the object's current size.
  static absl::StatusOr<std::unique_ptr<ObjectReader>> Open(std::shared_ptr<ObjectStore> store,
                                                            ObjectMeta meta,
                                                            ObjectReaderOptions options = {});
  ~ObjectReader();
  ObjectReader(const ObjectReader&) = delete;
  ObjectReader& operator=(const ObjectReader&) = delete;

  const ObjectMeta& meta() const { return meta_; }
  const std::string& key() const { return meta_.key; }
  // The object's URI, for error messages.
  const std::string& uri() const { return uri_; }
  // Object offset of the next unread byte.
  uint64_t position() const { return pos_; }
  // Object offset where reading stops (the end of the range).
  uint64_t end() const { return end_; }
  uint64_t remaining() const { return end_ - pos_; }

  // The unread bytes of the current chunk, waiting for the next chunk when the current one is
  // used up; empty at the end. Does not advance. The view is valid until the next call of a
  // non-const method.
  absl::StatusOr<absl::string_view> Peek();
  // Advances past `n` bytes of the last Peek(). REQUIRES: n <= that view's size.
  void Consume(size_t n);
  // Copies the next dst.size() bytes into dst. OutOfRange if fewer remain.
  absl::Status ReadExact(absl::Span<char> dst);
  // The next `n` bytes (see the sharing rule above). OutOfRange if fewer remain.
  absl::StatusOr<absl::Cord> ReadCord(uint64_t n);
  // Advances `n` bytes without returning them; chunks wholly skipped that were not requested
  // yet are never fetched. OutOfRange if fewer remain.
  absl::Status Skip(uint64_t n);

  ObjectReaderStats stats() const;

 private:
  struct Chunk;
  struct Shared;

  ObjectReader(std::shared_ptr<ObjectStore> store, ObjectMeta meta, std::string uri,
               ObjectReaderOptions options, uint64_t begin, uint64_t end);

  // Makes current_ the chunk holding pos_ (unless at the end), waiting for it.
  absl::Status Fill();
  // Starts GETs while the chunk count and byte bound allow.
  void Schedule();
  void Issue(std::shared_ptr<Chunk> chunk);
  void ReleaseCurrent();
  // With no chunk queued: whether the next one fits the bound (REQUIRES shared_->mu).
  bool RoomForNextChunkLocked() const;
  // Drops queued chunks that end at or before `offset`.
  void DropQueuedBefore(uint64_t offset);
  absl::Status NotEnough(uint64_t wanted) const;

  const std::shared_ptr<ObjectStore> store_;
  const ObjectMeta meta_;
  const std::string uri_;
  const ObjectReaderOptions options_;
  const uint64_t max_buffered_;
  const uint64_t end_;

  // Consumer-only state (the thread using the reader).
  uint64_t pos_;
  uint64_t next_fetch_;                       // first byte not yet requested
  std::shared_ptr<Chunk> current_;            // fetched chunk holding pos_, or null
  std::deque<std::shared_ptr<Chunk>> queue_;  // requested chunks after current_, in order
  uint64_t requests_ = 0;
  uint64_t bytes_copied_ = 0;
  absl::Status status_;

  // Shared with completions (which may outlive the reader by a few instructions).
  const std::shared_ptr<Shared> shared_;
};

}  // namespace wharf
