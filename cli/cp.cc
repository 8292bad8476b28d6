// wharf cp: copies one object, or every object below a prefix, between any two stores
// (local paths included). Within one store it asks for server-side copies. Across stores a
// recursive copy runs on the I/O engine: a work-stealing parallel listing feeds the fetch
// scheduler (many requests in flight under a memory budget), and fetched objects are put
// asynchronously; objects above 16 MiB are copied as ordered 8 MiB chunks into a writer
// (parallel multipart on S3), so no store thread ever waits on another store. A rerun
// skips objects the destination already holds with the same size and ETag.
#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>
#include <string>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/context.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "cli/common.h"
#include "cli/verbs.h"
#include "io/fetch_scheduler.h"
#include "io/parallel_list.h"
#include "io/prefix_fetch.h"
#include "store/registry.h"

namespace wharf::cli {
namespace {

// Objects larger than this are copied as ordered ranged chunks into a writer (multipart on
// S3) instead of being fetched whole and put in one request.
constexpr uint64_t kChunked = uint64_t{16} << 20;
constexpr uint64_t kChunk = uint64_t{8} << 20;

// Copies one object across stores through the engine: ordered kChunk ranges (each pinned to
// the listed ETag, 8 in flight) written from this thread into the destination's writer, so
// memory stays near 16 chunks and no store thread ever blocks on another store.
absl::Status CopyAcrossStores(const std::shared_ptr<ObjectStore>& src, ObjectStore& dst,
                              const ObjectMeta& meta, const std::string& dst_key,
                              Progress& progress) {
  WHARF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer, dst.NewWriter(dst_key));
  FetchScheduler scheduler(src, {.max_in_flight = 8, .memory_budget = 8 * kChunk,
                                 .coalesce_gap = 0, .ordered = true});
  std::vector<FetchItem> chunks;
  for (uint64_t off = 0; off < meta.size; off += kChunk) {
    chunks.push_back({.key = meta.key, .range = ByteRange::Of(off, std::min(kChunk, meta.size - off)),
                      .size = meta.size, .etag = meta.etag});
  }
  auto batch = scheduler.Fetch(std::move(chunks));
  while (auto r = batch->Next()) {
    if (!r->data.ok()) {
      writer->Abort();
      return r->data.status();
    }
    const uint64_t n = r->data->size();
    FetchBuffer data = *std::move(r->data);
    absl::Status s = writer->Write(absl::MakeCordFromExternal(data.view(), [data] {}));
    if (!s.ok()) {
      writer->Abort();
      return s;
    }
    progress.AddBytes(n);
  }
  WHARF_RETURN_IF_ERROR(writer->Close().status());
  return absl::OkStatus();
}

// Copies one object. Either way the destination appears atomically, complete or not at all:
// a server-side copy is one request, and a writer publishes its bytes only at Close().
absl::Status CopyObject(const std::shared_ptr<ObjectStore>& src, ObjectStore& dst, bool same_store,
                        const ObjectMeta& meta, const std::string& dst_key, Progress& progress) {
  if (same_store) {
    WHARF_ASSIGN_OR_RETURN(ObjectMeta copied, src->Copy(meta.key, dst_key));
    progress.AddBytes(copied.size);
  } else {
    WHARF_RETURN_IF_ERROR(CopyAcrossStores(src, dst, meta, dst_key, progress));
  }
  progress.ObjectDone();
  return absl::OkStatus();
}

// Runs copies on `jobs` worker threads. The blocking store calls run on the workers (inline
// for the local store, waiting on the event loop for network stores), so `jobs` bounds the
// transfers in flight; Add() blocks once 2 * jobs are queued or running, which keeps the
// listing only a little ahead of the copies.
class Copier {
 public:
  Copier(std::shared_ptr<ObjectStore> src, ObjectStore& dst, bool same_store, int jobs,
         Progress& progress)
      : src_(src), dst_(dst), same_store_(same_store), max_in_flight_(2 * jobs),
        progress_(progress), pool_(jobs) {}

  ~Copier() { Wait(); }

  void Add(ObjectMeta meta, std::string dst_key) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Copier::HasRoomLocked));
      ++in_flight_;
    }
    progress_.AddToTotal(1, meta.size);
    pool_.Schedule([this, meta = std::move(meta), dst_key = std::move(dst_key)] {
      absl::Status status = CopyObject(src_, dst_, same_store_, meta, dst_key, progress_);
      if (!status.ok()) Fail(status);
      absl::MutexLock lock(&mu_);
      --in_flight_;
    });
  }

  // Reports one object that failed (or was refused) and carries on with the rest.
  void Fail(const absl::Status& status) {
    progress_.PrintLine(absl::StrCat("wharf: ", OneLine(status.message())));
    absl::MutexLock lock(&mu_);
    if (failed_++ == 0) first_error_ = status;
  }

  void Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Copier::IdleLocked));
  }

  // Counts a failure already reported elsewhere.
  void CountFailure(absl::StatusCode code) {
    absl::MutexLock lock(&mu_);
    if (failed_++ == 0) first_error_ = absl::Status(code, "");
  }

  uint64_t failed() {
    absl::MutexLock lock(&mu_);
    return failed_;
  }
  absl::StatusCode first_error_code() {
    absl::MutexLock lock(&mu_);
    return first_error_.code();
  }

 private:
  bool HasRoomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_ < max_in_flight_;
  }
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; }

  const std::shared_ptr<ObjectStore> src_;
  ObjectStore& dst_;
  const bool same_store_;
  const int max_in_flight_;
  Progress& progress_;

  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);

  // Declared last, so destroyed first: its destructor joins the workers before the members
  // they use go away.
  ThreadPool pool_;
};

// True when `uri` is a file:// URI naming an existing directory. A local destination that
// is a directory receives the source under its own name, as with cp(1).
bool IsLocalDirectory(const ObjectUri& uri) {
  if (uri.scheme != "file") return false;
  struct stat st;
  const std::string path = absl::StrCat(uri.bucket == "/" ? "" : uri.bucket, "/", uri.key);
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void PrintSummary(const Progress& progress) {
  const absl::Duration elapsed = progress.elapsed();
  const uint64_t n = progress.objects_done();
  Print(absl::StrFormat("copied %d %s (%s MB) in %.2f s (%s MB/s)\n", n,
                        n == 1 ? "object" : "objects", Megabytes(progress.bytes()),
                        absl::ToDoubleSeconds(elapsed),
                        MegabytesPerSecond(progress.bytes(), elapsed)));
}

struct Endpoints {
  std::shared_ptr<ObjectStore> src;
  ObjectUri src_uri;
  std::shared_ptr<ObjectStore> dst;
  ObjectUri dst_uri;
  // Both sides are in one store (one bucket), so a server-side copy can be asked for.
  bool same_store = false;
};

absl::Status CopySingle(const Endpoints& ends, const ObjectMeta& meta, bool quiet) {
  std::string dst_key = ends.dst_uri.key;
  if (dst_key.empty() || dst_key.back() == '/' || IsLocalDirectory(ends.dst_uri)) {
    dst_key = JoinKey(dst_key, Basename(meta.key));
  }
  if (ends.same_store && dst_key == meta.key) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cp ", ends.src->Uri(meta.key), ": source and destination are the same object"));
  }
  Progress progress(Progress::ShouldShow(quiet));
  progress.AddToTotal(1, meta.size);
  progress.TotalIsFinal();
  absl::Status status =
      CopyObject(ends.src, *ends.dst, ends.same_store, meta, dst_key, progress);
  progress.Stop();
  WHARF_RETURN_IF_ERROR(status);
  if (!quiet) PrintSummary(progress);
  return absl::OkStatus();
}

// Bytes the engine may hold: fetched objects, plus those waiting for their put.
constexpr uint64_t kCopyBudget = uint64_t{1} << 30;

// Puts fetched objects into the destination asynchronously, holding at most half the
// engine's budget in pending puts so the engine always has room to fetch.
class PutQueue {
 public:
  PutQueue(ObjectStore& dst, Progress& progress, Copier& failures)
      : dst_(dst), progress_(progress), failures_(failures) {}
  ~PutQueue() { Wait(); }

  void Put(std::string dst_key, FetchBuffer data) {
    const uint64_t size = data.size();
    {
      absl::MutexLock lock(&mu_);
      auto room = [this, size]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return pending_ == 0 || pending_bytes_ + size <= kCopyBudget / 2;
      };
      mu_.Await(absl::Condition(&room));
      ++pending_;
      pending_bytes_ += size;
    }
    // Zero-copy: the Cord keeps the fetched block (and its budget charge) until written.
    absl::Cord cord = absl::MakeCordFromExternal(data.view(), [data] {});
    dst_.PutAsync(std::move(dst_key), std::move(cord),
                  [this, size](absl::StatusOr<ObjectMeta> meta) {
                    if (meta.ok()) {
                      progress_.AddBytes(size);
                      progress_.ObjectDone();
                    } else {
                      failures_.Fail(meta.status());
                    }
                    absl::MutexLock lock(&mu_);
                    --pending_;
                    pending_bytes_ -= size;
                  });
  }

  void Wait() {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
    mu_.Await(absl::Condition(&idle));
  }

 private:
  ObjectStore& dst_;
  Progress& progress_;
  Copier& failures_;
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// What the destination already holds below its prefix: relative key -> (size, etag), so a
// rerun skips objects already copied.
absl::StatusOr<absl::flat_hash_map<std::string, std::pair<uint64_t, std::string>>> ExistingObjects(
    ObjectStore& dst, const std::string& dst_prefix, int workers) {
  absl::flat_hash_map<std::string, std::pair<uint64_t, std::string>> out;
  ListOptions range;
  range.prefix = dst_prefix;
  absl::Status s = ParallelList(dst, range, {.workers = workers}, [&](std::vector<ObjectMeta> page) {
    for (ObjectMeta& m : page) {
      out[m.key.substr(dst_prefix.size())] = {m.size, std::move(m.etag)};
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return out;
}

absl::Status CopyPrefix(const Endpoints& ends, const std::string& src_prefix, const CpArgs& args) {
  const std::string dst_prefix = AsPrefix(ends.dst_uri.key);
  const std::string what =
      absl::StrCat("cp ", ends.src->Uri(src_prefix), " to ", ends.dst->Uri(dst_prefix));
  // Listing a prefix while writing into it could copy the copies, without end.
  if (ends.same_store && absl::StartsWith(dst_prefix, src_prefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the destination is inside the source"));
  }
  const bool dst_keeps_markers = ends.dst->capabilities().trailing_slash_keys;

  Progress progress(Progress::ShouldShow(args.quiet));
  // Threads for server-side copies and streamed big objects; the engine needs none.
  Copier copier(ends.src, *ends.dst, ends.same_store, std::min(args.jobs, 32), progress);
  uint64_t listed = 0, skipped = 0;
  absl::Status listing;
  // The destination key for a listed source key, or nullopt (with the failure reported)
  // for keys that must not be copied.
  auto destination = [&](const std::string& key) -> std::optional<std::string> {
    absl::string_view rel = key;
    const bool inside = absl::ConsumePrefix(&rel, src_prefix);
    // A directory marker ("dir/", an empty object some tools create for folders) carries
    // no data: copy it where the destination can hold such keys, skip it otherwise. The
    // source prefix's own marker (rel == "") has no place below the destination at all.
    const bool marker = absl::EndsWith(rel, "/");
    if (inside && (rel.empty() || (marker && !dst_keeps_markers))) return std::nullopt;
    absl::string_view checked = marker ? rel.substr(0, rel.size() - 1) : rel;
    if (!inside || !IsSafeRelativeKey(checked)) {
      copier.Fail(absl::InvalidArgumentError(absl::StrCat(
          "cp ", ends.src->Uri(key), ": refusing key that would escape the destination")));
      return std::nullopt;
    }
    return JoinKey(dst_prefix, rel);
  };

  ListOptions range;
  range.prefix = src_prefix;
  if (ends.same_store) {
    // Server-side copies: no bytes pass through this machine.
    listing = ForEachPage(*ends.src, range, [&](ListPage& page) {
      for (ObjectMeta& meta : page.objects) {
        ++listed;
        if (auto dst_key = destination(meta.key)) {
          copier.Add(std::move(meta), *std::move(dst_key));
        }
      }
      return absl::OkStatus();
    });
  } else {
    // Across stores: a parallel listing feeds the I/O engine, which fetches with many
    // requests in flight under a memory budget; fetched objects are put asynchronously.
    WHARF_ASSIGN_OR_RETURN(auto existing, ExistingObjects(*ends.dst, dst_prefix, args.list_workers));
    FetchScheduler scheduler(ends.src, {.max_in_flight = args.jobs, .memory_budget = kCopyBudget});
    std::vector<ObjectMeta> chunked;  // big: copied in ordered chunks into a writer
    absl::Mutex select_mu;
    PrefixFetch fetch(ends.src, scheduler, range, {.workers = args.list_workers},
                      [&](const ObjectMeta& meta) {
                        absl::MutexLock lock(&select_mu);
                        auto dst_key = destination(meta.key);
                        if (!dst_key) return false;
                        auto it = existing.find(dst_key->substr(dst_prefix.size()));
                        if (it != existing.end() && it->second.first == meta.size &&
                            it->second.second == meta.etag) {
                          ++skipped;  // a rerun: already copied, same size and ETag
                          return false;
                        }
                        progress.AddToTotal(1, meta.size);
                        if (meta.size > kChunked) {
                          chunked.push_back(meta);
                          return false;
                        }
                        return true;
                      });
    {
      PutQueue puts(*ends.dst, progress, copier);
      while (auto r = fetch.Next()) {
        if (fetch.listing_done()) progress.TotalIsFinal();  // from now on: a fraction and ETA
        const ObjectMeta meta = fetch.meta(r->index);
        if (!r->data.ok()) {
          copier.Fail(r->data.status());
          continue;
        }
        puts.Put(*destination(meta.key), *std::move(r->data));
      }
    }
    listing = fetch.listing_status();
    listed = fetch.listed();
    // Big objects, two at a time: each already keeps 8 chunks and 8 parts in flight, and
    // holds up to ~128 MiB.
    Copier big(ends.src, *ends.dst, /*same_store=*/false, 2, progress);
    for (ObjectMeta& meta : chunked) {
      std::string dst_key = *destination(meta.key);
      big.Add(std::move(meta), std::move(dst_key));
    }
    big.Wait();
    for (uint64_t i = big.failed(); i > 0; --i) copier.CountFailure(big.first_error_code());
  }
  progress.TotalIsFinal();
  copier.Wait();
  progress.Stop();

  if (listed == 0 && listing.ok()) {
    return absl::NotFoundError(
        absl::StrCat("cp ", ends.src->Uri(ends.src_uri.key), ": no such object or prefix"));
  }
  if (!args.quiet) PrintSummary(progress);
  if (!args.quiet && skipped > 0) {
    Print(absl::StrFormat("skipped %d already present (same size and ETag)\n", skipped));
  }
  WHARF_RETURN_IF_ERROR(Annotate(listing, what));
  if (const uint64_t failed = copier.failed(); failed > 0) {
    return absl::Status(copier.first_error_code(),
                        absl::StrCat(what, ": ", failed, " of ", listed, " objects failed"));
  }
  return absl::OkStatus();
}

}  // namespace

void AddCp(CLI::App& app, CpArgs& args) {
  CLI::App* cp = app.add_subcommand("cp", "Copy an object, or a whole prefix with -r");
  cp->add_flag("-r,--recursive", args.recursive,
               "Copy every object below SRC to the same relative key below DST");
  cp->add_option("-j,--jobs", args.jobs, "Requests in flight (objects, or parts of big ones)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cp->add_option("--list-workers", args.list_workers, "Parallel listing workers")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cp->add_flag("-q,--quiet", args.quiet, "No progress line and no summary");
  cp->add_option("SRC", args.src, "Source: a URI or a local path")->required();
  cp->add_option("DST", args.dst, "Destination: a URI or a local path")->required();
  cp->footer(
      "Without -r, SRC is one object; a DST ending in '/' (or an existing local directory)\n"
      "receives it under its own name. With -r, SRC/KEY is copied to DST/KEY for every key\n"
      "below SRC; keys that would land outside DST ('..', '//', ...) are refused. Each object\n"
      "appears complete or not at all. Failures are reported one per line; the rest go on.\n"
      "A rerun skips objects the destination already holds with the same size and ETag.");
}

absl::Status RunCp(const CpArgs& args) {
  Endpoints ends;
  WHARF_ASSIGN_OR_RETURN(OpenedUri src, OpenUri(args.src));
  ends.src = std::move(src.store);
  ends.src_uri = std::move(src.uri);
  WHARF_ASSIGN_OR_RETURN(ends.dst_uri, ParseUriOrPath(args.dst));
  ends.same_store =
      ends.dst_uri.scheme == ends.src_uri.scheme && ends.dst_uri.bucket == ends.src_uri.bucket;
  if (ends.same_store) {
    ends.dst = ends.src;
  } else {
    WHARF_ASSIGN_OR_RETURN(ends.dst,
                           StoreRegistry::Global().Open(ends.dst_uri, Context::Default()));
  }

  const std::string& key = ends.src_uri.key;
  if (args.recursive) {
    WHARF_ASSIGN_OR_RETURN(Target target, ResolveTarget(*ends.src, key));
    if (target.is_object) return CopySingle(ends, target.object, args.quiet);
    return CopyPrefix(ends, target.prefix, args);
  }

  const std::string uri = ends.src->Uri(key);
  absl::StatusOr<ObjectMeta> meta =
      absl::NotFoundError(absl::StrCat("cp ", uri, ": no such object"));
  if (!key.empty() && key.back() != '/') meta = ends.src->Head(key);
  if (absl::IsNotFound(meta.status())) {
    WHARF_ASSIGN_OR_RETURN(bool is_prefix, PrefixHasObjects(*ends.src, AsPrefix(key)));
    if (is_prefix) {
      return absl::InvalidArgumentError(absl::StrCat("cp ", uri, ": is a prefix; use -r"));
    }
  }
  WHARF_RETURN_IF_ERROR(meta.status());
  return CopySingle(ends, *meta, args.quiet);
}

}  // namespace wharf::cli
