#include "base/crc32c.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace wharf {
namespace {

TEST(Crc32cTest, KnownAnswers) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  // RFC 3720 (iSCSI) B.4 test vectors.
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending(32, '\0'), descending(32, '\0');
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<char>(i);
    descending[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
}

TEST(Crc32cTest, PortableAndHardwareAgreeAtEveryLengthAndAlignment) {
  std::mt19937 rng(1);
  std::string data(8192 + 16, '\0');
  for (auto& c : data) c = static_cast<char>(rng());
  const bool hw = internal::Crc32cHardwareAvailable();
  for (size_t offset = 0; offset < 8; ++offset) {
    // The hardware path hashes blocks of 3 x 512 bytes in three streams: lengths around
    // one and several blocks, with tails of every kind.
    for (size_t n :
         {0ul,    1ul,    7ul,    8ul,    9ul,    15ul,   16ul,   63ul,   100ul,  1000ul, 1535ul,
          1536ul, 1537ul, 1543ul, 1544ul, 3072ul, 3079ul, 4096ul, 4607ul, 4608ul, 8192ul}) {
      const char* p = data.data() + offset;
      const uint32_t portable = internal::Crc32cExtendPortable(0, p, n);
      // Byte-at-a-time reference: the portable tail loop alone.
      uint32_t reference = 0;
      for (size_t i = 0; i < n; ++i) {
        reference = internal::Crc32cExtendPortable(reference, p + i, 1);
      }
      EXPECT_EQ(portable, reference) << offset << " " << n;
      if (hw) {
        EXPECT_EQ(internal::Crc32cExtendHardware(0, p, n), portable) << offset << " " << n;
      }
      EXPECT_EQ(Crc32cExtend(0, p, n), portable);
    }
  }
}

TEST(Crc32cTest, ExtendAndCordAndMask) {
  const std::string a = "hello, ", b = "world";
  EXPECT_EQ(Crc32cExtend(Crc32c(a), b.data(), b.size()), Crc32c(a + b));
  // Long enough for the three-stream blocks on both sides of the split.
  std::mt19937 rng(2);
  std::string big(20000, '\0');
  for (auto& c : big) c = static_cast<char>(rng());
  const uint32_t whole = internal::Crc32cExtendPortable(0, big.data(), big.size());
  EXPECT_EQ(Crc32c(big), whole);
  for (size_t split : {1ul, 1536ul, 5000ul, 19999ul}) {
    EXPECT_EQ(Crc32cExtend(Crc32c(absl::string_view(big).substr(0, split)), big.data() + split,
                           big.size() - split),
              whole)
        << split;
  }
  absl::Cord cord;
  cord.Append(std::string(3000, 'x'));
  cord.Append(std::string(5000, 'y'));
  EXPECT_EQ(Crc32c(cord), Crc32c(std::string(cord)));
  for (uint32_t crc : {0u, 1u, 0xE3069283u, 0xffffffffu}) {
    EXPECT_EQ(UnmaskCrc32c(MaskCrc32c(crc)), crc);
    EXPECT_NE(MaskCrc32c(crc), crc);
  }
  EXPECT_EQ(MaskCrc32c(0), 0xa282ead8u);
}

}  // namespace
}  // namespace wharf
