// SPDX-License-Identifier: Apache-2.0
// Raw futex wait/wake on a 32-bit atomic. std::atomic::notify_* in libstdc++ 12
// hashes addresses into 16 shared waiter counters by bits 2-5, so every
// 64-byte-aligned fiber lands in one bucket and any waiter there turns every
// notify into a syscall. The scheduler knows exactly when someone sleeps, so
// it calls the kernel only then.
#pragma once

#include <atomic>
#include <cstdint>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace coresched::detail {

/// Blocks while *word == expected (spurious returns possible: re-check).
inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

/// Wakes up to `n` threads blocked on `word`.
inline void futex_wake(std::atomic<std::uint32_t>& word, int n) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, n, nullptr, nullptr, 0);
}

} // namespace coresched::detail
