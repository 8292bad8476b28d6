#include "formats/tar.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
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

TEST(TarTest, SplitSampleNameIsWebdatasetsBasePlusExt) {
  using P = std::pair<absl::string_view, absl::string_view>;
  // What webdataset 1.0.2's base_plus_ext returns for each (generated with it).
  EXPECT_EQ(SplitSampleName("a/b/sample001.jpg"), P("a/b/sample001", "jpg"));
  EXPECT_EQ(SplitSampleName("a.d/s.seg.png"), P("a.d/s", "seg.png"));
  EXPECT_EQ(SplitSampleName("./x.cls"), P("./x", "cls"));
  EXPECT_EQ(SplitSampleName("s."), P("s", ""));
  EXPECT_EQ(SplitSampleName("a/README"), std::nullopt);
  EXPECT_EQ(SplitSampleName("a/.hidden"), P("a/", "hidden"));
  EXPECT_EQ(SplitSampleName("a/b/.x.txt"), P("a/b/", "x.txt"));
  EXPECT_EQ(SplitSampleName(".x.txt"), std::nullopt);
  EXPECT_EQ(SplitSampleName(".hidden"), std::nullopt);
  EXPECT_EQ(SplitSampleName("a.d/.x"), std::nullopt);
  EXPECT_EQ(SplitSampleName("a.d//.x"), P("a.d//", "x"));
  EXPECT_EQ(SplitSampleName("/.x"), P("/", "x"));
  EXPECT_EQ(SplitSampleName("x/.DS_Store"), P("x/", "DS_Store"));
  EXPECT_EQ(SplitSampleName("a..b"), P("a", ".b"));
  EXPECT_EQ(SplitSampleName("a/b.c/d"), std::nullopt);
  EXPECT_EQ(SplitSampleName("dir.v1/s.JPG"), P("dir.v1/s", "JPG"));
  EXPECT_EQ(SplitSampleName("./a/b.c"), P("./a/b", "c"));
  EXPECT_EQ(SplitSampleName("../s.jpg"), P("../s", "jpg"));
  EXPECT_EQ(SplitSampleName("a/./b.c"), P("a/./b", "c"));
  EXPECT_EQ(SplitSampleName("..."), std::nullopt);
  EXPECT_EQ(SplitSampleName("."), std::nullopt);
  EXPECT_EQ(SplitSampleName("a/."), P("a/", ""));
  EXPECT_EQ(SplitSampleName("a/.."), P("a/", "."));
  EXPECT_EQ(SplitSampleName("a.b/c.d/.e"), std::nullopt);
  EXPECT_EQ(SplitSampleName(""), std::nullopt);
}

TEST(TarTest, SplitSampleNameAgreesWithTheRegexOnEveryShortName) {
  // webdataset's regex, run by std::regex (ECMAScript backtracks as Python's re does), on
  // every name of up to 8 bytes over the bytes that matter.
  const std::regex base_plus_ext("^((?:.*/|)[^.]+)[.]([^/]*)$");
  const std::string alphabet = "a./";
  std::vector<std::string> names = {""};
  for (size_t begin = 0, len = 0; len < 8; ++len) {
    const size_t end = names.size();
    for (size_t i = begin; i < end; ++i) {
      for (char c : alphabet) names.push_back(names[i] + c);
    }
    begin = end;
  }
  for (const std::string& name : names) {
    std::smatch m;
    const auto split = SplitSampleName(name);
    if (std::regex_match(name, m, base_plus_ext)) {
      ASSERT_TRUE(split.has_value()) << name;
      EXPECT_EQ(split->first, m[1].str()) << name;
      EXPECT_EQ(split->second, m[2].str()) << name;
    } else {
      EXPECT_FALSE(split.has_value()) << name;
    }
  }
}

TEST(TarTest, MetadataNamesAreWebdatasets) {
  EXPECT_TRUE(IsTarMetadataName("__meta__"));
  EXPECT_TRUE(IsTarMetadataName("__meta__/x.json"));
  EXPECT_TRUE(IsTarMetadataName("____"));
  EXPECT_FALSE(IsTarMetadataName("___"));
  EXPECT_FALSE(IsTarMetadataName("__key__.txt"));  // an ordinary sample "__key__"
  EXPECT_FALSE(IsTarMetadataName("a/__meta__/x.json"));
  EXPECT_FALSE(IsTarMetadataName("__a/b__"));
}

TEST(TarTest, GroupsAsWebdatasetDoes) {
  TempStore tmp;
  std::string tar;
  tar += TarEntry("__meta__/info.json", "{}");  // skipped: metadata
  tar += TarEntry("__index__", "x");            // skipped: metadata
  tar += TarEntry("d/s1.JPG", "upper");         // extension lower-cased
  tar += TarEntry("d/s1.Seg.PNG", "seg");       // all of it
  tar += TarEntry("d/.DS_Store", "finder");     // key "d/", extension "ds_store"
  tar += TarEntry("d/.hidden.TXT", "hid");      // the same sample "d/"
  tar += TarEntry("d/s2.cls", "2");
  tar += TarEntry("d/noext", "skipped, and s2 goes on");
  tar += TarEntry("d/s2.txt", "two");
  tar += TarEntry("./s3.jpg", "dot-slash kept in the key");
  tar += TarEntry(".top.txt", "skipped: no key at all");
  tar += TarEntry("__key__.txt", "an ordinary sample named __key__");
  tar += TarEndOfArchive();
  ASSERT_TRUE(tmp.store()->Put("w.tar", absl::Cord(tar)).ok());
  auto flat = ReadSamples(tmp.store(), "w.tar");
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_THAT(flat->keys, testing::ElementsAre("d/s1", "d/", "d/s2", "./s3", "__key__"));
  using M = std::map<std::string, std::string>;
  EXPECT_EQ(flat->samples["d/s1"], (M{{"jpg", "upper"}, {"seg.png", "seg"}}));
  EXPECT_EQ(flat->samples["d/"], (M{{"ds_store", "finder"}, {"hidden.txt", "hid"}}));
  EXPECT_EQ(flat->samples["d/s2"], (M{{"cls", "2"}, {"txt", "two"}}));
  EXPECT_EQ(flat->samples["./s3"], (M{{"jpg", "dot-slash kept in the key"}}));
  EXPECT_EQ(flat->samples["__key__"], (M{{"txt", "an ordinary sample named __key__"}}));

  // Extensions that differ only in case are one extension: an error, as in webdataset.
  const std::string dup = TarEntry("s1.jpg", "a") + TarEntry("s1.JPG", "b") + TarEndOfArchive();
  ASSERT_TRUE(tmp.store()->Put("case.tar", absl::Cord(dup)).ok());
  flat = ReadSamples(tmp.store(), "case.tar");
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(flat.status().message(), "two members with extension 'jpg'"))
      << flat.status();
  // Extensions that would overwrite a sample's metadata in Python.
  for (const char* name : {"s1.__key__", "s1.__URL__", "s1.__offset__"}) {
    const std::string meta = TarEntry("s1.jpg", "a") + TarEntry(name, "b") + TarEndOfArchive();
    ASSERT_TRUE(tmp.store()->Put("meta.tar", absl::Cord(meta)).ok());
    flat = ReadSamples(tmp.store(), "meta.tar");
    EXPECT_EQ(flat.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_TRUE(absl::StrContains(flat.status().message(), "names a sample's metadata"))
        << flat.status();
  }
}

TEST(TarTest, ReadsGzipCompressedShardsByNameOrOption) {
  TempStore tmp;
  std::string tar;
  for (int i = 0; i < 40; ++i) {
    tar += TarEntry(absl::StrCat("s", 100 + i, ".bin"), Content(std::to_string(i), 3000 * i));
    tar += TarEntry(absl::StrCat("s", 100 + i, ".cls"), std::to_string(i));
  }
  tar += TarEndOfArchive();
  const std::string gz = formats_testing::Deflate(tar, formats_testing::Deflated::kGzip);
  ASSERT_TRUE(tmp.store()->Put("plain.tar", absl::Cord(tar)).ok());
  ASSERT_TRUE(tmp.store()->Put("c.tar.gz", absl::Cord(gz)).ok());
  ASSERT_TRUE(tmp.store()->Put("c.tgz", absl::Cord(gz)).ok());
  ASSERT_TRUE(tmp.store()->Put("c-gz.tar", absl::Cord(gz)).ok());
  auto want = ReadSamples(tmp.store(), "plain.tar");
  ASSERT_TRUE(want.ok());
  ASSERT_EQ(want->keys.size(), 40u);
  for (const char* key : {"c.tar.gz", "c.tgz"}) {
    for (uint64_t chunk : {13ul, 100ul, 4096ul, uint64_t{8} << 20}) {
      TarOptions options;
      options.io.chunk_size = chunk;
      auto flat = ReadSamples(tmp.store(), key, options);
      ASSERT_TRUE(flat.ok()) << key << " chunk " << chunk << ": " << flat.status();
      EXPECT_EQ(flat->keys, want->keys);
      EXPECT_EQ(flat->samples, want->samples);
    }
  }
  // A gzip shard under a plain name: refused with what to do, or read when asked for gzip.
  auto plain = ReadSamples(tmp.store(), "c-gz.tar");
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(plain.status().message(),
                                "at byte 0: the shard is gzip-compressed but was read as an "
                                "uncompressed tar: name it .tar.gz or .tgz"))
      << plain.status();
  auto asked = ReadSamples(tmp.store(), "c-gz.tar", {.compression = Compression::kGzip});
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->samples, want->samples);
  // The same for a compressed shard shorter than one tar header (a one-member shard).
  const std::string tiny =
      formats_testing::Deflate(TarEntry("a.txt", "x"), formats_testing::Deflated::kGzip);
  ASSERT_LT(tiny.size(), 512u);
  ASSERT_TRUE(tmp.store()->Put("tiny-gz.tar", absl::Cord(tiny)).ok());
  auto small = ReadSamples(tmp.store(), "tiny-gz.tar");
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument) << small.status();
  EXPECT_TRUE(absl::StrContains(small.status().message(), "name it .tar.gz or .tgz"))
      << small.status();
  // Other compressions are named, not read as garbage.
  ASSERT_TRUE(tmp.store()
                  ->Put("x.tar", absl::Cord(std::string("\xfd"
                                                        "7zXZ\0",
                                                        6) +
                                            tar))
                  .ok());
  auto xz = ReadSamples(tmp.store(), "x.tar");
  EXPECT_EQ(xz.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StrContains(xz.status().message(), "the shard is xz-compressed"))
      << xz.status();
  // A shard cut inside the compressed stream, and inside a member.
  ASSERT_TRUE(tmp.store()->Put("cut.tar.gz", absl::Cord(gz.substr(0, gz.size() / 2))).ok());
  auto cut = ReadSamples(tmp.store(), "cut.tar.gz");
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(cut.status().message(), "gzip stream is cut short"))
      << cut.status();
  const std::string half =
      formats_testing::Deflate(tar.substr(0, 512 * 7 + 100), formats_testing::Deflated::kGzip);
  ASSERT_TRUE(tmp.store()->Put("half.tar.gz", absl::Cord(half)).ok());
  cut = ReadSamples(tmp.store(), "half.tar.gz");
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(
      absl::StrContains(cut.status().message(), "the gzip-decompressed stream ends at byte"))
      << cut.status();
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

// `prefix`: what the tool puts before every path ("./" for `tar -C dir .`; webdataset keeps
// it in the key).
void ExpectTree(const Flat& flat, const Tree& tree, const std::string& prefix = "") {
  std::map<std::string, std::map<std::string, std::string>> want;
  for (const auto& [relative, content] : tree.files) {
    const std::string path = prefix + relative;
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
                          std::initializer_list<uint64_t> chunk_sizes,
                          const std::string& prefix = "") {
  for (uint64_t chunk : chunk_sizes) {
    TarOptions options;
    options.io.chunk_size = chunk;
    auto flat = ReadSamples(tmp.store(), key, options);
    ASSERT_TRUE(flat.ok()) << key << " (chunk " << chunk << "): " << flat.status();
    ExpectTree(*flat, tree, prefix);
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
    ExpectShardHoldsTree(tmp, key, tree, {1000, 65536}, "./");
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

TEST(TarTest, ReadsShardsCompressedByGnuTar) {
  TempStore tmp;
  const std::string src = tmp.root() + "-src";
  const Tree tree = MakeTree(src);
  ASSERT_EQ(RunShell(absl::StrCat("tar --sort=name -C '", src, "' -czf '", tmp.PathOf("gnu.tar.gz"),
                                  "' .")),
            0);
  ExpectShardHoldsTree(tmp, "gnu.tar.gz", tree, {1000, 65536}, "./");
  fs::remove_all(src);
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
  // Cut inside the padding after s1.jpg's data (512 + 2000 bytes): s2.jpg is lost, so the
  // shard is an error, not an archive of one member (tarfile: "unexpected end of data").
  ASSERT_TRUE(tmp.store()->Put("cut-padding.tar", absl::Cord(tar.substr(0, 2512 + 20))).ok());
  flat = ReadSamples(tmp.store(), "cut-padding.tar");
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(flat.status().message(),
                                "truncated archive: 48 bytes of padding at byte 2512"))
      << flat.status();
  const std::string dangling = TarEntry("s1.jpg", "a") + TarEntry("././@LongLink", "s2.jpg", 'L');
  ASSERT_TRUE(tmp.store()->Put("dangling.tar", absl::Cord(dangling)).ok());
  flat = ReadSamples(tmp.store(), "dangling.tar");
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kDataLoss) << flat.status();
  // An empty object (a failed upload) is no archive: it gave 0 samples without an error. An
  // archive of no members (its end-of-archive blocks) is one.
  ASSERT_TRUE(tmp.store()->Put("empty.tar", absl::Cord()).ok());
  flat = ReadSamples(tmp.store(), "empty.tar");
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kDataLoss) << flat.status();
  EXPECT_TRUE(
      absl::StrContains(flat.status().message(), "empty.tar at byte 0: the object is empty"))
      << flat.status();
  ASSERT_TRUE(tmp.store()->Put("none.tar", absl::Cord(std::string(10240, '\0'))).ok());
  flat = ReadSamples(tmp.store(), "none.tar");
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_TRUE(flat->keys.empty());
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
