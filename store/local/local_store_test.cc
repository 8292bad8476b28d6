#include "store/local/local_store.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/conformance/object_store_conformance.h"
#include "store/local/temp_object.h"

namespace wharf {
namespace {

namespace fs = std::filesystem;

std::string MakeTempDir() {
  std::string tmpl = (fs::temp_directory_path() / "wharf-local-test-XXXXXX").string();
  char* dir = mkdtemp(tmpl.data());
  EXPECT_NE(dir, nullptr);
  return tmpl;
}

absl::StatusOr<std::shared_ptr<ObjectStore>> MakeFreshStore() {
  auto store = LocalStore::Open(MakeTempDir(), Runtime::Default());
  if (!store.ok()) return store.status();
  return std::shared_ptr<ObjectStore>(*std::move(store));
}

void DestroyStore(ObjectStore& store) { fs::remove_all(static_cast<LocalStore&>(store).root()); }

INSTANTIATE_TEST_SUITE_P(Local, ObjectStoreConformance,
                         testing::Values(ConformanceBackend{"local", MakeFreshStore, DestroyStore}),
                         ConformanceBackendName);

class LocalStoreTest : public testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir();
    auto store = LocalStore::Open(root_, Runtime::Default());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string root_;
  std::unique_ptr<LocalStore> store_;
};

TEST_F(LocalStoreTest, KeysThatWouldEscapeTheRootAreRefused) {
  // A name nothing else beside the root has (a "../x" test failed when another program had
  // made /tmp/x).
  for (const char* key : {"../wharf-escape-test", "a/../../wharf-escape-test", "/etc/passwd",
                          "a//b", "./a", "a/.", "", "a/", ".wharf-tmp-1"}) {
    auto put = store_->Put(key, absl::Cord("x"));
    EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument) << "'" << key << "'";
    EXPECT_EQ(store_->Read(key).status().code(), absl::StatusCode::kInvalidArgument) << key;
  }
  EXPECT_EQ(store_->Put(std::string("a\0b", 3), absl::Cord("x")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Put("bad\xff utf8", absl::Cord("x")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(fs::path(root_).parent_path() / "wharf-escape-test"));
}

TEST_F(LocalStoreTest, EtagIsContentMd5AndCachedForForeignFiles) {
  auto put = store_->Put("a/b", absl::Cord("hello"));
  ASSERT_TRUE(put.ok());
  EXPECT_EQ(put->etag, Md5Hex("hello"));
  // A file written by another program, then changed in place: the ETag follows the content.
  fs::create_directories(fs::path(root_) / "foreign");
  { std::ofstream(fs::path(root_) / "foreign" / "f") << "one"; }
  EXPECT_EQ(store_->Head("foreign/f")->etag, Md5Hex("one"));
  { std::ofstream(fs::path(root_) / "foreign" / "f") << "three"; }
  EXPECT_EQ(store_->Head("foreign/f")->etag, Md5Hex("three"));
}

// Asynchronous puts are hashed many at a time (Md5Batcher); each keeps its own content's
// MD5 as its ETag, in the result and in the attribute later listings read.
TEST_F(LocalStoreTest, AsyncPutsHashedTogetherEachGetTheirOwnEtag) {
  constexpr int kObjects = 30;
  std::vector<absl::StatusOr<ObjectMeta>> results(kObjects, absl::UnknownError("pending"));
  absl::Mutex mu;
  int done = 0;
  for (int i = 0; i < kObjects; ++i) {
    store_->PutAsync(absl::StrCat("p/", i), absl::Cord(std::string(100 + 999 * i, 'a' + i % 26)),
                     PutOptions{}, [&, i](absl::StatusOr<ObjectMeta> meta) {
                       absl::MutexLock lock(&mu);
                       results[i] = std::move(meta);
                       ++done;
                     });
  }
  absl::MutexLock lock(&mu);
  auto all = [&] { return done == kObjects; };
  mu.Await(absl::Condition(&all));
  for (int i = 0; i < kObjects; ++i) {
    const std::string want = Md5Hex(std::string(100 + 999 * i, 'a' + i % 26));
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_EQ(results[i]->etag, want) << i;
    const std::string path = absl::StrCat(root_, "/p/", i);
    struct stat st {};
    ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(CachedLocalEtag(-1, path, st), want) << i;
  }
}

TEST_F(LocalStoreTest, TemporaryFilesArePrivateAndNeverListed) {
  auto writer = store_->NewWriter("w/obj");
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Write(absl::Cord("secret")).ok());
  int temps = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(root_) / "w")) {
    ASSERT_TRUE(absl::StartsWith(entry.path().filename().string(), ".wharf-tmp-"));
    struct stat st;
    ASSERT_EQ(stat(entry.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0077, 0u) << "temporary file readable by others";
    ++temps;
  }
  EXPECT_EQ(temps, 1);
  EXPECT_TRUE(store_->ListAll({})->objects.empty());
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_EQ(store_->ListAll({})->objects.size(), 1u);
}

// Listings remove what killed writers left (temporary files whose lock nobody holds) at once,
// with no age to spare fresh ones: a writer locks its file as soon as it is made, and one
// whose new file a sweep took before that makes another. So sweeps running all the time
// beside writers cost no write anything, and leave no file.
TEST_F(LocalStoreTest, SweepsOfAbandonedTemporaryFilesNeverTakeALiveWritersFile) {
  const std::string dir = root_ + "/sweep";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  // A killed writer's file: no lock.
  const std::string killed = absl::StrCat(dir, "/", kLockedTempPrefix, "killed");
  std::ofstream(killed) << "partial";
  std::atomic<bool> stop{false};
  std::atomic<int> swept{0};
  std::thread sweeper([&] {
    while (!stop.load()) {
      DIR* d = opendir(dir.c_str());
      if (d == nullptr) continue;
      while (struct dirent* e = readdir(d)) {
        if (RemoveAbandonedTemp(dirfd(d), e->d_name)) ++swept;
      }
      closedir(d);
    }
  });
  constexpr int kFiles = 300;
  for (int i = 0; i < kFiles; ++i) {
    ASSERT_TRUE(store_->Put(absl::StrCat("sweep/", i), absl::Cord(std::string(1000, 'x'))).ok())
        << i;
  }
  stop = true;
  sweeper.join();
  EXPECT_GE(swept.load(), 1);  // the killed writer's file
  EXPECT_FALSE(fs::exists(killed));
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_FALSE(absl::StartsWith(entry.path().filename().string(), ".wharf-tmp-")) << entry.path();
    ++files;
  }
  EXPECT_EQ(files, kFiles);
}

// A key whose path is a FIFO or a character device is written into, as cp does, never
// replaced by a file renamed over it (for root that would replace /dev/null machine-wide).
TEST_F(LocalStoreTest, AFifoOrADeviceAtTheKeyIsWrittenIntoNotReplaced) {
  const std::string fifo = root_ + "/pipe";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::string got;
  std::thread reader([&] {
    std::ifstream in(fifo, std::ios::binary);
    got.assign(std::istreambuf_iterator<char>(in), {});
  });
  auto put = store_->Put("pipe", absl::Cord("through the pipe"));
  ASSERT_TRUE(put.ok()) << put.status();
  reader.join();
  EXPECT_EQ(got, "through the pipe");
  EXPECT_EQ(put->size, 16u);
  EXPECT_EQ(put->etag, Md5Hex("through the pipe"));
  struct stat st;
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  // /dev/null through a store rooted at /, with the streaming writer too.
  auto root = LocalStore::Open("/", Runtime::Default());
  ASSERT_TRUE(root.ok());
  ASSERT_TRUE((*root)->Put("dev/null", absl::Cord("discarded")).ok());
  auto writer = (*root)->NewWriter("dev/null");
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Write(absl::Cord("discarded too")).ok());
  ASSERT_TRUE((*writer)->Close().ok());
  ASSERT_EQ(lstat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  // An exclusive put finds the device there before writing anything (a FIFO with no
  // reader would otherwise block it, then fail).
  PutOptions exclusive;
  exclusive.if_absent = true;
  EXPECT_TRUE(absl::IsAlreadyExists((*root)->Put("dev/null", absl::Cord("x"), exclusive).status()));
  EXPECT_TRUE(absl::IsAlreadyExists(store_->Put("pipe", absl::Cord("x"), exclusive).status()));
  EXPECT_TRUE(absl::IsAlreadyExists(store_->NewWriter("pipe", exclusive).status()));
  // A regular file in /dev (tmpfs /dev/shm) is not a link: replaced atomically, as anywhere.
  if (fs::is_directory("/dev/shm")) {
    const std::string shm = absl::StrCat("dev/shm/wharf-test-", getpid());
    ASSERT_TRUE((*root)->Put(shm, absl::Cord("first")).ok());
    struct stat before, after;
    ASSERT_EQ(stat(("/" + shm).c_str(), &before), 0);
    ASSERT_TRUE((*root)->Put(shm, absl::Cord("second")).ok());
    ASSERT_EQ(stat(("/" + shm).c_str(), &after), 0);
    EXPECT_NE(before.st_ino, after.st_ino);  // a new file renamed over it, not written into
    EXPECT_EQ(*(*root)->Read(shm), "second");
    unlink(("/" + shm).c_str());
  }
  for (const auto& entry : fs::directory_iterator(root_)) {
    EXPECT_FALSE(absl::StartsWith(entry.path().filename().string(), ".wharf-tmp-"));
  }
}

TEST_F(LocalStoreTest, AProcFileIsRefusedNotReadAsEmpty) {
  auto root = LocalStore::Open("/", Runtime::Default());
  ASSERT_TRUE(root.ok());
  auto head = (*root)->Head("proc/self/status");
  EXPECT_TRUE(absl::IsFailedPrecondition(head.status())) << head.status();
  EXPECT_THAT(head.status().message(),
              testing::HasSubstr("file:///proc/self/status: a /proc file"));
  EXPECT_TRUE(absl::IsFailedPrecondition((*root)->Read("proc/self/status").status()));
  // An empty regular file elsewhere is an empty object.
  ASSERT_TRUE(store_->Put("empty", absl::Cord()).ok());
  auto empty = store_->Read("empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, "");
}

TEST_F(LocalStoreTest, DeletePrunesEmptyDirectoriesButNotTheRoot) {
  ASSERT_TRUE(store_->Put("x/y/z", absl::Cord("1")).ok());
  ASSERT_TRUE(store_->Delete("x/y/z").ok());
  EXPECT_FALSE(fs::exists(fs::path(root_) / "x"));
  EXPECT_TRUE(fs::exists(root_));
}

TEST_F(LocalStoreTest, DeletePrunesNoKeptDirectoryNorOneAboveIt) {
  LocalStore::KeepDirectory(absl::StrCat(root_, "/k/kept/"));
  ASSERT_TRUE(store_->Put("k/kept/below/z", absl::Cord("1")).ok());
  ASSERT_TRUE(store_->Put("k/other/z", absl::Cord("1")).ok());
  ASSERT_TRUE(store_->Delete("k/kept/below/z").ok());
  EXPECT_FALSE(fs::exists(fs::path(root_) / "k/kept/below"));  // below it: pruned
  EXPECT_TRUE(fs::is_directory(fs::path(root_) / "k/kept"));
  ASSERT_TRUE(store_->Delete("k/other/z").ok());
  EXPECT_FALSE(fs::exists(fs::path(root_) / "k/other"));
  EXPECT_TRUE(fs::is_directory(fs::path(root_) / "k"));  // above a kept one: stays
}

TEST_F(LocalStoreTest, DeleteNeverGoesThroughALinkToAFolder) {
  // A folder outside the root, reached through a link inside it: the listing follows the link
  // (a copy's source may be arranged so), but no delete removes a file through it.
  const std::string outside = MakeTempDir();
  ASSERT_TRUE(LocalStore::Open(outside, Runtime::Default())
                  .value()
                  ->Put("sub/precious", absl::Cord("keep"))
                  .ok());
  fs::create_symlink(outside, fs::path(root_) / "link");
  ASSERT_TRUE(store_->Put("mine", absl::Cord("1")).ok());
  auto listed = store_->List(ListOptions{});
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->objects.size(), 2u);  // link/sub/precious, mine
  absl::Status s = store_->DeleteMany({"link/sub/precious", "mine"});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), testing::HasSubstr("/link is a symbolic link"));
  EXPECT_TRUE(fs::exists(fs::path(outside) / "sub/precious"));
  EXPECT_FALSE(fs::exists(fs::path(root_) / "mine"));  // the others are deleted
  // The link itself, as a key, is removed; its target stays.
  ASSERT_TRUE(store_->Delete("link").ok());
  EXPECT_FALSE(fs::exists(fs::symlink_status(fs::path(root_) / "link")));
  EXPECT_TRUE(fs::exists(fs::path(outside) / "sub/precious"));
  fs::remove_all(outside);
}

TEST_F(LocalStoreTest, NoKeyIsWrittenIntoATiersOwnFolder) {
  // A copy of a bucket holding '.wharf/...' keys into a tier must not replace its settings.
  ASSERT_TRUE(store_->Put("t/.wharf/tier.json", absl::Cord("{}")).ok());  // no tier yet: a key
  for (const char* key : {"t/.wharf/tier.json", "t/.wharf/imports/x.json"}) {
    auto put = store_->Put(key, absl::Cord("evil"));
    EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(std::string(put.status().message()), testing::HasSubstr("own folder of the tier"));
    EXPECT_FALSE(store_->NewWriter(key).ok()) << key;
    EXPECT_FALSE(store_->Copy("t/.wharf/tier.json", key).ok()) << key;
  }
  EXPECT_EQ(*store_->Read("t/.wharf/tier.json"), "{}");
  EXPECT_TRUE(store_->Put("u/.wharf/x", absl::Cord("1")).ok());  // no tier.json there
}

TEST_F(LocalStoreTest, NoWriteGoesThroughALinkToAFolderBelowTheRoot) {
  const std::string outside = MakeTempDir();
  fs::create_symlink(outside, fs::path(root_) / "link");
  for (const char* key : {"link/x", "link/deeper/x"}) {
    auto put = store_->Put(key, absl::Cord("1"));
    EXPECT_EQ(put.status().code(), absl::StatusCode::kFailedPrecondition) << key;
    EXPECT_THAT(std::string(put.status().message()), testing::HasSubstr("is a symbolic link"));
    EXPECT_FALSE(store_->NewWriter(key).ok()) << key;
  }
  EXPECT_TRUE(fs::is_empty(outside));
  // The root may itself be a link; a link as the key's last part is replaced, not written
  // through.
  const std::string via = MakeTempDir() + "/via";
  fs::create_symlink(root_, via);
  auto linked = LocalStore::Open(via, Runtime::Default());
  ASSERT_TRUE(linked.ok()) << linked.status();
  EXPECT_TRUE((*linked)->Put("plain/y", absl::Cord("2")).ok());
  EXPECT_TRUE(store_->Put("link", absl::Cord("3")).ok());
  EXPECT_FALSE(fs::is_symlink(fs::path(root_) / "link"));
  EXPECT_TRUE(fs::is_empty(outside));
  fs::remove_all(outside);
  fs::remove_all(fs::path(via).parent_path());
}

TEST_F(LocalStoreTest, UriNamesTheRoot) {
  EXPECT_EQ(store_->Uri("a b/c"), absl::StrCat("file://", root_, "/a b/c"));
  auto missing = store_->Read("nope");
  EXPECT_THAT(std::string(missing.status().message()),
              testing::HasSubstr(absl::StrCat("file://", root_, "/nope")));
}

TEST_F(LocalStoreTest, PutOptionsMtimeIsTheFilesMtimeFromTheStart) {
  const absl::Time mtime = absl::FromUnixNanos(1'500'000'000'123'456'789);
  PutOptions options;
  options.mtime = mtime;
  options.content_type = "text/plain";  // ignored here
  auto put = store_->Put("m/put", absl::Cord("one"), options);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->mtime, mtime);
  auto writer = store_->NewWriter("m/written", options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Write(absl::Cord("two")).ok());
  auto closed = (*writer)->Close();
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->mtime, mtime);
  auto async = WaitFor<ObjectMeta>([&](Callback<ObjectMeta> cb) {
    store_->PutAsync("m/async", absl::Cord("three"), options, std::move(cb));
  });
  ASSERT_TRUE(async.ok()) << async.status();
  for (const char* key : {"m/put", "m/written", "m/async"}) {
    struct stat st;
    ASSERT_EQ(stat((fs::path(root_) / key).c_str(), &st), 0) << key;
    EXPECT_EQ(absl::TimeFromTimespec(st.st_mtim), mtime) << key;
    // The cached ETag was stamped with the final mtime, so it is still used.
    auto head = store_->Head(key);
    ASSERT_TRUE(head.ok()) << head.status();
    EXPECT_EQ(head->mtime, mtime);
  }
  EXPECT_EQ(store_->Head("m/put")->etag, Md5Hex("one"));
  // Without an mtime the file gets the time of writing.
  auto now = store_->Put("m/now", absl::Cord("x"));
  ASSERT_TRUE(now.ok());
  EXPECT_LT(absl::AbsDuration(now->mtime - absl::Now()), absl::Minutes(1));
}

TEST_F(LocalStoreTest, RelativeRootIsRefused) {
  EXPECT_EQ(LocalStore::Open("relative/dir", Runtime::Default()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace wharf
