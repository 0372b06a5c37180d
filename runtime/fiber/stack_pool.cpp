// SPDX-License-Identifier: Apache-2.0
#include "fiber/stack_pool.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>
#include <pthread.h>
#include <span>
#include <utility>
#include <sanitizer/asan_interface.h>
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
std::atomic<bool> hold_releases{false};
std::atomic<int> batches_released{0};
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
  // The CPUs of the thread that builds the runtime, before any worker pins
  // itself: the releaser starts on a worker and would inherit its one CPU.
  CPU_ZERO(&cpus_);
  if (sched_getaffinity(0, sizeof(cpus_), &cpus_) != 0) CPU_ZERO(&cpus_);
}

SharedStackPool::~SharedStackPool() {
  {
    std::lock_guard lk(slab_mu_);
    stopping_ = true; // unmap() below starts no batch: the slabs go whole
  }
  release_cv_.notify_all();
  if (releaser_.joinable()) releaser_.join();
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
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 // Linux 5.14
#endif

namespace {
constexpr int kPidfdSelf = -10001; // PIDFD_SELF_THREAD_GROUP (Linux 6.15); older headers lack it

// One advice over many ranges. A call per range, starting and finishing
// 100,000 parked fibers made 190,000 madvise calls (each give-back flushing
// every CPU's TLB): ~10 us a fiber each way. process_madvise on the process
// itself (PIDFD_SELF_THREAD_GROUP: Linux 6.15; older kernels refuse it) takes
// them all in one call (and, on recent kernels, one flush); where it is
// refused, each range gets its madvise. False if a range's advice failed.
bool advise(std::span<iovec> ranges, int advice) noexcept {
  std::size_t done = 0; // ranges advised (the next one may be in part: its base moved up)
  while (done < ranges.size() && !testing::advise_one_range_at_a_time.load(std::memory_order_relaxed)) {
    const std::size_t n = std::min<std::size_t>(ranges.size() - done, IOV_MAX);
    const long r = syscall(SYS_process_madvise, kPidfdSelf, &ranges[done], n, advice, 0);
    if (r <= 0) break;
    // A short count (at most MAX_RW_COUNT bytes a call) goes on where it stopped.
    for (auto left = static_cast<std::size_t>(r); left > 0 && done < ranges.size();) {
      iovec& v = ranges[done];
      if (left < v.iov_len) {
        v.iov_base = static_cast<char*>(v.iov_base) + left;
        v.iov_len -= left;
        left = 0;
      } else {
        left -= v.iov_len;
        ++done;
      }
    }
  }
  bool ok = true;
  for (std::size_t i = done; i < ranges.size(); ++i) ok = madvise(ranges[i].iov_base, ranges[i].iov_len, advice) == 0 && ok;
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
    // Every slot's guard page at once, as markers where the kernel has them,
    // and every slot's top page (its fiber's header and first frames) made
    // resident at once: a fault per fresh stack cost up to twice as much as
    // one call for all, in a VM. Before Linux 5.14 (no MADV_POPULATE_WRITE)
    // they fault in on first use.
    std::array<iovec, kSlabStacks> guards, tops; // no allocation between the mmap and the guards
    for (std::size_t i = 0; i < kSlabStacks; ++i) {
      char* g = next_slot_ + i * slot;
      guards[i] = {g, ps};
      tops[i] = {g + slot - ps, ps};
    }
    if (guard_markers_) guard_markers_ = advise(guards, MADV_GUARD_INSTALL);
    advise(tops, MADV_POPULATE_WRITE);
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
  {
    std::lock_guard lk(slab_mu_);
    to_release_.push_back(s);
    if (to_release_.size() < kReleaseBatch || releasing_ || stopping_) return;
    releasing_ = true;
    std::swap(to_release_, batch_); // batch_ was empty: to_release_ starts again
    if (!releaser_.joinable()) {
      try {
        releaser_ = std::thread([this] { release_loop(); });
        pthread_setname_np(releaser_.native_handle(), "coresched-stack");
      } catch (...) { // no thread to be had: this one gives the batch back below
      }
    }
    if (releaser_.joinable()) {
      release_cv_.notify_one();
      return;
    }
  }
  // No thread could be started: the batch goes back here, as the releaser
  // would give it.
  release_batch();
  finish_batch();
}

// The releaser: batches go back to the kernel on this thread, not on the
// worker that gave back the stack. A batch is one process_madvise over 512
// ranges (or a madvise each); on a VM its TLB flush waits for every vCPU, and
// a worker doing it would hold its other fibers and timers for 2 ms on
// average, at times for 25 ms of its CPU, which the stall report would then
// blame on the fiber that ran next. Outside the lock: a worker that maps or gives back a stack
// meanwhile does not wait. The batch's slots are in no list, so no carve()
// hands one out while its memory goes.
void SharedStackPool::release_loop() {
  // Off the CPU of the worker that started it: the flush's wait would hold that
  // worker's CPU as before (best effort, as the worker's own pinning).
  if (CPU_COUNT(&cpus_) > 0) pthread_setaffinity_np(pthread_self(), sizeof(cpus_), &cpus_);
  std::unique_lock lk(slab_mu_);
  for (;;) {
    release_cv_.wait(lk, [&] { return stopping_ || releasing_; });
    if (stopping_) return; // the slabs are unmapped whole next
    lk.unlock();
    release_batch();
    lk.lock();
    finish_batch_locked();
  }
}

void SharedStackPool::finish_batch() {
  std::lock_guard lk(slab_mu_);
  finish_batch_locked();
}

// The batch's slots are free again; one that filled meanwhile goes next.
void SharedStackPool::finish_batch_locked() {
  slots_.insert(slots_.end(), batch_.begin(), batch_.end());
  batch_.clear();
  releasing_ = to_release_.size() >= kReleaseBatch && !stopping_ && releaser_.joinable();
  if (releasing_) std::swap(to_release_, batch_);
  release_cv_.notify_all(); // wait_released()
}

void SharedStackPool::wait_released() {
  std::unique_lock lk(slab_mu_);
  release_cv_.wait(lk, [&] { return !releasing_ || stopping_; });
}

void SharedStackPool::release_batch() noexcept {
  testing::batches_released.fetch_add(1, std::memory_order_relaxed);
  while (testing::hold_releases.load(std::memory_order_relaxed)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::sort(batch_.begin(), batch_.end(), [](const Stack& a, const Stack& b) { return a.base < b.base; });
  const std::size_t ps = page_size();
  runs_.clear();
  for (std::size_t i = 0; i < batch_.size();) {
    // A run of slots side by side: one range from the first's base to the
    // last's top, over the guards between them (markers and PROT_NONE pages
    // both survive MADV_DONTNEED).
    std::size_t j = i + 1;
    while (j < batch_.size() && static_cast<char*>(batch_[j - 1].top()) + ps == batch_[j].base) ++j;
    char* from = static_cast<char*>(batch_[i].base);
    if (runs_.size() == runs_.capacity()) { // a batch that grew during the last release: no allocation
      advise(runs_, MADV_DONTNEED);
      runs_.clear();
    }
    runs_.push_back({from, static_cast<std::size_t>(static_cast<char*>(batch_[j - 1].top()) - from)});
    i = j;
  }
  advise(runs_, MADV_DONTNEED);
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
