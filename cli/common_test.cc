#include "cli/common.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wharf::cli {
namespace {

using ::testing::HasSubstr;

TEST(IsSafeRelativeKeyTest, AcceptsKeysBelowTheDestination) {
  for (const char* rel : {"ok/key", "x", "é/x", "日本/データ.bin", "a b/c+d%20=e&f~g", "a..b/c",
                          "...", "a/.hidden", "a/b..", "dir/file.", "a\\b"}) {
    EXPECT_TRUE(IsSafeRelativeKey(rel)) << rel;
  }
}

TEST(IsSafeRelativeKeyTest, RefusesKeysThatEscapeOrAlias) {
  for (const char* rel :
       {"", "..", ".", "../x", "a/../../x", "a/..", "/abs", "a//b", "a/./b", "./a", "a/", "a/b/",
        "//x", "..\\x", "a\\..\\..\\x", "a\\..", "\\abs", "a/.\\b", "x/..\\"}) {
    EXPECT_FALSE(IsSafeRelativeKey(rel)) << rel;
  }
  EXPECT_FALSE(IsSafeRelativeKey(std::string("a\0b", 3)));
  EXPECT_FALSE(IsSafeRelativeKey(std::string("\0", 1)));
}

TEST(IsSafeRelativeKeyTest, SaysWhyAKeyIsRefused) {
  EXPECT_EQ(UnsafeKeyReason("ok/key"), "");
  EXPECT_THAT(UnsafeKeyReason("a/../../x"), HasSubstr("'..' component would escape"));
  EXPECT_THAT(UnsafeKeyReason("/abs"), HasSubstr("absolute path would escape"));
  EXPECT_THAT(UnsafeKeyReason("a//b"), HasSubstr("empty path component"));
  EXPECT_THAT(UnsafeKeyReason("a/./b"), HasSubstr("'.' path component names no file"));
  EXPECT_THAT(UnsafeKeyReason("a\\..\\x"), HasSubstr("on Windows"));
  EXPECT_THAT(UnsafeKeyReason(std::string("a\0b", 3)), HasSubstr("NUL"));
  EXPECT_THAT(UnsafeKeyReason(""), HasSubstr("empty key"));
}

TEST(KeysTest, AsPrefixJoinKeyBasename) {
  EXPECT_EQ(AsPrefix(""), "");
  EXPECT_EQ(AsPrefix("a"), "a/");
  EXPECT_EQ(AsPrefix("a/"), "a/");
  EXPECT_EQ(JoinKey("", "x/y"), "x/y");
  EXPECT_EQ(JoinKey("p", "x"), "p/x");
  EXPECT_EQ(JoinKey("p/", "x"), "p/x");
  EXPECT_EQ(Basename("a/b/c.txt"), "c.txt");
  EXPECT_EQ(Basename("c.txt"), "c.txt");
  EXPECT_EQ(Basename("a/"), "");
}

TEST(ParseRangeTest, HttpForms) {
  auto r = ParseRange("0-4");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->offset, 0u);
  EXPECT_EQ(r->length, 5u);
  EXPECT_FALSE(r->suffix);
  r = ParseRange("5-");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->offset, 5u);
  EXPECT_FALSE(r->length.has_value());
  r = ParseRange("-3");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->suffix);
  EXPECT_EQ(r->length, 3u);
  r = ParseRange("7-7");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->length, 1u);
  r = ParseRange("0-18446744073709551615");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->length.has_value());
}

TEST(ParseRangeTest, RefusesEverythingElse) {
  for (const char* text : {"", "-", "abc", "5", "5-3", "-0", "1-2-3", " 1-2", "1-2 ", "+1-2",
                           "1--2", "0x10-20", "99999999999999999999-"}) {
    EXPECT_FALSE(ParseRange(text).ok()) << text;
  }
}

TEST(FormatTest, TimeAndRates) {
  EXPECT_EQ(FormatMtime(absl::FromUnixSeconds(0)), "1970-01-01T00:00:00Z");
  EXPECT_EQ(FormatMtime(absl::InfinitePast()), "-");
  EXPECT_EQ(Megabytes(12'345'678), "12.3");
  EXPECT_EQ(MegabytesPerSecond(10'000'000, absl::Seconds(2)), "5.0");
  EXPECT_EQ(MegabytesPerSecond(1, absl::ZeroDuration()), "-");
  EXPECT_EQ(OneLine("a\nb\x1b[2J"), "a\\nb\\x1b[2J");
}

TEST(ForEachEntryTest, InterleavesObjectsAndPrefixesInKeyOrder) {
  ListPage page;
  page.objects = {{.key = "p/a"}, {.key = "p/c"}, {.key = "p/e"}};
  page.common_prefixes = {"p/b/", "p/d/"};
  std::string order;
  ForEachEntry(
      page, [&](const ObjectMeta& m) { order += m.key + " "; },
      [&](const std::string& p) { order += p + " "; });
  EXPECT_EQ(order, "p/a p/b/ p/c p/d/ p/e ");
}

}  // namespace
}  // namespace wharf::cli
