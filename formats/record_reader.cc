#include "formats/record_reader.h"

#include <utility>

namespace wharf {

Record Record::Payload(uint64_t offset, absl::Cord data) {
  Record r;
  r.offset = offset;
  r.fields.emplace_back(std::string(kDataField), std::move(data));
  return r;
}

const absl::Cord* Record::Find(absl::string_view name) const {
  for (const auto& [field, bytes] : fields) {
    if (field == name) return &bytes;
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<ObjectReader>> RecordObject::Open(ObjectReaderOptions io) const {
  if (meta.has_value()) return ObjectReader::Open(store, *meta, std::move(io));
  return ObjectReader::Open(store, key, std::move(io));
}

absl::StatusOr<std::vector<Record>> RecordReader::NextBatch(size_t n) {
  std::vector<Record> out;
  while (out.size() < n) {
    absl::StatusOr<std::optional<Record>> r = Next();
    if (!r.ok()) {
      if (out.empty()) return r.status();
      break;  // the records taken are returned; the sticky error comes with the next call
    }
    if (!r->has_value()) break;
    out.push_back(**std::move(r));
  }
  return out;
}

}  // namespace wharf
