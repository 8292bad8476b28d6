#include "dataset/index.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "base/hash.h"
#include "dataset/index_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/local/local_store.h"
#include "store/testing/temp_store.h"

namespace wharf {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Keys(const SampleIndex& index) {
  std::vector<std::string> keys;
  for (const auto& e : index.entries()) keys.push_back(e.key);
  return keys;
}

absl::StatusOr<SampleIndex> Parse(absl::string_view text,
                                  ManifestFormat format = ManifestFormat::kAuto) {
  return SampleIndex::ParseManifest(text, "ds/", "s3://bucket/", "s3://bucket/ds/m",
                                    {.format = format});
}

TEST(ManifestTest, PlainKeys) {
  auto index = Parse("a/1.jpg\n\n  b/2.jpg \r\n/other/3.jpg\r\ns3://bucket/x/4.jpg\n5.jpg");
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_THAT(Keys(*index),
              ElementsAre("ds/a/1.jpg", "ds/b/2.jpg", "other/3.jpg", "x/4.jpg", "ds/5.jpg"));
  EXPECT_FALSE((*index)[0].size.has_value());
}

TEST(ManifestTest, JsonLines) {
  auto index = Parse(
      "{\"key\": \"a.jpg\", \"size\": 12, \"label\": 3}\n"
      "\n"
      "{\"key\": \"/abs/b.jpg\", \"etag\": \"\\\"0123\\\"\"}\r\n"
      "{\"key\": \"c.jpg\", \"size\": 0, \"etag\": \"ff\"}\n");
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->size(), 3u);
  EXPECT_EQ((*index)[0].key, "ds/a.jpg");
  EXPECT_EQ((*index)[0].size, 12u);
  EXPECT_EQ((*index)[1].key, "abs/b.jpg");
  EXPECT_FALSE((*index)[1].size.has_value());
  EXPECT_EQ((*index)[1].etag, "0123");  // quotes of the HTTP form dropped
  EXPECT_EQ((*index)[2].size, 0u);
  EXPECT_EQ((*index)[2].etag, "ff");
}

TEST(ManifestTest, ErrorsNameTheManifestAndTheLine) {
  struct Case {
    std::string text;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"{\"key\":\"a\"}\n\n{\"key\": \"b\"", "s3://bucket/ds/m line 3: invalid JSON"},
           {"{\"key\":\"a\"}\n[1]", "line 2: expected a JSON object"},
           {"{\"size\": 1}", "line 1: missing \"key\""},
           {"{\"key\": 5}", "line 1: \"key\" must be a string"},
           {"{\"key\": \"\"}", "line 1: empty key"},
           {"{\"key\":\"a\"}\n{\"key\":\"b\",\"size\":-1}",
            "line 2: \"size\" must be a non-negative integer"},
           {"{\"key\":\"b\",\"size\":\"12\"}", "line 1: \"size\" must be a non-negative integer"},
           {"{\"key\":\"b\",\"size\":1.5}", "line 1: \"size\" must be a non-negative integer"},
           {"{\"key\":\"b\",\"etag\":1}", "line 1: \"etag\" must be a string"},
           {"a\nb\ngs://elsewhere/c", "line 3: 'gs://elsewhere/c' is not in this dataset's store"},
           {"a\n/\n", "line 2: key '/' names no object"},
       }) {
    auto index = Parse(c.text);
    EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(index.status().message(), HasSubstr(c.message)) << c.text;
  }
  // The JSON parser's own explanation is kept.
  EXPECT_THAT(Parse("{\"key\": }").status().message(), HasSubstr("syntax error"));
}

TEST(ManifestTest, FormatCanBeForced) {
  // A plain manifest whose first key starts with '{'.
  auto index = Parse("{weird}.jpg\nb.jpg", ManifestFormat::kKeys);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_THAT(Keys(*index), ElementsAre("ds/{weird}.jpg", "ds/b.jpg"));
  EXPECT_THAT(Parse("a.jpg", ManifestFormat::kJsonLines).status().message(),
              HasSubstr("line 1: invalid JSON"));
  EXPECT_TRUE(Parse("").ok());
  EXPECT_TRUE(Parse("\n \n").value().empty());
}

TEST(FingerprintTest, DependsOnKeysAndOrderOnly) {
  SampleIndex a = SampleIndex::FromKeys({"x", "y"});
  SampleIndex b({{.key = "x", .size = 3, .etag = "e"}, {.key = "y"}});
  EXPECT_EQ(a.Fingerprint(), b.Fingerprint());
  EXPECT_NE(a.Fingerprint(), SampleIndex::FromKeys({"y", "x"}).Fingerprint());
  EXPECT_NE(SampleIndex::FromKeys({"ab", "c"}).Fingerprint(),
            SampleIndex::FromKeys({"a", "bc"}).Fingerprint());
  EXPECT_EQ(SampleIndex().Fingerprint().size(), 32u);
}

class LocalIndexTest : public testing::Test {
 protected:
  store_testing::TempStore temp_;
  const std::shared_ptr<LocalStore> store_ = temp_.store();
};

TEST_F(LocalIndexTest, ListingIsSortedAndIndependentOfParallelism) {
  std::vector<std::string> expected;
  // Inserted out of order; "a.txt" < "a/..." byte-wise, which a directory walk gets wrong.
  for (int i = 199; i >= 0; --i) {
    const std::string key = absl::StrCat("train/", i % 7, "/", 1000 + i, ".jpg");
    ASSERT_TRUE(store_->Put(key, absl::Cord(std::string(i, 'x'))).ok());
    expected.push_back(key);
  }
  ASSERT_TRUE(store_->Put("train/a.txt", absl::Cord("t")).ok());
  expected.push_back("train/a.txt");
  ASSERT_TRUE(store_->Put("val/z.jpg", absl::Cord("v")).ok());
  std::sort(expected.begin(), expected.end());

  auto one = SampleIndex::FromListing(*store_, "train/", {.list = {.workers = 1, .page_size = 7}});
  auto many = SampleIndex::FromListing(*store_, "train/", {.list = {.workers = 8, .page_size = 7}});
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ(Keys(*one), expected);
  EXPECT_EQ(Keys(*many), expected);
  EXPECT_EQ(one->Fingerprint(), many->Fingerprint());
  for (const auto& e : one->entries()) {
    ASSERT_TRUE(e.size.has_value());
    EXPECT_FALSE(e.etag.empty());
  }
  EXPECT_EQ((*one)[0].size, 0u);  // train/0/1000.jpg is empty

  auto jpgs = SampleIndex::FromListing(*store_, "train/", {.suffixes = {".jpg"}});
  ASSERT_TRUE(jpgs.ok());
  EXPECT_EQ(jpgs->size(), 200u);
}

TEST_F(LocalIndexTest, ManifestKeysAreRelativeToTheManifest) {
  ASSERT_TRUE(store_->Put("ds/v1/manifest.txt", absl::Cord("a/1.jpg\nb/2.jpg\n/top.jpg\n")).ok());
  auto index = SampleIndex::FromManifest(*store_, "ds/v1/manifest.txt");
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_THAT(Keys(*index), ElementsAre("ds/v1/a/1.jpg", "ds/v1/b/2.jpg", "top.jpg"));

  // A URI inside the store is accepted; the manifest's own error names its URI.
  ASSERT_TRUE(
      store_
          ->Put("m.jsonl", absl::Cord(absl::StrCat("{\"key\":\"", store_->Uri("x/y.bin"), "\"}\n",
                                                   "{\"key\":\"z\",\"size\":true}\n")))
          .ok());
  auto bad = SampleIndex::FromManifest(*store_, "m.jsonl");
  EXPECT_THAT(bad.status().message(),
              HasSubstr(absl::StrCat("manifest ", store_->Uri("m.jsonl"), " line 2")));

  auto missing = SampleIndex::FromManifest(*store_, "nope.txt");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(store_->Uri("nope.txt")));
}

// ---- Index files ----

std::vector<SampleEntry> SomeEntries(int n) {
  std::vector<SampleEntry> entries;
  for (int i = 0; i < n; ++i) {
    SampleEntry e{.key = absl::StrCat("train/", i % 3 == 0 ? "\xc3\xa9t\xc3\xa9/" : "", i, ".jpg")};
    if (i % 4 != 1) e.size = static_cast<uint64_t>(i) * 1000;
    if (i % 5 == 0) e.etag = absl::StrCat("etag-", i);
    entries.push_back(std::move(e));
  }
  return entries;
}

void ExpectSameEntries(const SampleIndex& got, const std::vector<SampleEntry>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const SampleRef r = got.Ref(i);
    EXPECT_EQ(r.key, want[i].key) << i;
    EXPECT_EQ(r.size, want[i].size) << i;
    EXPECT_EQ(r.etag, want[i].etag) << i;
  }
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

class IndexFileTest : public testing::Test {
 protected:
  absl::StatusOr<SampleIndex> BuildFile(const std::vector<SampleEntry>& entries,
                                        const std::string& name = "i.widx") {
    auto b = SampleIndexBuilder::ToFile(dir_.root());
    if (!b.ok()) return b.status();
    for (const SampleEntry& e : entries) {
      if (absl::Status s = b->Add(e.key, e.size, e.etag); !s.ok()) return s;
    }
    return b->FinishFile([&](absl::string_view) { return Path(name); }, /*replace=*/true);
  }
  std::string Path(const std::string& name) const { return dir_.root() + "/" + name; }

  store_testing::TempStore dir_;
};

TEST_F(IndexFileTest, RoundTripsEveryColumn) {
  const std::vector<SampleEntry> entries = SomeEntries(1000);
  const SampleIndex in_memory(entries);
  auto file = BuildFile(entries);
  ASSERT_TRUE(file.ok()) << file.status();
  ExpectSameEntries(*file, entries);
  ExpectSameEntries(in_memory, entries);
  EXPECT_EQ(file->path(), Path("i.widx"));
  EXPECT_EQ(file->memory_bytes(), 0u);  // mapped, not on the heap
  EXPECT_TRUE(in_memory.path().empty());
  EXPECT_TRUE(file->Verify().ok());
  EXPECT_TRUE(in_memory.Verify().ok());
  // The file is mode 0600 (it may name private objects) and nothing else is left in the dir.
  struct stat st;
  ASSERT_EQ(stat(Path("i.widx").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_.root()), {}), 1);

  // Reopened, and as bytes (a pickled in-memory index): the same entries.
  auto reopened = SampleIndex::OpenFile(Path("i.widx"));
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  ExpectSameEntries(*reopened, entries);
  auto from_bytes = SampleIndex::FromBytes(in_memory.Serialize());
  ASSERT_TRUE(from_bytes.ok()) << from_bytes.status();
  ExpectSameEntries(*from_bytes, entries);
  // The in-memory index serializes to exactly the file's bytes.
  EXPECT_EQ(in_memory.Serialize(), ReadAll(Path("i.widx")));
  EXPECT_EQ(file->Serialize(), ReadAll(Path("i.widx")));

  // Owning copies and the entries range agree with the views.
  EXPECT_EQ((*file)[7].key, entries[7].key);
  EXPECT_EQ(file->ToEntries().size(), entries.size());
  size_t n = 0;
  for (const SampleEntry& e : file->entries()) EXPECT_EQ(e.key, entries[n++].key);
  EXPECT_EQ(n, entries.size());
}

TEST_F(IndexFileTest, EmptyAndEtagLessIndexes) {
  auto empty = BuildFile({}, "empty.widx");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->size(), 0u);
  EXPECT_EQ(empty->Fingerprint(), SampleIndex().Fingerprint());
  EXPECT_EQ(empty->Serialize(), SampleIndex().Serialize());
  // Without any ETag the file has no ETag columns: keys, offsets and sizes only.
  auto plain = BuildFile({{.key = "a", .size = 1}, {.key = "bc"}}, "plain.widx");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(ReadAll(Path("plain.widx")).size(), 128u + 8 + 3 * 8 + 2 * 8);
  EXPECT_EQ(plain->Ref(0).etag, "");
  EXPECT_FALSE(plain->Ref(1).size.has_value());
}

// Resume states record the fingerprint: it must be the same as before index files, for the
// same keys, however the index is held.
TEST_F(IndexFileTest, FingerprintIsTheLengthPrefixedMd5OfTheKeys) {
  const std::vector<SampleEntry> entries = SomeEntries(300);
  Md5 md5;
  for (const SampleEntry& e : entries) {
    const uint64_t n = e.key.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    md5.Update(absl::string_view(len, sizeof(len)));
    md5.Update(e.key);
  }
  const std::string expected = HexLower(md5.Finish());
  auto file = BuildFile(entries);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->Fingerprint(), expected);
  EXPECT_EQ(SampleIndex(entries).Fingerprint(), expected);
  std::vector<std::string> keys;
  for (const SampleEntry& e : entries) keys.push_back(e.key);
  EXPECT_EQ(SampleIndex::FromKeys(keys).Fingerprint(), expected);
  EXPECT_EQ(SampleIndex::FromBytes(file->Serialize())->Fingerprint(), expected);
  EXPECT_EQ(SampleIndex().Fingerprint(), "d41d8cd98f00b204e9800998ecf8427e");  // MD5("")
}

TEST_F(IndexFileTest, DamagedFilesAreRefusedWithTheReason) {
  const std::vector<SampleEntry> entries = SomeEntries(50);
  ASSERT_TRUE(BuildFile(entries).ok());
  const std::string good = ReadAll(Path("i.widx"));
  const std::string path = Path("bad.widx");
  auto open_with = [&](const std::string& bytes) {
    WriteAll(path, bytes);
    return SampleIndex::OpenFile(path).status();
  };
  auto with_crc = [](std::string bytes) {  // a header edited consistently
    const uint32_t crc = Crc32c(absl::string_view(bytes.data(), 124));
    for (int i = 0; i < 4; ++i) bytes[124 + i] = static_cast<char>((crc >> (8 * i)) & 0xff);
    return bytes;
  };
  struct Case {
    std::string name;
    std::string bytes;
    std::string message;
  };
  std::string flipped = good;
  flipped[20] ^= 1;  // the count, without fixing the checksum
  std::string version2 = good;
  version2[8] = 2;
  std::string more = good;
  more[16] += 1;  // one entry more than the file holds, checksum fixed
  std::string offsets = good;
  // The last key offset (the entry count's end) no longer equals the key bytes.
  const uint64_t last_offset = good.size() - 8 * (50 + 1) - 8 * 50 - 8 * (50 + 1) + 8 * 50;
  offsets[last_offset] ^= 1;
  for (const Case& c : std::vector<Case>{
           {"empty", "", "not a wharf index file"},
           {"text", "a/1.jpg\nb/2.jpg\n", "not a wharf index file"},
           {"short", good.substr(0, 100), "truncated"},
           {"truncated", good.substr(0, good.size() - 8), "truncated"},
           {"extended", good + std::string(8, '\0'), "trailing bytes"},
           {"checksum", flipped, "corrupt header (checksum mismatch)"},
           {"version", with_crc(version2), "format version 2 is not supported"},
           {"count", with_crc(more), "truncated"},
           {"offsets", offsets, "corrupt key offsets"},
       }) {
    absl::Status s = open_with(c.bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.name;
    EXPECT_THAT(s.message(), HasSubstr(path)) << c.name;
    EXPECT_EQ(SampleIndex::FromBytes(c.bytes).status().code(), absl::StatusCode::kInvalidArgument)
        << c.name;
  }
  EXPECT_EQ(SampleIndex::OpenFile(Path("missing.widx")).status().code(),
            absl::StatusCode::kNotFound);

  // A damaged offset inside the file is not read at open (O(1)); entries stay inside the
  // mapping, and Verify names the entry.
  std::string middle = good;
  const uint64_t key_offsets = good.size() - 8 * (50 + 1) - 8 * 50 - 8 * (50 + 1);
  middle[key_offsets + 8 * 10 + 7] = '\x7f';  // entry 9's end / entry 10's start: huge
  auto damaged = SampleIndex::FromBytes(middle);
  ASSERT_TRUE(damaged.ok()) << damaged.status();
  for (size_t i = 0; i < damaged->size(); ++i) {
    const SampleRef r = damaged->Ref(i);
    ASSERT_LE(r.key.size(), 4096u) << i;
  }
  EXPECT_THAT(damaged->Verify().message(), HasSubstr("corrupt key offset of entry 10"));
  // A damaged key byte: the recorded fingerprint no longer matches.
  std::string key_byte = good;
  key_byte[128] ^= 1;
  EXPECT_THAT(SampleIndex::FromBytes(key_byte)->Verify().message(),
              HasSubstr("do not match the recorded fingerprint"));
}

TEST_F(IndexFileTest, ConcurrentReadersOfOneFile) {
  const std::vector<SampleEntry> entries = SomeEntries(20000);
  ASSERT_TRUE(BuildFile(entries).ok());
  auto shared = SampleIndex::OpenFile(Path("i.widx"));
  ASSERT_TRUE(shared.ok());
  std::vector<std::thread> readers;
  std::vector<int> mismatches(8, 0);
  for (int t = 0; t < 8; ++t) {
    readers.emplace_back([&, t] {
      // Half share one mapping, half map the file themselves.
      absl::StatusOr<SampleIndex> own = SampleIndex::OpenFile(Path("i.widx"));
      const SampleIndex& index = t % 2 == 0 ? *shared : *own;
      for (size_t i = t; i < entries.size(); i += 3) {
        const SampleRef r = index.Ref(i);
        if (r.key != entries[i].key || r.size != entries[i].size || r.etag != entries[i].etag) {
          ++mismatches[t];
        }
      }
      if (index.Fingerprint() != SampleIndex(entries).Fingerprint()) ++mismatches[t];
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_THAT(mismatches, testing::Each(0));
  // A copy shares the mapping, which outlives the original.
  SampleIndex copy = *shared;
  shared = absl::UnknownError("dropped");
  EXPECT_EQ(copy.Ref(19999).key, entries[19999].key);
}

TEST_F(IndexFileTest, ContentNamedPublishKeepsTheFirstFile) {
  const std::vector<SampleEntry> entries = SomeEntries(10);
  std::string digest;
  auto publish = [&]() {
    auto b = SampleIndexBuilder::ToFile(dir_.root(), "l-x-");
    EXPECT_TRUE(b.ok());
    for (const SampleEntry& e : entries) EXPECT_TRUE(b->Add(e.key, e.size, e.etag).ok());
    return b->FinishFile(
        [&](absl::string_view d) {
          digest = std::string(d);
          return Path(absl::StrCat("l-x-", d, ".widx"));
        },
        /*replace=*/false);
  };
  auto first = publish();
  ASSERT_TRUE(first.ok()) << first.status();
  struct stat a, b;
  ASSERT_EQ(stat(first->path().c_str(), &a), 0);
  auto second = publish();
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(stat(second->path().c_str(), &b), 0);
  EXPECT_EQ(first->path(), second->path());
  EXPECT_EQ(a.st_ino, b.st_ino);  // the first file kept: both processes share its pages
  EXPECT_EQ(digest.size(), 32u);
  // No temporary file left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_.root()), {}), 1);
}

class IndexCacheTest : public LocalIndexTest {
 protected:
  ManifestOptions Cached() const { return {.cache = {.dir = cache_.root() + "/idx"}}; }
  store_testing::TempStore cache_;
};

ino_t Inode(const std::string& path) {
  struct stat st;
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

TEST_F(IndexCacheTest, ManifestIndexIsBuiltOncePerManifestVersion) {
  // Long enough to arrive in several chunks, with lines across chunk boundaries.
  std::string text;
  for (int i = 0; i < 60000; ++i) {
    absl::StrAppend(&text, "{\"key\": \"img/", i, ".jpg\", \"size\": ", i, i % 2 ? "}\r\n" : "}\n");
  }
  ASSERT_TRUE(store_->Put("ds/m.jsonl", absl::Cord(text)).ok());
  auto parsed = SampleIndex::ParseManifest(text, "ds/", store_->Uri(""), "m");
  ASSERT_TRUE(parsed.ok()) << parsed.status();

  auto first = SampleIndex::FromManifest(*store_, "ds/m.jsonl", Cached());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->path().empty());
  ExpectSameEntries(*first, parsed->ToEntries());
  EXPECT_EQ(first->Fingerprint(), parsed->Fingerprint());
  const ino_t inode = Inode(first->path());

  // The same manifest again: the same file, not rebuilt.
  auto again = SampleIndex::FromManifest(*store_, "ds/m.jsonl", Cached());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->path(), first->path());
  EXPECT_EQ(Inode(again->path()), inode);

  // In memory without a cache dir: the same index.
  auto in_memory = SampleIndex::FromManifest(*store_, "ds/m.jsonl");
  ASSERT_TRUE(in_memory.ok());
  EXPECT_TRUE(in_memory->path().empty());
  EXPECT_EQ(in_memory->Fingerprint(), first->Fingerprint());

  // A new version of the manifest is another file.
  ASSERT_TRUE(store_->Put("ds/m.jsonl", absl::Cord("a.jpg\nb.jpg\n")).ok());
  auto changed = SampleIndex::FromManifest(*store_, "ds/m.jsonl", Cached());
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_NE(changed->path(), first->path());
  EXPECT_THAT(Keys(*changed), ElementsAre("ds/a.jpg", "ds/b.jpg"));
  EXPECT_EQ(first->size(), 60000u);  // the old mapping still reads the old file

  // A damaged cache file is rebuilt rather than used.
  WriteAll(changed->path(), "garbage");
  auto rebuilt = SampleIndex::FromManifest(*store_, "ds/m.jsonl", Cached());
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  EXPECT_THAT(Keys(*rebuilt), ElementsAre("ds/a.jpg", "ds/b.jpg"));

  // Errors still name the manifest and its line.
  ASSERT_TRUE(store_->Put("ds/bad.txt", absl::Cord("a\n/\n")).ok());
  EXPECT_THAT(SampleIndex::FromManifest(*store_, "ds/bad.txt", Cached()).status().message(),
              HasSubstr(absl::StrCat("manifest ", store_->Uri("ds/bad.txt"), " line 2")));
  EXPECT_EQ(SampleIndex::FromManifest(*store_, "ds/none.txt", Cached()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(IndexCacheTest, ConcurrentBuildersOfOneManifestShareOneFile) {
  std::string text;
  for (int i = 0; i < 20000; ++i) absl::StrAppend(&text, "k/", i, "\n");
  ASSERT_TRUE(store_->Put("m.txt", absl::Cord(text)).ok());
  std::vector<absl::StatusOr<SampleIndex>> got(4, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back(
        [&, t] { got[t] = SampleIndex::FromManifest(*store_, "m.txt", Cached()); });
  }
  for (auto& t : threads) t.join();
  for (const auto& g : got) {
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->size(), 20000u);
    EXPECT_EQ(Inode(g->path()), Inode(got[0]->path()));
  }
}

TEST_F(IndexCacheTest, ListingFileIsNamedByItsContents) {
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(store_->Put(absl::StrCat("t/", i, ".bin"), absl::Cord(std::string(i, 'x'))).ok());
  }
  ListingIndexOptions options{.cache = {.dir = cache_.root() + "/idx"}};
  auto a = SampleIndex::FromListing(*store_, "t/", options);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = SampleIndex::FromListing(*store_, "t/", options);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(a->path().empty());
  EXPECT_EQ(a->path(), b->path());
  EXPECT_EQ(Inode(a->path()), Inode(b->path()));
  auto memory = SampleIndex::FromListing(*store_, "t/");
  ASSERT_TRUE(memory.ok());
  ExpectSameEntries(*a, memory->ToEntries());
  // An object rewritten with another size: same keys, another file (sizes are in it).
  ASSERT_TRUE(store_->Put("t/3.bin", absl::Cord("longer than before")).ok());
  auto c = SampleIndex::FromListing(*store_, "t/", options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(c->path(), a->path());
  EXPECT_EQ(c->Fingerprint(), a->Fingerprint());
  EXPECT_EQ(c->Ref(23).size, 18u);  // "t/3.bin" sorts after "t/29.bin"
}

TEST_F(IndexCacheTest, EntriesUnusedForAWeekAreRemovedOnPublish) {
  const std::string dir = cache_.root() + "/idx";
  ASSERT_TRUE(internal_index::MakeDirs(dir).ok());
  const std::string old_entry = dir + "/m-0123456789abcdef-00.widx";
  const std::string old_lock = dir + "/l-0123456789abcdef-00.widx.lock";
  const std::string recent = dir + "/m-fedcba9876543210-00.widx";
  const std::string foreign = dir + "/m-notours.widx";
  for (const std::string& p : {old_entry, old_lock, recent, foreign}) WriteAll(p, "x");
  const timespec eight_days[2] = {{time(nullptr) - 8 * 24 * 3600, 0},
                                  {time(nullptr) - 8 * 24 * 3600, 0}};
  for (const std::string& p : {old_entry, old_lock, foreign}) {
    ASSERT_EQ(utimensat(AT_FDCWD, p.c_str(), eight_days, 0), 0);
  }
  ASSERT_TRUE(store_->Put("m.txt", absl::Cord("a\n")).ok());
  ASSERT_TRUE(SampleIndex::FromManifest(*store_, "m.txt", Cached()).ok());
  EXPECT_FALSE(std::filesystem::exists(old_entry));
  EXPECT_FALSE(std::filesystem::exists(old_lock));
  EXPECT_TRUE(std::filesystem::exists(recent));
  EXPECT_TRUE(std::filesystem::exists(foreign));  // not a name the cache gives
}

TEST_F(IndexCacheTest, UnwritableCacheDirIsAnError) {
  ASSERT_TRUE(store_->Put("m.txt", absl::Cord("a\n")).ok());
  WriteAll(cache_.root() + "/file", "x");
  auto got =
      SampleIndex::FromManifest(*store_, "m.txt", {.cache = {.dir = cache_.root() + "/file/idx"}});
  EXPECT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr(cache_.root() + "/file"));
}

}  // namespace
}  // namespace wharf
