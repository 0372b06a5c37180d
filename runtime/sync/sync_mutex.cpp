// SPDX-License-Identifier: Apache-2.0
// Mutex and ConditionVariable.
//
// Mutex: one atomic word for the uncontended path; under contention the lock
// is handed directly to the oldest waiter (it stays locked through the
// hand-off), so a waiter cannot be overtaken and never starves.
#include "sync/waiter.hpp"

#include <coresched/sync.hpp>

#include <immintrin.h>

namespace coresched {

namespace {
// Pauses spent polling a held mutex before queueing. A holder on another
// worker often releases within a few hundred nanoseconds; parking costs a
// switch and a wake-up. Measured on the 2-CPU VM, two fibers on two workers
// contending for one mutex (short critical sections): ~4.4 us per lock with no
// spin, ~0.5 us with 32-256 polls; no difference with 8 fibers queueing.
// The spin stops as soon as someone is queued (hand-off order).
constexpr int kSpinPolls = 64;
} // namespace

void Mutex::lock_slow() {
  for (int i = 0; i < kSpinPolls; ++i) {
    _mm_pause();
    std::uint32_t s = state_.load(std::memory_order_relaxed);
    if (s == 0 && state_.compare_exchange_weak(s, kLocked, std::memory_order_acquire)) return;
    if (s & kQueued) break; // others queue already: hand-off order, no barging
  }
  lk_.lock();
  std::uint32_t s = state_.load(std::memory_order_relaxed);
  for (;;) {
    if (!(s & kLocked)) { // released meanwhile (then nobody is queued either)
      if (state_.compare_exchange_weak(s, s | kLocked, std::memory_order_acquire, std::memory_order_relaxed)) {
        lk_.unlock();
        return;
      }
      continue;
    }
    if ((s & kQueued) ||
        state_.compare_exchange_weak(s, s | kQueued, std::memory_order_relaxed, std::memory_order_relaxed))
      break;
  }
  q_.wait(lk_, nullptr, nullptr, nullptr, "Mutex"); // returns owning the mutex: unlock_slow() handed it over
}

// As lock_slow(), queueing with a deadline and without the spin (a timed
// lock is a slow path). A waiter that times out leaves the queue; if it was
// the last one, kQueued goes too, so the holder's unlock takes the fast path
// again. (Only code under lk_ changes a word that has kQueued set.)
bool Mutex::lock_until(std::uint64_t deadline_ns) {
  lk_.lock();
  std::uint32_t s = state_.load(std::memory_order_relaxed);
  for (;;) {
    if (!(s & kLocked)) {
      if (state_.compare_exchange_weak(s, s | kLocked, std::memory_order_acquire, std::memory_order_relaxed)) {
        lk_.unlock();
        return true;
      }
      continue;
    }
    if ((s & kQueued) ||
        state_.compare_exchange_weak(s, s | kQueued, std::memory_order_relaxed, std::memory_order_relaxed))
      break;
  }
  if (q_.wait_until(lk_, deadline_ns, nullptr, nullptr, nullptr, nullptr, "Mutex") == detail::WaitOutcome::notified)
    return true; // unlock_slow() handed it over
  lk_.lock();
  if (q_.empty()) {
    std::uint32_t queued = kLocked | kQueued;
    state_.compare_exchange_strong(queued, kLocked, std::memory_order_relaxed);
  }
  lk_.unlock();
  return false;
}

void Mutex::unlock_slow() noexcept {
  lk_.lock();
  detail::Waiter* w = q_.pop();
  if (!w) state_.store(0, std::memory_order_release); // unlock of an unlocked mutex: stay sane
  else if (q_.empty()) state_.store(kLocked, std::memory_order_relaxed); // now held by `w`, nobody queued
  lk_.unlock();
  if (w) detail::WaitQueue::wake(w);
}

void ConditionVariable::wait(Mutex& m) {
  lk_.lock();
  // Queued before `m` is released, so a notify by whoever takes `m` next finds us.
  q_.wait(lk_, nullptr, [](void* mu) { static_cast<Mutex*>(mu)->unlock(); }, &m, "ConditionVariable");
  m.lock();
}

detail::WaitOutcome ConditionVariable::wait_until_ns(std::unique_lock<Mutex>& lk, std::uint64_t deadline_ns,
                                                    const std::stop_token& st) {
  if (!lk.owns_lock()) throw UsageError("coresched: ConditionVariable::wait on a unique_lock that is not locked");
  Mutex& m = *lk.mutex();
  lk_.lock();
  const auto outcome = q_.wait_until(lk_, deadline_ns, st.stop_possible() ? &st : nullptr, nullptr,
                                     [](void* mu) { static_cast<Mutex*>(mu)->unlock(); }, &m, "ConditionVariable");
  m.lock();
  return outcome;
}

void ConditionVariable::notify_one() noexcept {
  lk_.lock();
  detail::Waiter* w = q_.pop();
  lk_.unlock();
  if (w) detail::WaitQueue::wake(w);
}

void ConditionVariable::notify_all() noexcept {
  lk_.lock();
  detail::Waiter* all = q_.pop_all();
  lk_.unlock();
  detail::WaitQueue::wake_all(all);
}

} // namespace coresched
