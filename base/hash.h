// Hashes and encodings used by stores and signers (OpenSSL underneath).
// Thread-safety: functions are pure; an Md5 object is used by one thread at a time.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace wharf {

// Incremental MD5 (S3 ETags and Content-MD5).
class Md5 {
 public:
  Md5();
  ~Md5();
  Md5(const Md5&) = delete;
  Md5& operator=(const Md5&) = delete;

  void Update(absl::string_view data);
  void Update(const absl::Cord& data);
  // The 16-byte digest. The object must not be updated afterwards.
  std::array<uint8_t, 16> Finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string Md5Hex(absl::string_view data);
std::string Sha256Hex(absl::string_view data);
std::string Sha256Hex(const absl::Cord& data);
// Raw 32-byte HMAC-SHA256 of `data` under `key`.
std::string HmacSha256(absl::string_view key, absl::string_view data);

std::string HexLower(absl::string_view bytes);
std::string Base64(absl::string_view bytes);

template <size_t N>
std::string HexLower(const std::array<uint8_t, N>& bytes) {
  return HexLower(absl::string_view(reinterpret_cast<const char*>(bytes.data()), N));
}

}  // namespace wharf
