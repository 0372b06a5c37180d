// SPDX-License-Identifier: Apache-2.0
// A bounded ring of fibers that one thread (the owner) adds to without a lock
// and any thread takes from with one compare-and-swap, as Go's per-P run queue
// (runtime/proc.go: runqput, runqgrab). A single-PU core's worker puts the
// unpinned fibers it spawns here (in a runtime of more than one worker): an
// idle worker, a thief, takes half of them at a time, and the spawner never
// waits for the core lock the thief would otherwise hold while it steals
// (with 1M spawns, 85 % of the spawner's enqueue time would be the spin on
// that lock).
//
// Why a fiber here is never lost or run twice: `tail_` moves only by the
// owner, after the slot is written (release), and `head_` only by a CAS that
// claims slots [head, head + n) for whoever wins it. A taker copies the slots
// before its CAS; if the owner overwrote one meanwhile, the head must have
// moved past it first, so that CAS fails and the copy is dropped. The owner
// overwrites a slot only after reading a head past it (acquire), which orders
// the winner's copy before the overwrite. Counters are 32-bit and compared by
// difference; a taker would have to sleep through 2^32 additions between its
// read and its CAS to be fooled.
//
// The ring holds fibers; what runs them is decided elsewhere. Whoever takes
// fibers out queues them on a core under that core's lock (the owner at its
// next pick, a thief on its own core), so every fiber still reaches the core's
// pick, the one place isolation is enforced.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace coresched::detail {

struct Fiber;

class SpawnRing {
public:
  static constexpr std::uint32_t kCapacity = 256;

  /// Owner only. False when full (the caller queues the fiber elsewhere).
  bool push(Fiber* f) noexcept {
    const std::uint32_t t = tail_.load(std::memory_order_relaxed);
    if (t - head_.load(std::memory_order_acquire) >= kCapacity) return false;
    slots_[t % kCapacity].store(f, std::memory_order_relaxed);
    tail_.store(t + 1, std::memory_order_release);
    return true;
  }

  /// Any thread: takes up to `max` of the oldest fibers into `out` (half of
  /// those present, rounded up, if `half`). Returns how many.
  unsigned take(Fiber** out, unsigned max, bool half) noexcept {
    std::uint32_t h = head_.load(std::memory_order_acquire);
    for (;;) {
      const std::uint32_t t = tail_.load(std::memory_order_acquire);
      std::uint32_t n = t - h;
      if (n > kCapacity) { // read `h` and `t` at different times: read again
        h = head_.load(std::memory_order_acquire);
        continue;
      }
      if (half) n -= n / 2;
      if (n > max) n = max;
      if (n == 0) return 0;
      for (std::uint32_t i = 0; i < n; ++i) out[i] = slots_[(h + i) % kCapacity].load(std::memory_order_relaxed);
      if (head_.compare_exchange_weak(h, h + n, std::memory_order_acq_rel, std::memory_order_acquire)) return n;
    }
  }

  /// Any thread: takes the oldest fiber if it is `f` (compared by address
  /// only: the caller checks what it got). Returns whether it took it.
  bool take_if_oldest(const Fiber* f) noexcept {
    std::uint32_t h = head_.load(std::memory_order_acquire);
    if (tail_.load(std::memory_order_acquire) - h - 1 >= kCapacity) return false; // empty (or a torn read)
    if (slots_[h % kCapacity].load(std::memory_order_relaxed) != f) return false;
    return head_.compare_exchange_strong(h, h + 1, std::memory_order_acq_rel, std::memory_order_relaxed);
  }

  /// A hint: a taker may empty the ring just after this read it as not empty.
  bool empty() const noexcept {
    return head_.load(std::memory_order_acquire) == tail_.load(std::memory_order_acquire);
  }

private:
  // Takers write `head_`, the owner writes `tail_`: separate lines.
  alignas(64) std::atomic<std::uint32_t> head_{0};
  alignas(64) std::atomic<std::uint32_t> tail_{0};
  std::array<std::atomic<Fiber*>, kCapacity> slots_{};
};

} // namespace coresched::detail
