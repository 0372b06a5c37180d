// SPDX-License-Identifier: Apache-2.0
// Semaphore: a count, and a queue of waiters that release() hands units to
// directly. The count is never positive while someone waits.
#include "sync/waiter.hpp"

#include <coresched/sync.hpp>

#include <cstdint>

namespace coresched {

Semaphore::Semaphore(std::ptrdiff_t initial) : count_(initial) {
  if (initial < 0) throw UsageError("coresched: a Semaphore cannot start with a negative count");
}

void Semaphore::acquire() {
  if (try_acquire()) return;
  lk_.lock();
  if (try_acquire()) { // a release() came in between
    lk_.unlock();
    return;
  }
  q_.wait(lk_, nullptr, nullptr, nullptr, "Semaphore"); // release() handed us a unit
}

bool Semaphore::acquire_until(std::uint64_t deadline_ns, const std::stop_token& st) {
  lk_.lock();
  if (try_acquire()) {
    lk_.unlock();
    return true;
  }
  // release() hands a unit to a waiter only by dequeuing it, so one that
  // times out has taken nothing.
  return q_.wait_until(lk_, deadline_ns, st.stop_possible() ? &st : nullptr, nullptr, nullptr, nullptr,
                       "Semaphore") == detail::WaitOutcome::notified;
}

void Semaphore::release(std::ptrdiff_t n) {
  if (n < 0) throw UsageError("coresched: Semaphore::release with a negative count");
  if (n == 0) return;
  lk_.lock();
  // Only a release (under this lock) adds to the count; a take lowers it.
  if (n > PTRDIFF_MAX - count_.load(std::memory_order_relaxed)) {
    lk_.unlock();
    throw UsageError("coresched: Semaphore::release would overflow the count");
  }
  detail::Waiter* first = nullptr;
  detail::Waiter* last = nullptr;
  while (n > 0) {
    detail::Waiter* w = q_.pop();
    if (!w) break;
    if (last) last->next = w;
    else first = w;
    last = w;
    --n;
  }
  if (n > 0) count_.fetch_add(n, std::memory_order_release);
  lk_.unlock();
  detail::WaitQueue::wake_all(first);
}

} // namespace coresched
