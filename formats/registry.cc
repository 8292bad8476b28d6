#include "formats/registry.h"

#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "formats/lines.h"
#include "formats/tar.h"
#include "formats/tfrecord.h"

namespace wharf {
namespace {

// The builtin formats: a new format adds its line here (and its files to CMakeLists.txt).
// A table rather than self-registering objects in each format's .cc: a static library drops
// object files nothing references, and their registrations with them.
std::deque<RecordFormatSpec> BuiltinFormats() {
  std::deque<RecordFormatSpec> builtins;
  // Compressed objects are read by their name (byte_stream.h: ".gz"/".tgz" gzip, ".zlib").
  builtins.push_back(
      {"tar", {".tar"}, RecordShape::kFields, false, OpenTarRecordReader, {".tar.gz", ".tgz"}});
  builtins.push_back({"tfrecord",
                      {".tfrecord", ".tfrecords"},
                      RecordShape::kPayload,
                      false,
                      OpenTFRecordRecordReader,
                      {".tfrecord.gz", ".tfrecords.gz", ".tfrecord.zlib", ".tfrecords.zlib"}});
  builtins.push_back({"csv", {".csv"}, RecordShape::kPayload, true, OpenCsvRecordReader});
  builtins.push_back({"jsonl",
                      {".jsonl", ".json", ".ndjson"},
                      RecordShape::kPayload,
                      true,
                      OpenJsonLinesRecordReader});
  return builtins;
}

class Registry {
 public:
  static Registry& Get() {
    static Registry* const registry = new Registry;  // never destroyed: specs outlive callers
    return *registry;
  }

  Registry() : specs_(BuiltinFormats()) {}

  std::vector<const RecordFormatSpec*> All() {
    absl::MutexLock lock(&mu_);
    std::vector<const RecordFormatSpec*> out;
    for (const RecordFormatSpec& spec : specs_) out.push_back(&spec);
    return out;
  }

  const RecordFormatSpec* Find(absl::string_view name) {
    absl::MutexLock lock(&mu_);
    return FindLocked(name);
  }

  absl::Status Add(RecordFormatSpec spec) {
    if (spec.name.empty() || !spec.open) {
      return absl::InvalidArgumentError(absl::StrCat("registering record format \"", spec.name,
                                                     "\": it needs a name and an opener"));
    }
    absl::MutexLock lock(&mu_);
    if (FindLocked(spec.name) != nullptr) {
      return absl::AlreadyExistsError(
          absl::StrCat("registering record format \"", spec.name, "\": the name is taken"));
    }
    specs_.push_back(std::move(spec));  // a deque: the others stay where they are
    return absl::OkStatus();
  }

 private:
  const RecordFormatSpec* FindLocked(absl::string_view name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const RecordFormatSpec& spec : specs_) {
      if (spec.name == name) return &spec;
    }
    return nullptr;
  }

  absl::Mutex mu_;
  std::deque<RecordFormatSpec> specs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::vector<const RecordFormatSpec*> RecordFormats() { return Registry::Get().All(); }

absl::StatusOr<const RecordFormatSpec*> FindRecordFormat(absl::string_view name) {
  if (const RecordFormatSpec* spec = Registry::Get().Find(name)) return spec;
  // e.g. record format "zip": expected "tar", "tfrecord", "csv" or "jsonl"
  const std::vector<const RecordFormatSpec*> all = RecordFormats();
  std::string known;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i > 0) absl::StrAppend(&known, i + 1 == all.size() ? " or " : ", ");
    absl::StrAppend(&known, "\"", all[i]->name, "\"");
  }
  return absl::InvalidArgumentError(absl::StrCat("record format \"", name, "\": expected ", known));
}

absl::Status RegisterRecordFormat(RecordFormatSpec spec) {
  return Registry::Get().Add(std::move(spec));
}

absl::StatusOr<std::unique_ptr<RecordReader>> OpenRecordReader(absl::string_view format,
                                                               const RecordObject& object,
                                                               const RecordReaderOptions& options) {
  WHARF_ASSIGN_OR_RETURN(const RecordFormatSpec* spec, FindRecordFormat(format));
  return spec->open(object, options);
}

}  // namespace wharf
