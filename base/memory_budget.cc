#include "base/memory_budget.h"

#include <sys/mman.h>

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "base/cancel.h"
#include "base/metrics.h"
#include "base/profiler.h"

namespace wharf {

MemoryBudget::MemoryBudget(uint64_t limit) : limit_(limit) {}

MemoryBudget::~MemoryBudget() {
  // Every block holds a reference to the budget, so none is alive here; only the pool is.
  absl::MutexLock lock(&mu_);
  for (auto& [size, p] : pool_) Free(p, size);
}

// A pooled block is a mapping from kLargeBlock bytes on, else a heap array (by its size).
void MemoryBudget::Free(char* p, uint64_t size) {
  if (size >= kLargeBlock) {
    munmap(p, size);
  } else {
    delete[] p;
  }
}

void MemoryBudget::Unmap(const std::vector<Mapping>& mappings) {
  for (const auto& [size, p] : mappings) Free(p, size);
}

void MemoryBudget::set_limit(uint64_t limit) {
  std::vector<Mapping> evicted;
  {
    absl::MutexLock lock(&mu_);
    limit_ = limit;
    while (!pool_.empty() && held_ + pooled_ > limit_) {
      auto largest = std::prev(pool_.end());
      pooled_ -= largest->first;
      evicted.push_back(*largest);
      pool_.erase(largest);
    }
  }
  Unmap(evicted);
  NotifyListeners();  // a larger limit may let waiters go on
}

uint64_t MemoryBudget::limit() const {
  absl::MutexLock lock(&mu_);
  return limit_;
}

uint64_t MemoryBudget::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

uint64_t MemoryBudget::peak() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

uint64_t MemoryBudget::pooled() const {
  absl::MutexLock lock(&mu_);
  return pooled_;
}

uint64_t MemoryBudget::reused() const {
  absl::MutexLock lock(&mu_);
  return reused_;
}

void MemoryBudget::ResetPeak() {
  absl::MutexLock lock(&mu_);
  peak_ = held_;
}

std::shared_ptr<MemoryBudget::Account> MemoryBudget::NewAccount(uint64_t cap, std::string name) {
  return std::shared_ptr<Account>(new Account(cap, std::move(name)));
}

Block MemoryBudget::TryAllocate(const std::shared_ptr<Account>& account, uint64_t bytes) {
  if (bytes == 0) {
    // A valid, empty block: nothing to charge.
    return Block(std::shared_ptr<char>(new char[1], std::default_delete<char[]>()), 0);
  }
  char* taken = nullptr;
  uint64_t charge = bytes;
  std::vector<Mapping> evicted;
  {
    absl::MutexLock lock(&mu_);
    const uint64_t cap = account->cap_ > 0 ? account->cap_ : limit_;
    const uint64_t own = account->held_.load(std::memory_order_relaxed);
    // The two progress rules: an empty account may exceed its cap by one block, and an
    // empty budget may be exceeded by one block.
    auto fits = [&](uint64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return (own == 0 || own + n <= cap) && (held_ == 0 || held_ + n <= limit_);
    };
    if (!fits(bytes)) return Block();
    if (bytes >= kPooledBlock) {
      // A mapping serves a request up to a quarter smaller; a heap array only one of its own
      // size, so those are charged exactly what was asked (caps as small as a few blocks
      // stay exact).
      auto it = pool_.lower_bound(bytes);
      const uint64_t slack = bytes >= kLargeBlock ? bytes / 4 : 0;
      if (it != pool_.end() && it->first <= bytes + slack && fits(it->first)) {
        taken = it->second;
        charge = it->first;
        pooled_ -= it->first;
        pool_.erase(it);
        ++reused_;
      }
    }
    held_ += charge;
    peak_ = std::max(peak_, held_);
    const uint64_t now = own + charge;
    account->held_.store(now, std::memory_order_relaxed);
    if (now > account->peak_.load(std::memory_order_relaxed)) {
      account->peak_.store(now, std::memory_order_relaxed);
    }
    while (!pool_.empty() && held_ + pooled_ > limit_) {
      auto largest = std::prev(pool_.end());
      pooled_ -= largest->first;
      evicted.push_back(*largest);
      pool_.erase(largest);
    }
  }
  Unmap(evicted);

  auto self = shared_from_this();
  if (taken == nullptr && bytes >= kLargeBlock) {
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (m != MAP_FAILED) taken = static_cast<char*>(m);
  }
  if (taken == nullptr && bytes >= kPooledBlock && bytes < kLargeBlock) taken = new char[bytes];
  if (taken != nullptr) {
    return Block(
        std::shared_ptr<char>(
            taken, [self, account, charge](char* p) { self->Recycle(account.get(), p, charge); }),
        bytes);
  }
  return Block(std::shared_ptr<char>(new char[bytes],
                                     [self, account, charge](char* p) {
                                       delete[] p;
                                       self->Release(account.get(), charge);
                                     }),
               bytes);
}

void MemoryBudget::Release(Account* account, uint64_t charge) {
  {
    absl::MutexLock lock(&mu_);
    held_ -= charge;
    account->held_.fetch_sub(charge, std::memory_order_relaxed);
  }
  NotifyListeners();
}

void MemoryBudget::Recycle(Account* account, char* p, uint64_t size) {
  bool pooled = false;
  {
    absl::MutexLock lock(&mu_);
    held_ -= size;
    account->held_.fetch_sub(size, std::memory_order_relaxed);
    if (held_ + pooled_ + size <= limit_) {
      pool_.emplace(size, p);
      pooled_ += size;
      pooled = true;
    }
  }
  if (!pooled) Free(p, size);
  NotifyListeners();
}

bool MemoryBudget::WaitUntil(absl::FunctionRef<bool()> attempt) {
  if (attempt()) return true;
  const absl::Time start = absl::Now();
  ProfileSpan span(ProfileStage::kBudget);
  struct Wake {
    absl::Mutex mu;
    bool released ABSL_GUARDED_BY(mu) = false;
  };
  auto wake = std::make_shared<Wake>();
  auto rouse = [wake] {
    absl::MutexLock lock(&wake->mu);
    wake->released = true;
  };
  const uint64_t id = AddListener(rouse);
  // A copy: the token may be replaced on this thread while the wait's callback is registered.
  const CancelToken token = AmbientCancel();
  const uint64_t on_cancel = token ? token->OnCancel(rouse) : 0;
  const absl::Duration period = InterruptPollInstalled() ? kInterruptPollPeriod : absl::Seconds(1);
  bool room = false;
  // Armed before each attempt, so a release between a failed attempt and the wait is seen.
  while (true) {
    {
      absl::MutexLock lock(&wake->mu);
      wake->released = false;
    }
    if (attempt()) {
      room = true;
      break;
    }
    if (IsCancelled(token)) break;
    {
      absl::MutexLock lock(&wake->mu);
      wake->mu.AwaitWithTimeout(absl::Condition(&wake->released), period);
    }
    PollInterrupt();  // cancels `token` when the edge says stop; the loop then ends
  }
  if (token) token->Forget(on_cancel);
  RemoveListener(id);
  if (Histogram* h = wait_histogram_.load(std::memory_order_relaxed)) {
    h->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return room;
}

uint64_t MemoryBudget::AddListener(std::function<void()> fn) {
  absl::MutexLock lock(&listeners_mu_);
  const uint64_t id = next_listener_++;
  listeners_.emplace(id, std::move(fn));
  listener_count_.fetch_add(1, std::memory_order_relaxed);
  return id;
}

void MemoryBudget::RemoveListener(uint64_t id) {
  absl::MutexLock lock(&listeners_mu_);
  if (listeners_.erase(id) > 0) listener_count_.fetch_sub(1, std::memory_order_relaxed);
}

void MemoryBudget::NotifyListeners() {
  if (listener_count_.load(std::memory_order_relaxed) == 0) return;
  absl::MutexLock lock(&listeners_mu_);
  for (auto& [id, fn] : listeners_) fn();
}

}  // namespace wharf
