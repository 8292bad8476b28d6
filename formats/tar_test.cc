#include "formats/tar.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "formats/testing/record_objects.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/testing/temp_store.h"

namespace wharf {
namespace {

using store_testing::TempStore;

namespace fs = std::filesystem;

// The tar writer of formats/testing (tests control every byte).
using formats_testing::TarEndOfArchive;
using formats_testing::TarEntry;
using formats_testing::TarHeader;
using formats_testing::TarPadded;

std::string Content(const std::string& name, size_t n) {
  std::string s;
  while (s.size() < n) absl::StrAppend(&s, name, ":", s.size(), ";");
  s.resize(n);
  return s;
}

// Samples as plain strings: key -> (extension -> bytes), and the order of keys.
struct Flat {
  std::vector<std::string> keys;
  std::map<std::string, std::map<std::string, std::string>> samples;
};

absl::StatusOr<Flat> ReadSamples(std::shared_ptr<ObjectStore> store, const std::string& key,
                                 TarOptions options = {}) {
  WHARF_ASSIGN_OR_RETURN(auto reader, TarSampleReader::Open(store, key, options));
  Flat flat;
  while (true) {
    WHARF_ASSIGN_OR_RETURN(std::optional<TarSample> sample, reader->Next());
    if (!sample) break;
    flat.keys.push_back(sample->key);
    auto& fields = flat.samples[sample->key];
    EXPECT_TRUE(fields.empty()) << "sample " << sample->key << " split in two";
    for (auto& [ext, bytes] : sample->fields) fields[ext] = std::string(bytes);
  }
  return flat;
}

TEST(TarTest, GroupsMembersIntoSamplesAtEveryChunkSize) {
  TempStore tmp;
  std::string tar;
  tar += TarEntry("a/b/", "", '5');  // a directory
  tar += TarEntry("a/b/sample001.jpg", Content("jpg1", 1000));
  tar += TarEntry("a/b/sample001.cls", "7");
  tar += TarEntry("a/b/sample001.seg.png", Content("png1", 5000));
  tar += TarEntry("a/b/sample002.jpg", Content("jpg2", 512));
  tar += TarEntry("a/b/sample002.cls", "");  // empty member
  tar += TarEntry("a/b/README", "not a sample member");
  tar += TarEntry("a/b/link.jpg", "", '2');  // a symlink: skipped
  tar += TarEntry("sample003.txt", Content("t3", 70'000));
  tar += TarEndOfArchive();
  tar += "garbage after the end-of-archive block is ignored";
  ASSERT_TRUE(tmp.store()->Put("shard.tar", absl::Cord(tar)).ok());

  for (uint64_t chunk : {100ul, 512ul, 777ul, 4096ul, uint64_t{8} << 20}) {
    TarOptions options;
    options.io.chunk_size = chunk;
    auto flat = ReadSamples(tmp.store(), "shard.tar", options);
    ASSERT_TRUE(flat.ok()) << flat.status();
    EXPECT_THAT(flat->keys, testing::ElementsAre("a/b/sample001", "a/b/sample002", "sample003"));
    EXPECT_EQ(
        flat->samples["a/b/sample001"],
        (std::map<std::string, std::string>{
            {"jpg", Content("jpg1", 1000)}, {"cls", "7"}, {"seg.png", Content("png1", 5000)}}));
    EXPECT_EQ(flat->samples["a/b/sample002"],
              (std::map<std::string, std::string>{{"jpg", Content("jpg2", 512)}, {"cls", ""}}));
    EXPECT_EQ(flat->samples["sample003"]["txt"], Content("t3", 70'000));
  }
}

TEST(TarTest, MembersCarryOffsetsAndUstarPrefixesAndBase256Sizes) {
  TempStore tmp;
  std::string tar;
  tar += TarHeader("sample.jpg", 3, '0', "very/long/directory") + TarPadded("abc");
  tar +=
      TarHeader("big.bin", 600, '0', "", /*base256_size=*/true) + TarPadded(std::string(600, 'x'));
  tar += TarHeader("pax_global", 18, 'g') + TarPadded("18 comment=hello\n");
  tar += TarEntry("old_style", "v7", '\0');
  ASSERT_TRUE(tmp.store()->Put("t.tar", absl::Cord(tar)).ok());  // no end-of-archive blocks
  auto reader = TarReader::Open(tmp.store(), "t.tar");
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<TarMember> members;
  while (true) {
    auto m = (*reader)->Next();
    ASSERT_TRUE(m.ok()) << m.status();
    if (!*m) break;
    members.push_back(**std::move(m));
  }
  ASSERT_EQ(members.size(), 3u);
  EXPECT_EQ(members[0].name, "very/long/directory/sample.jpg");
  EXPECT_EQ(members[0].header_offset, 0u);
  EXPECT_EQ(members[0].data_offset, 512u);
  EXPECT_EQ(std::string(members[0].data), "abc");
  EXPECT_EQ(members[1].name, "big.bin");
  EXPECT_EQ(members[1].header_offset, 1024u);
  EXPECT_EQ(members[1].data.size(), 600u);
  EXPECT_EQ(members[2].name, "old_style");
  EXPECT_EQ(std::string(members[2].data), "v7");
}

TEST(TarTest, LongNamesFromGnuAndPaxEntriesWrittenByHand) {
  TempStore tmp;
  const std::string long_dir(150, 'd');
  const std::string gnu_name = long_dir + "/sample1.jpg";
  const std::string pax_name = long_dir + "/sample2.jpg";
  std::string tar;
  tar += TarEntry("././@LongLink", gnu_name + '\0', 'L');
  tar += TarEntry(gnu_name.substr(0, 100), "one");
  const std::string record = "path=" + pax_name + "\n";
  const std::string pax = absl::StrCat(record.size() + 4, " ", record);  // 3-digit length + ' '
  ASSERT_EQ(pax.size(), record.size() + 4);
  tar += TarEntry("./PaxHeaders/x", pax, 'x');
  tar += TarEntry("truncated-name-ignored", "two");
  tar += TarEndOfArchive();
  ASSERT_TRUE(tmp.store()->Put("t.tar", absl::Cord(tar)).ok());
  auto flat = ReadSamples(tmp.store(), "t.tar");
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_THAT(flat->keys, testing::ElementsAre(long_dir + "/sample1", long_dir + "/sample2"));
  EXPECT_EQ(flat->samples[long_dir + "/sample1"]["jpg"], "one");
  EXPECT_EQ(flat->samples[long_dir + "/sample2"]["jpg"], "two");
}

TEST(TarTest, SplitSampleName) {
  using P = std::pair<absl::string_view, absl::string_view>;
  EXPECT_EQ(SplitSampleName("a/b/sample001.jpg"), P("a/b/sample001", "jpg"));
  EXPECT_EQ(SplitSampleName("a.d/s.seg.png"), P("a.d/s", "seg.png"));
  EXPECT_EQ(SplitSampleName("./x.cls"), P("x", "cls"));
  EXPECT_EQ(SplitSampleName("s."), P("s", ""));
  EXPECT_EQ(SplitSampleName("a/README"), std::nullopt);
  EXPECT_EQ(SplitSampleName("a/.hidden"), std::nullopt);
}

// ---- Archives from real tools ----

struct Tree {
  // relative path -> content, in the order the tools should store them
  std::map<std::string, std::string> files;
};

Tree MakeTree(const std::string& dir) {
  Tree tree;
  const std::string long_dir = "dir_" + std::string(110, 'L');
  const std::string long_base = "sample_" + std::string(105, 'n');
  for (int i = 0; i < 5; ++i) {
    const std::string key = absl::StrCat("part/s", 100 + i);
    tree.files[key + ".jpg"] = Content(key, 1000 + 37 * i * i * i);
    tree.files[key + ".cls"] = std::to_string(i);
    tree.files[key + ".meta.json"] = absl::StrCat("{\"i\":", i, "}");
  }
  tree.files["part/s200.txt"] = "";  // an empty member
  tree.files["part/s200.bin"] = "";
  tree.files[long_dir + "/s300.jpg"] = Content("long dir", 3000);
  tree.files[long_dir + "/s300.cls"] = "long";
  tree.files["part/" + long_base + ".jpg"] = Content("long base", 200'000);
  tree.files["part/" + long_base + ".cls"] = "longbase";
  for (const auto& [path, content] : tree.files) {
    fs::create_directories((fs::path(dir) / path).parent_path());
    std::ofstream(fs::path(dir) / path, std::ios::binary) << content;
  }
  fs::create_directories(fs::path(dir) / "part" / "empty_dir");
  fs::create_symlink("s100.jpg", fs::path(dir) / "part" / "s100_link.jpg");
  return tree;
}

void ExpectTree(const Flat& flat, const Tree& tree) {
  std::map<std::string, std::map<std::string, std::string>> want;
  for (const auto& [path, content] : tree.files) {
    auto split = SplitSampleName(path);
    ASSERT_TRUE(split.has_value()) << path;
    want[std::string(split->first)][std::string(split->second)] = content;
  }
  EXPECT_EQ(flat.samples.size(), want.size());
  for (const auto& [key, fields] : want) {
    auto it = flat.samples.find(key);
    ASSERT_NE(it, flat.samples.end()) << key;
    EXPECT_EQ(it->second.size(), fields.size()) << key;
    for (const auto& [ext, content] : fields) {
      auto f = it->second.find(ext);
      ASSERT_NE(f, it->second.end()) << key << "." << ext;
      EXPECT_EQ(f->second, content) << key << "." << ext;
    }
  }
}

int RunShell(const std::string& command) {
  const int rc = std::system(command.c_str());
  EXPECT_EQ(rc, 0) << command;
  return rc;
}

// Reads `key` at each chunk size and expects exactly `tree`.
void ExpectShardHoldsTree(const TempStore& tmp, const std::string& key, const Tree& tree,
                          std::initializer_list<uint64_t> chunk_sizes) {
  for (uint64_t chunk : chunk_sizes) {
    TarOptions options;
    options.io.chunk_size = chunk;
    auto flat = ReadSamples(tmp.store(), key, options);
    ASSERT_TRUE(flat.ok()) << key << " (chunk " << chunk << "): " << flat.status();
    ExpectTree(*flat, tree);
  }
}

TEST(TarTest, ReadsShardsWrittenByGnuTar) {
  TempStore tmp;
  const std::string src = tmp.root() + "-src";
  const Tree tree = MakeTree(src);
  for (const char* format : {"gnu", "posix", "oldgnu"}) {
    const std::string key = absl::StrCat("gnu-", format, ".tar");
    ASSERT_EQ(RunShell(absl::StrCat("tar --sort=name --format=", format, " -C '", src, "' -cf '",
                                    tmp.PathOf(key), "' .")),
              0);
    ExpectShardHoldsTree(tmp, key, tree, {1000, 65536});
  }
  fs::remove_all(src);
}

TEST(TarTest, ReadsShardsWrittenByPythonTarfile) {
  TempStore tmp;
  const std::string src = tmp.root() + "-src";
  const Tree tree = MakeTree(src);
  const std::string script = tmp.root() + "-make.py";
  std::ofstream(script) << R"(import os, sys, tarfile
src, out, fmt = sys.argv[1], sys.argv[2], sys.argv[3]
fmt = {"pax": tarfile.PAX_FORMAT, "gnu": tarfile.GNU_FORMAT}[fmt]
with tarfile.open(out, "w", format=fmt) as tf:
    for root, dirs, files in os.walk(src):
        dirs.sort()
        rel = os.path.relpath(root, src)
        if rel != ".":
            tf.add(root, arcname=rel, recursive=False)
        for f in sorted(files):
            tf.add(os.path.join(root, f), arcname=os.path.normpath(os.path.join(rel, f)))
)";
  for (const char* format : {"pax", "gnu"}) {
    const std::string key = absl::StrCat("py-", format, ".tar");
    ASSERT_EQ(RunShell(absl::StrCat("python3 '", script, "' '", src, "' '", tmp.PathOf(key), "' ",
                                    format)),
              0);
    ExpectShardHoldsTree(tmp, key, tree, {4096, uint64_t{8} << 20});
  }
  fs::remove_all(src);
  fs::remove(script);
}

// ---- Errors ----

TEST(TarTest, ACorruptHeaderNamesTheShardAndTheOffset) {
  TempStore tmp;
  std::string tar = TarEntry("s1.jpg", Content("a", 700)) + TarEntry("s1.cls", "1") +
                    TarEntry("s2.jpg", "x") + TarEndOfArchive();
  const size_t second_header = 512 + 1024;  // after s1.jpg's header and two data blocks
  tar[second_header + 3] ^= 0x20;           // a byte of the name
  ASSERT_TRUE(tmp.store()->Put("bad.tar", absl::Cord(tar)).ok());
  auto reader = TarSampleReader::Open(tmp.store(), "bad.tar", {.io = {.chunk_size = 600}});
  ASSERT_TRUE(reader.ok());
  auto sample = (*reader)->Next();
  EXPECT_EQ(sample.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(sample.status().message(),
                                absl::StrCat("read tar ", tmp.store()->Uri("bad.tar"), " at byte ",
                                             second_header, ": header checksum mismatch")))
      << sample.status();
  EXPECT_EQ((*reader)->Next().status(), sample.status());  // sticky

  ASSERT_TRUE(tmp.store()->Put("random.tar", absl::Cord(Content("not a tar", 5000))).ok());
  auto random = ReadSamples(tmp.store(), "random.tar");
  EXPECT_EQ(random.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(random.status().message(), "at byte 0: header checksum"))
      << random.status();
}

TEST(TarTest, TruncatedShardsAreDataLoss) {
  TempStore tmp;
  const std::string tar =
      TarEntry("s1.jpg", Content("a", 2000)) + TarEntry("s2.jpg", Content("b", 3000));
  ASSERT_TRUE(tmp.store()->Put("cut-data.tar", absl::Cord(tar.substr(0, tar.size() - 1500))).ok());
  auto flat = ReadSamples(tmp.store(), "cut-data.tar");
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(flat.status().message(), "at byte 2560: truncated member 's2.jpg'"))
      << flat.status();
  ASSERT_TRUE(tmp.store()->Put("cut-header.tar", absl::Cord(tar.substr(0, 2560 + 100))).ok());
  flat = ReadSamples(tmp.store(), "cut-header.tar");
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(flat.status().message(), "at byte 2560: truncated header"))
      << flat.status();
  const std::string dangling = TarEntry("s1.jpg", "a") + TarEntry("././@LongLink", "s2.jpg", 'L');
  ASSERT_TRUE(tmp.store()->Put("dangling.tar", absl::Cord(dangling)).ok());
  flat = ReadSamples(tmp.store(), "dangling.tar");
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kDataLoss) << flat.status();
}

TEST(TarTest, DuplicateExtensionsAndOversizedMembersAreErrors) {
  TempStore tmp;
  const std::string dup = TarEntry("s1.jpg", "a") + TarEntry("s1.jpg", "b") + TarEndOfArchive();
  ASSERT_TRUE(tmp.store()->Put("dup.tar", absl::Cord(dup)).ok());
  auto flat = ReadSamples(tmp.store(), "dup.tar");
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(flat.status().message(), "at byte 1024: sample 's1' has two"))
      << flat.status();

  const std::string big = TarEntry("s1.jpg", Content("a", 5000)) + TarEndOfArchive();
  ASSERT_TRUE(tmp.store()->Put("big.tar", absl::Cord(big)).ok());
  flat = ReadSamples(tmp.store(), "big.tar", {.max_member_bytes = 4096});
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kResourceExhausted) << flat.status();

  auto missing = TarSampleReader::Open(tmp.store(), "missing.tar");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), tmp.store()->Uri("missing.tar")));
}

TEST(TarTest, StreamsALargeShardInBoundedMemory) {
  TempStore tmp;
  std::string tar;
  for (int i = 0; i < 200; ++i) {
    tar += TarEntry(absl::StrCat("s", 1000 + i, ".bin"), Content(std::to_string(i), 20'000 + i));
  }
  tar += TarEndOfArchive();
  ASSERT_TRUE(tmp.store()->Put("large.tar", absl::Cord(tar)).ok());
  auto reader = TarSampleReader::Open(tmp.store(), "large.tar",
                                      {.io = {.chunk_size = 16 << 10, .read_ahead = 2}});
  ASSERT_TRUE(reader.ok());
  int n = 0;
  while (true) {
    auto sample = (*reader)->Next();
    ASSERT_TRUE(sample.ok()) << sample.status();
    if (!*sample) break;
    EXPECT_EQ(std::string(*(*sample)->Find("bin")), Content(std::to_string(n), 20'000 + n));
    ++n;
  }
  EXPECT_EQ(n, 200);
  const ObjectReaderStats stats = (*reader)->tar().reader().stats();
  EXPECT_LE(stats.peak_buffered_bytes, 3u * (16 << 10));
  EXPECT_EQ(stats.bytes_fetched, tar.size());
}

}  // namespace
}  // namespace wharf
