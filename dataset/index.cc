#include "dataset/index.h"

#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/hash.h"
#include "base/status.h"
#include "nlohmann/json.hpp"
#include "store/uri.h"

namespace wharf {
namespace {

using Json = nlohmann::json;

// Captures the parser's message for a line that is not valid JSON. nlohmann reports errors
// by exception unless asked not to; a SAX handler gets the message without one (the library
// throws nothing, convention 1).
class ErrorCapture : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
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

// The key a manifest line names, or an error message (without the line prefix).
absl::StatusOr<std::string> ResolveKey(absl::string_view key, absl::string_view base_prefix,
                                       absl::string_view store_root_uri) {
  if (key.empty()) return absl::InvalidArgumentError("empty key");
  if (LooksLikeUri(key)) {
    if (store_root_uri.empty() || !absl::StartsWith(key, store_root_uri)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", key, "' is not in this dataset's store (", store_root_uri, ")"));
    }
    key.remove_prefix(store_root_uri.size());
    if (key.empty()) return absl::InvalidArgumentError("URI names no object");
    return std::string(key);
  }
  if (absl::ConsumePrefix(&key, "/")) {
    if (key.empty()) return absl::InvalidArgumentError("key '/' names no object");
    return std::string(key);
  }
  return absl::StrCat(base_prefix, key);
}

}  // namespace

FetchItem SampleEntry::ToFetchItem() const {
  FetchItem item;
  item.key = key;
  item.size = size;
  item.etag = etag;
  return item;
}

SampleIndex SampleIndex::FromKeys(std::vector<std::string> keys) {
  std::vector<SampleEntry> entries;
  entries.reserve(keys.size());
  for (auto& key : keys) entries.push_back({.key = std::move(key)});
  return SampleIndex(std::move(entries));
}

absl::StatusOr<SampleIndex> SampleIndex::FromListing(ObjectStore& store, absl::string_view prefix,
                                                     const ListingIndexOptions& options) {
  ListOptions range;
  range.prefix = std::string(prefix);
  auto listed = ParallelListAll(store, range, options.list);
  if (!listed.ok()) {
    return Annotate(listed.status(), absl::StrCat("indexing ", store.Uri(prefix)));
  }
  // ParallelListAll sorts by key, so the order is the same for any number of workers.
  std::vector<SampleEntry> entries;
  entries.reserve(listed->size());
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
    entries.push_back(
        {.key = std::move(meta.key), .size = meta.size, .etag = std::move(meta.etag)});
  }
  return SampleIndex(std::move(entries));
}

absl::StatusOr<SampleIndex> SampleIndex::FromManifest(ObjectStore& store,
                                                      const std::string& manifest_key,
                                                      const ManifestOptions& options) {
  auto text = store.Read(manifest_key);
  if (!text.ok()) {
    return Annotate(text.status(), absl::StrCat("reading manifest ", store.Uri(manifest_key)));
  }
  const size_t slash = manifest_key.rfind('/');
  const std::string base =
      slash == std::string::npos ? std::string() : manifest_key.substr(0, slash + 1);
  return ParseManifest(*text, base, store.Uri(""), store.Uri(manifest_key), options);
}

absl::StatusOr<SampleIndex> SampleIndex::ParseManifest(absl::string_view text,
                                                       absl::string_view base_prefix,
                                                       absl::string_view store_root_uri,
                                                       absl::string_view manifest_name,
                                                       const ManifestOptions& options) {
  std::vector<SampleEntry> entries;
  ManifestFormat format = options.format;
  size_t line_number = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == absl::string_view::npos) end = text.size();
    absl::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_number;
    absl::ConsumeSuffix(&line, "\r");
    const absl::string_view stripped = absl::StripAsciiWhitespace(line);
    if (stripped.empty()) continue;
    if (format == ManifestFormat::kAuto) {
      format = absl::StartsWith(stripped, "{") ? ManifestFormat::kJsonLines : ManifestFormat::kKeys;
    }
    auto line_error = [&](absl::string_view message) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest ", manifest_name, " line ", line_number, ": ", message));
    };

    SampleEntry entry;
    absl::string_view key;
    std::string json_key;
    if (format == ManifestFormat::kKeys) {
      key = stripped;
    } else {
      Json j = Json::parse(stripped.begin(), stripped.end(), /*cb=*/nullptr,
                           /*allow_exceptions=*/false);
      if (j.is_discarded()) {
        return line_error(absl::StrCat("invalid JSON: ", JsonErrorMessage(stripped)));
      }
      if (!j.is_object()) return line_error("expected a JSON object");
      auto k = j.find("key");
      if (k == j.end()) return line_error("missing \"key\"");
      if (!k->is_string()) return line_error("\"key\" must be a string");
      json_key = k->get<std::string>();
      key = json_key;
      if (auto s = j.find("size"); s != j.end() && !s->is_null()) {
        if (!s->is_number_unsigned()) {
          return line_error("\"size\" must be a non-negative integer");
        }
        entry.size = s->get<uint64_t>();
      }
      if (auto e = j.find("etag"); e != j.end() && !e->is_null()) {
        if (!e->is_string()) return line_error("\"etag\" must be a string");
        absl::string_view etag = e->get_ref<const std::string&>();
        // Accept the HTTP form ("\"abc\"") as well as the bare one ObjectMeta uses.
        if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') {
          etag = etag.substr(1, etag.size() - 2);
        }
        entry.etag = std::string(etag);
      }
    }
    auto resolved = ResolveKey(key, base_prefix, store_root_uri);
    if (!resolved.ok()) return line_error(resolved.status().message());
    entry.key = *std::move(resolved);
    entries.push_back(std::move(entry));
  }
  return SampleIndex(std::move(entries));
}

std::string SampleIndex::Fingerprint() const {
  Md5 md5;
  for (const SampleEntry& e : entries_) {
    // Length-prefixed so that {"ab", "c"} and {"a", "bc"} differ.
    const uint64_t n = e.key.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    md5.Update(absl::string_view(len, sizeof(len)));
    md5.Update(e.key);
  }
  return HexLower(md5.Finish());
}

}  // namespace wharf
