// SPDX-License-Identifier: Apache-2.0
// The scheduler's clock. Reading it costs ~28 ns here (vDSO steady_clock), so
// the hot paths (yield, preempt_point, single-cookie picks) never call it; it is
// read only when a core changes cookie, chooses between cookies, a cookie
// arrives beside another, or the core idles.
#pragma once

#include <chrono>
#include <cstdint>

namespace coresched::detail {

/// A clock in nanoseconds. The core coordinator reads its clock through one
/// (CoreConfig::clock), so a simulation can drive it with simulated time.
using ClockFn = std::uint64_t (*)() noexcept;

inline std::uint64_t now_ns() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

} // namespace coresched::detail
