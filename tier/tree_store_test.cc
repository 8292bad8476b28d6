// A tier's tree as a store: puts become entries carrying their provenance, published in
// batches; listings report the source's ETag so the transfer engine skips current entries.
#include "tier/tree_store.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/transfer.h"
#include "store/testing/temp_store.h"

namespace wharf {
namespace {

using store_testing::TempStore;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class TierTreeStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tier = Tier::Init(tier_dir_.root() + "/tier", {});
    ASSERT_TRUE(tier.ok()) << tier.status();
    tier_ = *tier;
  }
  std::shared_ptr<TierTreeStore> Tree(const std::string& rel) {
    auto tree = TierTreeStore::Open(tier_, tier_->root() + "/" + rel, Runtime::Default());
    EXPECT_TRUE(tree.ok()) << tree.status();
    return *tree;
  }

  TempStore tier_dir_;
  TempStore source_;
  std::shared_ptr<Tier> tier_;
};

// Asynchronous puts with MD5 ETags are hashed many at a time (Md5Batcher): each file is
// still checked against its own source's ETag, and a mismatch fails that put alone.
TEST_F(TierTreeStoreTest, AsyncPutsAreCheckedAgainstTheirOwnMd5InBatches) {
  auto tree = Tree("batch");
  constexpr int kObjects = 40, kCorrupt = 17;
  absl::Mutex mu;
  int done = 0;
  std::vector<absl::Status> results(kObjects);
  for (int i = 0; i < kObjects; ++i) {
    const std::string body(static_cast<size_t>(1000 + 131 * i), static_cast<char>('a' + i % 26));
    PutOptions o;
    o.source_uri = absl::StrCat("s3://b/batch/", i);
    // One object's bytes differ from what its source's ETag says.
    o.source_etag = Md5Hex(i == kCorrupt ? body + "!" : body);
    tree->PutAsync(absl::StrCat("o", i), absl::Cord(body), o,
                   [&, i](absl::StatusOr<ObjectMeta> meta) {
                     absl::MutexLock lock(&mu);
                     results[i] = meta.status();
                     ++done;
                   });
  }
  {
    absl::MutexLock lock(&mu);
    auto all = [&] { return done == kObjects; };
    mu.Await(absl::Condition(&all));
  }
  ASSERT_TRUE(tree->Flush().ok());
  for (int i = 0; i < kObjects; ++i) {
    const std::string path = absl::StrCat(tier_->root(), "/batch/o", i);
    if (i == kCorrupt) {
      EXPECT_EQ(results[i].code(), absl::StatusCode::kDataLoss) << results[i];
      EXPECT_THAT(std::string(results[i].message()), HasSubstr("is not the source's ETag"));
      EXPECT_FALSE(std::filesystem::exists(path));
      continue;
    }
    ASSERT_TRUE(results[i].ok()) << i << " " << results[i];
    EXPECT_EQ(ReadFile(path).size(), static_cast<size_t>(1000 + 131 * i));
    auto head = tree->Head(absl::StrCat("o", i));
    ASSERT_TRUE(head.ok()) << head.status();
    EXPECT_EQ(head->etag, Md5Hex(ReadFile(path)));
  }
}

TEST_F(TierTreeStoreTest, AnOpaqueSourceEtagIsKeptButNotCheckedAgainstTheContent) {
  // An SSE-KMS object's ETag looks like an MD5 and is none: every such import failed.
  auto tree = Tree("kms");
  PutOptions o;
  o.source_uri = "s3://b/kms/a.bin";
  o.source_etag = "0123456789abcdef0123456789abcdef";
  o.source_etag_opaque = true;
  auto meta = tree->Put("a.bin", absl::Cord("payload"), o);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->etag, o.source_etag);  // what a rerun compares with the listing's
  auto entry = ReadEntryAttr(tier_->root() + "/kms/a.bin");
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->md5, Md5Hex("payload"));  // what verify checks the content against
  o.source_etag_opaque = false;
  EXPECT_EQ(tree->Put("b.bin", absl::Cord("payload"), o).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(TierTreeStoreTest, PutMakesAnEntryWithProvenance) {
  auto tree = Tree("train");
  PutOptions o;
  o.source_uri = "s3://b/train/a.bin";
  o.source_etag = "0123456789abcdef-3";  // a multipart ETag: not an MD5, not checked
  auto meta = tree->Put("a.bin", absl::Cord("payload"), o);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->etag, o.source_etag);
  const std::string path = tier_->root() + "/train/a.bin";
  EXPECT_EQ(ReadFile(path), "payload");
  auto entry = ReadEntryAttr(path);
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->source, o.source_uri);
  EXPECT_EQ(entry->md5, Md5Hex("payload"));
  EXPECT_FALSE(entry->local);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077, 0644u & 0077 & ~ProcessUmask());  // readable as any file

  auto page = tree->List({});
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->objects.size(), 1u);
  EXPECT_EQ(page->objects[0].etag, o.source_etag);
  auto head = tree->Head("a.bin");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->etag, o.source_etag);
}

TEST_F(TierTreeStoreTest, ReadsAnswerWithTheListedEtagAndTakeItInConditions) {
  auto tree = Tree("ckpt");
  PutOptions o;
  o.source_uri = "s3://b/ckpt/m.bin";
  o.source_etag = "0123456789abcdef0123456789abcdef-2";  // multipart: not the file's MD5
  ASSERT_TRUE(tree->Put("m.bin", absl::Cord("weights"), o).ok());
  GetRequest req;
  req.key = "m.bin";
  req.range = ByteRange::Of(1, 3);
  std::string buf(3, '\0');
  req.buffer = absl::MakeSpan(buf);
  req.if_match = o.source_etag;  // as the engine reads a big object's parts
  auto got = tree->Get(req);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->meta.etag, o.source_etag);
  EXPECT_EQ(got->bytes, 3u);
  EXPECT_EQ(buf, "eig");
  req.if_match = "ffffffffffffffffffffffffffffffff";
  EXPECT_EQ(tree->Get(req).status().code(), absl::StatusCode::kFailedPrecondition);
  req.if_match.clear();
  req.if_none_match = o.source_etag;
  got = tree->Get(req);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->not_modified);
}

TEST_F(TierTreeStoreTest, ContentThatDisagreesWithAnMd5EtagIsRefusedAndLeavesNothing) {
  auto tree = Tree("");
  PutOptions o;
  o.source_uri = "s3://b/x";
  o.source_etag = Md5Hex("the real content");
  auto meta = tree->Put("x", absl::Cord("corrupted content"), o);
  ASSERT_FALSE(meta.ok());
  EXPECT_EQ(meta.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(meta.status().message(), HasSubstr("is not the source's ETag"));
  EXPECT_THAT(meta.status().message(), HasSubstr("/tier/x"));
  EXPECT_FALSE(std::filesystem::exists(tier_->root() + "/x"));
  // The temporary file went with the failed put.
  auto temp = tier_->TempDir();
  ASSERT_TRUE(temp.ok());
  // (Each thread creates its files in a subdirectory of its own: no file anywhere below.)
  for (const auto& e : std::filesystem::recursive_directory_iterator(*temp)) {
    EXPECT_TRUE(e.is_directory()) << e.path();
  }
}

TEST_F(TierTreeStoreTest, DataWithoutASourceIsLocalAndTheRootHidesTheTiersFolder) {
  auto tree = Tree("");
  ASSERT_TRUE(tree->Put("ckpt/step-1", absl::Cord("state"), PutOptions{}).ok());
  auto entry = ReadEntryAttr(tier_->root() + "/ckpt/step-1");
  ASSERT_TRUE(entry.has_value());
  EXPECT_TRUE(entry->local);
  ListOptions all;
  auto page = tree->List(all);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->objects.size(), 1u);
  EXPECT_EQ(page->objects[0].key, "ckpt/step-1");
  EXPECT_EQ(page->objects[0].etag, Md5Hex("state"));
  ListOptions top;
  top.delimiter = "/";
  page = tree->List(top);
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(page->common_prefixes, ::testing::ElementsAre("ckpt/"));
  EXPECT_EQ(tree->Put(".wharf/tier.json", absl::Cord("x"), PutOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TierTreeStoreTest, Crc32cEntriesListWithAnEtagOfTheirOwnThatReadsAndConditionsKeep) {
  TierTreeOptions options;
  options.written_checksum = Checksum::kCrc32c;
  auto tree = TierTreeStore::Open(tier_, tier_->root() + "/ckpt", Runtime::Default(), options);
  ASSERT_TRUE(tree.ok()) << tree.status();
  const std::string data(300000, 'c');
  auto meta = (*tree)->Put("a.bin", absl::Cord(data), PutOptions{});
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_THAT(meta->etag, ::testing::StartsWith("crc32c-"));
  const std::string path = tier_->root() + "/ckpt/a.bin";
  auto entry = ReadEntryAttr(path);
  ASSERT_TRUE(entry.has_value());
  EXPECT_TRUE(entry->local);
  EXPECT_TRUE(entry->md5.empty());
  EXPECT_EQ(entry->crc32c.size(), 8u);
  EXPECT_EQ(EntryEtag(*entry), meta->etag);
  // Listed, read and conditioned with that ETag; the file store agrees (its ETag cache
  // carries it: it never hashes the file).
  auto page = (*tree)->List(ListOptions{});
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->objects.size(), 1u);
  EXPECT_EQ(page->objects[0].etag, meta->etag);
  auto local = tier_dir_.store()->Head("tier/ckpt/a.bin");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->etag, meta->etag);
  GetRequest get;
  get.key = "a.bin";
  std::string buf(100, '\0');
  get.buffer = absl::MakeSpan(buf);
  get.range = ByteRange::Of(10, 100);
  get.if_match = meta->etag;
  auto got = (*tree)->Get(get);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->meta.etag, meta->etag);
  get.if_match = "crc32c-00000000-1";
  EXPECT_EQ((*tree)->Get(get).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(TierTreeStoreTest, AFileThatIsNotAnEntryListsWithoutAnEtag) {
  auto tree = Tree("d");
  std::filesystem::create_directories(tier_->root() + "/d");
  std::ofstream(tier_->root() + "/d/users-own-file") << "abc";
  auto page = tree->List({});
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->objects.size(), 1u);
  EXPECT_EQ(page->objects[0].etag, "");
}

TEST_F(TierTreeStoreTest, ImportThroughTheTransferEngineResumesByEtag) {
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(source_.store()
                    ->Put(absl::StrCat("train/", i % 4, "/obj", i),
                          absl::Cord(std::string(1000 + i, static_cast<char>('a' + i % 26))))
                    .ok());
  }
  // One object bigger than the stream threshold goes through a writer in parts.
  ASSERT_TRUE(source_.store()->Put("train/big", absl::Cord(std::string(3 << 20, 'z'))).ok());
  auto tree = Tree("imported");
  TransferOptions o;
  o.recursive = true;
  o.stream_threshold = 1 << 20;
  o.part_size = 1 << 20;
  auto first = Transfer({source_.store(), "train/"}, {tree, ""}, o);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->objects, 41u);
  EXPECT_EQ(first->skipped, 0u);
  EXPECT_EQ(ReadFile(tier_->root() + "/imported/big"), std::string(3 << 20, 'z'));
  auto big = ReadEntryAttr(tier_->root() + "/imported/big");
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(big->source, source_.store()->Uri("train/big"));

  auto again = Transfer({source_.store(), "train/"}, {tree, ""}, o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->objects, 0u);
  EXPECT_EQ(again->skipped, 41u);

  // A changed source object, and an entry damaged behind the tier's back, are fetched again.
  ASSERT_TRUE(source_.store()->Put("train/0/obj0", absl::Cord("changed")).ok());
  std::ofstream(tier_->root() + "/imported/1/obj1", std::ios::app) << "junk";
  auto third = Transfer({source_.store(), "train/"}, {tree, ""}, o);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->objects, 2u);
  EXPECT_EQ(ReadFile(tier_->root() + "/imported/0/obj0"), "changed");
  EXPECT_EQ(ReadFile(tier_->root() + "/imported/1/obj1"), std::string(1001, 'b'));
}

TEST_F(TierTreeStoreTest, ShardsTogetherImportEveryObjectOnce) {
  constexpr int kObjects = 60, kShards = 3;
  for (int i = 0; i < kObjects; ++i) {
    ASSERT_TRUE(source_.store()->Put(absl::StrCat("s/k", i), absl::Cord("v")).ok());
  }
  uint64_t total = 0;
  for (int shard = 0; shard < kShards; ++shard) {
    auto tree = Tree("sharded");
    TransferOptions o;
    o.recursive = true;
    o.shard_index = shard;
    o.shard_count = kShards;
    auto r = Transfer({source_.store(), "s/"}, {tree, ""}, o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LT(r->objects, static_cast<uint64_t>(kObjects));
    EXPECT_EQ(r->skipped, 0u) << "shards are disjoint";
    total += r->objects;
  }
  EXPECT_EQ(total, static_cast<uint64_t>(kObjects));
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(tier_->root() + "/sharded")) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, static_cast<size_t>(kObjects));
  TransferOptions bad;
  bad.recursive = true;
  bad.shard_index = 3;
  bad.shard_count = 3;
  EXPECT_EQ(Transfer({source_.store(), "s/"}, {Tree("x"), ""}, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TierTreeStoreTest, ManyConcurrentPutsArePublishedInBatches) {
  TierTreeOptions options;
  options.batch_files = 8;
  auto tree = TierTreeStore::Open(tier_, tier_->root() + "/many", Runtime::Default(), options);
  ASSERT_TRUE(tree.ok());
  absl::Mutex mu;
  int done = 0, failed = 0;
  constexpr int kPuts = 100;
  for (int i = 0; i < kPuts; ++i) {
    (*tree)->PutAsync(absl::StrCat("k", i), absl::Cord(absl::StrCat("v", i)), PutOptions{},
                      [&](absl::StatusOr<ObjectMeta> m) {
                        absl::MutexLock lock(&mu);
                        ++done;
                        if (!m.ok()) ++failed;
                      });
  }
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* d) { return *d == kPuts; }, &done));
  }
  EXPECT_EQ(failed, 0);
  for (int i = 0; i < kPuts; ++i) {
    EXPECT_EQ(ReadFile(absl::StrCat(tier_->root(), "/many/k", i)), absl::StrCat("v", i));
  }
}

TEST_F(TierTreeStoreTest, BulkPutsCompleteBeforePublishingAndFlushReportsFailures) {
  TierTreeOptions o;
  o.complete_before_publish = true;
  o.max_delay = absl::Seconds(30);  // nothing is published until Flush or a full batch
  o.batch_files = 1000;
  auto tree = TierTreeStore::Open(tier_, tier_->root() + "/bulk", Runtime::Default(), o);
  ASSERT_TRUE(tree.ok()) << tree.status();
  PutOptions p;
  p.source_uri = "s3://b/x";
  p.source_etag = "e";
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE((*tree)->Put(absl::StrCat("f", i), absl::Cord("data"), p).ok());
  }
  // Completed, not yet published: no file at a key path before its batch is durable.
  EXPECT_FALSE(std::filesystem::exists(tier_->root() + "/bulk/f0"));
  ASSERT_TRUE((*tree)->Flush().ok());
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(std::filesystem::exists(absl::StrCat(tier_->root(), "/bulk/f", i)));
  }
  // A file that cannot be published (its key is a directory) completes, then Flush says so.
  std::filesystem::create_directories(tier_->root() + "/bulk/d/inside");
  ASSERT_TRUE((*tree)->Put("d", absl::Cord("data"), p).ok());
  absl::Status flushed = (*tree)->Flush();
  EXPECT_FALSE(flushed.ok());
  EXPECT_THAT(std::string(flushed.message()), HasSubstr("1 files were written but not published"));
  EXPECT_THAT(std::string(flushed.message()), HasSubstr("/bulk/d"));
}

}  // namespace
}  // namespace wharf
