// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file blocking_call.hpp
/// coresched::blocking_call: run a call that blocks its thread (getaddrinfo,
/// a blocking client library, a read of a slow file) without stalling the
/// worker, and without breaking the isolation promise.

#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

namespace coresched {

/// Implementation details of blocking_call; not part of the API and may
/// change without notice.
namespace detail {
/// Runs `call(arg)` on a helper thread while the calling fiber waits, or in
/// place where the caller is not a fiber. `call` must not throw.
void run_blocking(void (*call)(void*) noexcept, void* arg);
} // namespace detail

/// Runs `fn()` on a helper thread and returns its result (or rethrows what it
/// threw) in the calling fiber, which waits meanwhile: the fiber's worker runs
/// its other fibers and timers as usual.
///
/// The call is user code of the fiber's cookie, so it runs under that cookie:
/// the helper thread is pinned to the fiber's core, and the core stays claimed
/// for the cookie until the call returns, as if a sibling ran it. Fibers of
/// the same cookie run beside it; fibers of other cookies on that core wait
/// for its end (or run on other cores), exactly as beside a fiber that never
/// yields. Keep such calls short on a core shared with other tenants.
///
/// A call starts within its cookie's turn on the core: if another cookie
/// leads there, the fiber first waits for its next turn (and may by then run
/// on another core, whose CPUs the call then gets), so tenants that make
/// calls back to back still share the core by their weights.
///
/// Inside `fn` the code runs on a plain thread: this_fiber and FiberLocal are
/// not available, a nested blocking_call just runs, and fibers it spawns
/// without a cookie get the call's. It must not wait for fibers of another
/// cookie that need its core (on a core of its own it would wait for ever).
/// The fiber sees `errno` as the call left it. Called from a plain thread,
/// blocking_call runs `fn` in place. Throws std::system_error, having run
/// nothing, if no thread can be started for the call.
template <class F>
std::invoke_result_t<F&> blocking_call(F&& fn) {
  using R = std::invoke_result_t<F&>;
  // A reference result is kept as a pointer (std::optional holds no reference).
  using Stored = std::conditional_t<std::is_reference_v<R>, std::remove_reference_t<R>*, R>;
  struct Frame {
    F& fn;
    std::conditional_t<std::is_void_v<R>, bool, std::optional<Stored>> result{};
    std::exception_ptr error;
  } frame{fn};
  detail::run_blocking(
      [](void* p) noexcept {
        auto& f = *static_cast<Frame*>(p);
        try {
          if constexpr (std::is_void_v<R>) {
            f.fn();
            f.result = true;
          } else if constexpr (std::is_reference_v<R>) {
            f.result.emplace(&f.fn());
          } else {
            f.result.emplace(f.fn());
          }
        } catch (...) {
          f.error = std::current_exception();
        }
      },
      &frame);
  if (frame.error) std::rethrow_exception(frame.error);
  if constexpr (std::is_reference_v<R>) return static_cast<R>(**frame.result);
  else if constexpr (!std::is_void_v<R>) return std::move(*frame.result);
}

} // namespace coresched
