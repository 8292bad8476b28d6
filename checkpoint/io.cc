#include "checkpoint/io.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/cancel.h"
#include "base/fork.h"
#include "base/status.h"
#include "io/get_all.h"

namespace wharf::checkpoint {
namespace {

// Bytes of the caller's memory as a Cord, without a copy (the caller keeps the memory alive
// and unchanged until WriteFiles returns, which outlives every writer).
absl::Cord External(absl::Span<const char> bytes) {
  return absl::MakeCordFromExternal(absl::string_view(bytes.data(), bytes.size()), [] {});
}

absl::StatusOr<ObjectMeta> WriteOne(ObjectStore& store, const FileToWrite& file,
                                    uint64_t slice_bytes, const std::atomic<bool>& failed) {
  auto writer = store.NewWriter(file.key, file.put);
  if (!writer.ok()) return writer.status();
  uint64_t size = 0;
  for (absl::Span<const char> region : file.regions) {
    for (uint64_t off = 0; off < region.size(); off += slice_bytes) {
      if (failed.load(std::memory_order_relaxed)) {
        (*writer)->Abort();
        return absl::CancelledError(absl::StrCat("write ", store.Uri(file.key),
                                                 ": cancelled (another file of the save failed)"));
      }
      const uint64_t n = std::min<uint64_t>(slice_bytes, region.size() - off);
      if (absl::Status s = (*writer)->Write(External(region.subspan(off, n))); !s.ok()) {
        (*writer)->Abort();
        return s;
      }
      size += n;
    }
  }
  auto meta = (*writer)->Close();
  if (!meta.ok()) return meta.status();
  if (meta->size != size) {
    return absl::DataLossError(absl::StrCat("write ", store.Uri(file.key), ": the store reports ",
                                            meta->size, " bytes, ", size, " were written"));
  }
  return meta;
}

}  // namespace

absl::StatusOr<std::vector<WrittenFile>> WriteFiles(ObjectStore& store,
                                                    std::vector<FileToWrite> files,
                                                    const WriteFilesOptions& options) {
  std::vector<WrittenFile> out(files.size());
  if (files.empty()) return out;
  const uint64_t slice = std::max<uint64_t>(options.slice_bytes, uint64_t{1} << 20);
  int workers = options.max_files_in_flight > 0 ? options.max_files_in_flight : 8;
  workers = std::min<int>(workers, static_cast<int>(files.size()));

  // ObjectWriter::Write blocks (back-pressure), so each file in flight needs a thread; a
  // few threads of this call's own (not the runtime's blocking pool, whose threads the
  // local store's writers may themselves wait for).
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  absl::Status first_error;
  std::vector<bool> done(files.size(), false);
  auto work = [&] {
    while (true) {
      const size_t i = next.fetch_add(1);
      if (i >= files.size()) return;
      if (failed.load()) continue;  // leave the rest unstarted
      absl::StatusOr<ObjectMeta> meta = WriteOne(store, files[i], slice, failed);
      absl::MutexLock lock(&mu);
      if (meta.ok()) {
        out[i] = WrittenFile{files[i].key, meta->size, meta->etag};
        done[i] = true;
        continue;
      }
      failed = true;
      // The first real failure wins over the cancellations it caused.
      if (first_error.ok() ||
          (absl::IsCancelled(first_error) && !absl::IsCancelled(meta.status()))) {
        first_error = meta.status();
      }
    }
  };
  // The workers' requests belong to this call: they carry its ambient token (base/cancel.h),
  // so an interrupt of the caller stops them too.
  const CancelToken scope = AmbientCancel();
  int running = workers - 1;
  std::vector<std::thread> threads;
  for (int t = 1; t < workers; ++t) {
    threads.push_back(StartThread([&, scope] {
      {
        ScopedAmbientCancel ambient(scope);
        work();
      }
      absl::MutexLock lock(&mu);
      --running;
    }));
  }
  work();
  {
    // Waited for interruptibly, then joined (at once: they have returned).
    absl::MutexLock lock(&mu);
    AwaitInterruptibly(mu, absl::Condition(
                               +[](int* n) { return *n == 0; }, &running));
  }
  for (std::thread& t : threads) t.join();

  if (failed.load()) {
    // Nothing of a failed call stays: the files that completed are removed. A cleanup, so
    // not cancelled with the call (an interrupted one too).
    std::vector<std::string> written;
    for (size_t i = 0; i < files.size(); ++i) {
      if (done[i]) written.push_back(files[i].key);
    }
    ScopedAmbientCancel cleanup(nullptr);
    if (!written.empty()) (void)store.DeleteMany(std::move(written));
    return first_error;
  }
  return out;
}

}  // namespace wharf::checkpoint
