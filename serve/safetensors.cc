#include "serve/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/json_sax.h"
#include "nlohmann/json.hpp"

namespace wharf::serve {
namespace {

using nlohmann::json;

absl::Status Malformed(absl::string_view uri, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(uri, ": not a valid safetensors file: ", what));
}

absl::Status BadTensor(absl::string_view uri, absl::string_view name, absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat(uri, ": not a valid safetensors file: tensor '", name, "': ", what));
}

// The first top-level name given twice and the first field given twice in one tensor's
// entry ("<tensor>\0<field>"), found in one linear SAX pass (values are not kept). A syntax
// error ends the pass; the DOM parse that follows reports it.
class DuplicateKeys final : public JsonSaxBase {
 public:
  std::string twice;
  std::string field_twice;

  bool start_object(std::size_t) override { return Open(); }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(); }
  bool end_array() override { return Close(); }
  // Depth 1: a tensor's name (or __metadata__); depth 2: a field of its entry (the header
  // begins with '{', so the outermost container is the header's object).
  bool key(string_t& name) override {
    if (depth_ == 1) {
      current_ = name;
      fields_.clear();
      if (twice.empty() && !names_.insert(current_).second) twice = current_;
    } else if (depth_ == 2 && current_ != "__metadata__" && field_twice.empty() &&
               !fields_.insert(name).second) {
      field_twice = absl::StrCat(current_, std::string(1, '\0'), name);
    }
    return true;
  }

 private:
  bool Open() {
    ++depth_;
    return true;
  }
  bool Close() {
    --depth_;
    return true;
  }

  int depth_ = 0;  // containers open (objects and arrays)
  std::set<std::string> names_;
  std::string current_;  // the tensor whose entry is being read
  std::set<std::string> fields_;
};

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

int SafetensorsDtypeBits(absl::string_view dtype) {
  // The dtypes of the format (safetensors' Dtype enum).
  static constexpr std::pair<const char*, int> kDtypes[] = {
      {"BOOL", 8},        {"U8", 8},          {"I8", 8},      {"F8_E5M2", 8}, {"F8_E4M3", 8},
      {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"F8_E8M0", 8}, {"I16", 16},    {"U16", 16},
      {"F16", 16},        {"BF16", 16},       {"I32", 32},    {"U32", 32},    {"F32", 32},
      {"C64", 64},        {"F64", 64},        {"I64", 64},    {"U64", 64},    {"F4", 4},
      {"F6_E2M3", 6},     {"F6_E3M2", 6},
  };
  for (const auto& [name, bits] : kDtypes) {
    if (dtype == name) return bits;
  }
  return 0;
}

absl::StatusOr<uint64_t> ParseSafetensorsHeaderLength(absl::string_view first8, uint64_t file_size,
                                                      absl::string_view uri) {
  if (first8.size() < 8 || file_size < 8) {
    return Malformed(uri, absl::StrCat("the file is ", file_size,
                                       " bytes, shorter than the 8-byte header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(first8[i]);
  if (n > file_size - 8) {
    return Malformed(uri, absl::StrCat("header length ", n, " is beyond the end of the file (",
                                       file_size, " bytes)"));
  }
  if (n > kMaxSafetensorsHeaderBytes) {
    return Malformed(uri, absl::StrCat("header length ", n, " is above the format's limit of ",
                                       kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (n < 2) return Malformed(uri, absl::StrCat("header length ", n, " is too short for JSON"));
  return n;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view text, uint64_t file_size,
                                                         absl::string_view uri) {
  if (8 + text.size() > file_size) {
    return Malformed(uri, absl::StrCat("header length ", text.size(),
                                       " is beyond the end of the file (", file_size, " bytes)"));
  }
  if (text.empty() || text.front() != '{') {
    return Malformed(uri, "the header does not begin with '{' (the format requires it)");
  }
  // The JSON parser takes a NUL byte for the end of its input and would ignore what follows
  // ("{...}\0garbage"); JSON has no raw NUL anywhere, so a header holding one is refused.
  if (text.find('\0') != absl::string_view::npos) {
    return Malformed(uri, "the header holds a NUL byte (it is not JSON)");
  }
  // A name given twice would silently keep its last entry (the JSON parser's way): refused,
  // as safetensors refuses it; so is a field given twice in one tensor's entry. The keys are
  // checked by a SAX pass of their own before the document is built: the parser's callback
  // form rescans the enclosing object at every object's end, quadratic in the tensors (a
  // header of 32,000 tensors took minutes).
  DuplicateKeys keys;
  json::sax_parse(text.begin(), text.end(), &keys, json::input_format_t::json,
                  /*strict=*/true);
  const std::string& twice = keys.twice;
  const std::string& field_twice = keys.field_twice;
  const json header = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Malformed(uri, "the header is not valid JSON");
  }
  if (twice == "__metadata__") return Malformed(uri, "the header has two __metadata__");
  if (!twice.empty()) return BadTensor(uri, twice, "the header names it twice");
  if (!field_twice.empty()) {
    const size_t nul = field_twice.find('\0');
    return BadTensor(uri, field_twice.substr(0, nul),
                     absl::StrCat("its entry gives '", field_twice.substr(nul + 1), "' twice"));
  }
  SafetensorsHeader out;
  out.data_start = 8 + text.size();
  const uint64_t data_size = file_size - out.data_start;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_null()) continue;  // safetensors reads null as no metadata
      if (!entry.is_object()) return Malformed(uri, "__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) {
          return Malformed(uri, absl::StrCat("__metadata__ '", k, "' is not a string"));
        }
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) return BadTensor(uri, name, "its entry is not an object");
    const auto dtype = entry.find("dtype");
    const auto shape = entry.find("shape");
    const auto offsets = entry.find("data_offsets");
    if (dtype == entry.end() || !dtype->is_string()) {
      return BadTensor(uri, name, "no \"dtype\" string");
    }
    if (shape == entry.end() || !shape->is_array()) {
      return BadTensor(uri, name, "no \"shape\" array");
    }
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return BadTensor(uri, name, "\"data_offsets\" is not [begin, end] of two unsigned integers");
    }
    SafetensorsTensor t;
    t.name = name;
    t.dtype = dtype->get<std::string>();
    const int bits = SafetensorsDtypeBits(t.dtype);
    if (bits == 0) return BadTensor(uri, name, absl::StrCat("unknown dtype '", t.dtype, "'"));
    uint64_t elements = 1;
    bool overflow = false;
    for (const json& d : *shape) {
      if (!d.is_number_unsigned()) {
        return BadTensor(uri, name, "\"shape\" holds something other than unsigned integers");
      }
      t.shape.push_back(d.get<uint64_t>());
      overflow = overflow || MulOverflows(elements, t.shape.back(), &elements);
    }
    uint64_t bits_total = 0;
    overflow = overflow || MulOverflows(elements, static_cast<uint64_t>(bits), &bits_total);
    if (overflow) return BadTensor(uri, name, "its shape overflows 64 bits");
    if (bits_total % 8 != 0) {
      return BadTensor(uri, name,
                       absl::StrCat(elements, " elements of ", t.dtype, " are not whole bytes"));
    }
    const uint64_t begin = (*offsets)[0].get<uint64_t>(), end = (*offsets)[1].get<uint64_t>();
    if (begin > end) {
      return BadTensor(uri, name,
                       absl::StrCat("data_offsets [", begin, ", ", end, ") run backwards"));
    }
    if (end > data_size) {
      return BadTensor(uri, name,
                       absl::StrCat("data_offsets [", begin, ", ", end,
                                    ") go past the data's end (", data_size, " bytes)"));
    }
    if (end - begin != bits_total / 8) {
      return BadTensor(
          uri, name,
          absl::StrCat("shape and dtype give ", bits_total / 8, " bytes, data_offsets [", begin,
                       ", ", end, ") hold ", end - begin));
    }
    t.offset = out.data_start + begin;
    t.size = end - begin;
    out.tensors.push_back(std::move(t));
  }
  // As the safetensors library requires (and every file it writes is): the tensors, sorted
  // by data_offsets, tile the data exactly, with no byte shared, no gap and nothing after
  // the last one; a file with a hole or trailing bytes is damaged or not what it says.
  std::vector<const SafetensorsTensor*> by_offset;
  for (const SafetensorsTensor& t : out.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
              if (a->offset != b->offset) return a->offset < b->offset;
              return a->size != b->size ? a->size < b->size : a->name < b->name;
            });
  uint64_t next = out.data_start;
  const SafetensorsTensor* previous = nullptr;
  for (const SafetensorsTensor* t : by_offset) {
    if (t->offset < next) {
      return BadTensor(uri, t->name,
                       absl::StrCat("its bytes overlap tensor '", previous->name, "'"));
    }
    if (t->offset > next) {
      return BadTensor(
          uri, t->name,
          absl::StrCat("its data_offsets start ", t->offset - next, " bytes after ",
                       previous == nullptr ? "the data's start"
                                           : absl::StrCat("tensor '", previous->name, "' ends"),
                       " (the tensors must fill the data with no gap)"));
    }
    next = t->offset + t->size;
    previous = t;
  }
  if (next != file_size) {
    return Malformed(
        uri, absl::StrCat(file_size - next, " bytes follow the last tensor's data (",
                          "the file is ", file_size, " bytes, the tensors end at ", next, ")"));
  }
  // nlohmann's object is a std::map: items() came sorted by name already.
  return out;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensors(absl::string_view head, uint64_t file_size,
                                                   absl::string_view uri) {
  absl::StatusOr<uint64_t> n = ParseSafetensorsHeaderLength(head.substr(0, 8), file_size, uri);
  if (!n.ok()) return n.status();
  if (head.size() < 8 + *n) {
    return Malformed(
        uri, absl::StrCat("the header is ", *n, " bytes, only ", head.size() - 8, " were given"));
  }
  return ParseSafetensorsHeader(head.substr(8, *n), file_size, uri);
}

absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(absl::string_view text,
                                                       absl::string_view uri) {
  const json index = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object()) {
    return absl::DataLossError(absl::StrCat(uri, ": not a safetensors index: not a JSON object"));
  }
  const auto map = index.find("weight_map");
  if (map == index.end() || !map->is_object()) {
    return absl::DataLossError(
        absl::StrCat(uri, ": not a safetensors index: no \"weight_map\" object"));
  }
  std::set<std::string> files;
  SafetensorsIndex out;
  for (const auto& [tensor, file] : map->items()) {
    if (!file.is_string()) {
      return absl::DataLossError(absl::StrCat(uri, ": weight_map: tensor '", tensor,
                                              "' maps to something other than a file name"));
    }
    const std::string name = file.get<std::string>();
    bool plain = !name.empty() && name.front() != '/' && name.find('\\') == std::string::npos;
    for (absl::string_view segment : absl::StrSplit(name, '/')) {
      plain = plain && !segment.empty() && segment != "." && segment != "..";
    }
    if (!plain) {
      return absl::DataLossError(
          absl::StrCat(uri, ": weight_map: tensor '", tensor, "' names file '", name,
                       "', which is not a relative path inside the index's folder"));
    }
    files.insert(name);
    out.weight_map[tensor] = name;
  }
  out.files.assign(files.begin(), files.end());
  return out;
}

}  // namespace wharf::serve
