// SPDX-License-Identifier: Apache-2.0
// The scheduler's clock. Reading it costs ~28 ns here (vDSO steady_clock), so
// the hot paths (yield, preempt_point, single-cookie picks) never call it; it is
// read only when a core changes cookie, chooses between cookies, a cookie
// arrives beside another, or the core idles.
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>

namespace coresched::detail {

/// A clock in nanoseconds. The core coordinator reads its clock through one
/// (CoreConfig::clock), so a simulation can drive it with simulated time.
using ClockFn = std::uint64_t (*)() noexcept;

inline std::uint64_t now_ns() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

/// The same clock (CLOCK_MONOTONIC's epoch) as of the kernel's last tick: it
/// lags now_ns() by at most a jiffy (1-10 ms) and costs a tenth as much. For
/// times that only reports show, such as when a fiber parked: read on every
/// park, the precise clock was 15 % of a channel round trip.
inline std::uint64_t coarse_now_ns() noexcept {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

} // namespace coresched::detail
