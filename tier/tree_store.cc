#include "tier/tree_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/status.h"

namespace wharf {

struct TierTreeStore::Sealed {
  std::unique_ptr<TempObject> temp;
  ObjectMeta meta;
  Callback<ObjectMeta> done;
  absl::Time queued;
};

namespace {

bool IsMd5Hex(absl::string_view etag) {
  return etag.size() == 32 &&
         std::all_of(etag.begin(), etag.end(), [](char c) { return absl::ascii_isxdigit(c); });
}

bool InMetaDir(absl::string_view key) {
  return key == Tier::kMetaDir || absl::StartsWith(key, absl::StrCat(Tier::kMetaDir, "/"));
}

// A writer whose Close() seals the file and waits until the committer published it.
class TierWriter : public ObjectWriter {
 public:
  TierWriter(TierTreeStore* store, std::unique_ptr<TempObject> temp, std::string key,
             PutOptions options)
      : store_(store), temp_(std::move(temp)), key_(std::move(key)), options_(std::move(options)) {}

  absl::Status Write(absl::Cord data) override {
    if (!temp_) return absl::FailedPreconditionError(absl::StrCat("write ", Uri(), ": closed"));
    bytes_ += data.size();
    absl::Status s = temp_->Append(data);
    if (!s.ok()) temp_.reset();
    return Annotate(s, absl::StrCat("write ", Uri()));
  }

  absl::StatusOr<ObjectMeta> Close() override;

  void Abort() override { temp_.reset(); }

 private:
  std::string Uri() const { return store_->Uri(key_); }

  TierTreeStore* const store_;
  std::unique_ptr<TempObject> temp_;
  const std::string key_;
  const PutOptions options_;
  uint64_t bytes_ = 0;
};

// A CRC32C entry's own ETag: "crc32c-<CRC>-<time in ns, hex>" (32 characters, as an MD5's
// hex: the file store's ETag cache holds either).
std::string OwnEtagPrefix(absl::string_view crc32c) { return absl::StrCat("crc32c-", crc32c, "-"); }
std::string OwnEtag(absl::string_view crc32c, absl::Time at) {
  return absl::StrCat(OwnEtagPrefix(crc32c), absl::Hex(absl::ToUnixNanos(at)));
}

// Seals `temp` as the entry for `key`: checks the content against a source ETag that is an
// MD5 and writes the entry attribute. A CRC32C temporary file (TierTreeOptions::
// written_checksum) gets an ETag of its own, recorded in the entry and in the file store's
// ETag cache (so the file store never hashes it).
absl::StatusOr<ObjectMeta> SealEntry(TempObject& temp, const std::string& key,
                                     const PutOptions& options) {
  std::string own_etag;
  // The file's mtime is set even without a source's time, to now from the precise clock: the
  // kernel stamps a write with its coarse clock (ticks of ~4 ms), so a user's write within the
  // tick of the seal would otherwise leave the mtime the entry recorded (WrittenSinceSealed).
  auto meta = temp.Seal(
      options.mtime.value_or(absl::Now()), /*fsync=*/false, [&](int fd, const ObjectMeta& m) {
        if (!options.source_etag_opaque && IsMd5Hex(options.source_etag) &&
            absl::AsciiStrToLower(options.source_etag) != m.etag) {
          return SourceMismatchError(absl::StrCat("the content's MD5 ", m.etag,
                                                  " is not the source's ETag ", options.source_etag,
                                                  " (", options.source_uri, ")"));
        }
        TierEntry entry;
        entry.source = options.source_uri;
        entry.etag = options.source_etag;
        entry.size = m.size;
        entry.filled = absl::Now();
        entry.local = options.source_uri.empty();
        entry.mtime = m.mtime;  // the file's, as sealed (its source's time, or now)
        if (m.etag.empty()) {   // a CRC32C file (only without provenance: see NewTemp)
          entry.crc32c = temp.checksum();
          own_etag = entry.etag = OwnEtag(entry.crc32c, entry.filled);
          struct stat st;
          if (fstat(fd, &st) == 0) StoreLocalEtag(fd, st, own_etag);
        } else {
          entry.md5 = m.etag;
        }
        WHARF_RETURN_IF_ERROR(WriteEntryAttr(fd, entry));
        // A file the user pinned stays pinned when a new version replaces it (set before the
        // rename: never a moment unpinned).
        return IsPinned(temp.target()) ? SetPinned(temp.path(), true) : absl::OkStatus();
      });
  if (!meta.ok()) return meta.status();
  meta->key = key;
  if (!options.source_uri.empty()) meta->etag = options.source_etag;
  if (!own_etag.empty()) meta->etag = own_etag;
  return meta;
}

// The ETag the file store gives the entry's file while it holds the entry's data: the MD5
// the entry records, or the ETag of its own that a CRC32C entry's file carries in the file
// store's cache ("crc32c-<its CRC>-<time>"), kept with the file's size, mtime and inode. ""
// when the cache holds neither: the file was written since it was sealed (a listing may have
// cached the MD5 of what it holds now), and its content decides.
std::string FileEtag(const TierEntry& entry, const std::string& path, const struct stat& st) {
  std::optional<std::string> cached = CachedLocalEtag(-1, path, st);
  if (!cached.has_value()) return "";
  if (!entry.md5.empty()) return *cached == entry.md5 ? entry.md5 : "";
  if (!absl::StartsWith(*cached, OwnEtagPrefix(entry.crc32c))) return "";
  return *std::move(cached);
}

// The file (open as `fd`, or at `path`) holds `entry`'s data but was written since it was
// sealed (only touched): the entry takes the file's mtime as its own again, so that other
// bytes with this mtime are damage from now on, not the user's (WrittenSinceSealed). Read
// again just before: what another process wrote to it meanwhile (an export's mark) stays.
// Best effort: else the next check looks at the content again.
void RenewSealedMtime(int fd, const std::string& path, const struct stat& st,
                      const TierEntry& entry) {
  if (!WrittenSinceSealed(entry, st)) return;
  std::optional<TierEntry> now = fd >= 0 ? ReadEntryAttr(fd) : ReadEntryAttr(path);
  if (!now.has_value() || !WrittenSinceSealed(*now, st) || now->md5 != entry.md5 ||
      now->crc32c != entry.crc32c) {
    return;
  }
  now->mtime = absl::TimeFromTimespec(st.st_mtim);
  (void)(fd >= 0 ? WriteEntryAttr(fd, *now) : WriteEntryAttr(path, *now));
}

// RecheckEntry on the file at `path`, opened here ("" when it cannot be opened).
std::string Recheck(const std::string& path, const TierEntry& entry,
                    absl::StatusOr<std::string>* sum = nullptr) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st;
  std::string renewed;
  if (fd >= 0 && fstat(fd, &st) == 0) {
    renewed = RecheckEntry(fd, st, entry, sum);
  } else if (sum != nullptr) {
    *sum = ErrnoToStatus(errno, "opening");
  }
  if (fd >= 0) close(fd);
  return renewed;
}

}  // namespace

std::string RecheckEntry(int fd, const struct stat& st, const TierEntry& entry,
                         absl::StatusOr<std::string>* sum) {
  const bool md5 = !entry.md5.empty();
  absl::StatusOr<std::string> found = absl::DataLossError("the file's size is not the entry's");
  std::string renewed;
  if (IsCompleteEntry(entry, st)) {
    found = ChecksumOfFile(fd, st.st_size, md5 ? Checksum::kMd5 : Checksum::kCrc32c);
    if (found.ok() && *found == (md5 ? entry.md5 : entry.crc32c)) {
      renewed = md5 ? entry.md5 : OwnEtag(entry.crc32c, absl::Now());
      StoreLocalEtag(fd, st, renewed);
      RenewSealedMtime(fd, "", st, entry);
    }
  }
  if (sum != nullptr) *sum = std::move(found);
  return renewed;
}

bool UsersEdit(const std::string& path, const struct stat& st, const TierEntry& entry) {
  if (!WrittenSinceSealed(entry, st)) return false;
  if (!IsCompleteEntry(entry, st)) return true;
  if (!FileEtag(entry, path, st).empty()) return false;  // the ETag cache vouches for it
  return Recheck(path, entry).empty();
}

std::string EntryEtag(const TierEntry& entry) {
  return entry.source.empty() && !entry.md5.empty() ? entry.md5 : entry.etag;
}

absl::StatusOr<std::shared_ptr<TierTreeStore>> TierTreeStore::Open(std::shared_ptr<Tier> tier,
                                                                   const std::string& dir,
                                                                   std::shared_ptr<Runtime> runtime,
                                                                   TierTreeOptions options) {
  const std::string abs = AbsolutePath(dir);
  if (abs != tier->root() && !absl::StartsWith(abs, tier->root() + "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat(abs, " is not inside the tier at ", tier->root()));
  }
  if (InMetaDir(tier->Relative(abs))) {
    return absl::InvalidArgumentError(absl::StrCat(abs, " is inside the tier's own folder"));
  }
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<LocalStore> local, LocalStore::Open(abs, runtime));
  return std::shared_ptr<TierTreeStore>(
      new TierTreeStore(std::move(tier), std::move(local), std::move(runtime), options));
}

TierTreeStore::TierTreeStore(std::shared_ptr<Tier> tier, std::shared_ptr<LocalStore> local,
                             std::shared_ptr<Runtime> runtime, TierTreeOptions options)
    : ForwardingStore(local),
      tier_(std::move(tier)),
      local_(std::move(local)),
      runtime_(std::move(runtime)),
      dir_(local_->root()),
      at_root_(dir_ == tier_->root()),
      options_(options),
      md5_batcher_(
          runtime_->Shared<Md5Batcher>("", [] { return std::make_shared<Md5Batcher>(); })) {
  committer_ = std::thread([this] { CommitLoop(); });
}

TierTreeStore::~TierTreeStore() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  committer_.join();  // publishes what is queued first
}

void TierTreeStore::Describe(ListPage& page) const {
  if (at_root_) {
    const std::string meta_prefix = absl::StrCat(Tier::kMetaDir, "/");
    std::erase_if(page.objects, [](const ObjectMeta& m) { return InMetaDir(m.key); });
    std::erase(page.common_prefixes, meta_prefix);
  }
  for (ObjectMeta& meta : page.objects) {
    const std::string path = absl::StrCat(dir_, "/", meta.key);
    struct stat st;
    const auto entry = ReadEntryAttr(path);
    const bool complete = stat(path.c_str(), &st) == 0 && IsCompleteEntry(entry, st);
    // The file store listed the file's own ETag: the MD5 of what it holds now (kept with its
    // size, mtime and inode; hashed again when they changed), or a CRC32C entry's own ETag
    // while the file is as it was sealed. An entry is listed as one only while its file holds
    // its data: an export or an import's rerun must never skip a file edited in place (even
    // to the same size) as "already there" by what its attribute recorded.
    bool holds = false;
    if (complete) {
      holds = entry->md5.empty() ? absl::StartsWith(meta.etag, OwnEtagPrefix(entry->crc32c)) ||
                                       !Recheck(path, *entry).empty()
                                 : meta.etag == entry->md5;
    }
    if (holds) {
      RenewSealedMtime(-1, path, st, *entry);
      meta.etag = EntryEtag(*entry);
      // The content's MD5 when the entry records one (an import's): so an export compares
      // by content with a destination whose ETag or md5Hash is an MD5, whatever ETag the
      // source gave (a GCS generation, a multipart ETag).
      meta.md5 = entry->md5;
    } else if (complete && !WrittenSinceSealed(*entry, st)) {
      // Damaged (other bytes of the same size, its mtime as sealed): no ETag, so its read
      // checks the content and fails naming the file (GetAsync), as `tier verify` reports
      // it. Never exported as the entry (a checkpoint's file, an imported object); an
      // import's rerun fetches the source's bytes again.
      meta.etag.clear();
      meta.md5.clear();
    } else if (!options_.plain_file_etags) {
      // Not an entry: a file of the user's, or an entry's file the user wrote since it was
      // sealed (UsersEdit), which is the user's own now. Listed as a plain file.
      meta.etag.clear();
    }
  }
}

absl::StatusOr<ObjectMeta> TierTreeStore::Describe(ObjectMeta meta) const {
  if (at_root_ && InMetaDir(meta.key)) {
    return absl::NotFoundError(absl::StrCat("head ", Uri(meta.key), ": no such object"));
  }
  ListPage page;
  page.objects.push_back(std::move(meta));
  Describe(page);
  return std::move(page.objects.front());
}

void TierTreeStore::ListAsync(ListOptions options, std::string continuation,
                              Callback<ListPage> done) {
  local_->ListAsync(std::move(options), std::move(continuation),
                    [this, done = std::move(done)](absl::StatusOr<ListPage> page) mutable {
                      if (page.ok()) Describe(*page);
                      std::move(done)(std::move(page));
                    });
}

absl::StatusOr<ListPage> TierTreeStore::List(const ListOptions& options,
                                             const std::string& continuation) {
  WHARF_ASSIGN_OR_RETURN(ListPage page, local_->List(options, continuation));
  Describe(page);
  return page;
}

void TierTreeStore::HeadAsync(std::string key, Callback<ObjectMeta> done) {
  local_->HeadAsync(std::move(key),
                    [this, done = std::move(done)](absl::StatusOr<ObjectMeta> meta) mutable {
                      if (meta.ok()) meta = Describe(*std::move(meta));
                      std::move(done)(std::move(meta));
                    });
}

void TierTreeStore::GetAsync(GetRequest request, Callback<GetResult> done) {
  // The file's own ETag (the local store's: the MD5 of its content) stands for the entry's
  // listed one: conditions given in the listed ETag are translated, and the result carries it.
  // One attribute read on the caller's thread, as a listing's Describe makes per object.
  std::optional<TierEntry> entry;
  std::string file_etag;
  if (!(at_root_ && InMetaDir(request.key))) {
    const std::string path = absl::StrCat(dir_, "/", request.key);
    struct stat st;
    entry = ReadEntryAttr(path);
    if (stat(path.c_str(), &st) != 0 || !IsCompleteEntry(entry, st)) {
      entry.reset();
    } else {
      file_etag = FileEtag(*entry, path, st);
    }
  }
  if (entry.has_value() && file_etag.empty()) {
    // The entry's checksum is kept with the file's size, mtime and inode (the file store's ETag
    // cache): gone, the file was written since it was sealed (or the attribute was lost). Its
    // content decides, on the blocking pool: the same bytes get their ETag back; others are
    // never served as the entry (an export would upload an edit or damage as the checkpoint,
    // or as the imported object). Other bytes in a file written since it was sealed are the
    // user's (read as a plain file); with the mtime as sealed they are damage (the read fails).
    runtime_->blocking_pool().Schedule([this, request = std::move(request),
                                        entry = *std::move(entry),
                                        done = std::move(done)]() mutable {
      absl::StatusOr<std::string> sum;
      const std::string path = absl::StrCat(dir_, "/", request.key);
      std::string own = Recheck(path, entry, &sum);
      struct stat now;
      if (own.empty() && stat(path.c_str(), &now) == 0 && WrittenSinceSealed(entry, now)) {
        // Written since it was sealed: the user's own file now (UsersEdit), read as one.
        GetEntryAsync(std::move(request), std::nullopt, "", std::move(done));
        return;
      }
      if (own.empty()) {
        const bool md5 = !entry.md5.empty();
        std::move(done)(absl::DataLossError(absl::StrCat(
            "get ", Uri(request.key), ": the file no longer holds its tier entry's data (",
            sum.ok() ? absl::StrCat(md5 ? "MD5 " : "CRC32C ", *sum, ", the entry says ",
                                    md5 ? entry.md5 : entry.crc32c)
                     : std::string(sum.status().message()),
            "): written since it was sealed, or damaged; see `wharf tier verify`")));
        return;
      }
      GetEntryAsync(std::move(request), std::move(entry), std::move(own), std::move(done));
    });
    return;
  }
  GetEntryAsync(std::move(request), std::move(entry), std::move(file_etag), std::move(done));
}

void TierTreeStore::GetEntryAsync(GetRequest request, std::optional<TierEntry> entry,
                                  std::string file_etag, Callback<GetResult> done) {
  bool translated = false;
  if (entry.has_value()) {
    const std::string listed = EntryEtag(*entry);
    if (request.if_match == listed) {
      request.if_match = file_etag;
      translated = !file_etag.empty();
    }
    if (request.if_none_match == listed) request.if_none_match = file_etag;
  }
  local_->GetAsync(std::move(request), [entry = std::move(entry), file_etag = std::move(file_etag),
                                        translated, done = std::move(done)](
                                           absl::StatusOr<GetResult> result) mutable {
    if (result.ok() && entry.has_value() && !file_etag.empty() && result->meta.etag == file_etag) {
      result->meta.etag = EntryEtag(*entry);
    } else if (translated && absl::IsFailedPrecondition(result.status())) {
      // The entry still describes the file, whose content is no longer what it recorded.
      result = absl::DataLossError(absl::StrCat(
          result.status().message(),
          ": the file no longer holds its tier entry's data (written since it was sealed, or "
          "damaged; see `wharf tier verify`)"));
    }
    std::move(done)(std::move(result));
  });
}

absl::StatusOr<ObjectMeta> TierTreeStore::Head(const std::string& key) {
  WHARF_ASSIGN_OR_RETURN(ObjectMeta meta, local_->Head(key));
  return Describe(std::move(meta));
}

absl::StatusOr<std::unique_ptr<TempObject>> TierTreeStore::NewTemp(const std::string& key,
                                                                   const PutOptions& options) {
  const std::string op = absl::StrCat("put ", Uri(key));
  if (at_root_ && InMetaDir(key)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": '.wharf' is the tier's own folder"));
  }
  if (MakesATier(key)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": a .wharf/tier.json below the tier would make a tier of its own"));
  }
  WHARF_RETURN_IF_ERROR(Annotate(LocalStore::ValidateKey(key), op));
  WHARF_RETURN_IF_ERROR(Annotate(RefuseLinksBelow(dir_, absl::StrCat(dir_, "/", key)), op));
  WHARF_RETURN_IF_ERROR(Annotate(ValidatePutOptions(options), op));
  if (options.if_absent) {
    return absl::UnimplementedError(
        absl::StrCat(op, ": the tier's tree does not take create-only puts"));
  }
  auto temp_dir = tier_->TempDir();
  if (!temp_dir.ok()) return Annotate(temp_dir.status(), op);
  // Copies of other stores' objects keep the MD5 (checked against an MD5 source ETag).
  auto temp = TempObject::Create(absl::StrCat(dir_, "/", key), *temp_dir, ChecksumFor(options));
  if (!temp.ok()) return Annotate(temp.status(), op);
  return temp;
}

absl::StatusOr<TierTreeStore::Sealed> TierTreeStore::Seal(const std::string& key,
                                                          const absl::Cord& data,
                                                          const PutOptions& options,
                                                          const Md5Digest* md5) {
  const std::string op = absl::StrCat("put ", Uri(key));
  auto temp = NewTemp(key, options);
  if (!temp.ok()) return temp.status();
  if (md5 != nullptr) (*temp)->SetMd5(*md5);
  WHARF_RETURN_IF_ERROR(Annotate((*temp)->Append(data), op));
  auto meta = SealEntry(**temp, key, options);
  if (!meta.ok()) return Annotate(meta.status(), op);
  Sealed sealed;
  sealed.temp = *std::move(temp);
  sealed.meta = *std::move(meta);
  return sealed;
}

void TierTreeStore::PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                             Callback<ObjectMeta> done) {
  PutAsync(std::move(key), std::move(data), options, /*batch_hash=*/true, std::move(done));
}

void TierTreeStore::PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                             bool batch_hash, Callback<ObjectMeta> done) {
  auto seal = [this, key = std::move(key), options, done = std::move(done)](
                  absl::Cord data, const Md5Digest* md5) mutable {
    auto sealed = Seal(key, data, options, md5);
    data = absl::Cord();  // the bytes are in the file: release them before the batch waits
    if (!sealed.ok()) return std::move(done)(sealed.status());
    sealed->done = std::move(done);
    Enqueue(*std::move(sealed));
  };
  if (batch_hash && ChecksumFor(options) == Checksum::kMd5 &&
      data.size() <= md5_batcher_->max_message()) {
    // An import's stream of objects: their MD5s are computed many at a time, then each
    // file is written on the blocking pool as before.
    md5_batcher_->Hash(std::move(data), runtime_->blocking_pool(),
                       [seal = std::move(seal)](absl::Cord data, const Md5Digest& md5) mutable {
                         seal(std::move(data), &md5);
                       });
    return;
  }
  runtime_->blocking_pool().Schedule([seal = std::move(seal), data = std::move(data)]() mutable {
    seal(std::move(data), nullptr);
  });
}

absl::StatusOr<ObjectMeta> TierTreeStore::Put(const std::string& key, absl::Cord data,
                                              const PutOptions& options) {
  return WaitFor<ObjectMeta>([&](Callback<ObjectMeta> cb) {
    PutAsync(key, std::move(data), options, false, std::move(cb));
  });
}

absl::StatusOr<std::unique_ptr<ObjectWriter>> TierTreeStore::NewWriter(std::string key,
                                                                       const PutOptions& options) {
  auto temp = NewTemp(key, options);
  if (!temp.ok()) return temp.status();
  return std::make_unique<TierWriter>(this, *std::move(temp), std::move(key), options);
}

absl::StatusOr<ObjectMeta> TierWriter::Close() {
  if (!temp_) return absl::FailedPreconditionError(absl::StrCat("close ", Uri(), ": closed"));
  auto meta = SealEntry(*temp_, key_, options_);
  if (!meta.ok()) {
    temp_.reset();
    return Annotate(meta.status(), absl::StrCat("put ", Uri()));
  }
  TierTreeStore::Sealed sealed;
  sealed.temp = std::move(temp_);
  sealed.meta = *std::move(meta);
  return WaitFor<ObjectMeta>([&](Callback<ObjectMeta> cb) {
    sealed.done = std::move(cb);
    store_->Enqueue(std::move(sealed));
  });
}

void TierTreeStore::CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) {
  runtime_->blocking_pool().Schedule(
      [this, src_key = std::move(src_key), dst_key = std::move(dst_key),
       done = std::move(done)]() mutable { std::move(done)(Copy(src_key, dst_key)); });
}

absl::StatusOr<ObjectMeta> TierTreeStore::Copy(const std::string& src_key,
                                               const std::string& dst_key) {
  // The copy is an entry of the same provenance as its source.
  PutOptions options;
  if (auto entry = ReadEntryAttr(absl::StrCat(dir_, "/", src_key)); entry.has_value()) {
    options.source_uri = entry->source;
    options.source_etag = entry->etag;
  }
  WHARF_ASSIGN_OR_RETURN(std::string data, local_->Read(src_key));
  return Put(dst_key, absl::Cord(std::move(data)), options);
}

void TierTreeStore::Enqueue(Sealed sealed) {
  Callback<ObjectMeta> early;
  ObjectMeta meta;
  {
    absl::MutexLock lock(&mu_);
    sealed.queued = absl::Now();
    queued_bytes_ += sealed.meta.size;
    if (options_.complete_before_publish && unpublished_ < options_.max_unpublished) {
      early = std::move(sealed.done);
      sealed.done = nullptr;
      meta = sealed.meta;
    }
    ++unpublished_;
    queue_.push_back(std::move(sealed));
  }
  if (early) std::move(early)(std::move(meta));
}

absl::Status TierTreeStore::Flush() {
  absl::MutexLock lock(&mu_);
  ++flushing_;  // the committer publishes what is queued without waiting for a full batch
  AwaitInterruptibly(mu_, absl::Condition(
                              +[](size_t* n) { return *n == 0; }, &unpublished_));
  --flushing_;
  if (unpublished_failures_ == 0) return absl::OkStatus();
  absl::Status s = first_unpublished_failure_;
  return absl::Status(
      s.code(),
      absl::StrCat(unpublished_failures_, " files were written but not published: ", s.message()));
}

uint64_t TierTreeStore::FailedToPublish() {
  absl::MutexLock lock(&mu_);
  return unpublished_failures_;
}

void TierTreeStore::CommitLoop() {
  while (true) {
    std::vector<Sealed> batch;
    {
      absl::MutexLock lock(&mu_);
      auto full = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || flushing_ > 0 || queue_.size() >= options_.batch_files ||
               queued_bytes_ >= options_.batch_bytes;
      };
      auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&any));
      if (!full()) {
        mu_.AwaitWithDeadline(absl::Condition(&full), queue_.front().queued + options_.max_delay);
      }
      if (queue_.empty()) {
        if (stop_) return;
        continue;
      }
      batch.reserve(queue_.size());
      for (Sealed& s : queue_) batch.push_back(std::move(s));
      queue_.clear();
      queued_bytes_ = 0;
    }
    PublishBatch(std::move(batch));
  }
}

void TierTreeStore::PublishBatch(std::vector<Sealed> batch) {
  // Data first (one syncfs for the whole batch), then the renames that publish it, then the
  // directory entries (a second syncfs): a published file is never one whose data could be
  // lost, and a completed put survives a crash.
  absl::Status synced = tier_->SyncFs();
  std::vector<absl::Status> results(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    results[i] = synced.ok() ? batch[i].temp->Publish() : synced;
  }
  if (synced.ok()) synced = tier_->SyncFs();
  for (size_t i = 0; i < batch.size(); ++i) {
    Sealed& s = batch[i];
    absl::Status status = results[i].ok() ? synced : results[i];
    s.temp.reset();
    if (!s.done) {  // completed when queued: Flush() reports it
      if (!status.ok()) {
        absl::Status failure = Annotate(status, absl::StrCat("put ", Uri(s.meta.key)));
        if (options_.on_unpublished) options_.on_unpublished(failure);
        absl::MutexLock lock(&mu_);
        if (unpublished_failures_++ == 0) first_unpublished_failure_ = std::move(failure);
      }
    } else if (status.ok()) {
      std::move(s.done)(std::move(s.meta));
    } else {
      std::move(s.done)(Annotate(status, absl::StrCat("put ", Uri(s.meta.key))));
    }
  }
  absl::MutexLock lock(&mu_);
  unpublished_ -= batch.size();
}

}  // namespace wharf
