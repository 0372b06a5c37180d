// SPDX-License-Identifier: Apache-2.0
#include "fiber/stack_pool.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>
#include <sanitizer/asan_interface.h>
#include <climits>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

namespace coresched::detail {

std::size_t page_size() noexcept {
  static const std::size_t ps = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return ps;
}

namespace testing {
std::atomic<int> fail_stack_allocations{0};
std::atomic<bool> advise_one_range_at_a_time{false};
} // namespace testing

Stack allocate_stack(std::size_t usable) {
  // Test hook: behave as an mmap that failed (vm.max_map_count reached).
  if (testing::fail_stack_allocations.load(std::memory_order_relaxed) > 0 &&
      testing::fail_stack_allocations.fetch_sub(1, std::memory_order_relaxed) > 0)
    throw std::bad_alloc();
  const std::size_t ps = page_size();
  usable = (usable + ps - 1) / ps * ps;
  void* p = mmap(nullptr, usable + ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  if (mprotect(p, ps, PROT_NONE) != 0) {
    munmap(p, usable + ps);
    throw std::bad_alloc();
  }
  return Stack{static_cast<char*>(p) + ps, usable};
}

void free_stack(Stack s) noexcept {
  if (!s) return;
  const std::size_t ps = page_size();
  // Frames that never returned (a finished fiber's entry frame, a fiber that
  // was switched away from for good) leave ASan's redzone marks behind. The
  // kernel may hand these pages to the next mmap (an io_uring ring, a heap
  // arena), so clear them first or ASan reports a false stack-buffer-underflow
  // there. A no-op without ASan.
  ASAN_UNPOISON_MEMORY_REGION(s.base, s.size);
  munmap(static_cast<char*>(s.base) - ps, s.size + ps);
}

SharedStackPool::SharedStackPool(std::size_t stack_size) : stack_size_(stack_size) {
  const char* guard = std::getenv("CORESCHED_STACK_GUARD");
  guard_markers_ = !(guard && std::strcmp(guard, "mprotect") == 0);
  runs_.reserve(kReleaseBatch);
}

SharedStackPool::~SharedStackPool() {
  for (Stack s : free_) unmap(s);
  unmap(reserve_);
  for (const auto& [base, bytes] : slabs_) {
    ASAN_UNPOISON_MEMORY_REGION(base, bytes); // (see free_stack)
    munmap(base, bytes);
  }
}

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102 // Linux 6.13; older headers lack it
#endif

namespace {
constexpr int kPidfdSelf = -10001; // PIDFD_SELF_THREAD_GROUP (Linux 6.15); older headers lack it

// One advice over many ranges. A call per range, starting and finishing
// 100,000 parked fibers made 190,000 madvise calls, each flushing every CPU's
// TLB: ~10 us a fiber each way. process_madvise on the process itself
// (PIDFD_SELF: Linux 6.15; older kernels refuse it) takes them all in one
// call (and, on recent kernels, one flush); where it is refused, each range
// gets its madvise. False if a range's advice failed.
bool advise(std::vector<iovec>& ranges, int advice) noexcept {
  for (std::size_t done = 0; done < ranges.size() && !testing::advise_one_range_at_a_time.load();) {
    const std::size_t n = std::min<std::size_t>(ranges.size() - done, IOV_MAX);
    std::size_t bytes = 0;
    for (std::size_t i = done; i < done + n; ++i) bytes += ranges[i].iov_len;
    if (syscall(SYS_process_madvise, kPidfdSelf, &ranges[done], n, advice, 0) != static_cast<long>(bytes)) break;
    done += n;
    if (done == ranges.size()) return true;
  }
  bool ok = true; // advice is idempotent: ranges already advised may be again
  for (const iovec& r : ranges) ok = madvise(r.iov_base, r.iov_len, advice) == 0 && ok;
  return ok;
}
} // namespace

Stack SharedStackPool::carve() {
  if (testing::fail_stack_allocations.load(std::memory_order_relaxed) > 0 &&
      testing::fail_stack_allocations.fetch_sub(1, std::memory_order_relaxed) > 0)
    throw std::bad_alloc();
  for (auto* list : {&to_release_, &slots_}) {
    if (list->empty()) continue;
    Stack s = list->back();
    list->pop_back();
    return s;
  }
  const std::size_t ps = page_size();
  const std::size_t slot = ps + stack_size_;
  if (next_slot_ == slab_end_) {
    const std::size_t bytes = slot * kSlabStacks;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    slabs_.emplace_back(static_cast<char*>(p), bytes);
    next_slot_ = static_cast<char*>(p);
    slab_end_ = next_slot_ + bytes;
    // Every slot's guard page at once, as markers where the kernel has them.
    if (guard_markers_) {
      std::vector<iovec> guards;
      for (char* g = next_slot_; g != slab_end_; g += slot) guards.push_back({g, ps});
      guard_markers_ = advise(guards, MADV_GUARD_INSTALL);
    }
  }
  char* guard = next_slot_;
  // Without markers the guard page is PROT_NONE (an mprotect that fails, at
  // vm.max_map_count, leaves the slot for later).
  if (!guard_markers_ && mprotect(guard, ps, PROT_NONE) != 0) throw std::bad_alloc();
  next_slot_ += slot;
  return Stack{guard + ps, stack_size_};
}

void SharedStackPool::keep_reserve() {
  Stack s = map(stack_size_);
  if (!refill_reserve(s)) unmap(s);
}

bool SharedStackPool::take_reserve(Stack& out) {
  std::lock_guard lk(mu_);
  if (!reserve_) return false;
  out = std::exchange(reserve_, Stack{});
  has_reserve_.store(false, std::memory_order_relaxed);
  return true;
}

bool SharedStackPool::refill_reserve(Stack s) {
  std::lock_guard lk(mu_);
  if (reserve_) return false;
  reserve_ = s;
  has_reserve_.store(true, std::memory_order_relaxed);
  return true;
}

Stack SharedStackPool::map(std::size_t usable) {
  Stack s;
  if (usable == stack_size_) {
    std::lock_guard lk(slab_mu_);
    s = carve();
  } else {
    s = allocate_stack(usable);
  }
  StackHeader* h = new (s.header()) StackHeader;
  std::lock_guard lk(list_mu_);
  if (!list_.next) list_.next = list_.prev = &list_;
  h->prev = &list_;
  h->next = list_.next;
  list_.next->prev = h;
  list_.next = h;
  return s;
}

void SharedStackPool::unmap(Stack s) noexcept {
  if (!s) return;
  {
    std::lock_guard lk(list_mu_);
    StackHeader* h = s.header();
    h->prev->next = h->next;
    h->next->prev = h->prev;
  }
  if (s.size != stack_size_) return free_stack(s);
  // A slab's slot: its memory goes back to the kernel with the next batch,
  // its guard and its place in the slab stay for the next carve().
  ASAN_UNPOISON_MEMORY_REGION(s.base, s.size);
  std::lock_guard lk(slab_mu_);
  to_release_.push_back(s);
  if (to_release_.size() >= kReleaseBatch) release_batch();
}

void SharedStackPool::release_batch() noexcept {
  std::sort(to_release_.begin(), to_release_.end(), [](const Stack& a, const Stack& b) { return a.base < b.base; });
  const std::size_t ps = page_size();
  runs_.clear(); // reserved for a batch: no allocation here
  for (std::size_t i = 0; i < to_release_.size();) {
    // A run of slots side by side: one range from the first's base to the
    // last's top, over the guards between them (markers and PROT_NONE pages
    // both survive MADV_DONTNEED).
    std::size_t j = i + 1;
    while (j < to_release_.size() && static_cast<char*>(to_release_[j - 1].top()) + ps == to_release_[j].base) ++j;
    char* from = static_cast<char*>(to_release_[i].base);
    runs_.push_back({from, static_cast<std::size_t>(static_cast<char*>(to_release_[j - 1].top()) - from)});
    i = j;
  }
  advise(runs_, MADV_DONTNEED);
  slots_.insert(slots_.end(), to_release_.begin(), to_release_.end());
  to_release_.clear();
}

bool SharedStackPool::take(Stack& out) {
  std::lock_guard lk(mu_);
  if (free_.empty()) return false;
  out = free_.back();
  free_.pop_back();
  return true;
}

void SharedStackPool::give(Stack s) {
  {
    std::lock_guard lk(mu_);
    if (free_.size() < kMax) {
      free_.push_back(s);
      return;
    }
  }
  unmap(s);
}

StackPool::~StackPool() {
  for (Stack s : free_) shared_.give(s);
}

Stack StackPool::get(std::size_t usable) {
  const std::size_t ps = page_size();
  const std::size_t want = (usable + ps - 1) / ps * ps;
  if (want == shared_.stack_size()) {
    if (!free_.empty()) {
      Stack s = free_.back();
      free_.pop_back();
      return s;
    }
    Stack s;
    if (shared_.take(s)) return s;
  }
  return shared_.map(want);
}

void StackPool::put(Stack s) noexcept {
  if (!s) return;
  if (s.size != shared_.stack_size()) {
    shared_.unmap(s); // odd sizes are not pooled
    return;
  }
  if (!shared_.has_reserve() && shared_.refill_reserve(s)) [[unlikely]]
    return;
  if (free_.size() < kLocalMax) {
    free_.push_back(s);
    return;
  }
  try {
    shared_.give(s);
  } catch (...) {
    shared_.unmap(s);
  }
}

} // namespace coresched::detail
