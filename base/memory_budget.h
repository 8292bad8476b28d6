// MemoryBudget: the process's one bound on the bytes wharf holds for data, with per-consumer
// accounts (per-call caps) and the pool of large blocks (docs/design/runtime.md).
//
// Consumers (a fetch batch, an object reader, a transfer, a Python get_many) open an Account
// with a cap and allocate Blocks through it. A block is charged to its account and to the
// budget from allocation until its last reference is dropped (the deleter returns the
// charge), so handing a block on (zero-copy, to Python or to an upload) keeps it counted.
//
// A reservation succeeds when it fits the account's cap and the budget, with two exceptions
// that keep progress possible: an account that holds nothing may take one block larger than
// its cap, and when the budget holds nothing at all one block larger than the budget is
// allowed alone. So the budget is never exceeded except by a single oversized block.
//
// Blocks of kLargeBlock bytes and more are anonymous mappings populated up front; blocks from
// kPooledBlock bytes on are heap arrays. Released ones of either kind stay in a pool and serve
// the next request of a similar size (a mapping: at most a quarter larger; a heap array: the
// same size, so small charges stay exact), because the kernel
// zero-fills every page of a fresh mapping, and the C heap gives the top of its free memory
// back to the kernel: a stream of 100 KiB samples through a fresh heap block each spent a
// quarter of its CPU in page faults. The bound held + pooled <= limit always holds:
// reservations evict pooled blocks that no longer fit.
//
// Waiting: TryAllocate never blocks. A consumer that could not reserve registers a listener
// (AddListener) and retries when it fires; listeners run after every release, on the
// releasing thread, after the budget's lock is dropped. They must be short and must only take
// locks that are never held while a block is released (leaf locks).
//
// Thread-safety: thread-safe. Blocks may be released on any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace wharf {

class Histogram;
class MemoryBudget;

// A charged, writable byte block. Shares ownership like a shared_ptr; the charge is returned
// when the last copy (and every aliasing shared_ptr made from data()) is gone.
class Block {
 public:
  Block() = default;
  char* data() const { return data_.get(); }
  uint64_t size() const { return size_; }
  explicit operator bool() const { return data_ != nullptr; }
  // The owning pointer, for zero-copy hand-offs (Python buffers, cords).
  const std::shared_ptr<char>& owner() const { return data_; }

 private:
  friend class MemoryBudget;
  Block(std::shared_ptr<char> data, uint64_t size) : data_(std::move(data)), size_(size) {}
  std::shared_ptr<char> data_;
  uint64_t size_ = 0;
};

class MemoryBudget : public std::enable_shared_from_this<MemoryBudget> {
 public:
  // Blocks from this size on are pooled mappings.
  static constexpr uint64_t kLargeBlock = uint64_t{4} << 20;
  // Blocks from this size on (below kLargeBlock: heap arrays) are pooled too.
  static constexpr uint64_t kPooledBlock = uint64_t{32} << 10;

  // One consumer's share: its cap, what it holds and its peak. Created by NewAccount.
  class Account {
   public:
    uint64_t cap() const { return cap_; }
    uint64_t held() const { return held_.load(std::memory_order_relaxed); }
    uint64_t peak() const { return peak_.load(std::memory_order_relaxed); }
    const std::string& name() const { return name_; }

   private:
    friend class MemoryBudget;
    Account(uint64_t cap, std::string name) : cap_(cap), name_(std::move(name)) {}
    const uint64_t cap_;
    const std::string name_;
    std::atomic<uint64_t> held_{0};
    std::atomic<uint64_t> peak_{0};
  };

  // Create with std::make_shared (blocks keep the budget alive).
  explicit MemoryBudget(uint64_t limit);
  ~MemoryBudget();
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // A new limit for new reservations (bytes held stay held). Pooled blocks beyond it are
  // unmapped.
  void set_limit(uint64_t limit);
  uint64_t limit() const;
  uint64_t held() const;
  uint64_t peak() const;
  uint64_t pooled() const;
  // Blocks served from the pool instead of a fresh mapping, since the start.
  uint64_t reused() const;
  // Resets peak() to held() (benchmarks and tests measure one phase).
  void ResetPeak();

  // An account capped at `cap` bytes (0: the budget's limit at each reservation). `name`
  // appears in messages ("the memory cap of fetch batch ...").
  std::shared_ptr<Account> NewAccount(uint64_t cap, std::string name = "");

  // A block of `bytes` charged to `account` and the budget, or an empty Block when either
  // has no room now (see the rules above). Never blocks.
  Block TryAllocate(const std::shared_ptr<Account>& account, uint64_t bytes);

  // Blocks until `attempt` returns true: calls it now, then again after every release in
  // the budget (and at least once a second, a safety net). `attempt` runs on the calling
  // thread with no budget lock held; it typically calls TryAllocate, and may also decide to
  // give up (returning true after noting why). The one way consumers wait for room.
  // Returns false, without room, when the caller's ambient token (base/cancel.h) is
  // cancelled first: room held by another consumer may never come back to an operation that
  // Ctrl-C stopped. The wait polls an installed interrupt poll as the engine's other waits do.
  [[nodiscard]] bool WaitUntil(absl::FunctionRef<bool()> attempt);
  // Where WaitUntil records how long it waited (when it had to): the runtime's
  // wharf_memory_budget_wait_seconds. Null: not recorded.
  void SetWaitHistogram(Histogram* h) { wait_histogram_.store(h, std::memory_order_relaxed); }

  // Listeners run after every release (see above). Returns an id for RemoveListener.
  uint64_t AddListener(std::function<void()> fn);
  // After it returns, the listener is not running and will not run again. Listeners run under
  // an internal lock: they must not add or remove listeners.
  void RemoveListener(uint64_t id);

 private:
  using Mapping = std::pair<uint64_t, char*>;  // (size, address)
  void Release(Account* account, uint64_t charge);
  // Returns a pooled-size block: back to the pool when it fits the limit, else freed.
  void Recycle(Account* account, char* p, uint64_t size);
  static void Free(char* p, uint64_t size);
  void NotifyListeners();
  static void Unmap(const std::vector<Mapping>& mappings);

  mutable absl::Mutex mu_;
  uint64_t limit_ ABSL_GUARDED_BY(mu_);
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  std::multimap<uint64_t, char*> pool_ ABSL_GUARDED_BY(mu_);  // block size -> address
  uint64_t pooled_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reused_ ABSL_GUARDED_BY(mu_) = 0;

  // Listeners: taken under listeners_mu_ (never held while mu_ is).
  absl::Mutex listeners_mu_;
  std::map<uint64_t, std::function<void()>> listeners_ ABSL_GUARDED_BY(listeners_mu_);
  uint64_t next_listener_ ABSL_GUARDED_BY(listeners_mu_) = 1;
  std::atomic<int> listener_count_{0};
  std::atomic<Histogram*> wait_histogram_{nullptr};
};
}  // namespace wharf
