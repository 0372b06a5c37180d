// SPDX-License-Identifier: Apache-2.0
// A Waiter: one suspended fiber or one blocked plain thread, queued on a sync
// primitive (an intrusive node that lives in the waiting frame). Every
// primitive in sync.hpp is a few words of state, a SyncLock and WaitQueues of
// these, and waits in the same three steps:
//
//   lock; ...; w.prepare(); queue w; unlock;   w.block();    // the waiter
//   lock; ...; take w off the queue; unlock;   w.notify();   // the waker
//
// prepare() runs under the lock: a fiber announces `parking` there, so a
// notify() that comes before it has switched out is remembered (the runtime's
// park protocol, see wake_fiber). A thread waits on a futex over `woken`.
// A parked fiber is resumed only by wake_fiber, which only notify() calls for
// it, so block() needs no loop for fibers; threads loop over spurious futex
// returns.
#pragma once

#include "fiber/fiber.hpp"
#include "platform/futex.hpp"
#include "sched/worker.hpp"

#include <coresched/sync.hpp>

#include <atomic>
#include <cassert>
#include <cstdint>

namespace coresched::detail {

struct SelectGroup;

struct Waiter {
  Waiter* next = nullptr;  // queue link (guarded by the primitive's lock)
  Fiber* fiber = nullptr;  // the parked fiber, or null for a plain thread
  void* slot = nullptr;    // the primitive's payload (e.g. a Channel item)
  const char* what = nullptr;   // the primitive's name and address, for the fiber dump
  const void* object = nullptr;
  std::atomic<std::uint32_t> woken{0}; // 0 waiting, 1 notified, 2 a thread sleeps on it
  WaitOutcome outcome = WaitOutcome::notified; // set under the primitive's lock by whoever dequeues it
  // A select's case (select.cpp): whoever dequeues it must first claim the
  // select for this case (WaitQueue::pop), and wakes the select's own waiter.
  SelectGroup* group = nullptr;
  int case_index = 0;

  /// Under the primitive's lock, before the waiter becomes visible.
  void prepare() noexcept {
    Worker* w = Worker::current();
    if (w && w->in_task()) {
      fiber = w->running();
      fiber->state.store(FiberState::parking, std::memory_order_release);
    }
  }

  /// After every lock is released: suspends until notify(). The fiber may
  /// resume on another worker, so nothing worker-related is cached here.
  void block() noexcept {
    if (fiber) {
      Worker::current()->park({.kind = WaitKind::sync, .what = what, .object = object});
      assert(woken.load(std::memory_order_acquire) == 1);
      return;
    }
    std::uint32_t s = 0;
    if (woken.compare_exchange_strong(s, 2, std::memory_order_acquire)) s = 2;
    while (s != 1) {
      futex_wait(woken, 2);
      s = woken.load(std::memory_order_acquire);
    }
  }

  /// Threads only: as block(), until `deadline_ns` (CLOCK_MONOTONIC); false
  /// if it passed first (the waiter may still be queued, or being notified).
  bool block_until(std::uint64_t deadline_ns) noexcept {
    std::uint32_t s = 0;
    if (woken.compare_exchange_strong(s, 2, std::memory_order_acquire)) s = 2;
    while (s != 1) {
      if (!futex_wait_until(woken, 2, deadline_ns)) return woken.load(std::memory_order_acquire) == 1;
      s = woken.load(std::memory_order_acquire);
    }
    return true;
  }

  /// After the waker took it off the queue and released the lock. The
  /// waiter's frame may be gone as soon as `woken` is 1, so `fiber` is read
  /// first. (futex_wake on a vanished thread frame at most wakes some other
  /// futex waiter of that address spuriously; every futex user here loops.)
  void notify() noexcept;
};

/// One select in progress: a Waiter per case sits in that case's queue, and
/// the first to claim the select (a waker that dequeues a case, the
/// deadline, a stop request) decides which case happened and wakes
/// `primary`, on which the selecting fiber or thread blocks. A claim that
/// fails leaves the case as if never queued, so a losing send case's value
/// never moves.
struct SelectGroup {
  static constexpr int kOpen = -1000;
  std::atomic<int> chosen{kOpen};
  Waiter primary;
  bool claim(int outcome) noexcept {
    int open = kOpen;
    return chosen.compare_exchange_strong(open, outcome, std::memory_order_acq_rel);
  }
};

inline void Waiter::notify() noexcept {
  if (group) return group->primary.notify(); // claimed: the select's frame lives until this
  if (Fiber* f = fiber) {
    woken.store(1, std::memory_order_release);
    wake_fiber(f);
    return;
  }
  if (woken.exchange(1, std::memory_order_release) == 2) futex_wake(woken, 1);
}

} // namespace coresched::detail
