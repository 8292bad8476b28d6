#include "dataset/index.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/file_io.h"
#include "base/hash.h"
#include "base/json_sax.h"
#include "base/status.h"
#include "dataset/index_file.h"
#include "nlohmann/json.hpp"
#include "store/uri.h"

namespace wharf {
namespace {

using Json = nlohmann::json;

// Captures the parser's message for a line that is not valid JSON. nlohmann reports errors
// by exception unless asked not to; a SAX handler gets the message without one (the library
// throws nothing, convention 1).
class ErrorCapture : public JsonSaxBase {
 public:
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    message = ex.what();
    return false;
  }
  std::string message;
};

std::string JsonErrorMessage(absl::string_view line) {
  ErrorCapture capture;
  Json::sax_parse(line.begin(), line.end(), &capture);
  // nlohmann's messages start with "[json.exception.parse_error.101] parse error at ...".
  absl::string_view m = capture.message;
  const size_t bracket = m.find("] ");
  if (absl::StartsWith(m, "[json.exception.") && bracket != absl::string_view::npos) {
    m.remove_prefix(bracket + 2);
  }
  return m.empty() ? std::string("not a JSON value") : std::string(m);
}

// Resolves the key a manifest line names into `out`; an error message (without the line
// prefix) otherwise. `out` is reused from line to line: no allocation per line once warm.
absl::Status ResolveKey(absl::string_view key, absl::string_view base_prefix,
                        absl::string_view store_root_uri, std::string& out) {
  if (key.empty()) return absl::InvalidArgumentError("empty key");
  if (LooksLikeUri(key)) {
    if (store_root_uri.empty() || !absl::StartsWith(key, store_root_uri)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", key, "' is not in this dataset's store (", store_root_uri, ")"));
    }
    key.remove_prefix(store_root_uri.size());
    if (key.empty()) return absl::InvalidArgumentError("URI names no object");
    out.assign(key.data(), key.size());
    return absl::OkStatus();
  }
  if (absl::ConsumePrefix(&key, "/")) {
    if (key.empty()) return absl::InvalidArgumentError("key '/' names no object");
    out.assign(key.data(), key.size());
    return absl::OkStatus();
  }
  out.assign(base_prefix.data(), base_prefix.size());
  out.append(key.data(), key.size());
  return absl::OkStatus();
}

// Parses manifest text fed in pieces split anywhere (a streamed GET), into a builder.
class ManifestParser {
 public:
  ManifestParser(absl::string_view base_prefix, absl::string_view store_root_uri,
                 absl::string_view manifest_name, ManifestFormat format, SampleIndexBuilder& out)
      : base_prefix_(base_prefix),
        store_root_uri_(store_root_uri),
        manifest_name_(manifest_name),
        format_(format),
        out_(out) {}

  absl::Status Feed(absl::string_view chunk) {
    if (!pending_.empty()) {
      const size_t nl = chunk.find('\n');
      if (nl == absl::string_view::npos) {
        pending_.append(chunk.data(), chunk.size());
        return absl::OkStatus();
      }
      pending_.append(chunk.data(), nl);
      WHARF_RETURN_IF_ERROR(Line(pending_));
      pending_.clear();
      chunk.remove_prefix(nl + 1);
    }
    while (!chunk.empty()) {
      const size_t nl = chunk.find('\n');
      if (nl == absl::string_view::npos) {
        pending_.assign(chunk.data(), chunk.size());
        break;
      }
      WHARF_RETURN_IF_ERROR(Line(chunk.substr(0, nl)));
      chunk.remove_prefix(nl + 1);
    }
    return absl::OkStatus();
  }

  // The last line, when the text does not end in a line end.
  absl::Status Finish() {
    if (pending_.empty()) return absl::OkStatus();
    absl::Status s = Line(pending_);
    pending_.clear();
    return s;
  }

 private:
  absl::Status Line(absl::string_view line) {
    ++line_number_;
    absl::ConsumeSuffix(&line, "\r");
    const absl::string_view stripped = absl::StripAsciiWhitespace(line);
    if (stripped.empty()) return absl::OkStatus();
    if (format_ == ManifestFormat::kAuto) {
      format_ =
          absl::StartsWith(stripped, "{") ? ManifestFormat::kJsonLines : ManifestFormat::kKeys;
    }
    auto line_error = [&](absl::string_view message) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest ", manifest_name_, " line ", line_number_, ": ", message));
    };

    std::optional<uint64_t> size;
    absl::string_view etag;
    absl::string_view key;
    Json j;
    if (format_ == ManifestFormat::kKeys) {
      key = stripped;
    } else {
      j = Json::parse(stripped.begin(), stripped.end(), /*cb=*/nullptr,
                      /*allow_exceptions=*/false);
      if (j.is_discarded()) {
        return line_error(absl::StrCat("invalid JSON: ", JsonErrorMessage(stripped)));
      }
      if (!j.is_object()) return line_error("expected a JSON object");
      auto k = j.find("key");
      if (k == j.end()) return line_error("missing \"key\"");
      if (!k->is_string()) return line_error("\"key\" must be a string");
      key = k->get_ref<const std::string&>();
      if (auto s = j.find("size"); s != j.end() && !s->is_null()) {
        if (!s->is_number_unsigned()) {
          return line_error("\"size\" must be a non-negative integer");
        }
        size = s->get<uint64_t>();
        // The index file's "unknown" sentinel.
        if (*size == internal_index::kUnknownSize) return line_error("\"size\" is too large");
      }
      if (auto e = j.find("etag"); e != j.end() && !e->is_null()) {
        if (!e->is_string()) return line_error("\"etag\" must be a string");
        etag = e->get_ref<const std::string&>();
        // Accept the HTTP form ("\"abc\"") as well as the bare one ObjectMeta uses.
        if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') {
          etag = etag.substr(1, etag.size() - 2);
        }
      }
    }
    if (absl::Status s = ResolveKey(key, base_prefix_, store_root_uri_, key_); !s.ok()) {
      return line_error(s.message());
    }
    return out_.Add(key_, size, etag);
  }

  const absl::string_view base_prefix_;
  const absl::string_view store_root_uri_;
  const absl::string_view manifest_name_;
  ManifestFormat format_;
  SampleIndexBuilder& out_;
  std::string pending_;  // a line split across chunks
  std::string key_;      // the resolved key of the current line
  size_t line_number_ = 0;
};

// Feeds a streamed GET to a ManifestParser. The parser's own error is kept: the store
// would report it wrapped in its read error.
class ParserSink : public ReadSink {
 public:
  explicit ParserSink(ManifestParser& parser) : parser_(parser) {}
  absl::Status Append(absl::string_view chunk) override {
    parse_error_ = parser_.Feed(chunk);
    return parse_error_;
  }
  const absl::Status& parse_error() const { return parse_error_; }

 private:
  ManifestParser& parser_;
  absl::Status parse_error_;
};

using internal_index::Columns;
using internal_index::Load64;
using internal_index::Store64;

std::string U64Bytes(uint64_t v) {
  std::string out(8, '\0');
  Store64(out.data(), v);
  return out;
}

// Columns held in this process's memory, as strings of column bytes.
struct HeapColumns : Columns {
  std::string key_bytes_s, etag_bytes_s, key_offsets_s, sizes_s, etag_offsets_s;
  void Bind(bool has_etags) {
    count = sizes_s.size() / 8;
    keys = key_bytes_s.data();
    key_bytes = key_bytes_s.size();
    key_offsets = key_offsets_s.data();
    sizes = sizes_s.data();
    if (has_etags) {
      etags = etag_bytes_s.data();
      etag_bytes = etag_bytes_s.size();
      etag_offsets = etag_offsets_s.data();
    }
    heap_bytes = key_bytes_s.capacity() + etag_bytes_s.capacity() + key_offsets_s.capacity() +
                 sizes_s.capacity() + etag_offsets_s.capacity();
  }
};

// An index file's image held as one string (FromBytes: a pickled index).
struct ImageColumns : Columns {
  std::string image;
};

// The 8-byte length prefix + key that Fingerprint() hashes.
void FingerprintKey(Md5& md5, absl::string_view key) {
  char len[8];
  // Length-prefixed so that {"ab", "c"} and {"a", "bc"} differ.
  Store64(len, key.size());
  md5.Update(absl::string_view(len, sizeof(len)));
  md5.Update(key);
}

}  // namespace

// ---- Builders ----

struct SampleIndexBuilder::Impl {
  virtual ~Impl() = default;
  virtual absl::Status AddColumns(absl::string_view key, uint64_t size, absl::string_view etag) = 0;

  absl::Status Add(absl::string_view key, std::optional<uint64_t> size, absl::string_view etag) {
    const uint64_t s = size.value_or(internal_index::kUnknownSize);
    WHARF_RETURN_IF_ERROR(AddColumns(key, s, etag));
    FingerprintKey(fingerprint, key);
    // The content digest covers everything an entry holds (names listing files).
    char buf[16];
    Store64(buf, s);
    Store64(buf + 8, etag.size());
    content.Update(absl::string_view(buf, sizeof(buf)));
    content.Update(etag);
    FingerprintKey(content, key);
    ++count;
    return absl::OkStatus();
  }

  uint64_t count = 0;
  uint64_t key_bytes = 0;
  uint64_t etag_bytes = 0;
  Md5 fingerprint;
  Md5 content;
};

namespace {

class MemoryBuilder : public SampleIndexBuilder::Impl {
 public:
  MemoryBuilder() : columns_(std::make_shared<HeapColumns>()) {
    columns_->key_offsets_s = U64Bytes(0);
    columns_->etag_offsets_s = U64Bytes(0);
  }

  absl::Status AddColumns(absl::string_view key, uint64_t size, absl::string_view etag) override {
    HeapColumns& c = *columns_;
    c.key_bytes_s.append(key.data(), key.size());
    c.etag_bytes_s.append(etag.data(), etag.size());
    char buf[8];
    Store64(buf, c.key_bytes_s.size());
    c.key_offsets_s.append(buf, 8);
    Store64(buf, size);
    c.sizes_s.append(buf, 8);
    Store64(buf, c.etag_bytes_s.size());
    c.etag_offsets_s.append(buf, 8);
    return absl::OkStatus();
  }

  std::shared_ptr<HeapColumns> Finish() {
    HeapColumns& c = *columns_;
    const bool has_etags = !c.etag_bytes_s.empty();
    if (!has_etags) std::string().swap(c.etag_offsets_s);
    for (std::string* s :
         {&c.key_bytes_s, &c.etag_bytes_s, &c.key_offsets_s, &c.sizes_s, &c.etag_offsets_s}) {
      s->shrink_to_fit();
    }
    c.fingerprint = fingerprint.Finish();
    c.Bind(has_etags);
    return std::move(columns_);
  }

 private:
  std::shared_ptr<HeapColumns> columns_;
};

// A file descriptor with a write buffer: columns are appended in 1 MiB writes.
class BufferedFd {
 public:
  BufferedFd() = default;
  BufferedFd(int fd, std::string what) : fd_(fd), what_(std::move(what)) {
    buffer_.reserve(kBuffer);
  }
  BufferedFd(BufferedFd&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)),
        what_(std::move(o.what_)),
        buffer_(std::move(o.buffer_)),
        written_(o.written_) {}
  BufferedFd& operator=(BufferedFd&& o) noexcept {
    if (this != &o) {
      Close();
      fd_ = std::exchange(o.fd_, -1);
      what_ = std::move(o.what_);
      buffer_ = std::move(o.buffer_);
      written_ = o.written_;
    }
    return *this;
  }
  ~BufferedFd() { Close(); }

  absl::Status Append(absl::string_view data) {
    if (buffer_.size() + data.size() > kBuffer) WHARF_RETURN_IF_ERROR(Flush());
    if (data.size() >= kBuffer) {
      WHARF_RETURN_IF_ERROR(Annotate(WriteAll(fd_, data), what_));
    } else {
      buffer_.append(data.data(), data.size());
    }
    written_ += data.size();
    return absl::OkStatus();
  }
  absl::Status Append64(uint64_t v) {
    char buf[8];
    Store64(buf, v);
    return Append(absl::string_view(buf, 8));
  }
  absl::Status Pad8() {
    static const char kZeros[8] = {};
    return Append(absl::string_view(kZeros, (8 - written_ % 8) % 8));
  }
  absl::Status Flush() {
    if (buffer_.empty()) return absl::OkStatus();
    absl::Status s = Annotate(WriteAll(fd_, buffer_), what_);
    buffer_.clear();
    return s;
  }
  // Appends everything `from` holds (flushed) to this file.
  absl::Status AppendFile(BufferedFd& from) {
    WHARF_RETURN_IF_ERROR(Flush());
    WHARF_RETURN_IF_ERROR(from.Flush());
    off_t in = 0;
    uint64_t left = from.written_;
    while (left > 0) {
      const ssize_t n = copy_file_range(from.fd_, &in, fd_, nullptr, left, 0);
      if (n > 0) {
        left -= static_cast<uint64_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EXDEV && errno != ENOSYS && errno != EINVAL && errno != EOPNOTSUPP) {
        return ErrnoToStatus(errno, what_);
      }
      // No in-kernel copy here: read and write.
      std::string buf(kBuffer, '\0');
      while (left > 0) {
        const ssize_t r = pread(from.fd_, buf.data(), std::min<uint64_t>(left, kBuffer), in);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return ErrnoToStatus(r == 0 ? EIO : errno, from.what_);
        WHARF_RETURN_IF_ERROR(
            Annotate(WriteAll(fd_, absl::string_view(buf.data(), static_cast<size_t>(r))), what_));
        in += r;
        left -= static_cast<uint64_t>(r);
      }
    }
    written_ += from.written_;
    return absl::OkStatus();
  }
  uint64_t written() const { return written_; }
  int fd() const { return fd_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  static constexpr size_t kBuffer = size_t{1} << 20;
  int fd_ = -1;
  std::string what_;
  std::string buffer_;
  uint64_t written_ = 0;
};

// An unnamed temporary file in `dir` (created and unlinked at once).
absl::StatusOr<BufferedFd> SideFile(const std::string& dir, const std::string& what) {
  std::string name = absl::StrCat(dir, "/.wharf-index-XXXXXX");
  const int fd = mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("creating a temporary file in ", dir));
  unlink(name.c_str());
  return BufferedFd(fd, what);
}

class FileBuilder : public SampleIndexBuilder::Impl {
 public:
  static absl::StatusOr<std::unique_ptr<FileBuilder>> Create(const std::string& dir,
                                                             absl::string_view name_prefix) {
    auto b = std::unique_ptr<FileBuilder>(new FileBuilder);
    b->dir_ = dir;
    b->temp_ = absl::StrCat(dir, "/", name_prefix, "tmp-XXXXXX");
    const int fd = mkostemp(b->temp_.data(), O_CLOEXEC);  // mode 0600
    if (fd < 0) {
      return ErrnoToStatus(errno, absl::StrCat("creating index file in ", dir));
    }
    const std::string what = absl::StrCat("writing index file ", b->temp_);
    b->main_ = BufferedFd(fd, what);
    WHARF_ASSIGN_OR_RETURN(b->etags_, SideFile(dir, what));
    WHARF_ASSIGN_OR_RETURN(b->key_offsets_, SideFile(dir, what));
    WHARF_ASSIGN_OR_RETURN(b->sizes_, SideFile(dir, what));
    WHARF_ASSIGN_OR_RETURN(b->etag_offsets_, SideFile(dir, what));
    // The header is written last, when the counts are known.
    WHARF_RETURN_IF_ERROR(b->main_.Append(std::string(internal_index::kHeaderSize, '\0')));
    WHARF_RETURN_IF_ERROR(b->key_offsets_.Append64(0));
    WHARF_RETURN_IF_ERROR(b->etag_offsets_.Append64(0));
    return b;
  }
  ~FileBuilder() override {
    if (!published_) unlink(temp_.c_str());
  }

  absl::Status AddColumns(absl::string_view key, uint64_t size, absl::string_view etag) override {
    WHARF_RETURN_IF_ERROR(main_.Append(key));
    key_bytes += key.size();
    etag_bytes += etag.size();
    if (!etag.empty()) WHARF_RETURN_IF_ERROR(etags_.Append(etag));
    WHARF_RETURN_IF_ERROR(key_offsets_.Append64(key_bytes));
    WHARF_RETURN_IF_ERROR(sizes_.Append64(size));
    return etag_offsets_.Append64(etag_bytes);
  }

  absl::StatusOr<SampleIndex> Finish(const std::function<std::string(absl::string_view)>& path_for,
                                     bool replace);

 private:
  FileBuilder() = default;

  std::string dir_;
  std::string temp_;
  BufferedFd main_, etags_, key_offsets_, sizes_, etag_offsets_;
  bool published_ = false;
};

}  // namespace

SampleIndexBuilder::SampleIndexBuilder() : impl_(std::make_unique<MemoryBuilder>()) {}
SampleIndexBuilder::SampleIndexBuilder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SampleIndexBuilder::~SampleIndexBuilder() = default;
SampleIndexBuilder::SampleIndexBuilder(SampleIndexBuilder&&) noexcept = default;
SampleIndexBuilder& SampleIndexBuilder::operator=(SampleIndexBuilder&&) noexcept = default;

absl::StatusOr<SampleIndexBuilder> SampleIndexBuilder::ToFile(const std::string& dir,
                                                              absl::string_view name_prefix) {
  WHARF_ASSIGN_OR_RETURN(std::unique_ptr<FileBuilder> b, FileBuilder::Create(dir, name_prefix));
  return SampleIndexBuilder(std::move(b));
}

absl::Status SampleIndexBuilder::Add(absl::string_view key, std::optional<uint64_t> size,
                                     absl::string_view etag) {
  return impl_->Add(key, size, etag);
}

uint64_t SampleIndexBuilder::size() const { return impl_->count; }

absl::StatusOr<SampleIndex> SampleIndexBuilder::Finish() {
  auto* memory = dynamic_cast<MemoryBuilder*>(impl_.get());
  if (memory == nullptr) {
    return absl::FailedPreconditionError("an index file builder finishes with FinishFile");
  }
  return SampleIndex(memory->Finish());
}

absl::StatusOr<SampleIndex> SampleIndexBuilder::FinishFile(
    const std::function<std::string(absl::string_view)>& path_for, bool replace) {
  auto* file = dynamic_cast<FileBuilder*>(impl_.get());
  if (file == nullptr) {
    return absl::FailedPreconditionError("an in-memory index builder finishes with Finish");
  }
  return file->Finish(path_for, replace);
}

absl::StatusOr<SampleIndex> FileBuilder::Finish(
    const std::function<std::string(absl::string_view)>& path_for, bool replace) {
  internal_index::Header h;
  h.count = count;
  h.key_bytes = key_bytes;
  h.etag_bytes = etag_bytes;
  h.has_etags = etag_bytes > 0;
  h.fingerprint = fingerprint.Finish();
  WHARF_RETURN_IF_ERROR(main_.Pad8());
  if (h.has_etags) {
    WHARF_RETURN_IF_ERROR(main_.AppendFile(etags_));
    WHARF_RETURN_IF_ERROR(main_.Pad8());
  }
  WHARF_RETURN_IF_ERROR(main_.AppendFile(key_offsets_));
  WHARF_RETURN_IF_ERROR(main_.AppendFile(sizes_));
  if (h.has_etags) WHARF_RETURN_IF_ERROR(main_.AppendFile(etag_offsets_));
  WHARF_RETURN_IF_ERROR(main_.Flush());
  for (BufferedFd* side : {&etags_, &key_offsets_, &sizes_, &etag_offsets_}) side->Close();
  const std::string header = internal_index::EncodeHeader(h);
  if (pwrite(main_.fd(), header.data(), header.size(), 0) != static_cast<ssize_t>(header.size())) {
    return ErrnoToStatus(errno, absl::StrCat("writing index file ", temp_));
  }
  // Durable before it is visible: a crash never leaves a published, half-written file.
  if (fdatasync(main_.fd()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("syncing index file ", temp_));
  }
  main_.Close();
  const std::string path = path_for(HexLower(content.Finish()));
  if (replace) {
    if (rename(temp_.c_str(), path.c_str()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("publishing index file ", path));
    }
    published_ = true;
    return SampleIndex::OpenFile(path);
  }
  // Publish only where nothing is: link(2) fails on an existing name, rename(2) would not.
  if (link(temp_.c_str(), path.c_str()) != 0) {
    if (errno != EEXIST) return ErrnoToStatus(errno, absl::StrCat("publishing index file ", path));
    auto existing = SampleIndex::OpenFile(path);
    if (existing.ok()) return existing;
    // A damaged file under this name: ours replaces it.
    if (rename(temp_.c_str(), path.c_str()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("publishing index file ", path));
    }
    published_ = true;
    return SampleIndex::OpenFile(path);
  }
  return SampleIndex::OpenFile(path);  // the destructor removes the temporary name
}

// ---- SampleIndex ----

FetchItem SampleEntry::ToFetchItem() const {
  FetchItem item;
  item.key = key;
  item.size = size;
  item.etag = etag;
  return item;
}

FetchItem SampleRef::ToFetchItem() const {
  FetchItem item;
  item.key = std::string(key);
  item.size = size;
  item.etag = std::string(etag);
  return item;
}

SampleEntry SampleRef::ToEntry() const {
  return SampleEntry{.key = std::string(key), .size = size, .etag = std::string(etag)};
}

SampleIndex::SampleIndex(std::shared_ptr<const Columns> columns) : columns_(std::move(columns)) {}

SampleIndex::SampleIndex() {
  static const std::shared_ptr<const Columns> empty = SampleIndexBuilder().Finish()->columns_;
  columns_ = empty;
}

SampleIndex::SampleIndex(const std::vector<SampleEntry>& entries) {
  SampleIndexBuilder b;
  for (const SampleEntry& e : entries) b.Add(e.key, e.size, e.etag).IgnoreError();  // in memory
  columns_ = b.Finish()->columns_;
}

SampleIndex SampleIndex::FromKeys(const std::vector<std::string>& keys) {
  SampleIndexBuilder b;
  for (const std::string& k : keys) b.Add(k, std::nullopt, "").IgnoreError();  // in memory
  return *b.Finish();
}

size_t SampleIndex::size() const { return columns_->count; }

SampleRef SampleIndex::Ref(size_t i) const {
  const Columns& c = *columns_;
  SampleRef ref;
  // Clamped into the section: a damaged offset gives a wrong key, never a read outside.
  uint64_t end = std::min(Load64(c.key_offsets + 8 * (i + 1)), c.key_bytes);
  uint64_t begin = std::min(Load64(c.key_offsets + 8 * i), end);
  ref.key = absl::string_view(c.keys + begin, end - begin);
  const uint64_t size = Load64(c.sizes + 8 * i);
  if (size != internal_index::kUnknownSize) ref.size = size;
  if (c.etag_offsets != nullptr) {
    end = std::min(Load64(c.etag_offsets + 8 * (i + 1)), c.etag_bytes);
    begin = std::min(Load64(c.etag_offsets + 8 * i), end);
    ref.etag = absl::string_view(c.etags + begin, end - begin);
  }
  return ref;
}

std::vector<SampleEntry> SampleIndex::ToEntries() const {
  std::vector<SampleEntry> out;
  out.reserve(size());
  for (size_t i = 0; i < size(); ++i) out.push_back((*this)[i]);
  return out;
}

std::string SampleIndex::Fingerprint() const { return HexLower(columns_->fingerprint); }

const std::string& SampleIndex::path() const { return columns_->path; }

uint64_t SampleIndex::memory_bytes() const { return columns_->heap_bytes; }

absl::StatusOr<SampleIndex> SampleIndex::OpenFile(const std::string& path) {
  WHARF_ASSIGN_OR_RETURN(std::shared_ptr<const Columns> columns, internal_index::MapFile(path));
  return SampleIndex(std::move(columns));
}

absl::StatusOr<SampleIndex> SampleIndex::FromBytes(std::string bytes) {
  auto columns = std::make_shared<ImageColumns>();
  columns->image = std::move(bytes);
  columns->heap_bytes = columns->image.capacity();
  WHARF_RETURN_IF_ERROR(internal_index::BindImage(columns->image.data(), columns->image.size(),
                                                  "index bytes", *columns));
  return SampleIndex(std::shared_ptr<const Columns>(std::move(columns)));
}

std::string SampleIndex::Serialize() const {
  const Columns& c = *columns_;
  internal_index::Header h;
  h.count = c.count;
  h.key_bytes = c.key_bytes;
  h.etag_bytes = c.etag_bytes;
  h.has_etags = c.etag_offsets != nullptr;
  h.fingerprint = c.fingerprint;
  const internal_index::Layout l = internal_index::LayoutOf(h);
  std::string out(l.file_size, '\0');
  std::memcpy(out.data(), internal_index::EncodeHeader(h).data(), internal_index::kHeaderSize);
  std::memcpy(out.data() + l.keys, c.keys, c.key_bytes);
  std::memcpy(out.data() + l.key_offsets, c.key_offsets, 8 * (c.count + 1));
  std::memcpy(out.data() + l.sizes, c.sizes, 8 * c.count);
  if (h.has_etags) {
    std::memcpy(out.data() + l.etags, c.etags, c.etag_bytes);
    std::memcpy(out.data() + l.etag_offsets, c.etag_offsets, 8 * (c.count + 1));
  }
  return out;
}

absl::Status SampleIndex::Verify() const {
  const Columns& c = *columns_;
  const std::string what =
      c.path.empty() ? std::string("index") : absl::StrCat("index file ", c.path);
  auto check = [&](const char* offsets, uint64_t bytes, absl::string_view column) {
    uint64_t previous = 0;
    for (uint64_t i = 0; i <= c.count; ++i) {
      const uint64_t o = Load64(offsets + 8 * i);
      if (o < previous || o > bytes) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": corrupt ", column,
                                                       " offset of entry ", i, " (", o,
                                                       "; delete the file to rebuild it)"));
      }
      previous = o;
    }
    return absl::OkStatus();
  };
  WHARF_RETURN_IF_ERROR(check(c.key_offsets, c.key_bytes, "key"));
  if (c.etag_offsets != nullptr) WHARF_RETURN_IF_ERROR(check(c.etag_offsets, c.etag_bytes, "ETag"));
  Md5 md5;
  for (uint64_t i = 0; i < c.count; ++i) FingerprintKey(md5, Ref(i).key);
  if (md5.Finish() != c.fingerprint) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the keys do not match the recorded fingerprint (delete the file to rebuild it)"));
  }
  return absl::OkStatus();
}

// ---- Building from a listing or a manifest ----

std::string DefaultIndexCacheDir() {
  if (const char* dir = std::getenv("WHARF_INDEX_CACHE"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/wharf/index");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return absl::StrCat(home, "/.cache/wharf/index");
  }
  return "";
}

namespace {

// Cache entries not opened for a week (superseded manifest versions and listings, datasets
// no longer used) are removed when a new one is published.
constexpr int64_t kStaleSeconds = 7 * 24 * 3600;

std::string JoinedSuffixes(const std::vector<std::string>& suffixes) {
  std::string out;
  for (const std::string& s : suffixes) absl::StrAppend(&out, s.size(), ":", s, ";");
  return out;
}

}  // namespace

absl::StatusOr<SampleIndex> SampleIndex::FromListing(ObjectStore& store, absl::string_view prefix,
                                                     const ListingIndexOptions& options) {
  const std::string uri = store.Uri(prefix);
  const IndexCacheOptions& cache = options.cache;
  std::string name_prefix;
  if (!cache.dir.empty()) {
    WHARF_RETURN_IF_ERROR(
        Annotate(internal_index::MakeDirs(cache.dir), absl::StrCat("indexing ", uri)));
    name_prefix =
        absl::StrCat("l-",
                     internal_index::CacheDigest({"listing", "v1", cache.scope, uri,
                                                  JoinedSuffixes(options.suffixes),
                                                  options.keep_directory_markers ? "1" : "0"})
                         .substr(0, 16),
                     "-");
  }
  ListOptions range;
  range.prefix = std::string(prefix);
  auto listed = ParallelListAll(store, range, options.list);
  if (!listed.ok()) return Annotate(listed.status(), absl::StrCat("indexing ", uri));
  SampleIndexBuilder builder;
  if (!cache.dir.empty()) {
    auto file = SampleIndexBuilder::ToFile(cache.dir, name_prefix);
    if (!file.ok()) return Annotate(file.status(), absl::StrCat("indexing ", uri));
    builder = *std::move(file);
  }
  // ParallelListAll sorts by key, so the order is the same for any number of workers.
  for (ObjectMeta& meta : *listed) {
    // A directory marker is an empty object whose key ends in '/'. A key ending in '/' that
    // holds data is not a marker: it is kept, like any object (never dropped silently).
    if (!options.keep_directory_markers && absl::EndsWith(meta.key, "/") && meta.size == 0) {
      continue;
    }
    if (!options.suffixes.empty()) {
      bool match = false;
      for (const std::string& suffix : options.suffixes) {
        if (absl::EndsWith(meta.key, suffix)) {
          match = true;
          break;
        }
      }
      if (!match) continue;
    }
    WHARF_RETURN_IF_ERROR(
        Annotate(builder.Add(meta.key, meta.size, meta.etag), absl::StrCat("indexing ", uri)));
  }
  listed->clear();
  listed->shrink_to_fit();
  if (cache.dir.empty()) return builder.Finish();
  std::string name;
  auto index = builder.FinishFile(
      [&](absl::string_view digest) {
        name = absl::StrCat(name_prefix, digest.substr(0, 32), internal_index::kFileSuffix);
        return absl::StrCat(cache.dir, "/", name);
      },
      /*replace=*/false);
  if (!index.ok()) return Annotate(index.status(), absl::StrCat("indexing ", uri));
  internal_index::RemoveStale(cache.dir, name, kStaleSeconds);
  return index;
}

namespace {

// Streams the manifest into `builder`: one GET, parsed as it arrives.
absl::Status ReadManifest(ObjectStore& store, const std::string& manifest_key,
                          const std::string& if_match, ManifestFormat format,
                          SampleIndexBuilder& builder) {
  const size_t slash = manifest_key.rfind('/');
  const std::string base =
      slash == std::string::npos ? std::string() : manifest_key.substr(0, slash + 1);
  const std::string root = store.Uri("");
  const std::string name = store.Uri(manifest_key);
  ManifestParser parser(base, root, name, format, builder);
  ParserSink sink(parser);
  GetRequest request;
  request.key = manifest_key;
  request.sink = &sink;
  request.if_match = if_match;
  auto got = store.Get(request);
  if (!sink.parse_error().ok()) return sink.parse_error();
  if (!got.ok()) return Annotate(got.status(), absl::StrCat("reading manifest ", name));
  return parser.Finish();
}

const char* FormatName(ManifestFormat f) {
  switch (f) {
    case ManifestFormat::kKeys:
      return "keys";
    case ManifestFormat::kJsonLines:
      return "jsonl";
    case ManifestFormat::kAuto:
      break;
  }
  return "auto";
}

}  // namespace

absl::StatusOr<SampleIndex> SampleIndex::FromManifest(ObjectStore& store,
                                                      const std::string& manifest_key,
                                                      const ManifestOptions& options) {
  const std::string uri = store.Uri(manifest_key);
  const IndexCacheOptions& cache = options.cache;
  if (cache.dir.empty()) {
    SampleIndexBuilder builder;
    WHARF_RETURN_IF_ERROR(ReadManifest(store, manifest_key, "", options.format, builder));
    return builder.Finish();
  }
  // The manifest's version names the file: a changed manifest is a new file, never a stale
  // index.
  auto meta = store.Head(manifest_key);
  if (!meta.ok()) return Annotate(meta.status(), absl::StrCat("reading manifest ", uri));
  if (meta->etag.empty()) {  // no version to name a file by: build in memory
    SampleIndexBuilder builder;
    WHARF_RETURN_IF_ERROR(ReadManifest(store, manifest_key, "", options.format, builder));
    return builder.Finish();
  }
  const std::string context = absl::StrCat("indexing manifest ", uri);
  WHARF_RETURN_IF_ERROR(Annotate(internal_index::MakeDirs(cache.dir), context));
  const std::string name_prefix = absl::StrCat(
      "m-",
      internal_index::CacheDigest({"manifest", "v1", cache.scope, uri, FormatName(options.format)})
          .substr(0, 16),
      "-");
  const std::string name = absl::StrCat(
      name_prefix,
      internal_index::CacheDigest({meta->etag, absl::StrCat(meta->size)}).substr(0, 32),
      internal_index::kFileSuffix);
  const std::string path = absl::StrCat(cache.dir, "/", name);
  if (auto cached = OpenFile(path); cached.ok()) return cached;
  // One process of the node builds; the others wait here and then map its file. Best effort:
  // where no lock can be taken (a read-only cache, a file system without flock), processes
  // may build side by side, and the last rename wins with the same contents.
  auto lock = internal_index::FileLock::Acquire(absl::StrCat(path, ".lock"));
  if (auto cached = OpenFile(path); cached.ok()) return cached;
  auto builder = SampleIndexBuilder::ToFile(cache.dir, name_prefix);
  if (!builder.ok()) return Annotate(builder.status(), context);
  WHARF_RETURN_IF_ERROR(ReadManifest(store, manifest_key, meta->etag, options.format, *builder));
  auto index = builder->FinishFile([&](absl::string_view) { return path; }, /*replace=*/true);
  if (!index.ok()) return Annotate(index.status(), context);
  internal_index::RemoveStale(cache.dir, name, kStaleSeconds);
  return index;
}

absl::StatusOr<SampleIndex> SampleIndex::ParseManifest(absl::string_view text,
                                                       absl::string_view base_prefix,
                                                       absl::string_view store_root_uri,
                                                       absl::string_view manifest_name,
                                                       const ManifestOptions& options) {
  SampleIndexBuilder builder;
  ManifestParser parser(base_prefix, store_root_uri, manifest_name, options.format, builder);
  WHARF_RETURN_IF_ERROR(parser.Feed(text));
  WHARF_RETURN_IF_ERROR(parser.Finish());
  return builder.Finish();
}

}  // namespace wharf
