// Test helpers: objects of every registered record format, written byte by byte so tests
// control every byte, and a test-only format that proves code above formats/ reads any
// registered format without knowing it.
//
// A new format adds its writer to EncodeRecords (record_objects.cc): the dataset suite
// (dataset/records_test.cc) runs its resume tests on every format of the registry and fails
// for a format it cannot write.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace wharf::formats_testing {

// ---- A minimal tar writer. ----
// `width` octal digits of v, then NUL.
std::string TarOctal(uint64_t v, size_t width);
// A ustar header block (checksum computed) for a member of `size` bytes.
std::string TarHeader(const std::string& name, uint64_t size, char type = '0',
                      const std::string& prefix = "", bool base256_size = false);
// `data` padded with NULs to a multiple of 512 bytes.
std::string TarPadded(const std::string& data);
// A header and the padded data.
std::string TarEntry(const std::string& name, const std::string& data, char type = '0');
// Two zero blocks.
std::string TarEndOfArchive();

// ---- Compression, as gzip(1) and zlib.compress write it. ----
// `data` deflated in a GZIP (RFC 1952) or ZLIB (RFC 1950) wrapper at `level`.
enum class Deflated { kGzip, kZlib };
std::string Deflate(absl::string_view data, Deflated wrapper, int level = 6);

// An object of `format` with one record per payload, in order:
//  - tar: sample "r<i>" with members "r<i>.cls" (the payload) and "r<i>.txt" (payload + "!");
//  - tfrecord: the payload framed;
//  - csv: a row `"<payload>\nmore",<i>` (a quoted newline in every row);
//  - jsonl: a row {"v":"<payload>"};
//  - kTestFormat: a 4-byte little-endian length, then the payload.
// With header (row formats), a header row "name,value" first. NotFound for a format this
// helper cannot write yet.
absl::StatusOr<absl::Cord> EncodeRecords(absl::string_view format,
                                         const std::vector<std::string>& payloads,
                                         bool header = false);

// A format known only to tests: records are a 4-byte little-endian length and that many
// bytes; one payload each ("data"); suffix ".len32".
inline constexpr absl::string_view kTestFormat = "test-len32";
// Registers kTestFormat once (later calls do nothing).
absl::Status RegisterTestFormat();

}  // namespace wharf::formats_testing
