// SPDX-License-Identifier: Apache-2.0
// A shared bitmask of idle workers, one per LLC (seed 001): a waker finds an
// idle worker by reading a few words instead of visiting every worker.
// Bits are hints: the worker's core lock is what decides.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <memory>

namespace coresched::detail {

class IdleMask {
public:
  explicit IdleMask(unsigned bits) : nwords_((bits + 63) / 64), words_(new std::atomic<std::uint64_t>[nwords_]) {
    for (unsigned i = 0; i < nwords_; ++i) words_[i].store(0, std::memory_order_relaxed);
  }
  void set(unsigned bit) noexcept {
    words_[bit / 64].fetch_or(std::uint64_t{1} << (bit % 64), std::memory_order_release);
  }
  void clear(unsigned bit) noexcept {
    words_[bit / 64].fetch_and(~(std::uint64_t{1} << (bit % 64)), std::memory_order_release);
  }
  bool test(unsigned bit) const noexcept {
    return words_[bit / 64].load(std::memory_order_acquire) >> (bit % 64) & 1;
  }
  /// Calls f(bit) for each set bit until f returns true; returns that bit or -1.
  template <class F> int find(F&& f) const {
    for (unsigned w = 0; w < nwords_; ++w) {
      // seq_cst (a plain load on x86, as acquire): a spawner's wake_helper
      // relies on it (see LockedFlag in core_coordinator.hpp).
      for (std::uint64_t m = words_[w].load(std::memory_order_seq_cst); m; m &= m - 1) {
        const unsigned bit = w * 64 + static_cast<unsigned>(std::countr_zero(m));
        if (f(bit)) return static_cast<int>(bit);
      }
    }
    return -1;
  }
  /// Like find(), but starts at bit `start` and wraps around (as the kernel's
  /// for_each_cpu_wrap), so wake-ups spread instead of piling on low bits.
  template <class F> int find_from(unsigned start, F&& f) const {
    const unsigned w0 = start / 64;
    const std::uint64_t high = ~std::uint64_t{0} << (start % 64); // bits >= start in the first word
    for (unsigned i = 0; i <= nwords_; ++i) {
      const unsigned w = (w0 + i) % nwords_;
      std::uint64_t m = words_[w].load(std::memory_order_acquire);
      if (i == 0) m &= high;
      else if (i == nwords_) m &= ~high; // back at the first word: the bits below start
      for (; m; m &= m - 1) {
        const unsigned bit = w * 64 + static_cast<unsigned>(std::countr_zero(m));
        if (f(bit)) return static_cast<int>(bit);
      }
    }
    return -1;
  }
  bool any() const noexcept {
    for (unsigned w = 0; w < nwords_; ++w)
      if (words_[w].load(std::memory_order_relaxed)) return true;
    return false;
  }

private:
  unsigned nwords_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> words_;
};

} // namespace coresched::detail
