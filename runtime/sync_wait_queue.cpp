// SPDX-License-Identifier: Apache-2.0
// The lock and wait queue under every primitive of sync.hpp.
#include "waiter.hpp"

#include <coresched/sync.hpp>

#include <immintrin.h>
#include <sched.h>

namespace coresched::detail {

// The lock guards a few words, so it is normally free within a few pauses. If
// not, its holder was probably preempted by the OS (a plain thread, or a
// worker on an oversubscribed machine): yield the CPU rather than spin.
void SyncLock::lock_slow() noexcept {
  for (int i = 0;; ++i) {
    if (!flag_.load(std::memory_order_relaxed) && !flag_.exchange(true, std::memory_order_acquire)) return;
    if (i < 64) _mm_pause();
    else sched_yield();
  }
}

void WaitQueue::wait(SyncLock& lock, void* slot, void (*after_unlock)(void*), void* arg, const char* what) {
  Waiter w;
  w.slot = slot;
  w.what = what;
  w.object = this;
  w.prepare();
  if (tail_) tail_->next = &w;
  else head_ = &w;
  tail_ = &w;
  lock.unlock();
  if (after_unlock) after_unlock(arg);
  w.block();
}

Waiter* WaitQueue::pop() noexcept {
  Waiter* w = head_;
  if (w) {
    head_ = w->next;
    if (!head_) tail_ = nullptr;
    w->next = nullptr;
  }
  return w;
}

Waiter* WaitQueue::pop_all() noexcept {
  Waiter* w = head_;
  head_ = tail_ = nullptr;
  return w;
}

void* WaitQueue::slot(const Waiter* w) noexcept { return w->slot; }

void WaitQueue::wake(Waiter* w) noexcept { w->notify(); }

void WaitQueue::wake_all(Waiter* chain) noexcept {
  while (chain) {
    Waiter* next = chain->next; // read before notify: the waiter's frame may go at once
    chain->notify();
    chain = next;
  }
}

} // namespace coresched::detail
