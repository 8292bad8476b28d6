#include "formats/byte_stream.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace wharf {

absl::string_view CompressionName(Compression c) {
  switch (c) {
    case Compression::kAuto:
      return "auto";
    case Compression::kNone:
      return "none";
    case Compression::kGzip:
      return "gzip";
    case Compression::kZlib:
      return "zlib";
  }
  return "?";
}

absl::StatusOr<Compression> ParseCompression(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower.empty() || lower == "auto") return Compression::kAuto;
  if (lower == "none") return Compression::kNone;
  if (lower == "gzip") return Compression::kGzip;
  if (lower == "zlib") return Compression::kZlib;
  return absl::InvalidArgumentError(
      absl::StrCat("compression \"", name,
                   "\": expected \"auto\" (by the object's name), \"none\", "
                   "\"gzip\" or \"zlib\""));
}

Compression ResolveCompression(Compression requested, absl::string_view key) {
  if (requested != Compression::kAuto) return requested;
  if (absl::EndsWith(key, ".gz") || absl::EndsWith(key, ".tgz")) return Compression::kGzip;
  if (absl::EndsWith(key, ".zlib")) return Compression::kZlib;
  return Compression::kNone;
}

std::optional<absl::string_view> SniffCompression(absl::string_view head, bool zlib_too) {
  const auto starts = [&](absl::string_view magic) { return absl::StartsWith(head, magic); };
  if (starts("\x1f\x8b")) return "gzip";
  if (starts("BZh")) return "bzip2";
  if (starts(absl::string_view("\xfd"
                               "7zXZ\0",
                               6)))
    return "xz";
  if (starts("\x28\xb5\x2f\xfd")) return "zstd";
  if (zlib_too && head.size() >= 2) {
    // RFC 1950: CM 8 (deflate), a window of at most 32 KiB, and CMF*256+FLG a multiple of 31.
    const auto cmf = static_cast<unsigned char>(head[0]);
    const auto flg = static_cast<unsigned char>(head[1]);
    if ((cmf & 0x0f) == 8 && (cmf >> 4) <= 7 && (cmf * 256 + flg) % 31 == 0) return "zlib";
  }
  return std::nullopt;
}

// zlib's state and the output buffer of an inflating stream.
class ByteStream::Inflater {
 public:
  explicit Inflater(Compression compression) : compression_(compression) {
    std::memset(&z_, 0, sizeof(z_));
    // 15 + 16: a gzip wrapper only (not zlib's auto-detection, which would also take a zlib
    // stream for a gzip one); 15: a zlib wrapper.
    init_ = inflateInit2(&z_, compression == Compression::kGzip ? 15 + 16 : 15);
  }
  ~Inflater() {
    if (init_ == Z_OK) inflateEnd(&z_);
  }

  const Compression compression_;
  z_stream z_;
  int init_;
  std::unique_ptr<char[]> out_ = std::make_unique<char[]>(kInflateBufferBytes);
  size_t begin_ = 0, end_ = 0;  // the unconsumed output: out_[begin_, end_)
  bool member_ended_ = false;   // the last gzip member (or the zlib stream) ended
  bool padded_ = false;         // zero padding followed it: only more zeros may come
  bool done_ = false;           // nothing more comes: the object ended after a whole stream
  absl::Status error_;          // found while inflating; returned once out_ is consumed
};

std::unique_ptr<ByteStream> ByteStream::Stored(std::unique_ptr<ObjectReader> reader) {
  return std::unique_ptr<ByteStream>(new ByteStream(std::move(reader), Compression::kNone, 0));
}

std::unique_ptr<ByteStream> ByteStream::Inflating(std::unique_ptr<ObjectReader> reader,
                                                  Compression compression, uint64_t skip) {
  return std::unique_ptr<ByteStream>(new ByteStream(std::move(reader), compression, skip));
}

absl::StatusOr<std::unique_ptr<ByteStream>> ByteStream::Open(const RecordObject& object,
                                                             ObjectReaderOptions io,
                                                             Compression compression) {
  compression = ResolveCompression(compression, object.key);
  if (compression == Compression::kNone) {
    WHARF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> reader, object.Open(std::move(io)));
    return Stored(std::move(reader));
  }
  if (io.length.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("read ", object.store->Uri(object.key), ": a byte range of a ",
                     CompressionName(compression), "-compressed object cannot be read"));
  }
  const uint64_t skip = io.offset;
  io.offset = 0;
  WHARF_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> reader, object.Open(std::move(io)));
  return Inflating(std::move(reader), compression, skip);
}

ByteStream::ByteStream(std::unique_ptr<ObjectReader> reader, Compression compression, uint64_t skip)
    : reader_(std::move(reader)), compression_(compression), skip_(skip) {
  if (compressed()) {
    inflater_ = std::make_unique<Inflater>(compression);
    if (inflater_->init_ != Z_OK) {
      status_ = absl::ResourceExhaustedError(
          absl::StrCat("starting to inflate ", reader_->uri(), ": zlib error ", inflater_->init_));
    }
  }
}

ByteStream::~ByteStream() = default;

uint64_t ByteStream::position() const { return compressed() ? pos_ + skip_ : reader_->position(); }

std::optional<uint64_t> ByteStream::remaining() const {
  if (compressed()) return std::nullopt;
  return reader_->remaining();
}

std::string ByteStream::DescribeEnd(uint64_t end) const {
  if (compressed()) {
    return absl::StrCat("the ", CompressionName(compression_), "-decompressed stream ends at byte ",
                        end);
  }
  return absl::StrCat("the object ends at byte ", end);
}

absl::Status ByteStream::Fail(absl::StatusCode code, absl::string_view what) {
  status_ = absl::Status(code, what);
  return status_;
}

absl::Status ByteStream::Fill() {
  Inflater& f = *inflater_;
  const absl::string_view kind = CompressionName(compression_);
  while (f.begin_ == f.end_ && !f.done_) {
    if (!f.error_.ok()) {
      status_ = f.error_;
      return status_;
    }
    auto view = reader_->Peek();
    if (!view.ok()) {
      status_ = view.status();
      return status_;
    }
    if (f.member_ended_) {
      // Between gzip members, or after the zlib stream: only the end of the object, zero
      // padding (gzip), or the next gzip member may follow.
      if (view->empty()) {
        f.done_ = true;
        break;
      }
      if (compression_ == Compression::kGzip) {
        const size_t zeros = view->find_first_not_of('\0');
        if (zeros == absl::string_view::npos) {
          reader_->Consume(view->size());
          f.padded_ = true;
          continue;
        }
        if (zeros == 0 && (*view)[0] == '\x1f' && !f.padded_) {
          inflateReset(&f.z_);
          f.member_ended_ = false;
          continue;
        }
        reader_->Consume(zeros);
        // Zeros followed by other bytes, a member after the padding included: garbage,
        // wherever the object's chunks happened to end (the padding ends the stream).
      }
      return Fail(absl::StatusCode::kDataLoss,
                  absl::StrCat("bytes after the end of the ", kind, " stream at compressed byte ",
                               reader_->position(), " of ", reader_->end(), ": not one ", kind,
                               " stream, or corrupt"));
    }
    if (view->empty()) {
      return Fail(absl::StatusCode::kDataLoss,
                  absl::StrCat("the ", kind, " stream is cut short: the object ends at byte ",
                               reader_->end(), " before the stream does (truncated)"));
    }
    f.z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(view->data()));
    f.z_.avail_in = static_cast<uInt>(std::min<size_t>(view->size(), uint64_t{1} << 30));
    f.begin_ = f.end_ = 0;
    f.z_.next_out = reinterpret_cast<Bytef*>(f.out_.get());
    f.z_.avail_out = static_cast<uInt>(kInflateBufferBytes);
    const size_t offered = f.z_.avail_in;
    const int ret = inflate(&f.z_, Z_NO_FLUSH);
    reader_->Consume(offered - f.z_.avail_in);
    f.end_ = kInflateBufferBytes - f.z_.avail_out;
    // An error comes after the bytes inflated before it, so that what is returned before the
    // error does not depend on where the object's chunks happened to end.
    switch (ret) {
      case Z_OK:
      case Z_BUF_ERROR:  // no progress possible with this input: more comes next round
        break;
      case Z_STREAM_END:
        f.member_ended_ = true;
        break;
      case Z_NEED_DICT:
        f.error_ = absl::UnimplementedError(
            absl::StrCat("the ", kind, " stream needs a preset dictionary"));
        break;
      case Z_MEM_ERROR:
        f.error_ = absl::ResourceExhaustedError(
            absl::StrCat("inflating the ", kind, " stream: out of memory"));
        break;
      default:  // Z_DATA_ERROR, Z_STREAM_ERROR
        f.error_ = absl::DataLossError(
            absl::StrCat("corrupt ", kind, " data near compressed byte ", reader_->position(), ": ",
                         f.z_.msg != nullptr ? f.z_.msg : "inflate failed"));
        break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::string_view> ByteStream::Peek() {
  if (!status_.ok()) return status_;
  if (!compressed()) {
    auto view = reader_->Peek();
    if (!view.ok()) status_ = view.status();
    return view;
  }
  Inflater& f = *inflater_;
  while (true) {
    WHARF_RETURN_IF_ERROR(Fill());
    const absl::string_view view(f.out_.get() + f.begin_, f.end_ - f.begin_);
    if (skip_ == 0 || view.empty()) {
      if (skip_ > 0) {
        return Fail(
            absl::StatusCode::kOutOfRange,
            absl::StrCat("offset ", pos_ + skip_, " is past the end of the ",
                         CompressionName(compression_), "-decompressed stream (", pos_, " bytes)"));
      }
      return view;
    }
    const size_t n = static_cast<size_t>(std::min<uint64_t>(skip_, view.size()));
    skip_ -= n;
    Consume(n);
  }
}

void ByteStream::Consume(size_t n) {
  if (!compressed()) {
    reader_->Consume(n);
    return;
  }
  inflater_->begin_ += n;
  pos_ += n;
}

absl::StatusOr<size_t> ByteStream::Read(absl::Span<char> dst) {
  if (!status_.ok()) return status_;
  if (!compressed()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(dst.size(), reader_->remaining()));
    if (absl::Status s = reader_->ReadExact(dst.subspan(0, n)); !s.ok()) {
      status_ = s;
      return s;
    }
    return n;
  }
  size_t done = 0;
  while (done < dst.size()) {
    WHARF_ASSIGN_OR_RETURN(absl::string_view view, Peek());
    if (view.empty()) break;
    const size_t n = std::min(view.size(), dst.size() - done);
    std::memcpy(dst.data() + done, view.data(), n);
    Consume(n);
    done += n;
  }
  return done;
}

absl::StatusOr<absl::Cord> ByteStream::ReadCord(uint64_t n) {
  if (!status_.ok()) return status_;
  if (!compressed()) {
    auto cord = reader_->ReadCord(std::min(n, reader_->remaining()));
    if (!cord.ok()) status_ = cord.status();
    return cord;
  }
  constexpr size_t kPiece = size_t{1} << 20;
  absl::Cord out;
  std::string piece;
  uint64_t left = n;
  while (left > 0) {
    WHARF_ASSIGN_OR_RETURN(absl::string_view view, Peek());
    if (view.empty()) break;
    const size_t take = static_cast<size_t>(std::min<uint64_t>(left, view.size()));
    if (piece.empty()) piece.reserve(static_cast<size_t>(std::min<uint64_t>(left, kPiece)));
    piece.append(view.data(), take);
    Consume(take);
    left -= take;
    if (piece.size() >= kPiece) {
      out.Append(std::move(piece));
      piece = std::string();
    }
  }
  if (!piece.empty()) out.Append(std::move(piece));
  return out;
}

absl::StatusOr<uint64_t> ByteStream::Skip(uint64_t n) {
  if (!status_.ok()) return status_;
  if (!compressed()) {
    const uint64_t m = std::min(n, reader_->remaining());
    if (absl::Status s = reader_->Skip(m); !s.ok()) {
      status_ = s;
      return s;
    }
    return m;
  }
  uint64_t done = 0;
  while (done < n) {
    WHARF_ASSIGN_OR_RETURN(absl::string_view view, Peek());
    if (view.empty()) break;
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n - done, view.size()));
    Consume(take);
    done += take;
  }
  return done;
}

}  // namespace wharf
