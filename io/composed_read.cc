#include "io/composed_read.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/log.h"
#include "base/runtime.h"
#include "base/status.h"

namespace wharf {
namespace {

std::string HostName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "localhost";
  std::string h(host);
  for (char& c : h) {
    if (c == '/') c = '_';
  }
  return h;
}

// A marker of this process's lifetime, so a reused pid is not taken for ours.
int64_t ProcessStartNanos() {
  static const int64_t start = absl::ToUnixNanos(absl::Now());
  return start;
}

bool ProcessAlive(int64_t pid) {
  if (pid <= 0 || pid > INT32_MAX) return false;
  return kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

}  // namespace

absl::StatusOr<ComposeMode> ComposeModeFromEnv() {
  const char* v = std::getenv("WHARF_GS_COMPOSE");
  if (v == nullptr || *v == '\0') return ComposeMode::kAuto;
  const std::string mode = absl::AsciiStrToLower(v);
  if (mode == "auto") return ComposeMode::kAuto;
  if (mode == "off") return ComposeMode::kOff;
  if (mode == "on") return ComposeMode::kOn;
  return absl::InvalidArgumentError(
      absl::StrCat("WHARF_GS_COMPOSE: '", v, "' is not one of auto, off, on"));
}

ComposedReads::ComposedReads(std::shared_ptr<ObjectStore> store)
    : shared_(std::make_shared<Shared>()),
      prefix_(absl::StrCat(kTempRoot, HostName(), "/", getpid(), "-", ProcessStartNanos(), "/")) {
  shared_->store = std::move(store);
}

ComposedReads::~ComposedReads() = default;

void ComposedReads::WaitIdle() {
  absl::MutexLock lock(&shared_->mu);
  AwaitInterruptibly(shared_->mu,
                     absl::Condition(
                         +[](int* pending) { return *pending == 0; }, &shared_->pending));
}

void ComposedReads::Shared::Done() {
  absl::MutexLock lock(&mu);
  --pending;
}

// Ends the read counted in `pending` once the temporary is gone.
void ComposedReads::Shared::DeleteTemp(const std::shared_ptr<Shared>& self, std::string key) {
  // No cancel token, and no ambient one (base/cancel.h): a cancelled read still removes its
  // temporary.
  ScopedAmbientCancel cleanup(nullptr);
  store->DeleteAsync(key, [self, key](absl::Status s) {
    if (!s.ok()) {
      LogLine(LogLevel::kWarning,
              absl::StrCat("could not delete the temporary ", self->store->Uri(key),
                           " of a composed read (a later run sweeps it): ", s.message()));
    }
    self->Done();
  });
}

void ComposedReads::StartSweepOnce() {
  if (swept_.exchange(true)) return;
  {
    absl::MutexLock lock(&shared_->mu);
    ++shared_->pending;
  }
  ScopedAmbientCancel shared_work(nullptr);  // the sweep serves every read, not this one
  Runtime::Default()->blocking_pool().Schedule([shared = shared_] {
    auto swept = Sweep(*shared->store);
    if (!swept.ok()) {
      LogLine(LogLevel::kInfo, absl::StrCat("sweeping the temporaries of composed reads: ",
                                            swept.status().message()));
    } else if (*swept > 0) {
      LogLine(LogLevel::kInfo,
              absl::StrCat("removed ", *swept, " temporaries that earlier runs left under ",
                           shared->store->Uri(kTempRoot)));
    }
    shared->Done();
  });
}

void ComposedReads::ReadAsync(std::vector<Source> sources, absl::Span<char> buffer,
                              CancelToken cancel, Callback<GetResult> done) {
  StartSweepOnce();
  uint64_t total = 0;
  std::vector<std::string> keys;
  keys.reserve(sources.size());
  for (const Source& s : sources) {
    total += s.size;
    keys.push_back(s.key);
  }
  std::string temp = absl::StrCat(prefix_, next_.fetch_add(1));
  ObjectStore& store = *shared_->store;
  const std::string what = absl::StrCat("composed read of ", sources.size(), " objects from ",
                                        store.Uri(sources.front().key), " on");
  if (IsCancelled(cancel)) {
    return std::move(done)(absl::CancelledError(absl::StrCat(what, ": cancelled")));
  }
  created_.fetch_add(1, std::memory_order_relaxed);
  {
    // Counted from here to the end of the temporary's delete (Shared::DeleteTemp).
    absl::MutexLock lock(&shared_->mu);
    ++shared_->pending;
  }
  store.ComposeAsync(
      std::move(keys), temp,
      [shared = shared_, temp, total, buffer, cancel, what,
       done = std::move(done)](absl::StatusOr<ObjectMeta> composed) mutable {
        if (!composed.ok()) {
          if (composed.status().code() == absl::StatusCode::kPermissionDenied &&
              !shared->disabled.exchange(true)) {
            LogLine(LogLevel::kWarning,
                    absl::StrCat("composed reads turned off: the credentials cannot write "
                                 "the temporary ",
                                 shared->store->Uri(temp),
                                 " (objects are read one by one; WHARF_GS_COMPOSE=off "
                                 "silences this): ",
                                 composed.status().message()));
          }
          // A compose that failed may still have created the object (the answer was lost).
          shared->DeleteTemp(shared, temp);
          return std::move(done)(composed.status());
        }
        if (composed->size != total) {
          shared->DeleteTemp(shared, temp);
          return std::move(done)(
              absl::DataLossError(absl::StrCat(what, ": the composed object has ", composed->size,
                                               " bytes, the listed sizes add up to ", total,
                                               " (a source changed since it was listed)")));
        }
        GetRequest get;
        get.key = temp;
        get.buffer = buffer;
        get.if_match = composed->etag;
        get.cancel = cancel;
        shared->store->GetAsync(std::move(get), [shared, temp, done = std::move(done)](
                                                    absl::StatusOr<GetResult> r) mutable {
          shared->DeleteTemp(shared, temp);
          std::move(done)(std::move(r));
        });
      });
}

absl::StatusOr<int> ComposedReads::Sweep(ObjectStore& store, absl::Duration max_age) {
  ListOptions options;
  options.prefix = kTempRoot;
  WHARF_ASSIGN_OR_RETURN(ListPage listed, store.ListAll(options));
  const std::string host = HostName();
  const absl::Time now = absl::Now();
  std::vector<std::string> stale;
  for (const ObjectMeta& o : listed.objects) {
    // .wharf-compose/<host>/<pid>-<start>/<seq>
    std::vector<std::string> parts =
        absl::StrSplit(absl::string_view(o.key).substr(absl::string_view(kTempRoot).size()), '/');
    bool dead = false;
    if (parts.size() == 3 && parts[0] == host) {
      std::vector<std::string> run = absl::StrSplit(parts[1], '-');
      int64_t pid = 0, start = 0;
      if (run.size() == 2 && absl::SimpleAtoi(run[0], &pid) && absl::SimpleAtoi(run[1], &start)) {
        dead = !ProcessAlive(pid) || (pid == getpid() && start != ProcessStartNanos());
      }
    }
    const bool old = o.mtime != absl::InfinitePast() && now - o.mtime > max_age;
    if (dead || old) stale.push_back(o.key);
  }
  if (stale.empty()) return 0;
  const int n = static_cast<int>(stale.size());
  WHARF_RETURN_IF_ERROR(store.DeleteMany(std::move(stale)));
  return n;
}

}  // namespace wharf
