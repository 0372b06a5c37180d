// SPDX-License-Identifier: Apache-2.0
#include "fiber/stack_pool.hpp"

#include <atomic>
#include <new>
#include <utility>
#include <sanitizer/asan_interface.h>
#include <sys/mman.h>
#include <unistd.h>

namespace coresched::detail {

std::size_t page_size() noexcept {
  static const std::size_t ps = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return ps;
}

namespace testing {
std::atomic<int> fail_stack_allocations{0};
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

SharedStackPool::~SharedStackPool() {
  for (Stack s : free_) unmap(s);
  unmap(reserve_);
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
  Stack s = allocate_stack(usable);
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
  free_stack(s);
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
