// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file this_fiber.hpp
/// Calls a fiber makes about itself, after std::this_thread.

#include <coresched/cookie.hpp>

#include <chrono>
#include <stop_token>
#include <cstdint>

namespace coresched {

/// Where a fiber is running right now.
struct Location {
  unsigned worker; ///< Worker index (== PU index in the topology).
  unsigned core;   ///< Physical core index.
  unsigned llc;    ///< Last-level-cache index.
  unsigned cpu;    ///< Real CPU the worker is pinned to.
};

namespace this_fiber {

/// True when called on a fiber of some Runtime; false on any other thread.
bool in_fiber() noexcept;

/// Lets other runnable fibers run; returns at once if there are none.
/// @throws UsageError on a plain thread.
void yield();

/// A cooperative preemption point: yields only when this fiber's slice has
/// expired or a sibling PU waits for a cookie change. When nothing is due it
/// costs a function call and one flag read. On a plain thread it does nothing.
void preempt_point() noexcept;

/// Suspends the fiber (not its worker) for at least `d`. On a plain thread it
/// sleeps the thread. Returns early only when the runtime shuts down.
void sleep_for(std::chrono::nanoseconds d);

/// Suspends the fiber (not its worker) until `t` (steady clock). On a plain
/// thread it sleeps the thread. Returns early only when the runtime shuts down.
void sleep_until(std::chrono::steady_clock::time_point t);

/// As sleep_for(d), ending early when `st` is stopped: false then (true when
/// the whole time passed, or the runtime shut down). Fibers and plain threads.
bool sleep_for(std::chrono::nanoseconds d, std::stop_token st);

/// As sleep_until(t), ending early when `st` is stopped: false then.
bool sleep_until(std::chrono::steady_clock::time_point t, std::stop_token st);

/// The calling fiber's id (unique in the process, never 0); 0 on a plain thread.
std::uint64_t id() noexcept;

/// The calling fiber's cookie (untagged on a plain thread).
Cookie cookie() noexcept;

/// Changes the calling fiber's cookie. Takes effect at once when no sibling PU
/// runs another cookie; otherwise the fiber yields at once and resumes only
/// where the new cookie is allowed.
/// @throws UsageError on a plain thread.
void set_cookie(Cookie c);

/// Where the calling fiber runs now (it may move at any scheduling point).
/// @throws UsageError on a plain thread.
Location location();

} // namespace this_fiber
} // namespace coresched
