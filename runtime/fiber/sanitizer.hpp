// SPDX-License-Identifier: Apache-2.0
// Tells AddressSanitizer and ThreadSanitizer about fiber switches. Without it
// ASan sees the stack pointer jump between stacks and reports false
// overflows, and TSan mixes up the happens-before of different fibers.
// Compiles to nothing in normal builds (and Fiber::san is then empty).
#pragma once

#include "fiber/fiber.hpp"

#include <utility>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define CORESCHED_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define CORESCHED_TSAN 1
#endif

namespace coresched::detail::san {

/// A thread's own stack becomes the context of its idle fiber.
inline void adopt_thread(Fiber& idle) noexcept {
#ifdef CORESCHED_TSAN
  idle.san.tsan_fiber = __tsan_get_current_fiber();
#endif
  (void)idle;
}

/// A fiber gets the stack it will run on (its own).
inline void assign_stack(Fiber& f, const void* bottom, std::size_t size) noexcept {
#if defined(CORESCHED_ASAN) || defined(CORESCHED_TSAN)
  f.san.stack_bottom = bottom;
  f.san.stack_size = size;
#endif
#ifdef CORESCHED_TSAN
  if (!f.san.tsan_fiber) f.san.tsan_fiber = __tsan_create_fiber(0);
#endif
  (void)f, (void)bottom, (void)size;
}

/// `to` takes over the stack of `from`, which has finished on it.
inline void hand_over_stack(Fiber& from, Fiber& to) noexcept {
#if defined(CORESCHED_ASAN) || defined(CORESCHED_TSAN)
  to.san.stack_bottom = from.san.stack_bottom;
  to.san.stack_size = from.san.stack_size;
  to.san.tsan_fiber = std::exchange(from.san.tsan_fiber, nullptr); // same stack, same sanitizer fiber
#endif
  (void)from, (void)to;
}

/// `child` runs inline on `parent`'s stack, which it does not own.
inline void borrow_stack(const Fiber& parent, Fiber& child) noexcept {
#if defined(CORESCHED_ASAN) || defined(CORESCHED_TSAN)
  child.san.stack_bottom = parent.san.stack_bottom;
  child.san.stack_size = parent.san.stack_size;
  child.san.tsan_fiber = parent.san.tsan_fiber;
  child.san.owns_tsan_fiber = false;
#endif
  (void)parent, (void)child;
}

/// Called on `from` just before jumping to `to`. `from_ends`: `from` never resumes.
inline void before_switch(Fiber& from, Fiber& to, bool from_ends) noexcept {
#ifdef CORESCHED_ASAN
  __sanitizer_start_switch_fiber(from_ends ? nullptr : &from.san.asan_fake_stack, to.san.stack_bottom,
                                 to.san.stack_size);
#endif
#ifdef CORESCHED_TSAN
  __tsan_switch_to_fiber(to.san.tsan_fiber, 0);
#endif
  (void)from, (void)to, (void)from_ends;
}

/// Called on `self` right after it was switched to; learns the bounds of the
/// stack it came from (the thread's own stack the first time).
inline void after_switch(Fiber& self, Fiber& from) noexcept {
#ifdef CORESCHED_ASAN
  const void* bottom = nullptr;
  std::size_t size = 0;
  __sanitizer_finish_switch_fiber(self.san.asan_fake_stack, &bottom, &size);
  if (!from.san.stack_bottom) {
    from.san.stack_bottom = bottom;
    from.san.stack_size = size;
  }
#endif
  (void)self, (void)from;
}

/// A finished fiber's context is gone.
inline void retire(Fiber& f) noexcept {
#ifdef CORESCHED_TSAN
  if (f.san.tsan_fiber && f.san.owns_tsan_fiber) __tsan_destroy_fiber(f.san.tsan_fiber);
  f.san.tsan_fiber = nullptr;
#endif
  (void)f;
}

} // namespace coresched::detail::san
