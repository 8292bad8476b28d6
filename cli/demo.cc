// wharf demo: the main job end to end on the embedded local store (or any store --dir names).
// It writes a synthetic image data set once, lists it, reads every object back through the
// dataset engine (a SampleIndex from the listing, one shuffled epoch of the Sampler, a
// SampleStream over the FetchScheduler: what the PyTorch datasets read through), and
// verifies each against its listed ETag: the access pattern of a training input pipeline,
// measured.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "base/hash.h"
#include "base/runtime.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "cli/common.h"
#include "cli/store_flags.h"
#include "cli/verbs.h"
#include "dataset/index.h"
#include "dataset/loader.h"
#include "dataset/order.h"
#include "dataset/sampler.h"
#include "io/fetch_scheduler.h"
#include "io/transfer.h"
#include "store/registry.h"
#include "tier/tier.h"
#include "tier/tier_store.h"
#include "tier/tree_store.h"

namespace wharf::cli {
namespace {

constexpr int kClasses = 10;
constexpr uint64_t kHeaderSize = 16;

std::string KeyOf(int index) {
  return absl::StrFormat("train/class-%02d/img-%06d.raw", index % kClasses, index);
}

// The index of a data set key relative to the demo prefix, or -1 for any other key.
int IndexOf(absl::string_view rel) {
  absl::string_view name = Basename(rel);
  if (!absl::ConsumePrefix(&name, "img-") || !absl::ConsumeSuffix(&name, ".raw")) return -1;
  int index = 0;
  if (name.empty() || !absl::ascii_isdigit(name.front()) || !absl::SimpleAtoi(name, &index) ||
      index < 0 || KeyOf(index) != rel) {
    return -1;
  }
  return index;
}

void PutLittleEndian32(char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// An "image": a 16-byte header ("WIMG", then width, height and class label as little-endian
// uint32) and pixel bytes from wharf's generator (dataset/order.h) seeded by the index, so any
// object can be regenerated.
std::string MakeImage(int index, uint64_t size) {
  std::string out(size, '\0');
  SplitMix64 rng(static_cast<uint64_t>(index) * 0x2545f4914f6cdd1dull + 1);
  char header[kHeaderSize];
  std::memcpy(header, "WIMG", 4);
  PutLittleEndian32(header + 4, 224 + 32 * (index % 5));  // width
  PutLittleEndian32(header + 8, 224 + 32 * (index % 3));  // height
  PutLittleEndian32(header + 12, index % kClasses);       // label
  std::memcpy(out.data(), header, std::min<uint64_t>(size, kHeaderSize));
  uint64_t pos = kHeaderSize;
  for (; pos + 8 <= size; pos += 8) {
    const uint64_t v = rng.Next();
    std::memcpy(out.data() + pos, &v, 8);
  }
  if (pos < size) {
    const uint64_t v = rng.Next();
    std::memcpy(out.data() + pos, &v, size - pos);
  }
  return out;
}

bool IsMd5Hex(absl::string_view etag) {
  return etag.size() == 32 &&
         std::all_of(etag.begin(), etag.end(), [](char c) { return absl::ascii_isxdigit(c); });
}

// Counts operations in flight against a bound, and the failures among them. Callbacks only
// take the lock briefly, so they never block a store's threads.
class Tracker {
 public:
  explicit Tracker(int limit) : limit_(limit) {}

  void Acquire() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Tracker::HasRoomLocked));
    ++in_flight_;
  }
  void Release(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    if (!status.ok() && failed_++ == 0) first_error_ = status;
  }
  void WaitIdle() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Tracker::IdleLocked));
  }
  // After WaitIdle(): OK, or the first failure annotated with how many of `total` failed.
  absl::Status Result(absl::string_view what, uint64_t total) {
    absl::MutexLock lock(&mu_);
    if (failed_ == 0) return absl::OkStatus();
    return absl::Status(first_error_.code(),
                        absl::StrCat(what, ": ", failed_, " of ", total,
                                     " objects failed (first: ", first_error_.message(), ")"));
  }

 private:
  bool HasRoomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ < limit_; }
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; }

  const int limit_;
  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

struct Row {
  std::string phase;
  std::string objects;
  std::string bytes;
  std::string seconds;
  std::string rate;
};

Row MakeRow(std::string phase, uint64_t objects, uint64_t bytes, absl::Duration elapsed,
            bool with_rate) {
  return {std::move(phase), absl::StrCat(objects), absl::StrCat(bytes),
          absl::StrFormat("%.3f", absl::ToDoubleSeconds(elapsed)),
          with_rate ? MegabytesPerSecond(bytes, elapsed) : "-"};
}

void PrintTable(const std::vector<Row>& rows) {
  std::vector<std::vector<std::string>> cells = {{"phase", "objects", "bytes", "seconds", "MB/s"}};
  for (const Row& r : rows) cells.push_back({r.phase, r.objects, r.bytes, r.seconds, r.rate});
  std::vector<size_t> width(5, 0);
  for (const auto& line : cells) {
    for (size_t c = 0; c < line.size(); ++c) width[c] = std::max(width[c], line[c].size());
  }
  auto print_line = [&](const std::vector<std::string>& line) {
    std::string out = "|";
    for (size_t c = 0; c < line.size(); ++c) {
      // The phase column reads left to right; numbers line up on the right.
      out += c == 0 ? absl::StrFormat(" %-*s |", width[c], line[c])
                    : absl::StrFormat(" %*s |", width[c], line[c]);
    }
    Print(absl::StrCat(out, "\n"));
  };
  print_line(cells[0]);
  std::string rule = "|";
  for (size_t c = 0; c < width.size(); ++c) {
    rule += c == 0 ? absl::StrCat(" ", std::string(width[c], '-'), " |")
                   : absl::StrCat(" ", std::string(width[c] - 1, '-'), ": |");
  }
  Print(absl::StrCat(rule, "\n"));
  for (size_t i = 1; i < cells.size(); ++i) print_line(cells[i]);
}

class Demo {
 public:
  Demo(std::shared_ptr<ObjectStore> store, std::string prefix, const DemoArgs& args)
      : shared_store_(std::move(store)),
        store_(*shared_store_),
        prefix_(std::move(prefix)),
        args_(args),
        // The put payloads and read buffers in flight fit the runtime's budget
        // (--memory-budget, WHARF_MEMORY_BUDGET).
        in_flight_(static_cast<int>(std::clamp<uint64_t>(
            Runtime::Default()->budget().limit() / std::max<uint64_t>(args.size, 1), 1,
            args.jobs))) {}

  absl::Status Run() {
    Print(absl::StrFormat("wharf demo: %d objects of %d bytes in %s\n\n", args_.objects, args_.size,
                          OneLine(store_.Uri(prefix_))));
    std::vector<Row> rows;
    absl::Status status = Generate(rows);
    if (status.ok()) status = List(rows);
    if (status.ok()) status = Read(shared_store_, "read", rows);
    const bool verified = status.ok();
    // The tier's workflow: import the data set into a tier, then read it from there.
    if (verified && !args_.no_tier) status = Tier(rows);
    PrintTable(rows);
    if (!verified) {
      Print("\nverification: FAILED\n");
      return status;
    }
    Print(absl::StrFormat(
        "\nverification: OK, all %d objects (%s MB) read back match their listed ETags\n",
        args_.objects, Megabytes(read_bytes_)));
    if (!status.ok()) return status;
    if (!args_.no_tier) {
      Print(absl::StrFormat("tier: %s MB/s from the store (cold), %s MB/s from the tier at %s\n",
                            cold_rate_, warm_rate_, tier_root_));
    }
    return absl::OkStatus();
  }

 private:
  // Phase 1: write whichever objects of the data set are missing or have the wrong size.
  // Other keys below the prefix are left alone (the directory may be the user's).
  absl::Status Generate(std::vector<Row>& rows) {
    const absl::Time start = absl::Now();
    std::vector<bool> present(args_.objects, false);
    ListOptions options;
    options.prefix = prefix_;
    WHARF_RETURN_IF_ERROR(ForEachPage(store_, options, [&](ListPage& page) {
      for (const ObjectMeta& meta : page.objects) {
        const int index = IndexOf(absl::string_view(meta.key).substr(prefix_.size()));
        if (index >= 0 && index < args_.objects && meta.size == args_.size) present[index] = true;
      }
      return absl::OkStatus();
    }));
    const uint64_t missing = std::count(present.begin(), present.end(), false);
    if (missing == 0) {
      rows.push_back({"generate", "skipped (already present)", "-", "-", "-"});
      return absl::OkStatus();
    }
    Tracker puts(in_flight_);
    for (int i = 0; i < args_.objects; ++i) {
      if (present[i]) continue;
      puts.Acquire();
      store_.PutAsync(prefix_ + KeyOf(i), absl::Cord(MakeImage(i, args_.size)),
                      [&puts](absl::StatusOr<ObjectMeta> put) { puts.Release(put.status()); });
    }
    puts.WaitIdle();
    WHARF_RETURN_IF_ERROR(
        puts.Result(absl::StrCat("demo: writing ", store_.Uri(prefix_)), missing));
    rows.push_back(MakeRow("generate", missing, missing * args_.size, absl::Now() - start, true));
    return absl::OkStatus();
  }

  // Phase 2: list the whole prefix, keeping the metadata of the data set's objects.
  absl::Status List(std::vector<Row>& rows) {
    const absl::Time start = absl::Now();
    dataset_.assign(args_.objects, ObjectMeta{});
    std::vector<bool> found(args_.objects, false);
    uint64_t listed = 0;
    uint64_t listed_bytes = 0;
    ListOptions options;
    options.prefix = prefix_;
    WHARF_RETURN_IF_ERROR(ForEachPage(store_, options, [&](ListPage& page) {
      for (ObjectMeta& meta : page.objects) {
        ++listed;
        listed_bytes += meta.size;
        const int index = IndexOf(absl::string_view(meta.key).substr(prefix_.size()));
        if (index < 0 || index >= args_.objects) continue;
        found[index] = true;
        dataset_[index] = std::move(meta);
      }
      return absl::OkStatus();
    }));
    rows.push_back(MakeRow("list", listed, listed_bytes, absl::Now() - start, false));
    const uint64_t missing = std::count(found.begin(), found.end(), false);
    if (missing > 0) {
      const int first =
          static_cast<int>(std::find(found.begin(), found.end(), false) - found.begin());
      return absl::NotFoundError(absl::StrCat(
          "demo: ", missing,
          " objects missing from the listing (first: ", store_.Uri(prefix_ + KeyOf(first)), ")"));
    }
    return absl::OkStatus();
  }

  // Phase 3: read everything back through the dataset engine, as a training epoch does: the
  // listing becomes a SampleIndex (sizes and ETags known: no HEADs), the Sampler gives one
  // shuffled epoch, and a SampleStream reads it through a FetchScheduler, `in_flight_`
  // requests and samples ahead. Each sample is verified on a CPU pool (hashing is not work
  // for the engine's I/O threads) and its buffer released to the budget once checked.
  // Phases 4 and 5: import train/ into the tier (a rerun copies only what changed), then read
  // the epoch again through the tier, which answers from the imported files.
  absl::Status Tier(std::vector<Row>& rows) {
    const std::string source = prefix_ + "train/";
    WHARF_ASSIGN_OR_RETURN(std::shared_ptr<wharf::Tier> tier, Tier::FindOrCreate(args_.tier));
    WHARF_RETURN_IF_ERROR(tier->CollectGarbage().status());
    tier_root_ = tier->root();
    const absl::Time start = absl::Now();
    TransferSummary summary;
    {
      WHARF_ASSIGN_OR_RETURN(
          std::shared_ptr<TierTreeStore> tree,
          TierTreeStore::Open(tier, tier->root() + "/train", Runtime::Default()));
      TransferOptions options;
      options.recursive = true;
      WHARF_ASSIGN_OR_RETURN(summary, Transfer({shared_store_, source}, {tree, ""}, options));
    }
    WHARF_RETURN_IF_ERROR(tier->RecordImport({store_.Uri(source), "train"}));
    if (summary.objects == 0) {
      rows.push_back({"import to tier", absl::StrCat("skipped (", summary.skipped, " current)"),
                      "-", "-", "-"});
    } else {
      rows.push_back(
          MakeRow("import to tier", summary.objects, summary.bytes, absl::Now() - start, true));
    }
    WHARF_ASSIGN_OR_RETURN(std::shared_ptr<TierStore> cached,
                           TierStore::Open(shared_store_, tier, Runtime::Default()));
    return Read(cached, "read from tier", rows);
  }

  absl::Status Read(const std::shared_ptr<ObjectStore>& from, const std::string& phase,
                    std::vector<Row>& rows) {
    const absl::Time start = absl::Now();
    std::vector<SampleEntry> entries;
    entries.reserve(dataset_.size());
    for (const ObjectMeta& meta : dataset_) {
      entries.push_back({.key = meta.key, .size = meta.size, .etag = meta.etag});
    }
    auto index = std::make_shared<const SampleIndex>(std::move(entries));
    WHARF_ASSIGN_OR_RETURN(Sampler sampler, Sampler::Create(index->size(), {.seed = 0}));
    FetchOptions fetch;
    fetch.max_in_flight = in_flight_;
    // Buffers are released by the verifying pool, not by the reading thread: wait for them.
    fetch.wait_for_release = true;
    auto scheduler = std::make_shared<FetchScheduler>(from, fetch);
    WHARF_ASSIGN_OR_RETURN(
        std::unique_ptr<SampleStream> stream,
        SampleStream::Create(index, sampler, sampler.State(/*epoch=*/0, /*consumed=*/0), {},
                             scheduler, {.prefetch = static_cast<size_t>(in_flight_)}));
    std::atomic<uint64_t> bytes{0};
    // Samples being verified, at most in_flight_: each holds its buffer until checked.
    Tracker checks(in_flight_);
    {
      ThreadPool cpu(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
      while (true) {
        absl::StatusOr<std::optional<Sample>> next = stream->Next();
        checks.Acquire();
        if (!next.ok()) {
          checks.Release(next.status());  // counted; the stream goes on with the next sample
          continue;
        }
        if (!next->has_value()) {
          checks.Release(absl::OkStatus());
          break;
        }
        cpu.Schedule([this, &bytes, &checks, sample = **std::move(next)] {
          const absl::Status verified = Verify(static_cast<int>(sample.index), sample.data.view());
          if (verified.ok()) bytes += sample.data.size();
          checks.Release(verified);
        });
      }
      checks.WaitIdle();
    }
    read_bytes_ = bytes;
    rows.push_back(MakeRow(phase, args_.objects, read_bytes_, absl::Now() - start, true));
    (phase == "read" ? cold_rate_ : warm_rate_) = rows.back().rate;
    return checks.Result(absl::StrCat("demo: verifying ", store_.Uri(prefix_)), args_.objects);
  }

  // The bytes read must be the object the listing described: its MD5 must be the ETag. Where
  // the ETag is not an MD5 (multipart uploads, GCS generations), regenerate and compare.
  absl::Status Verify(int index, absl::string_view data) const {
    const ObjectMeta& meta = dataset_[index];
    const std::string uri = store_.Uri(meta.key);
    if (data.size() != meta.size) {
      return absl::DataLossError(absl::StrCat("verify ", uri, ": read ", data.size(),
                                              " bytes, listed size is ", meta.size));
    }
    if (IsMd5Hex(meta.etag)) {
      const std::string md5 = Md5Hex(data);
      if (md5 != absl::AsciiStrToLower(meta.etag)) {
        return absl::DataLossError(absl::StrCat("verify ", uri, ": MD5 of the bytes read is ", md5,
                                                ", listed ETag is ", meta.etag));
      }
    } else if (data != MakeImage(index, meta.size)) {
      return absl::DataLossError(
          absl::StrCat("verify ", uri, ": bytes read differ from the generated object"));
    }
    return absl::OkStatus();
  }

  const std::shared_ptr<ObjectStore> shared_store_;
  ObjectStore& store_;
  const std::string prefix_;
  const DemoArgs& args_;
  const int in_flight_;
  std::vector<ObjectMeta> dataset_;  // by index, from the listing
  uint64_t read_bytes_ = 0;
  std::string tier_root_, cold_rate_, warm_rate_;
};

}  // namespace

void AddDemo(CLI::App& app, DemoArgs& args) {
  CLI::App* demo = app.add_subcommand(
      "demo", "Write, list, read back and verify a synthetic image data set (a self-test)");
  demo->add_option("--dir", args.dir, "Where the data set lives: a local directory or a URI")
      ->capture_default_str();
  demo->add_option("--objects", args.objects, "Number of objects")
      ->check(CLI::Range(1, 10'000'000))
      ->capture_default_str();
  demo->add_option("--size", args.size, "Bytes per object")
      ->check(CLI::Range(kHeaderSize, uint64_t{1} << 30))
      ->capture_default_str();
  demo->add_option("--inflight,-j,--jobs", args.jobs,
                   "Puts and gets in flight at once (fewer when the memory budget holds fewer "
                   "objects)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  AddEngineFlags(demo, args.engine, /*budget_mb_alias=*/true);
  demo->add_option("--tier", args.tier,
                   "The tier the data set is imported into and read from (made one if needed)")
      ->capture_default_str();
  demo->add_flag("--no-tier", args.no_tier, "Skip the tier phases (import, read from the tier)");
  demo->footer(
      "Objects are 'train/class-NN/img-NNNNNN.raw' below --dir: a small header (synthetic\n"
      "width, height, label) and pseudo-random pixels. The data set is written only when it is\n"
      "missing or incomplete; every object is then read back and checked against its ETag,\n"
      "imported into the tier (--tier) and read again from there: cold vs warm.");
}

absl::Status RunDemo(const DemoArgs& args) {
  WHARF_RETURN_IF_ERROR(ApplyEngineArgs(args.engine, 0));
  WHARF_ASSIGN_OR_RETURN(OpenedUri opened, OpenCliUri(args.dir));
  Demo demo(opened.store, AsPrefix(opened.uri.key), args);
  return demo.Run();
}

}  // namespace wharf::cli
