// SPDX-License-Identifier: Apache-2.0
#include "platform/deadline_timer.hpp"

#include "platform/clock.hpp"

#include <chrono>
#include <immintrin.h>
#include <sched.h>
#include <sys/prctl.h>

namespace coresched::detail {

DeadlineTimer::DeadlineTimer() : thread_([this] { run(); }) {}

DeadlineTimer::~DeadlineTimer() {
  {
    std::lock_guard lk(mu_);
    exit_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void DeadlineTimer::arm(Deadline* d) noexcept {
  std::lock_guard lk(mu_);
  heap_.push(d);
  // Wake the thread only when its sleep would end too late.
  if (heap_.top() == d || expire_all_) cv_.notify_one();
}

void DeadlineTimer::disarm(Deadline* d) noexcept {
  {
    std::lock_guard lk(mu_);
    if (heap_.contains(d)) {
      heap_.remove(d);
      return;
    }
  }
  // Popped for firing: fire() may still be taking the waiter off its queue
  // (a few dozen instructions), and reads `d` until it clears `firing`.
  for (int spins = 0; d->firing.load(std::memory_order_acquire); ++spins) {
    if (spins < 1024) _mm_pause();
    else sched_yield();
  }
}

void DeadlineTimer::expire_all() {
  {
    std::lock_guard lk(mu_);
    expire_all_ = true;
  }
  cv_.notify_one();
}

void DeadlineTimer::run() {
  // Deadlines are kept to the nanosecond the kernel allows: the default 50 us
  // of timer slack would make every timed wait that long late.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  std::unique_lock lk(mu_); // (the constructor may still be running: every member but thread_ is built)
  while (!exit_) {
    if (heap_.empty()) {
      cv_.wait(lk);
      continue;
    }
    Deadline* d = heap_.top();
    const std::uint64_t now = now_ns();
    if (!expire_all_ && d->at_ns > now) {
      cv_.wait_until(lk, std::chrono::steady_clock::time_point(std::chrono::nanoseconds(d->at_ns)));
      continue;
    }
    heap_.remove(d);
    d->firing.store(true, std::memory_order_relaxed); // before the unlock: disarm() sees it or the heap slot
    lk.unlock();
    d->fire(d);
    d->firing.store(false, std::memory_order_release); // the last touch of `d`
    lk.lock();
  }
}

} // namespace coresched::detail
