// SPDX-License-Identifier: Apache-2.0
// WaitGroup and Latch: a count that releases its waiters at zero.
//
// The step to zero is taken under the lock, together with taking the waiters;
// a waiter checks the count under the same lock before queueing, so it either
// sees zero or is queued before the step. Steps that do not reach zero take
// no lock. Because the step to zero holds the lock, a waiter that saw zero
// without the lock may destroy the object once the lock is free (see the
// destructors' wait_idle()).
#include "sync/waiter.hpp"

#include <coresched/sync.hpp>

namespace coresched {

namespace {
// `c + delta`, or throws (`error` if negative; a count past the type's range
// is refused too: the sum overflowed, and read as negative).
template <class C> C checked_sum(C c, C delta, const char* error) {
  C sum;
  if (__builtin_add_overflow(c, delta, &sum)) throw UsageError("coresched: count would overflow");
  if (sum < 0) throw UsageError(error);
  return sum;
}

// Adds `delta` to `count`; throws (leaving the count alone) if it would go
// negative (`error`) or overflow.
template <class C> void step(std::atomic<C>& count, C delta, detail::SyncLock& lk, detail::WaitQueue& q,
                             const char* error) {
  C c = count.load(std::memory_order_relaxed);
  for (;;) {
    const C sum = checked_sum(c, delta, error);
    if (sum == 0) break;
    if (count.compare_exchange_weak(c, sum, std::memory_order_acq_rel, std::memory_order_relaxed)) return;
  }
  lk.lock();
  c = count.load(std::memory_order_relaxed);
  C sum;
  do {
    try {
      sum = checked_sum(c, delta, error);
    } catch (...) {
      lk.unlock();
      throw;
    }
  } while (!count.compare_exchange_weak(c, sum, std::memory_order_acq_rel, std::memory_order_relaxed));
  detail::Waiter* all = sum == 0 ? q.pop_all() : nullptr;
  lk.unlock();
  detail::WaitQueue::wake_all(all);
}

// Waits for zero until `deadline_ns` (kNever and no `st`: the plain wait);
// true at zero.
template <class C>
bool wait_for_zero(const std::atomic<C>& count, detail::SyncLock& lk, detail::WaitQueue& q, const char* what,
                   std::uint64_t deadline_ns = detail::kNever, const std::stop_token* st = nullptr) {
  if (count.load(std::memory_order_acquire) == 0) return true;
  lk.lock();
  if (count.load(std::memory_order_acquire) == 0) {
    lk.unlock();
    return true;
  }
  if (deadline_ns == detail::kNever && !st) {
    q.wait(lk, nullptr, nullptr, nullptr, what);
    return true;
  }
  return q.wait_until(lk, deadline_ns, st, nullptr, nullptr, nullptr, what) == detail::WaitOutcome::notified;
}
} // namespace

void WaitGroup::add(std::int64_t delta) {
  if (delta == 0) return;
  step<std::int64_t>(count_, delta, lk_, q_, "coresched: WaitGroup count would become negative (done() without add()?)");
}

void WaitGroup::wait() { wait_for_zero(count_, lk_, q_, "WaitGroup"); }

bool WaitGroup::wait_until_ns(std::uint64_t deadline_ns, const std::stop_token& st) {
  return wait_for_zero(count_, lk_, q_, "WaitGroup", deadline_ns, st.stop_possible() ? &st : nullptr);
}

Latch::Latch(std::ptrdiff_t expected) : count_(expected) {
  if (expected < 0) throw UsageError("coresched: a Latch cannot expect a negative count");
}

void Latch::count_down(std::ptrdiff_t n) {
  if (n < 0) throw UsageError("coresched: Latch::count_down with a negative count");
  if (n == 0) return;
  step<std::ptrdiff_t>(count_, -n, lk_, q_, "coresched: Latch::count_down below zero");
}

void Latch::wait() { wait_for_zero(count_, lk_, q_, "Latch"); }

bool Latch::wait_until_ns(std::uint64_t deadline_ns, const std::stop_token& st) {
  return wait_for_zero(count_, lk_, q_, "Latch", deadline_ns, st.stop_possible() ? &st : nullptr);
}

} // namespace coresched
