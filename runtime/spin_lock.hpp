// SPDX-License-Identifier: Apache-2.0
// A test-and-test-and-set spin lock. Critical sections in the scheduler are a
// few dozen instructions, so a futex-based mutex would cost more than it saves.
#pragma once

#include <atomic>
#include <immintrin.h>

namespace coresched::detail {

class SpinLock {
public:
  void lock() noexcept {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      while (flag_.load(std::memory_order_relaxed)) _mm_pause();
    }
  }
  bool try_lock() noexcept {
    return !flag_.load(std::memory_order_relaxed) && !flag_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }

private:
  std::atomic<bool> flag_{false};
};

} // namespace coresched::detail
