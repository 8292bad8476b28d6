#include "base/hash.h"

#include "gtest/gtest.h"

namespace wharf {
namespace {

TEST(HashTest, KnownVectors) {
  EXPECT_EQ(Md5Hex(""), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(Md5Hex("hello"), "5d41402abc4b2a76b9719d911017c592");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex(absl::Cord("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // RFC 4231 test case 2.
  EXPECT_EQ(HexLower(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(Base64("hello"), "aGVsbG8=");
}

TEST(HashTest, IncrementalMd5MatchesOneShot) {
  Md5 md5;
  md5.Update("hel");
  md5.Update(absl::Cord("lo"));
  EXPECT_EQ(HexLower(md5.Finish()), Md5Hex("hello"));
}

}  // namespace
}  // namespace wharf
