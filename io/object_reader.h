// ObjectReader: reads one object (or a byte range of it) sequentially, in chunks, with
// read-ahead, under a fixed bound on the bytes it holds. The byte source under every record
// format (tar.h, tfrecord.h, lines.h), so a shard of any size streams in bounded memory from
// any ObjectStore.
//
// The object is read as ranged GETs of `chunk_size` bytes. Up to `read_ahead` chunks beyond
// the one being consumed are requested at once through GetAsync, so while the consumer parses
// one chunk the next ones are already on the wire (one chunk per first-byte latency would cap
// a stream at chunk_size / latency, e.g. 8 MiB / 50 ms = 160 MiB/s). Left unset, both come
// from the store's link estimate in the runtime (base/link_estimate.h): the chunk is the
// estimate's part size, and read-ahead covers one time to first byte at the estimated
// bandwidth (never fewer than 2 chunks).
//
// Memory: every chunk buffer is a Block of the runtime's one MemoryBudget, charged to an
// account of this reader whose cap is `max_buffered_bytes` (docs/design/runtime.md). The
// bytes the reader holds (chunks in flight, fetched and not yet consumed) never exceed that
// cap, except that one chunk is always allowed so progress is possible; read-ahead also stops
// while the process's budget is full, and the reader waits for releases (anywhere in the
// process) when it has no chunk at all.
//
// Every GET carries If-Match on the object's ETag (unless pin_version is off), so an object
// rewritten while it is read fails with FailedPrecondition instead of mixing two versions.
//
// Bytes handed out by ReadCord() share the chunk buffer (zero-copy) when they cover at least
// half of it and are copied otherwise, so bytes the caller keeps (e.g. samples in a shuffle
// buffer) pin at most about twice their own size. Shared bytes stay charged to the budget
// until the caller drops them, but they are the caller's, not the reader's: they do not count
// against the reader's cap (a reader that holds no chunk of its own moves to a fresh account,
// leaving the old one to the caller's pieces). When the caller's pieces alone fill the whole
// budget the reader fails with ResourceExhausted instead of waiting for itself.
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
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/runtime.h"
#include "store/object_store.h"

namespace wharf {

struct ObjectReaderOptions {
  // Bytes per ranged GET. 0: the store's link estimate (LinkEstimator::PartSize(): bandwidth
  // x time to first byte in [8, 64] MiB; 8 MiB before any measurement), which keeps the
  // per-request overhead small against the transfer time.
  uint64_t chunk_size = 0;
  // Chunks requested ahead of the one being consumed. -1: enough chunks to cover one time to
  // first byte at the estimated bandwidth, at least 2 (one chunk parsed while two are in
  // flight hides first-byte latency when a chunk takes longer to transfer than to parse).
  int read_ahead = -1;
  // Most bytes held at once (in flight + fetched and unconsumed): the cap of the reader's
  // account in the runtime's budget. 0: (read_ahead + 1) * chunk_size. One chunk is always
  // allowed, so a bound below chunk_size means no read-ahead.
  uint64_t max_buffered_bytes = 0;
  // The part of the object to read: [offset, offset + length), or to the end when length is
  // unset. Clipped to the object; an offset past the end is OutOfRange.
  uint64_t offset = 0;
  std::optional<uint64_t> length;
  // Guard every GET with If-Match on the object's ETag (from HEAD or the given meta).
  bool pin_version = true;
  // Size the read-ahead from the access pattern instead of always keeping read_ahead chunks
  // of chunk_size on the wire (file objects, whose callers seek: Parquet, zip, torch.load).
  // Nothing is requested until the first read (opened by key, only the first min_chunk bytes,
  // whose GET tells the object's size). After opening and after every seek out of the
  // bytes held or requested (a jump), the next chunk is `min_chunk` bytes and nothing is read
  // ahead; each time the consumer moves on into the next chunk without a jump, the next
  // chunk is twice as large, up to chunk_size, and once chunks are chunk_size the read-ahead
  // grows by one chunk at a time up to read_ahead (the ramp of the Linux page cache's
  // on-demand read-ahead); a derived read_ahead (-1) is only where the ramp may pass
  // through: it goes on up to 16 chunks, as the memory budget allows. A ReadDirect of at least
  // kExactReadBytes right after a jump fetches exactly its bytes (the caller said how many it
  // wants), in chunk_size GETs in parallel; any other ReadDirect continues sequential reading, and
  // read-ahead goes on from its end (torch.load reads a checkpoint's records in order with small
  // gaps between them). A jump to within min_chunk of the end fetches the last min_chunk bytes
  // (a footer read backwards in pieces: a zip's end record, central directory and local
  // headers, Parquet's metadata, in one round trip), and the small chunk read before a jump
  // is kept until the next one, so returning to it costs nothing (a zip's first bytes, read
  // before and after its footer). A sequential reader pays about
  // log2(chunk_size / min_chunk) extra first bytes at the start; a random reader fetches what
  // it reads plus at most min_chunk per small read.
  bool adaptive = false;
  // The first chunk after a jump (adaptive), and the first chunk of an Open by key (any
  // reader). 0: chunk_size / 16, at least 64 KiB.
  uint64_t min_chunk = 0;
  // The runtime whose memory budget and link estimates are used; null: Runtime::Default().
  std::shared_ptr<Runtime> runtime;

  // chunk_size and read_ahead with the unset ones derived from `link`.
  ObjectReaderOptions Resolved(const LinkEstimator& link) const;
};

struct ObjectReaderStats {
  uint64_t jumps = 0;                // seeks out of the bytes held or requested (adaptive)
  uint64_t requests = 0;             // GETs issued
  uint64_t bytes_fetched = 0;        // bytes those GETs delivered
  uint64_t bytes_copied = 0;         // bytes ReadCord() copied rather than shared
  uint64_t bytes_direct = 0;         // bytes ReadDirect() fetched straight into its caller's
  uint64_t peak_buffered_bytes = 0;  // most bytes held at once (<= the bound, or one chunk)
  uint64_t chunk_size = 0;           // as used (derived when the options left it unset)
  int read_ahead = 0;                // as used
};

class ObjectReader {
 public:
  // Adaptive readers: a ReadDirect right after a jump at least this long is fetched exactly.
  static constexpr uint64_t kExactReadBytes = uint64_t{64} << 10;

  // Opens `key` in one round trip: the GET of the first chunk (min_chunk bytes, adaptive or
  // not) also answers the object's size and ETag, so no HEAD goes first, and Open returns once
  // that chunk is here (read-ahead, if any, started). An object that GET cannot describe
  // (empty, shorter than options.offset, or served without an ETag to pin the later GETs to)
  // is asked about with a HEAD instead, as it is when the memory budget has no room for the
  // chunk (Open never waits for the budget).
  // REQUIRES: store != nullptr, options.read_ahead >= -1.
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
  // Moves the position to `offset`, in [the range's start, end()]: the random access of a file
  // object (wharf.open in Python). Forward, as Skip(). Backward within the
  // current chunk, the chunk is reused; further back, every chunk held or in flight is dropped
  // and read-ahead restarts at `offset` (no byte before it is fetched). Never waits.
  // OutOfRange outside the range; a sticky error is returned as by every call.
  absl::Status Seek(uint64_t offset);
  // Reads the next dst.size() bytes into dst, as ReadExact(), but a large read skips the
  // chunk buffers: bytes already requested (held or in flight) are copied from their chunks,
  // and the rest, when at least one chunk long, is fetched by ranged GETs of chunk_size bytes
  // straight into dst, up to max(read_ahead + 1, 16) of them in flight (pinned to the ETag like
  // every GET). That costs no copy and no charge to the budget (the memory is the caller's);
  // read-ahead restarts with the next read. OutOfRange if fewer remain. REQUIRES: dst stays
  // valid until it returns (it waits for every GET it started).
  absl::Status ReadDirect(absl::Span<char> dst);
  // The unread bytes of the current chunk that are already here, without waiting or
  // requesting anything (empty when the next byte is not fetched yet). Valid as Peek()'s view.
  absl::string_view Buffered() const;

  ObjectReaderStats stats() const;
  // The reader's account in the runtime's budget (its cap is the reader's byte bound).
  const MemoryBudget::Account& account() const { return *account_; }

 private:
  struct Chunk;
  struct Shared;

  ObjectReader(std::shared_ptr<ObjectStore> store, ObjectMeta meta, std::string uri,
               ObjectReaderOptions options, uint64_t begin, uint64_t end, int ramp_limit);
  // Validates and resolves the options. `size`: the object's, or unknown (Open by key: the
  // range is taken to end where options.length ends, or nowhere, until Discover()).
  static absl::StatusOr<std::unique_ptr<ObjectReader>> Create(std::shared_ptr<ObjectStore> store,
                                                              ObjectMeta meta,
                                                              ObjectReaderOptions options,
                                                              std::optional<uint64_t> size);
  // Open by key: fetches the first chunk, learning the object's meta from its answer, and
  // makes it the current chunk. False when that answer cannot describe the object (empty,
  // shorter than the range's start, no ETag to pin to) or the budget has no room for the
  // chunk now: Open asks with a HEAD. Other errors are the GET's.
  absl::StatusOr<bool> Discover();
  // The bytes held by pieces this reader handed out that the caller still keeps.
  uint64_t KeptByCaller() const;

  // Makes current_ the chunk holding pos_ (unless at the end), waiting for it.
  absl::Status Fill();
  // Starts GETs while the chunk count, the byte bound and the budget allow.
  void Schedule();
  // Adaptive: the consumer moved on sequentially; doubles the window, then the read-ahead.
  void Ramp();
  // Adaptive: a jump; the window starts over at min_chunk with no read-ahead.
  void Restart();
  // A block for the next chunk (`len` bytes) from the budget, or an empty one when the
  // reader's cap or the budget has no room now. Never blocks.
  Block TryAllocateChunk(uint64_t len);
  // Waits until a block for the next chunk can be allocated; called with no chunk queued.
  // ResourceExhausted when the pieces the caller keeps hold the whole budget.
  absl::StatusOr<Block> AllocateWaiting(uint64_t len);
  void Issue(std::shared_ptr<Chunk> chunk);
  // Queues the chunk at next_fetch_ held in `block` and counts it; the caller issues it.
  std::shared_ptr<Chunk> StartChunk(Block block);
  void ReleaseCurrent();
  void Release(std::shared_ptr<Chunk>& chunk);
  // Adaptive, at a jump: current_ is set aside when it is small (a file's header or footer,
  // which readers of zip and Parquet files come back to), releasing the one set aside
  // before; otherwise released.
  void SetAsideCurrent();
  // Leaves everything held for `offset` (current_ set aside or released, the queue
  // abandoned); reading goes on from there.
  void LeaveFor(uint64_t offset);
  // Adaptive: a jump to `offset` inside the chunk set aside brings it back (no request).
  bool ReturnToSetAside(uint64_t offset);
  // Adaptive: ramps the window and read-ahead to cover twice `bytes` in about 8 parallel
  // chunks (as far as the limits allow).
  void RampToCover(uint64_t bytes);
  // The first chunk after a jump (adaptive).
  uint64_t MinChunk() const;
  // Drops queued chunks that end at or before `offset`.
  void DropQueuedBefore(uint64_t offset);
  absl::Status NotEnough(uint64_t wanted) const;

  const std::shared_ptr<ObjectStore> store_;
  ObjectMeta meta_;  // set once: by Open, or by Discover() before Open returns
  const std::string uri_;
  const ObjectReaderOptions options_;  // resolved: chunk_size > 0, read_ahead >= 0
  const int ramp_limit_;               // the read-ahead the adaptive ramp may reach (see Open)
  const uint64_t max_buffered_;
  uint64_t end_;  // set once, as meta_
  const std::shared_ptr<MemoryBudget> budget_;

  // Consumer-only state (the thread using the reader).
  uint64_t pos_;
  uint64_t next_fetch_;                       // first byte not yet requested
  std::shared_ptr<Chunk> current_;            // fetched chunk holding pos_, or null
  std::shared_ptr<Chunk> set_aside_;          // adaptive: see SetAsideCurrent, or null
  std::deque<std::shared_ptr<Chunk>> queue_;  // requested chunks after current_, in order
  uint64_t requests_ = 0;
  uint64_t bytes_copied_ = 0;
  uint64_t bytes_direct_ = 0;
  bool hold_read_ahead_ = false;  // ReadDirect: Schedule() requests nothing
  // The chunk size and read-ahead in use: the options' own unless adaptive (see there).
  uint64_t window_;
  int ahead_;
  // Adaptive: opened or jumped, and nothing read since; Schedule() requests nothing.
  bool jumped_ = false;
  uint64_t jumps_ = 0;
  // Opened by key, and no byte of the first chunk (Discover) consumed yet: a return to it
  // after a jump is a jump too (see ReturnToSetAside).
  bool first_chunk_unread_ = false;
  absl::Status status_;
  // The account chunks are charged to; replaced by a fresh one when only pieces the caller
  // keeps are left in it (see the class comment). Earlier ones live as long as those pieces.
  std::shared_ptr<MemoryBudget::Account> account_;
  std::vector<std::shared_ptr<MemoryBudget::Account>> retired_;

  // Shared with completions (which may outlive the reader by a few instructions).
  const std::shared_ptr<Shared> shared_;
};

}  // namespace wharf
