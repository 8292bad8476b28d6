#include "formats/object_reader.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"

namespace wharf {

uint64_t ObjectReaderOptions::EffectiveMaxBufferedBytes() const {
  if (max_buffered_bytes > 0) return max_buffered_bytes;
  return (static_cast<uint64_t>(std::max(read_ahead, 0)) + 1) * chunk_size;
}

// One ranged GET. offset/size/data are fixed when it is created; the rest is written by the
// completion and read by the consumer, both under Shared::mu.
struct ObjectReader::Chunk {
  uint64_t offset = 0;
  uint64_t size = 0;
  std::shared_ptr<char[]> data;
  bool done = false;
  bool abandoned = false;  // skipped while in flight: the completion returns its bytes
  absl::Status status;
};

struct ObjectReader::Shared {
  absl::Mutex mu;
  int in_flight ABSL_GUARDED_BY(mu) = 0;
  uint64_t held ABSL_GUARDED_BY(mu) = 0;
  uint64_t peak ABSL_GUARDED_BY(mu) = 0;
  uint64_t bytes_fetched ABSL_GUARDED_BY(mu) = 0;
};

absl::StatusOr<std::unique_ptr<ObjectReader>> ObjectReader::Open(
    std::shared_ptr<ObjectStore> store, std::string key, ObjectReaderOptions options) {
  WHARF_ASSIGN_OR_RETURN(ObjectMeta meta, store->Head(key));
  meta.key = std::move(key);
  return Open(std::move(store), std::move(meta), options);
}

absl::StatusOr<std::unique_ptr<ObjectReader>> ObjectReader::Open(
    std::shared_ptr<ObjectStore> store, ObjectMeta meta, ObjectReaderOptions options) {
  std::string uri = store->Uri(meta.key);
  if (options.chunk_size == 0 || options.read_ahead < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("read ", uri, ": chunk_size must be > 0 and read_ahead >= 0"));
  }
  const uint64_t size = meta.size;
  if (options.offset > size) {
    return absl::OutOfRangeError(absl::StrCat("read ", uri, ": range starts at byte ",
                                              options.offset, " of a ", size, "-byte object"));
  }
  const uint64_t begin = options.offset;
  const uint64_t end = options.length.has_value() ? std::min(size, begin + *options.length)
                                                  : size;
  auto reader = std::unique_ptr<ObjectReader>(new ObjectReader(
      std::move(store), std::move(meta), std::move(uri), options, begin, end));
  reader->Schedule();
  return reader;
}

ObjectReader::ObjectReader(std::shared_ptr<ObjectStore> store, ObjectMeta meta, std::string uri,
                           ObjectReaderOptions options, uint64_t begin, uint64_t end)
    : store_(std::move(store)),
      meta_(std::move(meta)),
      uri_(std::move(uri)),
      options_(options),
      max_buffered_(options.EffectiveMaxBufferedBytes()),
      end_(end),
      pos_(begin),
      next_fetch_(begin),
      shared_(std::make_shared<Shared>()) {}

ObjectReader::~ObjectReader() {
  // The chunk buffers are kept alive by the completions; only the store must still be there
  // when they run, and the caller owns the store.
  absl::MutexLock lock(&shared_->mu);
  shared_->mu.Await(
      absl::Condition(+[](Shared* s) { return s->in_flight == 0; }, shared_.get()));
}

void ObjectReader::Schedule() {
  std::vector<std::shared_ptr<Chunk>> start;
  {
    absl::MutexLock lock(&shared_->mu);
    const size_t max_chunks = static_cast<size_t>(options_.read_ahead) + 1;
    while (next_fetch_ < end_ && queue_.size() + (current_ != nullptr ? 1 : 0) < max_chunks) {
      const uint64_t len = std::min(options_.chunk_size, end_ - next_fetch_);
      if (shared_->held > 0 && shared_->held + len > max_buffered_) break;
      auto chunk = std::make_shared<Chunk>();
      chunk->offset = next_fetch_;
      chunk->size = len;
      chunk->data = std::shared_ptr<char[]>(new char[len]);
      shared_->held += len;
      shared_->peak = std::max(shared_->peak, shared_->held);
      ++shared_->in_flight;
      next_fetch_ += len;
      queue_.push_back(chunk);
      start.push_back(std::move(chunk));
    }
  }
  // Outside the lock: a store may complete a request inline.
  for (auto& chunk : start) Issue(std::move(chunk));
}

void ObjectReader::Issue(std::shared_ptr<Chunk> chunk) {
  ++requests_;
  GetRequest request;
  request.key = meta_.key;
  request.range = ByteRange::Of(chunk->offset, chunk->size);
  request.buffer = absl::Span<char>(chunk->data.get(), chunk->size);
  if (options_.pin_version) request.if_match = meta_.etag;
  store_->GetAsync(
      std::move(request),
      [shared = shared_, chunk, uri = uri_](absl::StatusOr<GetResult> result) {
        absl::Status status = result.status();
        if (status.ok() && result->bytes != chunk->size) {
          status = absl::DataLossError(absl::StrCat(
              "get ", uri, " bytes [", chunk->offset, ", ", chunk->offset + chunk->size,
              "): short read of ", result->bytes, " bytes (object changed while reading?)"));
        }
        absl::MutexLock lock(&shared->mu);
        chunk->status = std::move(status);
        chunk->done = true;
        --shared->in_flight;
        if (chunk->status.ok()) shared->bytes_fetched += chunk->size;
        if (chunk->abandoned) shared->held -= chunk->size;
      });
}

void ObjectReader::ReleaseCurrent() {
  if (current_ == nullptr) return;
  absl::MutexLock lock(&shared_->mu);
  shared_->held -= current_->size;
  current_.reset();
}

void ObjectReader::DropQueuedBefore(uint64_t offset) {
  absl::MutexLock lock(&shared_->mu);
  while (!queue_.empty() && queue_.front()->offset + queue_.front()->size <= offset) {
    Chunk& chunk = *queue_.front();
    if (chunk.done) {
      shared_->held -= chunk.size;
    } else {
      chunk.abandoned = true;
    }
    queue_.pop_front();
  }
}

bool ObjectReader::RoomForNextChunkLocked() const {
  const uint64_t len = std::min(options_.chunk_size, end_ - next_fetch_);
  return shared_->held == 0 || shared_->held + len <= max_buffered_;
}

absl::Status ObjectReader::Fill() {
  if (!status_.ok()) return status_;
  if (current_ != nullptr && pos_ < current_->offset + current_->size) return absl::OkStatus();
  ReleaseCurrent();
  if (pos_ >= end_) return absl::OkStatus();
  DropQueuedBefore(pos_);
  if (queue_.empty()) {
    if (next_fetch_ < pos_) next_fetch_ = pos_;
    // Chunks skipped while in flight still count until they complete; wait for room.
    absl::MutexLock lock(&shared_->mu);
    shared_->mu.Await(absl::Condition(this, &ObjectReader::RoomForNextChunkLocked));
  }
  Schedule();
  std::shared_ptr<Chunk> chunk = queue_.front();
  queue_.pop_front();
  {
    absl::MutexLock lock(&shared_->mu);
    shared_->mu.Await(absl::Condition(&chunk->done));
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
  return absl::string_view(current_->data.get() + skip, current_->size - skip);
}

void ObjectReader::Consume(size_t n) { pos_ += n; }

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
      out.Append(absl::MakeCordFromExternal(piece, [block = current_->data] {}));
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

ObjectReaderStats ObjectReader::stats() const {
  ObjectReaderStats stats;
  stats.requests = requests_;
  stats.bytes_copied = bytes_copied_;
  absl::MutexLock lock(&shared_->mu);
  stats.bytes_fetched = shared_->bytes_fetched;
  stats.peak_buffered_bytes = shared_->peak;
  return stats;
}

}  // namespace wharf
