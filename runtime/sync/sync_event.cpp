// SPDX-License-Identifier: Apache-2.0
// Event: a manual-reset flag with a queue of waiters.
#include "sync/waiter.hpp"

#include <coresched/sync.hpp>

namespace coresched {

void Event::set() noexcept {
  lk_.lock();
  set_.store(true, std::memory_order_release);
  detail::Waiter* all = q_.pop_all();
  lk_.unlock();
  detail::WaitQueue::wake_all(all);
}

void Event::reset() noexcept {
  lk_.lock();
  set_.store(false, std::memory_order_relaxed);
  lk_.unlock();
}

void Event::wait() {
  if (set_.load(std::memory_order_acquire)) return;
  lk_.lock();
  if (set_.load(std::memory_order_relaxed)) {
    lk_.unlock();
    return;
  }
  q_.wait(lk_, nullptr, nullptr, nullptr, "Event"); // set() released us; a reset() since then does not matter
}

bool Event::wait_until_ns(std::uint64_t deadline_ns, const std::stop_token& st) {
  if (set_.load(std::memory_order_acquire)) return true;
  lk_.lock();
  if (set_.load(std::memory_order_relaxed)) {
    lk_.unlock();
    return true;
  }
  return q_.wait_until(lk_, deadline_ns, st.stop_possible() ? &st : nullptr, nullptr, nullptr, nullptr, "Event") ==
         detail::WaitOutcome::notified;
}

} // namespace coresched
