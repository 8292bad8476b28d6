#include "io/object_reader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/profiler.h"
#include "base/status.h"
#include "io/get_all.h"

namespace wharf {

namespace {
// Derived read-ahead: never below what the fixed default was (2), never more than 16 chunks.
constexpr int kMinReadAhead = 2;
constexpr int kMaxReadAhead = 16;
// ReadDirect: parts in flight at least (they land in the caller's memory).
constexpr int kDirectReadParts = 16;
// Adaptive: a forward seek at most this far past the bytes requested is not a jump.
constexpr uint64_t kSequentialGap = 4096;
}  // namespace

ObjectReaderOptions ObjectReaderOptions::Resolved(const LinkEstimator& link) const {
  ObjectReaderOptions o = *this;
  if (o.chunk_size == 0) o.chunk_size = link.PartSize();
  if (o.read_ahead < 0) {
    // Bytes that arrive during one time to first byte: the chunks to keep on the wire so the
    // consumer never waits for a first byte.
    const double cover = link.bytes_per_second() * absl::ToDoubleSeconds(link.time_to_first_byte());
    const double parts = std::ceil(cover / static_cast<double>(o.chunk_size));
    o.read_ahead = static_cast<int>(std::clamp<double>(parts, kMinReadAhead, kMaxReadAhead));
  }
  return o;
}

// One ranged GET. offset/size/block are fixed when it is created; the rest is written by the
// completion and read by the consumer, both under Shared::mu.
struct ObjectReader::Chunk {
  uint64_t offset = 0;
  uint64_t size = 0;     // the bytes asked for, then (Open by key's first chunk) delivered
  uint64_t charged = 0;  // block.size(): what the reader's bound counts while it holds it
  Block block;           // charged to the runtime's budget until the last piece of it is dropped
  bool done = false;
  bool abandoned = false;  // skipped while in flight: the completion returns its bytes
  // The first chunk of an Open by key: it may end short, where the object ends, and its
  // answer's meta is kept (size and ETag: what a HEAD would have said).
  bool discover = false;
  ObjectMeta meta;
  absl::Status status;
};

// Never hold `mu` while a Block is released: the release runs the budget's listeners, and
// the reader's listener takes `mu`.
struct ObjectReader::Shared {
  absl::Mutex mu;
  int in_flight ABSL_GUARDED_BY(mu) = 0;
  uint64_t held ABSL_GUARDED_BY(mu) = 0;  // the reader's own chunks (not the caller's pieces)
  uint64_t peak ABSL_GUARDED_BY(mu) = 0;
  uint64_t bytes_fetched ABSL_GUARDED_BY(mu) = 0;
};

absl::StatusOr<std::unique_ptr<ObjectReader>> ObjectReader::Open(std::shared_ptr<ObjectStore> store,
                                                                 std::string key,
                                                                 ObjectReaderOptions options) {
  if (!options.length.has_value() || *options.length > 0) {
    ObjectMeta unknown;
    unknown.key = key;
    WHARF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> reader,
                           Create(store, std::move(unknown), options, std::nullopt));
    WHARF_ASSIGN_OR_RETURN(const bool found, reader->Discover());
    if (found) return reader;
  }
  // What the first GET could not describe: the HEAD gives what an Open with the object's meta
  // gives (an empty range, or OutOfRange naming the size).
  WHARF_ASSIGN_OR_RETURN(ObjectMeta meta, store->Head(key));
  meta.key = std::move(key);
  return Open(std::move(store), std::move(meta), options);
}

absl::StatusOr<std::unique_ptr<ObjectReader>> ObjectReader::Open(std::shared_ptr<ObjectStore> store,
                                                                 ObjectMeta meta,
                                                                 ObjectReaderOptions options) {
  const uint64_t size = meta.size;
  WHARF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> reader,
                         Create(std::move(store), std::move(meta), options, size));
  reader->Schedule();  // adaptive: nothing until the first read
  return reader;
}

absl::StatusOr<std::unique_ptr<ObjectReader>> ObjectReader::Create(
    std::shared_ptr<ObjectStore> store, ObjectMeta meta, ObjectReaderOptions options,
    std::optional<uint64_t> size) {
  std::string uri = store->Uri(meta.key);
  if (options.read_ahead < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("read ", uri, ": read_ahead must be >= 0 (or -1: derived)"));
  }
  if (!options.runtime) options.runtime = Runtime::Default();
  // A derived read-ahead is an estimate from one connection's measurements (the priors, in a
  // fresh process: 2 chunks): an adaptive reader whose consumer keeps reading sequentially
  // ramps past it, up to kMaxReadAhead chunks (within the memory budget). A read_ahead the
  // caller set is a bound.
  const bool derived = options.read_ahead < 0;
  options = options.Resolved(options.runtime->link(store->Uri("")));
  const int ramp_limit = derived && options.adaptive ? kMaxReadAhead : options.read_ahead;
  const uint64_t known = size.value_or(std::numeric_limits<uint64_t>::max());
  if (options.offset > known) {
    return absl::OutOfRangeError(absl::StrCat("read ", uri, ": range starts at byte ",
                                              options.offset, " of a ", known, "-byte object"));
  }
  const uint64_t begin = options.offset;
  const uint64_t end = options.length.has_value() && *options.length <= known - begin
                           ? begin + *options.length
                           : known;
  return std::unique_ptr<ObjectReader>(new ObjectReader(std::move(store), std::move(meta),
                                                        std::move(uri), std::move(options), begin,
                                                        end, ramp_limit));
}

absl::StatusOr<bool> ObjectReader::Discover() {
  // The first chunk is min_chunk bytes, not chunk_size: its answer comes back sooner (and
  // read-ahead starts from it at once), and an object much smaller than a chunk (a config, a
  // small shard) does not get a whole chunk's block. Open never waits for the budget (its
  // caller may hold what would free it): without room now, Open asks with a HEAD.
  Block block = TryAllocateChunk(std::min(MinChunk(), end_ - pos_));
  if (!block) return false;
  std::shared_ptr<Chunk> chunk = StartChunk(std::move(block));
  chunk->discover = true;
  queue_.clear();
  Issue(chunk);
  {
    ProfileSpan wait(ProfileStage::kIoWait);
    absl::MutexLock lock(&shared_->mu);
    AwaitInterruptibly(shared_->mu, absl::Condition(&chunk->done));
  }
  // The GET cannot describe an empty object or one shorter than the range's start
  // (OutOfRange), and a store that does not say which version it served (the GCS emulator
  // sends no generation on reads) gives no ETag to pin the later GETs to: the HEAD's answer
  // decides then (as it does for an answer whose size contradicts its own bytes).
  const bool described = chunk->status.ok() &&
                         (!options_.pin_version || !chunk->meta.etag.empty()) &&
                         chunk->meta.size >= chunk->offset + chunk->size;
  if (!described) {
    absl::Status status = chunk->status;
    Release(chunk);
    if (status.ok() || status.code() == absl::StatusCode::kOutOfRange) return false;
    return status;
  }
  std::string key = std::move(meta_.key);
  meta_ = std::move(chunk->meta);
  meta_.key = std::move(key);
  if (options_.length.has_value() && *options_.length <= meta_.size - pos_) {
    end_ = pos_ + *options_.length;
  } else {
    end_ = meta_.size;
  }
  next_fetch_ = chunk->offset + chunk->size;
  current_ = std::move(chunk);
  first_chunk_unread_ = true;
  // Adaptive: bytes are here and none read yet, as after a return to the chunk set aside:
  // reading on from them is sequential (the ramp starts), a seek away a jump.
  jumped_ = false;
  Schedule();
  return true;
}

ObjectReader::ObjectReader(std::shared_ptr<ObjectStore> store, ObjectMeta meta, std::string uri,
                           ObjectReaderOptions options, uint64_t begin, uint64_t end,
                           int ramp_limit)
    : store_(std::move(store)),
      meta_(std::move(meta)),
      uri_(std::move(uri)),
      options_(std::move(options)),
      ramp_limit_(std::max(ramp_limit, options_.read_ahead)),
      max_buffered_(options_.max_buffered_bytes > 0
                        ? options_.max_buffered_bytes
                        : (static_cast<uint64_t>(std::max(ramp_limit_, 0)) + 1) *
                              options_.chunk_size),
      end_(end),
      budget_(options_.runtime->shared_budget()),
      pos_(begin),
      next_fetch_(begin),
      window_(options_.chunk_size),
      ahead_(options_.read_ahead),
      account_(budget_->NewAccount(max_buffered_, "object reader " + uri_)),
      shared_(std::make_shared<Shared>()) {
  if (options_.adaptive) {
    jumps_ = 0;
    Restart();
  }
}

uint64_t ObjectReader::MinChunk() const {
  const uint64_t min_chunk = options_.min_chunk > 0
                                 ? options_.min_chunk
                                 : std::max<uint64_t>(uint64_t{64} << 10, options_.chunk_size / 16);
  return std::min(min_chunk, options_.chunk_size);
}

void ObjectReader::Restart() {
  window_ = MinChunk();
  ahead_ = 0;
  jumped_ = true;
}

void ObjectReader::SetAsideCurrent() {
  // At most two first chunks: what a header or footer read fetched, not a sequential
  // reader's large chunk (that would pin up to chunk_size for a return that rarely comes).
  if (options_.adaptive && current_ != nullptr && current_->size <= 2 * MinChunk()) {
    std::swap(set_aside_, current_);
  }
  ReleaseCurrent();
}

void ObjectReader::LeaveFor(uint64_t offset) {
  SetAsideCurrent();
  DropQueuedBefore(std::numeric_limits<uint64_t>::max());
  pos_ = next_fetch_ = offset;
}

bool ObjectReader::ReturnToSetAside(uint64_t offset) {
  if (set_aside_ == nullptr || offset < set_aside_->offset ||
      offset >= set_aside_->offset + set_aside_->size) {
    return false;
  }
  std::shared_ptr<Chunk> back = std::move(set_aside_);
  LeaveFor(offset);
  current_ = std::move(back);
  next_fetch_ = current_->offset + current_->size;
  ++jumps_;
  // Reading goes on in bytes the reader already had (a file's start, after its footer): the
  // ramp starts over, as sequential reading (jumped_ stays false: the next read is not one
  // of known size after a jump). Unless no byte of them was ever read: the first chunk of an
  // Open by key, fetched only because its GET tells the size, is no evidence of sequential
  // reading, and a Parquet reader's first column chunk, a few bytes after the file's magic,
  // is one read of known size after a jump (fetched exactly past the bytes here).
  window_ = MinChunk();
  ahead_ = 0;
  jumped_ = current_->discover && first_chunk_unread_;
  return true;
}

void ObjectReader::RampToCover(uint64_t bytes) {
  // This read and one more like it, so the next one is on the wire while this one is
  // consumed (a reader of large records reads one after another), in parallel chunks: one
  // connection carries a fraction of what several do (through the 25 ms proxy, an 8 MiB GET
  // alone took ~0.2 s, 16 of them at once ~0.23 s).
  constexpr uint64_t kParts = 8;
  const uint64_t cover = 2 * bytes;
  while (window_ < options_.chunk_size && window_ * kParts < cover) {
    window_ = std::min(window_ * 2, options_.chunk_size);
  }
  const uint64_t chunks = (cover + window_ - 1) / window_;
  ahead_ = std::max(ahead_, static_cast<int>(std::min<uint64_t>(ramp_limit_, chunks - 1)));
}

void ObjectReader::Ramp() {
  if (window_ < options_.chunk_size) {
    window_ = std::min(window_ * 2, options_.chunk_size);
  } else if (ahead_ < ramp_limit_) {
    ahead_ = std::min(std::max(1, ahead_ * 2), ramp_limit_);  // doubling, as the window did
  }
}

ObjectReader::~ObjectReader() {
  // The chunk buffers are kept alive by the completions; only the store must still be there
  // when they run, and the caller owns the store.
  {
    absl::MutexLock lock(&shared_->mu);
    AwaitInterruptibly(shared_->mu,
                       absl::Condition(
                           +[](Shared* s) { return s->in_flight == 0; }, shared_.get()));
  }
  // Return the charges now: a store may destroy a completion (which shares its chunk) a
  // little after running it.
  if (current_ != nullptr) current_->block = Block();
  if (set_aside_ != nullptr) set_aside_->block = Block();
  for (auto& chunk : queue_) chunk->block = Block();
}

uint64_t ObjectReader::KeptByCaller() const {
  uint64_t charged = account_->held();
  for (const auto& a : retired_) charged += a->held();
  uint64_t own;
  {
    absl::MutexLock lock(&shared_->mu);
    own = shared_->held;
  }
  return charged > own ? charged - own : 0;
}

Block ObjectReader::TryAllocateChunk(uint64_t len) {
  uint64_t own;
  {
    absl::MutexLock lock(&shared_->mu);
    own = shared_->held;
  }
  if (account_->held() > own) {
    // Pieces the caller keeps (ReadCord) are in the account: they are the caller's, not the
    // reader's, so they must not use up the reader's cap. Later chunks go to a fresh account;
    // the old one lives as long as those pieces. (A spurious switch, while an abandoned
    // chunk's release is on its way, costs only an account.)
    retired_.erase(std::remove_if(retired_.begin(), retired_.end(),
                                  [](const auto& a) { return a->held() == 0; }),
                   retired_.end());
    retired_.push_back(std::move(account_));
    account_ = budget_->NewAccount(max_buffered_, "object reader " + uri_);
  }
  return budget_->TryAllocate(account_, len);
}

absl::StatusOr<Block> ObjectReader::AllocateWaiting(uint64_t len) {
  // The chunk set aside never makes the reader wait: without room now, it goes first.
  if (set_aside_ != nullptr) {
    bool room;
    {
      absl::MutexLock lock(&shared_->mu);
      room = shared_->held + len <= max_buffered_;
    }
    if (room) {
      if (Block block = TryAllocateChunk(len)) return block;
    }
    Release(set_aside_);
  }
  // Chunks skipped while in flight still count against the reader's bound until they
  // complete (their completion releases them, which wakes the wait below).
  auto own_room = [&] {
    absl::MutexLock lock(&shared_->mu);
    return shared_->held == 0 || shared_->held + len <= max_buffered_;
  };
  Block block;
  absl::Status status;
  // Releases anywhere in the process, those of this reader's completions included, wake it.
  const bool waited = budget_->WaitUntil([&] {
    if (own_room() && (block = TryAllocateChunk(len))) return true;
    uint64_t own;
    {
      absl::MutexLock lock(&shared_->mu);
      own = shared_->held;
    }
    if (own == 0 && budget_->held() <= KeptByCaller()) {
      status = absl::ResourceExhaustedError(absl::StrCat(
          "read ", uri_, ": the memory budget (", FormatSize(budget_->limit()),
          ") is held by bytes this reader returned that are still kept; release them or "
          "raise the budget (--memory-budget, WHARF_MEMORY_BUDGET, wharf.configure)"));
      return true;
    }
    return false;
  });
  if (!waited) return absl::CancelledError(absl::StrCat("read ", uri_, ": cancelled"));
  if (!status.ok()) return status;
  return block;
}

std::shared_ptr<ObjectReader::Chunk> ObjectReader::StartChunk(Block block) {
  auto chunk = std::make_shared<Chunk>();
  chunk->offset = next_fetch_;
  chunk->size = chunk->charged = block.size();
  chunk->block = std::move(block);
  {
    absl::MutexLock lock(&shared_->mu);
    shared_->held += chunk->charged;
    shared_->peak = std::max(shared_->peak, shared_->held);
    ++shared_->in_flight;
  }
  next_fetch_ += chunk->size;
  queue_.push_back(chunk);
  return chunk;
}

void ObjectReader::Schedule() {
  if (hold_read_ahead_ || jumped_) return;
  std::vector<std::shared_ptr<Chunk>> start;
  const size_t max_chunks = static_cast<size_t>(ahead_) + 1;
  while (next_fetch_ < end_ && queue_.size() + (current_ != nullptr ? 1 : 0) < max_chunks) {
    const uint64_t len = std::min(window_, end_ - next_fetch_);
    {
      absl::MutexLock lock(&shared_->mu);
      if (shared_->held > 0 && shared_->held + len > max_buffered_) break;
    }
    // Read-ahead never waits: with the budget full, the chunks come later, one by one.
    Block block = TryAllocateChunk(len);
    if (!block) break;
    start.push_back(StartChunk(std::move(block)));
  }
  // Outside the lock: a store may complete a request inline.
  for (auto& chunk : start) Issue(std::move(chunk));
}

void ObjectReader::Issue(std::shared_ptr<Chunk> chunk) {
  ++requests_;
  GetRequest request;
  request.key = meta_.key;
  request.range = ByteRange::Of(chunk->offset, chunk->size);
  request.buffer = absl::Span<char>(chunk->block.data(), chunk->size);
  if (options_.pin_version) request.if_match = meta_.etag;
  store_->GetAsync(std::move(request), [shared = shared_, chunk,
                                        uri = uri_](absl::StatusOr<GetResult> result) {
    absl::Status status = result.status();
    const bool at_end =
        status.ok() && chunk->discover && result->offset + result->bytes == result->meta.size;
    if (status.ok() && result->bytes != chunk->size && !(at_end && result->bytes < chunk->size)) {
      status = absl::DataLossError(absl::StrCat(
          "get ", uri, " bytes [", chunk->offset, ", ", chunk->offset + chunk->size,
          "): short read of ", result->bytes,
          " bytes (the object is shorter than expected: truncated, or changed while reading)"));
    }
    Block drop;  // declared before the lock: released after it is dropped
    absl::MutexLock lock(&shared->mu);
    if (status.ok() && chunk->discover) {
      chunk->meta = std::move(result->meta);
      chunk->size = result->bytes;
    }
    chunk->status = std::move(status);
    chunk->done = true;
    --shared->in_flight;
    if (chunk->status.ok()) shared->bytes_fetched += chunk->size;
    if (chunk->abandoned) {
      shared->held -= chunk->charged;
      drop = std::move(chunk->block);
    }
  });
}

// Releasing a chunk moves its block out: the completion of its GET shares the Chunk and may
// be destroyed later than it ran, and the charge must return when the reader is done with
// the bytes (the reader's cap and the budget's peak count on it).
void ObjectReader::ReleaseCurrent() { Release(current_); }

void ObjectReader::Release(std::shared_ptr<Chunk>& chunk) {
  if (chunk == nullptr) return;
  Block drop = std::move(chunk->block);  // released after the lock
  const uint64_t charged = chunk->charged;
  chunk.reset();
  absl::MutexLock lock(&shared_->mu);
  shared_->held -= charged;
}

void ObjectReader::DropQueuedBefore(uint64_t offset) {
  std::vector<Block> drop;  // released after the lock
  absl::MutexLock lock(&shared_->mu);
  while (!queue_.empty() && queue_.front()->offset + queue_.front()->size <= offset) {
    Chunk& chunk = *queue_.front();
    if (chunk.done) {
      shared_->held -= chunk.charged;
      drop.push_back(std::move(chunk.block));
    } else {
      chunk.abandoned = true;
    }
    queue_.pop_front();
  }
}

absl::Status ObjectReader::Fill() {
  if (!status_.ok()) return status_;
  if (current_ != nullptr && pos_ < current_->offset + current_->size) return absl::OkStatus();
  ReleaseCurrent();
  if (pos_ >= end_) return absl::OkStatus();
  DropQueuedBefore(pos_);
  const bool after_jump = options_.adaptive && jumped_;
  if (options_.adaptive) {
    // Moving on into the next chunk without a jump is the evidence of sequential reading.
    if (!jumped_) Ramp();
    jumped_ = false;
  }
  if (queue_.empty()) {
    if (next_fetch_ < pos_) next_fetch_ = pos_;
    // A jump that lands within one window of the end is a footer's read: a zip's end record
    // and then its central directory and local headers before it (torch.load), Parquet's
    // metadata before its last 8 bytes. They are read backwards in small pieces, each of
    // which would be a jump and a round trip of its own: one window ending at the end
    // fetches them together, for at most a window of bytes never read.
    if (after_jump && end_ - next_fetch_ < window_) {
      next_fetch_ = std::max(options_.offset, end_ > window_ ? end_ - window_ : 0);
    }
    // The reader holds no chunk but abandoned ones in flight: wait until the next one fits
    // the budget (releases anywhere, those completions included, wake the wait).
    absl::StatusOr<Block> block = AllocateWaiting(std::min(window_, end_ - next_fetch_));
    if (!block.ok()) {
      status_ = block.status();
      return status_;
    }
    Issue(StartChunk(*std::move(block)));
  }
  Schedule();
  std::shared_ptr<Chunk> chunk = queue_.front();
  queue_.pop_front();
  {
    ProfileSpan wait(ProfileStage::kIoWait);
    absl::MutexLock lock(&shared_->mu);
    AwaitInterruptibly(shared_->mu, absl::Condition(&chunk->done));
  }
  current_ = std::move(chunk);
  if (!current_->status.ok()) {
    status_ = current_->status;
    ReleaseCurrent();
    return status_;
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::string_view> ObjectReader::Peek() {
  WHARF_RETURN_IF_ERROR(Fill());
  if (pos_ >= end_) return absl::string_view();
  const uint64_t skip = pos_ - current_->offset;
  return absl::string_view(current_->block.data() + skip, current_->size - skip);
}

void ObjectReader::Consume(size_t n) {
  pos_ += n;
  if (n > 0 && current_ != nullptr && current_->discover) first_chunk_unread_ = false;
}

absl::Status ObjectReader::NotEnough(uint64_t wanted) const {
  return absl::OutOfRangeError(absl::StrCat("read ", uri_, ": ", wanted, " bytes wanted at byte ",
                                            pos_, ", the range ends at byte ", end_));
}

absl::Status ObjectReader::ReadExact(absl::Span<char> dst) {
  if (dst.size() > remaining()) return NotEnough(dst.size());
  size_t done = 0;
  while (done < dst.size()) {
    WHARF_ASSIGN_OR_RETURN(absl::string_view view, Peek());
    const size_t n = std::min(view.size(), dst.size() - done);
    std::memcpy(dst.data() + done, view.data(), n);
    Consume(n);
    done += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Cord> ObjectReader::ReadCord(uint64_t n) {
  if (n > remaining()) return NotEnough(n);
  absl::Cord out;
  while (n > 0) {
    WHARF_ASSIGN_OR_RETURN(absl::string_view view, Peek());
    const size_t take = static_cast<size_t>(std::min<uint64_t>(view.size(), n));
    const absl::string_view piece = view.substr(0, take);
    if (take * 2 >= current_->size) {
      out.Append(absl::MakeCordFromExternal(piece, [block = current_->block.owner()] {}));
    } else {
      out.Append(piece);
      bytes_copied_ += take;
    }
    Consume(take);
    n -= take;
  }
  return out;
}

absl::Status ObjectReader::Skip(uint64_t n) {
  if (!status_.ok()) return status_;
  if (n > remaining()) return NotEnough(n);
  pos_ += n;
  if (current_ != nullptr && pos_ >= current_->offset + current_->size) ReleaseCurrent();
  DropQueuedBefore(pos_);
  if (current_ == nullptr && queue_.empty() && next_fetch_ < pos_) next_fetch_ = pos_;
  Schedule();
  return absl::OkStatus();
}

absl::Status ObjectReader::Seek(uint64_t offset) {
  if (!status_.ok()) return status_;
  if (offset < options_.offset || offset > end_) {
    return absl::OutOfRangeError(absl::StrCat("seek ", uri_, ": byte ", offset,
                                              " is outside the range [", options_.offset, ", ",
                                              end_, "]"));
  }
  if (offset >= pos_) {
    // Adaptive: a skip past everything requested is a jump (within it, reading goes on), unless
    // it is a small gap: a zip's local header and padding between the members torch.load
    // reads one after another, which is sequential reading.
    const uint64_t requested_end = std::max(next_fetch_, pos_);
    if (options_.adaptive && offset > requested_end + kSequentialGap) {
      if (ReturnToSetAside(offset)) return absl::OkStatus();
      LeaveFor(offset);
      ++jumps_;
      Restart();
      return absl::OkStatus();
    }
    return Skip(offset - pos_);
  }
  if (current_ != nullptr && offset >= current_->offset) {
    pos_ = offset;  // still inside the current chunk
    return absl::OkStatus();
  }
  // Behind everything held: none of it is of use now. Chunks in flight are abandoned (their
  // completions return the bytes); read-ahead starts over at the new position.
  if (ReturnToSetAside(offset)) return absl::OkStatus();  // only adaptive readers set aside
  LeaveFor(offset);
  if (options_.adaptive) {
    ++jumps_;
    Restart();
  }
  Schedule();
  return absl::OkStatus();
}

absl::Status ObjectReader::ReadDirect(absl::Span<char> dst) {
  if (!status_.ok()) return status_;
  if (dst.size() > remaining()) return NotEnough(dst.size());
  size_t done = 0;
  // Bytes already requested come through their chunks, with read-ahead held back meanwhile
  // (what it would request is read directly below).
  const uint64_t requested = next_fetch_;
  hold_read_ahead_ = true;
  while (done < dst.size() && pos_ < requested) {
    absl::StatusOr<absl::string_view> view = Peek();
    if (!view.ok()) {
      hold_read_ahead_ = false;
      return view.status();
    }
    const size_t n = std::min(view->size(), dst.size() - done);
    std::memcpy(dst.data() + done, view->data(), n);
    Consume(n);
    done += n;
  }
  hold_read_ahead_ = false;
  const uint64_t rest = dst.size() - done;
  bool exact = false;
  if (options_.adaptive) {
    // Right after a jump a read of known size is fetched exactly; otherwise it is one more
    // sign of sequential reading.
    exact = jumped_ && rest >= kExactReadBytes;
    if (!exact && rest < options_.chunk_size) {
      // A sequential read: the caller said it wants that many bytes, so the ramp goes at
      // once to parallel chunks covering it (RampToCover) instead of one doubling per chunk,
      // each a round trip (torch.load reads each record with one readinto).
      if (!jumped_) RampToCover(rest);
      return ReadExact(dst.subspan(done));  // Fill ramps
    }
    if (!jumped_) Ramp();
    jumped_ = false;
  } else if (rest < options_.chunk_size) {
    return ReadExact(dst.subspan(done));
  }
  // Nothing past pos_ is requested: the rest goes straight into dst.
  ReleaseCurrent();
  DropQueuedBefore(std::numeric_limits<uint64_t>::max());  // empty by now; never stale
  const uint64_t begin = pos_;
  std::vector<GetRequest> requests;
  for (uint64_t off = 0; off < rest; off += options_.chunk_size) {
    const uint64_t len = std::min(options_.chunk_size, rest - off);
    GetRequest request;
    request.key = meta_.key;
    request.range = ByteRange::Of(begin + off, len);
    request.buffer = dst.subspan(done + off, len);
    if (options_.pin_version) request.if_match = meta_.etag;
    requests.push_back(std::move(request));
  }
  GetAllOptions get_options;
  // The caller's memory: nothing is charged to the budget, so the parts in flight are
  // bounded only to keep the request count sane. read_ahead + 1 alone (sized for a consumer
  // that parses chunk by chunk) would leave a large read first-byte-bound on a far store.
  get_options.max_in_flight = std::max(options_.read_ahead + 1, kDirectReadParts);
  const GetAllResult got = GetAll(*store_, std::move(requests), get_options);
  requests_ += got.started;
  {
    absl::MutexLock lock(&shared_->mu);
    shared_->bytes_fetched += got.bytes;
  }
  bytes_direct_ += got.bytes;
  if (!got.error.ok()) {
    status_ = got.error;
    return status_;
  }
  // A read that went on reading sequentially keeps read-ahead going from its end: torch.load
  // reads a checkpoint's records in file order with small gaps between them (a skip within
  // the window, not a jump), and starting the window only at the next read cost it a round
  // trip per record (0.12 GB/s at 25 ms, 37 requests one after another). The exact read
  // right after a jump (a Parquet column chunk) starts none: the next read is as likely
  // elsewhere.
  pos_ = next_fetch_ = begin + rest;
  if (!exact) Schedule();
  return absl::OkStatus();
}

absl::string_view ObjectReader::Buffered() const {
  if (!status_.ok() || current_ == nullptr || pos_ >= current_->offset + current_->size) {
    return absl::string_view();
  }
  const uint64_t skip = pos_ - current_->offset;
  return absl::string_view(current_->block.data() + skip, current_->size - skip);
}

ObjectReaderStats ObjectReader::stats() const {
  ObjectReaderStats stats;
  stats.requests = requests_;
  stats.bytes_copied = bytes_copied_;
  stats.bytes_direct = bytes_direct_;
  stats.chunk_size = options_.chunk_size;
  stats.read_ahead = options_.read_ahead;
  stats.jumps = jumps_;
  absl::MutexLock lock(&shared_->mu);
  stats.bytes_fetched = shared_->bytes_fetched;
  stats.peak_buffered_bytes = shared_->peak;
  return stats;
}

}  // namespace wharf
