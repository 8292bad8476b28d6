#include "base/hash.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"

namespace wharf {

struct Md5::State {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~State() { EVP_MD_CTX_free(ctx); }
};

Md5::Md5() : state_(std::make_unique<State>()) {
  EVP_DigestInit_ex(state_->ctx, EVP_md5(), nullptr);
}
Md5::~Md5() = default;

void Md5::Update(absl::string_view data) {
  EVP_DigestUpdate(state_->ctx, data.data(), data.size());
}

void Md5::Update(const absl::Cord& data) {
  for (absl::string_view chunk : data.Chunks()) Update(chunk);
}

std::array<uint8_t, 16> Md5::Finish() {
  std::array<uint8_t, 16> out{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(state_->ctx, out.data(), &len);
  return out;
}

std::string Md5Hex(absl::string_view data) {
  Md5 md5;
  md5.Update(data);
  return HexLower(md5.Finish());
}

namespace {
template <typename Feed>
std::string Sha256HexOf(Feed&& feed) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  feed(ctx);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, out, &len);
  EVP_MD_CTX_free(ctx);
  return HexLower(absl::string_view(reinterpret_cast<const char*>(out), len));
}
}  // namespace

std::string Sha256Hex(absl::string_view data) {
  return Sha256HexOf([&](EVP_MD_CTX* ctx) { EVP_DigestUpdate(ctx, data.data(), data.size()); });
}

std::string Sha256Hex(const absl::Cord& data) {
  return Sha256HexOf([&](EVP_MD_CTX* ctx) {
    for (absl::string_view chunk : data.Chunks()) EVP_DigestUpdate(ctx, chunk.data(), chunk.size());
  });
}

std::string HmacSha256(absl::string_view key, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string HexLower(absl::string_view bytes) { return absl::BytesToHexString(bytes); }

std::string Base64(absl::string_view bytes) { return absl::Base64Escape(bytes); }

}  // namespace wharf
