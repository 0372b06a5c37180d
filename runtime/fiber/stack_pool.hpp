// SPDX-License-Identifier: Apache-2.0
// Fiber stacks, each with a guard page below it, pooled and reused.
// Stacks of the runtime's default size are carved from slabs of kSlabStacks,
// one mapping each, their guard pages installed as page-table markers
// (MADV_GUARD_INSTALL, Linux 6.13) that do not split the mapping: a server
// that parks a fiber per connection would otherwise hold two mappings per
// fiber and meet vm.max_map_count (65,530) at about 32,000 fibers, and every
// stack would cost an mmap, an mprotect and, once given back, a munmap, each
// taking the process's mmap lock for writing. Where the kernel has no guard
// markers the guard page is mprotect'ed (two mappings per stack, as odd-sized
// stacks always have). A slab's guards are installed together when it is
// mapped. Stacks given back beyond what the pools keep return their memory
// kReleaseBatch at a time with MADV_DONTNEED (which keeps the guards), the
// batch's ranges in one system call where the kernel allows (advise() in
// stack_pool.cpp): each call flushes every CPU's TLB, and a call per stack
// made draining a hundred thousand parked fibers cost ~10 us per fiber. The
// batches go back on a thread of the pool's own (release_loop()), started at
// the first, so that no worker waits for the flush.
#pragma once

#include "fiber/stack_header.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <sched.h>
#include <sys/uio.h>
#include <thread>
#include <utility>
#include <vector>

namespace coresched::detail {

struct Stack {
  void* base = nullptr;   // lowest usable address (just above the guard page)
  std::size_t size = 0;   // usable bytes
  void* top() const noexcept { return static_cast<char*>(base) + size; }
  /// The header in the stack's top kStackHeaderBytes (stack_header.hpp).
  StackHeader* header() const noexcept {
    return reinterpret_cast<StackHeader*>(static_cast<char*>(top()) - kStackHeaderBytes);
  }
  /// Where the fiber's frames begin: just below the header.
  void* frames_top() const noexcept { return header(); }
  explicit operator bool() const noexcept { return base != nullptr; }
};

namespace testing {
/// Test-only: while positive, each stack allocation fails (std::bad_alloc) and
/// decrements it, as when mmap meets vm.max_map_count.
extern std::atomic<int> fail_stack_allocations;
/// Test-only: advise ranges one madvise at a time, as where the kernel
/// refuses process_madvise on the process itself (before Linux 6.15).
extern std::atomic<bool> advise_one_range_at_a_time;
/// Test-only: while true, a batch of stacks being given back waits, as a
/// slow TLB flush would.
extern std::atomic<bool> hold_releases;
/// Test-only: batches of stacks given back so far.
extern std::atomic<int> batches_released;
} // namespace testing

/// The bytes mapped for a fiber that asked for `asked` (whole pages): twice
/// that. A join runs a child that has not started inline, on the joiner's
/// stack below the joiner's frame, only where at least the child's own ask is
/// left there (Worker::may_run_inline); the second half is that room, so a
/// joiner that has used less than its own ask can still run an equal child
/// inline. With the ask alone mapped, a joiner's frames and its inline
/// children's would add up and overflow stacks that each fit its own ask
/// (a 64 KiB joiner and child using 40 KiB each, on one PU). MAP_NORESERVE:
/// a page that no frame reaches costs address
/// space, not memory.
inline constexpr std::size_t mapped_stack_bytes(std::size_t asked) noexcept { return 2 * asked; }
/// The largest stack a fiber may ask for (Options and SpawnOptions::stack_size).
/// Larger asks are refused: rounding SIZE_MAX up to pages would wrap to 0, and
/// a size no mmap can ever give would leave the fiber waiting for a stack for ever.
inline constexpr std::size_t kMaxStackBytes = std::size_t{1} << 30;

/// Allocates a stack with a PROT_NONE guard page below it. Throws std::bad_alloc.
Stack allocate_stack(std::size_t usable);
/// Unmaps a stack made by allocate_stack.
void free_stack(Stack s) noexcept;
/// The system page size.
std::size_t page_size() noexcept;

/// Overflow pool shared by all workers of one runtime, and the list of every
/// stack the runtime has mapped (the registry the fiber dump walks).
class SharedStackPool {
public:
  /// CORESCHED_STACK_GUARD=mprotect asks for mprotect'ed guard pages even
  /// where the kernel has markers: gdb's gcore cannot read a mapping with a
  /// marker in it and leaves the whole slab out of the core file (the
  /// kernel's own core dumps read it).
  explicit SharedStackPool(std::size_t stack_size);
  ~SharedStackPool();
  SharedStackPool(const SharedStackPool&) = delete;
  SharedStackPool& operator=(const SharedStackPool&) = delete;
  bool take(Stack& out);
  void give(Stack s);
  std::size_t stack_size() const noexcept { return stack_size_; }

  /// One stack kept back for a fiber that must fail because no stack can be
  /// mapped (Worker::give_stack): failing still runs the destructor of its
  /// callable, which is its tenant's code and needs a stack of its own. Mapped
  /// by keep_reserve() at start, refilled by the next stack given back.
  void keep_reserve();
  bool take_reserve(Stack& out);
  /// Keeps `s` as the reserve if there is none; false if there is one.
  bool refill_reserve(Stack s);
  bool has_reserve() const noexcept { return has_reserve_.load(std::memory_order_relaxed); }

  /// Maps a new stack of `usable` bytes (carved from a slab when it is the
  /// pool's size) and lists it. Throws std::bad_alloc.
  Stack map(std::size_t usable);
  /// Unlists a stack made by map() and gives its memory back: a slab's slot
  /// is kept for the next map(), any other stack is unmapped.
  void unmap(Stack s) noexcept;
  /// Stacks per slab.
  static constexpr std::size_t kSlabStacks = 64;
  /// Slots whose memory is given back in one go: enough that the slots of
  /// fibers retired in turn on different workers meet their neighbours and
  /// go back as one range (at 64, a batch held every other slot).
  static constexpr std::size_t kReleaseBatch = 512;
  /// Returns once no batch is being given back (tests: a slot unmapped in a
  /// full batch is zero when carved again only after this).
  void wait_released();
  /// Calls `fn(const StackHeader&)` for every mapped stack, with the list
  /// locked (no stack is unmapped meanwhile). False if the lock stayed busy
  /// for `patience_ms` (the dump never waits long on a stuck runtime).
  template <class Fn> bool for_each_stack(Fn fn, int patience_ms) const;
  /// The list's sentinel (for debuggers: debug_registry.hpp).
  const void* stack_list() const noexcept { return &list_; }

private:
  static constexpr std::size_t kMax = 4096;
  /// A slot of a slab, guarded and ready (under slab_mu_).
  Stack carve();
  /// Gives the memory of the slots in batch_ back, neighbours as one range
  /// (by the releaser, or the thread that set releasing_ where no releaser
  /// could start; outside slab_mu_).
  void release_batch() noexcept;
  void release_loop();
  void finish_batch();
  void finish_batch_locked();
  std::size_t stack_size_;
  std::mutex slab_mu_;               // guards the slabs and their free slots
  std::vector<std::pair<char*, std::size_t>> slabs_; // base, bytes
  std::vector<Stack> to_release_;    // given back, memory not yet: carved first
  std::vector<Stack> slots_;         // carved before, memory given back, free again
  std::vector<Stack> batch_;         // given back, memory going back now: in no list
  bool releasing_ = false;           // batch_ and runs_ belong to a release in progress
  bool stopping_ = false;            // the pool is going: no more batches
  std::condition_variable release_cv_; // (slab_mu_) a batch is due, or one was given back
  std::thread releaser_;             // started at the first batch
  cpu_set_t cpus_;                   // the releaser's CPUs: those of the runtime's builder
  std::vector<iovec> runs_;          // release_batch()'s ranges (reserved for a batch)
  char* next_slot_ = nullptr;        // the newest slab's first slot never carved
  char* slab_end_ = nullptr;
  bool guard_markers_ = true;        // MADV_GUARD_INSTALL works here (else mprotect)
  std::mutex mu_;
  std::vector<Stack> free_;
  Stack reserve_; // guarded by mu_
  std::atomic<bool> has_reserve_{false};
  mutable std::mutex list_mu_; // guards the list below: taken only to map, unmap and dump
  StackHeader list_;                 // sentinel of the circular list of mapped stacks (empty: null links)
};

template <class Fn> bool SharedStackPool::for_each_stack(Fn fn, int patience_ms) const {
  // try_lock in steps, not timed_mutex: TSan (g++ 12) does not see pthread_mutex_clocklock.
  for (int waited = 0; !list_mu_.try_lock(); ++waited) {
    if (waited >= patience_ms) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (const StackHeader* h = list_.next; h && h != &list_; h = h->next) fn(*h);
  list_mu_.unlock();
  return true;
}

/// A worker's own free list (no locking: used only by its worker thread).
class StackPool {
public:
  explicit StackPool(SharedStackPool& shared) : shared_(shared) {}
  ~StackPool();
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;
  Stack get(std::size_t usable);
  void put(Stack s) noexcept;

private:
  static constexpr std::size_t kLocalMax = 64;
  SharedStackPool& shared_;
  std::vector<Stack> free_;
};

} // namespace coresched::detail
