#include "base/file_io.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace wharf {
namespace {

// A Cord of many separate chunks (more than one writev takes) is written whole, in order.
TEST(FileIoTest, WriteAllOfAFragmentedCordWritesEveryChunkInOrder) {
  std::string expect;
  absl::Cord cord;
  for (int i = 0; i < 300; ++i) {
    auto* piece = new std::string(static_cast<size_t>(600 + i), static_cast<char>('a' + i % 26));
    expect += *piece;
    cord.Append(absl::MakeCordFromExternal(*piece, [piece] { delete piece; }));
  }
  ASSERT_GT(std::distance(cord.chunk_begin(), cord.chunk_end()), 64);
  char path[] = "/tmp/wharf-file-io-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WriteAll(fd, cord).ok());
  ASSERT_TRUE(WriteAll(fd, absl::Cord("tail")).ok());  // a flat Cord
  close(fd);
  std::string got;
  ASSERT_TRUE(ReadFile(path, &got));
  unlink(path);
  EXPECT_EQ(got, expect + "tail");
}

TEST(FileIoTest, WriteAllNamesTheErrno) {
  const absl::Status s = WriteAll(-1, absl::Cord(std::string(10, 'x')));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("write"), std::string::npos) << s;
}

}  // namespace
}  // namespace wharf
