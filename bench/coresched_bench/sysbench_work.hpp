// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file sysbench_work.hpp
/// The two sysbench 1.0.20 events the matrix benchmark runs, header-only so a
/// unit test can link them without the benchmark program.

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <time.h>

namespace coresched::bench {

/// One sysbench `cpu` event: counts the primes in [3, max_prime) by trial
/// division, with sysbench's exact loop and 64-bit unsigned types, so our events
/// per second compare with its figure. Returns 1228 for max_prime 10000.
inline std::uint64_t cpu_event(std::uint64_t max_prime) noexcept {
  std::uint64_t n = 0;
  for (std::uint64_t c = 3; c < max_prime; ++c) {
    const auto t = static_cast<std::uint64_t>(std::sqrt(static_cast<double>(c)));
    std::uint64_t l = 2;
    for (; l <= t; ++l)
      if (c % l == 0) break;
    if (l > t) ++n;
  }
  return n;
}

/// The buffer of sysbench's `memory` test (scope global, write, sequential).
/// sysbench rewrites one block (the matrix's default: buffer = block); we can
/// also advance block by block through a larger buffer and wrap, so the stream
/// can go past the caches when the buffer is big.
class MemoryBuffer {
public:
  /// block and buffer sizes in bytes; the block is rounded down to whole
  /// 8-byte words, the buffer up to whole blocks.
  MemoryBuffer(std::size_t block_bytes, std::size_t buffer_bytes)
      : words_per_block_(block_bytes / sizeof(std::uint64_t)),
        blocks_((buffer_bytes + block_bytes - 1) / block_bytes),
        words_(new std::uint64_t[words_per_block_ * blocks_]()) {} // () zeroes: pages are faulted in now, not in a run

  std::size_t block_bytes() const noexcept { return words_per_block_ * sizeof(std::uint64_t); }
  std::size_t buffer_bytes() const noexcept { return block_bytes() * blocks_; }
  /// Word `i` of the buffer (for tests).
  std::uint64_t word(std::size_t i) const noexcept { return words_[i]; }

private:
  friend class MemoryCursor;
  std::size_t words_per_block_;
  std::size_t blocks_;
  std::unique_ptr<std::uint64_t[]> words_;
};

/// One writer's position in a MemoryBuffer. event() is one sysbench `memory`
/// event as sysbench 1.0.20 writes it (sb_memory.c, event_seq_write): one
/// `size_t` store per 8 bytes of the block, storing the number of words from
/// there to the block's end, so 128 plain 64-bit stores per KiB and no load.
/// (Read from Debian's /usr/bin/sysbench itself: `objdump -d` shows the loop,
/// unrolled eight times, storing `(end - p) >> 3`; callgrind counts 704
/// instructions per 1 KiB event.)
class MemoryCursor {
public:
  explicit MemoryCursor(MemoryBuffer& b) noexcept : buf_(b) {}

  void event() noexcept {
    // volatile stores: every one happens, one 64-bit word at a time, as in
    // sysbench's binary (the compiler may neither drop, merge nor vectorise
    // them, nor turn the loop into memset). Nothing is loaded.
    const std::size_t n = buf_.words_per_block_;
    volatile std::uint64_t* p = buf_.words_.get() + block_ * n;
    for (std::size_t i = 0; i < n; ++i) p[i] = n - i;
    if (++block_ == buf_.blocks_) block_ = 0;
  }

private:
  MemoryBuffer& buf_;
  std::size_t block_ = 0;
};

/// What sysbench 1.0.20 does around every event besides the event itself
/// (sysbench.c thread_run: sb_more_events reads the clock for the time limit,
/// sb_event_start and sb_event_stop read it twice more for the event's latency,
/// sb_histogram_update adds the latency to a histogram: a random slot, a log()
/// and an atomic increment; sb_memory.c memory_next_event counts down the
/// thread's own events, no lock). callgrind on Debian's sysbench 1.0.20 counts
/// 271 instructions of it per event beside the 704 of a 1 KiB write: our MiB/s
/// compare with sysbench's only when our loop pays it too; beside a cpu event
/// (about a millisecond) it is lost in the noise.
class SysbenchBookkeeping {
public:
  /// Runs `event` with sysbench's per-event work around it.
  template <class Event>
  auto around(Event&& event) {
    (void)now_ns();                  // sb_more_events: the time limit
    ops_ = ops_ + 1;                 // memory_next_event: the thread's own count (a thread-local in sysbench)
    const std::uint64_t start = now_ns();          // sb_event_start
    auto result = event();
    const std::uint64_t stop = now_ns();           // sb_event_stop
    histogram_update(static_cast<double>(stop - start) / 1e6);
    return result;
  }

private:
  static std::uint64_t now_ns() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u + static_cast<std::uint64_t>(ts.tv_nsec);
  }
  // sb_histogram_update with sysbench's latency histogram (1024 buckets over 0.001 ms .. 100 s, log scale) and
  // its 128 slots picked at random per update (xorshift here; sysbench's own generator is of the same cost class).
  void histogram_update(double ms) noexcept {
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    const std::size_t slot = rng_ % kSlots;
    const double deduct = std::log(0.001), mult = (kBuckets - 1) / (std::log(1e5) - deduct);
    long i = static_cast<long>(std::floor((std::log(ms) - deduct) * mult + 0.5));
    if (i < 0) i = 0;
    else if (i >= static_cast<long>(kBuckets)) i = kBuckets - 1;
    slots_[slot * kBuckets + static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed);
  }
  static constexpr std::size_t kSlots = 128, kBuckets = 1024;
  volatile std::uint64_t ops_ = 0;
  std::uint64_t rng_ = 0x9e3779b97f4a7c15ull;
  std::unique_ptr<std::atomic<std::uint64_t>[]> slots_{new std::atomic<std::uint64_t>[kSlots * kBuckets]()};
};

} // namespace coresched::bench
