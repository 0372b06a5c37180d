// SPDX-License-Identifier: Apache-2.0
// A test-and-test-and-set spin lock. Critical sections in the scheduler are a
// few dozen instructions, so a futex-based mutex would cost more than it saves.
// A waiter that has spun far longer than any critical section takes yields
// the CPU: the holder has been descheduled (by the hypervisor, or by the
// kernel when two synthetic siblings share one real CPU) and spinning on
// would only delay it.
#pragma once

#include <atomic>
#include <immintrin.h>
#include <sched.h>

namespace coresched::detail {

class SpinLock {
public:
  void lock() noexcept {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      for (int spins = 0; flag_.load(std::memory_order_relaxed); ++spins) {
        _mm_pause();
        if (spins == kSpinsBeforeYield) {
          sched_yield();
          spins = 0;
        }
      }
    }
  }
  bool try_lock() noexcept {
    return !flag_.load(std::memory_order_relaxed) && !flag_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }
  /// Held by some thread (for CORESCHED_INVARIANT: a caller that needs the
  /// lock and forgot it finds it free, unless another thread holds it).
  bool is_locked() const noexcept { return flag_.load(std::memory_order_relaxed); }

private:
  static constexpr int kSpinsBeforeYield = 1024;
  std::atomic<bool> flag_{false};
};

} // namespace coresched::detail
