#include "formats/tar.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace wharf {
namespace {

constexpr size_t kBlock = 512;

// Field offsets in a header block (POSIX ustar; GNU reuses the prefix area for other fields).
constexpr size_t kNameOffset = 0, kNameLen = 100;
constexpr size_t kSizeOffset = 124, kSizeLen = 12;
constexpr size_t kChecksumOffset = 148, kChecksumLen = 8;
constexpr size_t kTypeOffset = 156;
constexpr size_t kMagicOffset = 257;
constexpr size_t kPrefixOffset = 345, kPrefixLen = 155;

uint64_t Padding(uint64_t size) { return (kBlock - size % kBlock) % kBlock; }

absl::string_view CString(const char* field, size_t len) {
  const void* nul = std::memchr(field, '\0', len);
  return absl::string_view(field, nul != nullptr ? static_cast<const char*>(nul) - field : len);
}

// A numeric field: octal digits (optionally space-padded, ended by NUL or space), or GNU's
// base-256 form (high bit of the first byte set) for values that do not fit.
std::optional<uint64_t> ParseNumber(const char* field, size_t len) {
  const auto* p = reinterpret_cast<const unsigned char*>(field);
  if (p[0] & 0x80) {
    if (p[0] == 0xff) return std::nullopt;  // negative
    uint64_t v = p[0] & 0x7f;
    for (size_t i = 1; i < len; ++i) {
      if (v >> 56) return std::nullopt;
      v = (v << 8) | p[i];
    }
    return v;
  }
  size_t i = 0;
  while (i < len && p[i] == ' ') ++i;
  uint64_t v = 0;
  for (; i < len && p[i] != ' ' && p[i] != '\0'; ++i) {
    if (p[i] < '0' || p[i] > '7' || (v >> 61) != 0) return std::nullopt;
    v = v * 8 + (p[i] - '0');
  }
  for (; i < len; ++i) {
    if (p[i] != ' ' && p[i] != '\0') return std::nullopt;
  }
  return v;
}

std::string Octal(uint64_t v) {
  std::string out;
  do {
    out.insert(out.begin(), static_cast<char>('0' + (v & 7)));
    v >>= 3;
  } while (v != 0);
  return out;
}

bool AllZero(const char* block) {
  return std::all_of(block, block + kBlock, [](char c) { return c == '\0'; });
}

// Pax extended header records: "<length> <key>=<value>\n", length counting the whole record.
// Returns an error message, or "" when well formed.
std::string ParsePax(absl::string_view data, std::optional<std::string>* path, bool* has_size,
                     uint64_t* size, bool* sparse) {
  while (!data.empty()) {
    if (std::all_of(data.begin(), data.end(), [](char c) { return c == '\0'; })) break;
    const size_t space = data.find(' ');
    uint64_t len = 0;
    if (space == absl::string_view::npos || space == 0 ||
        !absl::SimpleAtoi(data.substr(0, space), &len) || len <= space + 1 || len > data.size() ||
        data[len - 1] != '\n') {
      return "malformed pax extended header record";
    }
    const absl::string_view record = data.substr(space + 1, len - space - 2);
    data.remove_prefix(len);
    const size_t eq = record.find('=');
    if (eq == absl::string_view::npos) return "malformed pax extended header record";
    const absl::string_view key = record.substr(0, eq);
    const absl::string_view value = record.substr(eq + 1);
    if (key == "path") {
      *path = std::string(value);
    } else if (key == "size") {
      if (!absl::SimpleAtoi(value, size)) return absl::StrCat("bad pax size '", value, "'");
      *has_size = true;
    } else if (absl::StartsWith(key, "GNU.sparse.")) {
      *sparse = true;
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<TarReader>> TarReader::Open(std::shared_ptr<ObjectStore> store,
                                                           std::string key, TarOptions options) {
  const std::string uri = store->Uri(key);
  auto stream = ByteStream::Open(RecordObject{std::move(store), std::move(key), std::nullopt},
                                 options.io, options.compression);
  if (!stream.ok()) return Annotate(stream.status(), absl::StrCat("read tar ", uri));
  return std::make_unique<TarReader>(*std::move(stream), options);
}

TarReader::TarReader(std::unique_ptr<ByteStream> stream, TarOptions options)
    : stream_(std::move(stream)), options_(options) {}

absl::Status TarReader::Fail(absl::StatusCode code, uint64_t at, absl::string_view what) {
  status_ =
      absl::Status(code, absl::StrCat("read tar ", stream_->uri(), " at byte ", at, ": ", what));
  return status_;
}

absl::Status TarReader::IoError(const absl::Status& status, uint64_t at) {
  status_ = Annotate(status, absl::StrCat("read tar ", stream_->uri(), " at byte ", at));
  return status_;
}

absl::Status TarReader::ReadSmall(uint64_t at, uint64_t size, std::string* out) {
  if (size > options_.max_extended_header_bytes) {
    return Fail(
        absl::StatusCode::kResourceExhausted, at,
        absl::StrCat("extended header of ", size, " bytes exceeds max_extended_header_bytes (",
                     options_.max_extended_header_bytes, ")"));
  }
  const uint64_t start = stream_->position();
  out->resize(size);
  auto got = stream_->Read(absl::MakeSpan(*out));
  if (!got.ok()) return IoError(got.status(), at);
  if (*got < size) {
    return Fail(absl::StatusCode::kDataLoss, at,
                absl::StrCat("truncated extended header: ", size, " bytes at byte ", start, ", ",
                             stream_->DescribeEnd(stream_->position())));
  }
  return SkipPadding(at, size);
}

absl::Status TarReader::SkipPadding(uint64_t at, uint64_t size) {
  // The archive cut inside a member's padding loses every member after it: as tarfile and
  // GNU tar, an error, not an archive that ends there.
  const uint64_t padding = Padding(size);
  const uint64_t start = stream_->position();
  auto skipped = stream_->Skip(padding);
  if (!skipped.ok()) return IoError(skipped.status(), at);
  if (*skipped < padding) {
    return Fail(absl::StatusCode::kDataLoss, at,
                absl::StrCat("truncated archive: ", padding, " bytes of padding at byte ", start,
                             ", ", stream_->DescribeEnd(stream_->position())));
  }
  return absl::OkStatus();
}

absl::Status TarReader::SkipData(uint64_t at, uint64_t size) {
  const uint64_t start = stream_->position();
  const auto truncated = [&](uint64_t end) {
    return Fail(absl::StatusCode::kDataLoss, at,
                absl::StrCat("truncated entry: ", size, " data bytes at byte ", start, ", ",
                             stream_->DescribeEnd(end)));
  };
  if (const auto left = stream_->remaining(); left && *left < size) return truncated(start + *left);
  auto skipped = stream_->Skip(size);
  if (!skipped.ok()) return IoError(skipped.status(), at);
  if (*skipped < size) return truncated(stream_->position());
  return SkipPadding(at, size);
}

absl::Status TarReader::NotATarHeader(uint64_t at, const char* block, uint64_t unsigned_sum) {
  if (at == 0 && !stream_->compressed()) {
    const auto kind = SniffCompression(absl::string_view(block, kBlock), /*zlib_too=*/false);
    if (kind == "gzip") {
      return Fail(absl::StatusCode::kInvalidArgument, at,
                  "the shard is gzip-compressed but was read as an uncompressed tar: name it "
                  ".tar.gz or .tgz, or read it with compression gzip");
    }
    if (kind) {
      return Fail(absl::StatusCode::kUnimplemented, at,
                  absl::StrCat("the shard is ", *kind,
                               "-compressed; wharf reads uncompressed and gzip-compressed "
                               "(.tar.gz, .tgz) tar shards"));
    }
  }
  return Fail(
      absl::StatusCode::kDataLoss, at,
      absl::StrCat("header checksum mismatch (stored '",
                   absl::CEscape(absl::string_view(block + kChecksumOffset, kChecksumLen)),
                   "', computed ", Octal(unsigned_sum), "): not a tar archive, or corrupt"));
}

absl::StatusOr<std::optional<TarMember>> TarReader::Next() {
  if (!status_.ok()) return status_;
  if (done_) return std::nullopt;
  // What extended entries ('L', 'x') said about the member that follows them.
  std::optional<std::string> long_name, pax_path;
  // (Not std::optional: GCC 12 warns, wrongly, that its value may be used uninitialized.)
  bool has_pax_size = false;
  uint64_t pax_size = 0;
  bool pax_sparse = false;
  uint64_t first = stream_->position();  // the member's first header
  while (true) {
    const uint64_t at = stream_->position();
    const bool extended = long_name || pax_path || has_pax_size || pax_sparse;
    char block[kBlock];
    auto got = stream_->Read(absl::MakeSpan(block));
    if (!got.ok()) return IoError(got.status(), at);
    if (*got == 0) {
      // An empty object is no archive (a failed or cut upload, most likely): tarfile says
      // "empty file", GNU tar "does not look like a tar archive". An empty archive still has
      // its end-of-archive blocks.
      if (at == 0) {
        return Fail(absl::StatusCode::kDataLoss, 0,
                    "the object is empty: not a tar archive (an empty archive has its "
                    "end-of-archive blocks)");
      }
      // No end-of-archive blocks: accepted, as tarfile and GNU tar do.
      if (extended) {
        return Fail(absl::StatusCode::kDataLoss, first,
                    "the archive ends after an extended header, before its member");
      }
      done_ = true;
      return std::nullopt;
    }
    if (*got < kBlock) {
      // Shorter than one header at the start: a small compressed shard named as a plain tar
      // says so (its signature is in the first bytes), as a longer one does.
      if (at == 0 && !stream_->compressed() &&
          SniffCompression(absl::string_view(block, *got), /*zlib_too=*/false)) {
        std::memset(block + *got, 0, kBlock - *got);
        return NotATarHeader(at, block, 0);
      }
      return Fail(absl::StatusCode::kDataLoss, at,
                  absl::StrCat("truncated header: ", *got, " of ", kBlock,
                               " bytes before the end (", stream_->DescribeEnd(at + *got), ")"));
    }
    if (AllZero(block)) {
      if (extended) {
        return Fail(absl::StatusCode::kDataLoss, at,
                    "end-of-archive block after an extended header");
      }
      done_ = true;  // what follows the first zero block is not part of the archive
      return std::nullopt;
    }

    const std::optional<uint64_t> stored = ParseNumber(block + kChecksumOffset, kChecksumLen);
    uint64_t unsigned_sum = 0;
    int64_t signed_sum = 0;
    for (size_t i = 0; i < kBlock; ++i) {
      const bool in_field = i >= kChecksumOffset && i < kChecksumOffset + kChecksumLen;
      unsigned_sum += in_field ? ' ' : static_cast<unsigned char>(block[i]);
      signed_sum += in_field ? ' ' : static_cast<signed char>(block[i]);
    }
    if (!stored || (*stored != unsigned_sum && static_cast<int64_t>(*stored) != signed_sum)) {
      return NotATarHeader(at, block, unsigned_sum);
    }
    const std::optional<uint64_t> size = ParseNumber(block + kSizeOffset, kSizeLen);
    if (!size) {
      return Fail(
          absl::StatusCode::kDataLoss, at,
          absl::StrCat("bad size field '",
                       absl::CEscape(absl::string_view(block + kSizeOffset, kSizeLen)), "'"));
    }
    const char type = block[kTypeOffset];
    switch (type) {
      case 'L': {  // GNU long name of the next member
        std::string name;
        WHARF_RETURN_IF_ERROR(ReadSmall(at, *size, &name));
        long_name = std::string(CString(name.data(), name.size()));
        continue;
      }
      case 'x': {  // pax extended header of the next member
        std::string pax;
        WHARF_RETURN_IF_ERROR(ReadSmall(at, *size, &pax));
        const std::string error = ParsePax(pax, &pax_path, &has_pax_size, &pax_size, &pax_sparse);
        if (!error.empty()) return Fail(absl::StatusCode::kDataLoss, at, error);
        continue;
      }
      case 'K':  // GNU long link name: links are skipped anyway
      case 'g':  // pax global header: no field of it matters for reading members
        WHARF_RETURN_IF_ERROR(SkipData(at, *size));
        continue;
      case 'S':
        return Fail(absl::StatusCode::kUnimplemented, at, "GNU sparse members are not supported");
      default:
        break;
    }

    std::string name;
    if (pax_path) {
      name = *std::move(pax_path);
    } else if (long_name) {
      name = *std::move(long_name);
    } else {
      name = std::string(CString(block + kNameOffset, kNameLen));
      // POSIX ustar ("ustar\0"): a name prefix. GNU ("ustar  \0") keeps other fields there.
      if (std::memcmp(block + kMagicOffset, "ustar\0", 6) == 0) {
        const absl::string_view prefix = CString(block + kPrefixOffset, kPrefixLen);
        if (!prefix.empty()) name = absl::StrCat(prefix, "/", name);
      }
    }
    const uint64_t data_size = has_pax_size ? pax_size : *size;
    const bool regular = type == '0' || type == '7' || (type == '\0' && !absl::EndsWith(name, "/"));
    if (!regular) {
      // Links, devices, directories and FIFOs ('1'-'6') have no data, whatever their size
      // field says (as tarfile reads them); unknown types are skipped with their data.
      if (type < '1' || type > '6') WHARF_RETURN_IF_ERROR(SkipData(at, data_size));
      long_name.reset();
      pax_path.reset();
      has_pax_size = false;
      pax_sparse = false;
      first = stream_->position();
      continue;
    }
    if (pax_sparse) {
      return Fail(absl::StatusCode::kUnimplemented, first, "pax sparse members are not supported");
    }
    if (data_size > options_.max_member_bytes) {
      return Fail(
          absl::StatusCode::kResourceExhausted, at,
          absl::StrCat("member '", name, "' of ", data_size, " bytes exceeds max_member_bytes (",
                       options_.max_member_bytes, ")"));
    }
    TarMember member;
    member.header_offset = first;
    member.data_offset = stream_->position();
    const auto truncated = [&](uint64_t end) {
      return Fail(absl::StatusCode::kDataLoss, at,
                  absl::StrCat("truncated member '", name, "': ", data_size, " data bytes at byte ",
                               member.data_offset, ", ", stream_->DescribeEnd(end)));
    };
    if (const auto left = stream_->remaining(); left && *left < data_size) {
      return truncated(member.data_offset + *left);  // known before reading: nothing read
    }
    auto data = stream_->ReadCord(data_size);
    if (!data.ok()) return IoError(data.status(), at);
    if (data->size() < data_size) return truncated(stream_->position());
    member.data = *std::move(data);
    WHARF_RETURN_IF_ERROR(SkipPadding(at, data_size));
    member.name = std::move(name);
    return member;
  }
}

const absl::Cord* TarSample::Find(absl::string_view extension) const {
  for (const auto& [ext, bytes] : fields) {
    if (ext == extension) return &bytes;
  }
  return nullptr;
}

std::optional<std::pair<absl::string_view, absl::string_view>> SplitSampleName(
    absl::string_view name) {
  // webdataset's base_plus_ext, the regex ^((?:.*/|)[^.]+)[.]([^/]*)$, without a regex
  // engine. The extension ([^/]*) holds no '/', so the dot that splits is in the last
  // component; the key ends in a non-empty run of non-dots ([^.]+) that starts at the name's
  // start or after a '/' ((?:.*/|)), so that dot is the component's first.
  const size_t slash = name.rfind('/');
  const size_t base = slash == absl::string_view::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', base);
  if (dot == absl::string_view::npos) return std::nullopt;
  if (dot == base) {
    // The component starts with '.': [^.]+ must end at the '/' before it, so it is a run
    // of non-dots reaching back to the start or to an earlier '/' with a byte after it.
    if (base == 0) return std::nullopt;  // ".x": no key at all
    const size_t last_dot = name.rfind('.', base - 1);
    if (last_dot != absl::string_view::npos) {
      const size_t earlier = base >= 2 ? name.rfind('/', base - 2) : absl::string_view::npos;
      if (earlier == absl::string_view::npos || earlier < last_dot) return std::nullopt;
    }
  }
  return std::make_pair(name.substr(0, dot), name.substr(dot + 1));
}

bool IsTarMetadataName(absl::string_view name) {
  // webdataset's tar_file_iterator skips "__...__" at the top level and, with its default
  // skip_meta r"__[^/]*__($|/)", such a first component of any path.
  const absl::string_view first = name.substr(0, name.find('/'));
  return first.size() >= 4 && absl::StartsWith(first, "__") && absl::EndsWith(first, "__");
}

absl::StatusOr<std::unique_ptr<TarSampleReader>> TarSampleReader::Open(
    std::shared_ptr<ObjectStore> store, std::string key, TarOptions options) {
  WHARF_ASSIGN_OR_RETURN(auto tar, TarReader::Open(std::move(store), std::move(key), options));
  return std::make_unique<TarSampleReader>(std::move(tar));
}

TarSampleReader::TarSampleReader(std::unique_ptr<TarReader> tar) : tar_(std::move(tar)) {}

absl::StatusOr<std::optional<TarSample>> TarSampleReader::Next() {
  if (!status_.ok()) return status_;
  std::optional<TarSample> sample;
  while (true) {
    std::optional<TarMember> member;
    if (pending_) {
      member = std::move(pending_);
      pending_.reset();
    } else {
      auto next = tar_->Next();
      if (!next.ok()) {
        status_ = next.status();
        return status_;
      }
      member = *std::move(next);
    }
    if (!member) return sample;
    if (IsTarMetadataName(member->name)) continue;
    const auto split = SplitSampleName(member->name);
    if (!split) continue;
    const absl::string_view key = split->first;
    // webdataset lower-cases the extension (Python's str.lower(); ASCII letters here).
    const std::string extension = absl::AsciiStrToLower(split->second);
    if (extension == "__key__" || extension == "__url__" || extension == "__offset__") {
      status_ = absl::InvalidArgumentError(
          absl::StrCat("read tar ", tar_->uri(), " at byte ", member->header_offset, ": member '",
                       member->name, "' has the extension '", extension,
                       "', which names a sample's metadata (webdataset refuses it too)"));
      return status_;
    }
    if (!sample) {
      sample.emplace();
      sample->key = std::string(key);
      sample->offset = member->header_offset;
    } else if (key != sample->key) {
      pending_ = std::move(member);
      return sample;
    }
    if (sample->Find(extension) != nullptr) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat("read tar ", tar_->uri(), " at byte ", member->header_offset, ": sample '",
                       sample->key, "' has two members with extension '", extension,
                       "' (extensions are compared lower-cased, as webdataset does)"));
      return status_;
    }
    sample->fields.emplace_back(extension, std::move(member->data));
  }
}

namespace {

class TarRecordReader : public RecordReader {
 public:
  explicit TarRecordReader(std::unique_ptr<ByteStream> stream)
      : samples_(std::make_unique<TarReader>(std::move(stream))) {}

  absl::StatusOr<std::optional<Record>> Next() override {
    WHARF_ASSIGN_OR_RETURN(std::optional<TarSample> s, samples_.Next());
    if (!s) return std::nullopt;
    Record r;
    r.offset = s->offset;
    r.key = std::move(s->key);
    r.fields = std::move(s->fields);
    return r;
  }
  uint64_t offset() const override { return samples_.offset(); }
  const ObjectReader& reader() const override { return samples_.tar().reader(); }

 private:
  TarSampleReader samples_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RecordReader>> OpenTarRecordReader(
    const RecordObject& object, const RecordReaderOptions& options) {
  WHARF_ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> stream,
                         ByteStream::Open(object, options.io, options.compression));
  return std::make_unique<TarRecordReader>(std::move(stream));
}

}  // namespace wharf
