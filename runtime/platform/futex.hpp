// SPDX-License-Identifier: Apache-2.0
// Raw futex wait/wake on a 32-bit atomic. std::atomic::notify_* in libstdc++ 12
// hashes addresses into 16 shared waiter counters by bits 2-5, so every
// 64-byte-aligned fiber lands in one bucket and any waiter there turns every
// notify into a syscall. The scheduler knows exactly when someone sleeps, so
// it calls the kernel only then.
#pragma once

#include <atomic>
#include <cerrno>
#include <ctime>
#include <cstdint>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace coresched::detail {

/// Blocks while *word == expected (spurious returns possible: re-check).
inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

/// As futex_wait, until the absolute CLOCK_MONOTONIC time `deadline_ns`;
/// false once it has passed.
inline bool futex_wait_until(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::uint64_t deadline_ns) noexcept {
  const timespec ts{static_cast<time_t>(deadline_ns / 1000000000), static_cast<long>(deadline_ns % 1000000000)};
  const long r = syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_BITSET_PRIVATE, expected, &ts,
                         nullptr, FUTEX_BITSET_MATCH_ANY);
  return !(r == -1 && errno == ETIMEDOUT);
}

/// Wakes up to `n` threads blocked on `word`.
inline void futex_wake(std::atomic<std::uint32_t>& word, int n) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, n, nullptr, nullptr, 0);
}

} // namespace coresched::detail
