#include "base/md5_many.h"

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/hash.h"
#include "gtest/gtest.h"

namespace wharf {
namespace {

using internal::Md5Kernel;

// A Cord of `data` split into pieces of the given sizes (cycled), each its own chunk, so
// blocks straddle chunk boundaries at every offset.
absl::Cord Fragmented(const std::string& data, const std::vector<size_t>& pieces) {
  absl::Cord cord;
  size_t at = 0;
  for (size_t i = 0; at < data.size(); ++i) {
    const size_t n = std::min(pieces[i % pieces.size()], data.size() - at);
    auto* copy = new std::string(data.substr(at, n));
    cord.Append(absl::MakeCordFromExternal(*copy, [copy] { delete copy; }));
    at += n;
  }
  return cord;
}

Md5Digest Reference(const absl::Cord& data) {
  Md5 md5;
  md5.Update(data);
  return md5.Finish();
}

std::vector<const absl::Cord*> Pointers(const std::vector<absl::Cord>& cords) {
  std::vector<const absl::Cord*> out;
  for (const absl::Cord& c : cords) out.push_back(&c);
  return out;
}

std::vector<Md5Kernel> Kernels() {
  std::vector<Md5Kernel> out;
  for (Md5Kernel k : {Md5Kernel::kScalar, Md5Kernel::kAvx2, Md5Kernel::kAvx512}) {
    if (internal::Md5ManyAvailable(k)) out.push_back(k);
  }
  return out;
}

TEST(Md5ManyTest, KnownAnswers) {
  // RFC 1321 A.5.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "d41d8cd98f00b204e9800998ecf8427e"},
      {"a", "0cc175b9c0f1b6a831c399e269772661"},
      {"abc", "900150983cd24fb0d6963f7d28e17f72"},
      {"message digest", "f96b697d7cb7938d525a2f31aaf161d0"},
      {"abcdefghijklmnopqrstuvwxyz", "c3fcd3d76192e4007dfb496cca67e13b"},
      {"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
       "d174ab98d277d9f5a5611c2c9f419d9f"},
      {"12345678901234567890123456789012345678901234567890123456789012345678901234567890",
       "57edf4a22be3c955ac49da2e2107b67a"},
  };
  std::vector<absl::Cord> cords;
  for (const auto& c : cases) cords.emplace_back(c.first);
  const std::vector<const absl::Cord*> ptrs = Pointers(cords);
  for (Md5Kernel kind : Kernels()) {
    const auto got = internal::Md5ManyWith(kind, ptrs);
    ASSERT_EQ(got.size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(HexLower(got[i]), cases[i].second) << static_cast<int>(kind) << " " << i;
    }
  }
  EXPECT_EQ(HexLower(Md5Many(ptrs)[2]), cases[2].second);
}

TEST(Md5ManyTest, EveryKernelAgreesWithOpenSslAtEveryLengthAndFragmentation) {
  std::mt19937 rng(7);
  std::string data(70000, '\0');
  for (auto& c : data) c = static_cast<char>(rng());
  // Lengths around every padding boundary, and a spread of longer ones; more messages than
  // lanes so finished lanes take new messages of other sizes.
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 200; ++n) lengths.push_back(n);
  for (size_t n : {255ul, 256ul, 1000ul, 4095ul, 4096ul, 4097ul, 65536ul, 69999ul})
    lengths.push_back(n);
  std::vector<absl::Cord> cords;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const std::string msg = data.substr(i % 13, lengths[i]);
    switch (i % 3) {
      case 0:
        cords.emplace_back(msg);
        break;
      case 1:
        cords.push_back(Fragmented(msg, {1, 63, 64, 65, 700}));
        break;
      default:
        cords.push_back(Fragmented(msg, {4096, 3, 129}));
        break;
    }
  }
  const std::vector<const absl::Cord*> ptrs = Pointers(cords);
  for (Md5Kernel kind : Kernels()) {
    const auto got = internal::Md5ManyWith(kind, ptrs);
    ASSERT_EQ(got.size(), cords.size());
    for (size_t i = 0; i < cords.size(); ++i) {
      EXPECT_EQ(got[i], Reference(cords[i])) << static_cast<int>(kind) << " length " << lengths[i];
    }
  }
  for (size_t n : {0ul, 1ul, 2ul, 3ul, 8ul, 9ul, 17ul}) {
    const auto some = absl::MakeSpan(ptrs).subspan(100, n);
    const auto got = Md5Many(some);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(got[i], Reference(*some[i])) << n << " " << i;
  }
}

TEST(Md5BatcherTest, EveryMessageGetsItsOwnDigestInBatchesFromManyThreads) {
  Md5Batcher::Options options;
  options.max_batch = 16;
  options.max_wait = absl::Milliseconds(50);
  ThreadPool pool(2);  // declared first: it outlives the batcher's scheduled work
  Md5Batcher batcher(options);
  constexpr int kThreads = 4, kEach = 100;
  absl::Mutex mu;
  int done = 0, wrong = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        std::string msg(static_cast<size_t>(100 + 37 * i + t), static_cast<char>('a' + t));
        absl::Cord data(msg);
        const Md5Digest want = Reference(data);
        batcher.Hash(std::move(data), pool,
                     [&, want, msg](absl::Cord got_data, const Md5Digest& md5) {
                       absl::MutexLock lock(&mu);
                       ++done;
                       if (md5 != want || std::string(got_data) != msg) ++wrong;
                     });
      }
    });
  }
  for (auto& th : threads) th.join();
  absl::MutexLock lock(&mu);
  auto all = [&] { return done == kThreads * kEach; };
  mu.Await(absl::Condition(&all));
  EXPECT_EQ(wrong, 0);
}

TEST(Md5BatcherTest, ALoneMessageIsHashedWithoutOthersAndDestructionHashesWhatIsQueued) {
  ThreadPool pool(1);
  absl::Notification lone;
  Md5Digest got{};
  {
    Md5Batcher batcher;  // default gap: a lone message waits ~2 ms, not forever
    batcher.Hash(absl::Cord("abc"), pool, [&](absl::Cord, const Md5Digest& md5) {
      got = md5;
      lone.Notify();
    });
    lone.WaitForNotification();
    EXPECT_EQ(HexLower(got), "900150983cd24fb0d6963f7d28e17f72");
  }
  absl::Mutex mu;
  int called = 0;
  {
    Md5Batcher::Options options;
    options.gap = options.max_wait = absl::Hours(1);
    Md5Batcher batcher(options);
    for (int i = 0; i < 5; ++i) {
      batcher.Hash(absl::Cord("x"), pool, [&](absl::Cord, const Md5Digest&) {
        absl::MutexLock lock(&mu);
        ++called;
      });
    }
  }  // nothing fills the batch and no deadline passes: the destructor hashes the five
  absl::MutexLock lock(&mu);
  auto all = [&] { return called == 5; };
  EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(30))) << called;
}

// Not a timing assertion: prints each kernel's rate over 64 objects of 100 KiB, so a
// regression is visible in the test log (ctest -V).
TEST(Md5ManyTest, PrintsEachKernelsRate) {
  std::string data(100 * 1024, 'x');
  std::vector<absl::Cord> cords(64, absl::Cord(data));
  const std::vector<const absl::Cord*> ptrs = Pointers(cords);
  for (Md5Kernel kind : Kernels()) {
    const auto start = std::chrono::steady_clock::now();
    const auto got = internal::Md5ManyWith(kind, ptrs);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(got.back(), Reference(cords.back()));
    std::printf("md5 kernel %d: %.0f MB/s\n", static_cast<int>(kind), 64.0 * data.size() / s / 1e6);
  }
}

}  // namespace
}  // namespace wharf
