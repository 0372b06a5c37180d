// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file sysbench_work.hpp
/// The two sysbench 1.0.20 events the matrix benchmark runs, header-only so a
/// unit test can link them without the benchmark program.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

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
/// sysbench rewrites one block; we advance block by block through a larger
/// buffer and wrap, so the stream can go past the caches when the buffer is big
/// (a buffer of one block reproduces sysbench exactly).
class MemoryBuffer {
public:
  /// block and buffer sizes in bytes; the buffer is rounded up to whole blocks.
  MemoryBuffer(std::size_t block_bytes, std::size_t buffer_bytes)
      : words_per_block_(block_bytes / sizeof(std::uint64_t)),
        blocks_((buffer_bytes + block_bytes - 1) / block_bytes),
        words_(new std::uint64_t[words_per_block_ * blocks_]()) {} // () zeroes: pages are faulted in now, not in a run

  std::size_t block_bytes() const noexcept { return words_per_block_ * sizeof(std::uint64_t); }
  std::size_t buffer_bytes() const noexcept { return block_bytes() * blocks_; }

private:
  friend class MemoryCursor;
  std::size_t words_per_block_;
  std::size_t blocks_;
  std::unique_ptr<std::uint64_t[]> words_;
};

/// One writer's position in a MemoryBuffer. event() is one sysbench `memory`
/// event: sequential 64-bit stores over the next block.
class MemoryCursor {
public:
  explicit MemoryCursor(MemoryBuffer& b) noexcept : buf_(b) {}

  void event() noexcept {
    // volatile: every store must happen, one 64-bit word at a time, as in
    // sysbench; without it the compiler may drop stores nobody reads.
    volatile std::uint64_t* p = buf_.words_.get() + block_ * buf_.words_per_block_;
    for (std::size_t i = 0; i < buf_.words_per_block_; ++i) p[i] = value_;
    if (++block_ == buf_.blocks_) block_ = 0;
    ++value_;
  }

private:
  MemoryBuffer& buf_;
  std::size_t block_ = 0;
  std::uint64_t value_ = 0;
};

} // namespace coresched::bench
