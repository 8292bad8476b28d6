#include "http/transport.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace wharf {

std::optional<std::string_view> HttpResponse::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, absl::string_view(name.data(), name.size()))) return value;
  }
  return std::nullopt;
}

uint64_t DeliveredBytes(const absl::Status& status) {
  auto payload = status.GetPayload(kDeliveredBytesPayloadUrl);
  uint64_t bytes = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(payload->Flatten(), &bytes)) return 0;
  return bytes;
}

void SetDeliveredBytes(absl::Status& status, uint64_t bytes) {
  status.SetPayload(kDeliveredBytesPayloadUrl, absl::Cord(std::to_string(bytes)));
}

}  // namespace wharf
