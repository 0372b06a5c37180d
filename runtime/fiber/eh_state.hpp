// SPDX-License-Identifier: Apache-2.0
// Per-thread state of the C and C++ runtimes that a fiber carries with it.
//
// libstdc++ keeps the stack of caught exceptions (what std::current_exception()
// and `throw;` read) and the count of exceptions in flight (what
// std::uncaught_exceptions() reads) per thread, in __cxa_get_globals(). A fiber
// that suspends inside a catch block, or in a destructor during unwinding,
// and resumes later — possibly on another worker — must find its own state
// there, not that of whatever ran on the thread meanwhile. So every switch
// saves the thread's state into the fiber leaving and loads the one of the
// fiber arriving. errno likewise, but saved where the suspension begins: the
// worker's own system calls on the way to the switch (io_uring_enter, eventfd
// writes) would otherwise overwrite the value the fiber had set, and another
// fiber's value would show through after it.
//
// The layout is the Itanium C++ ABI's __cxa_eh_globals as libstdc++ and libc++abi
// define it on x86-64 and AArch64 (caughtExceptions, uncaughtExceptions); the
// ARM EH ABI adds a third field, which this build does not target. A test
// (test_fibers.cpp, "exception state follows the fiber") checks the layout
// against std::current_exception() and std::uncaught_exceptions().
#pragma once

#include <cerrno>
#include <cxxabi.h>

namespace coresched::detail {

/// The Itanium ABI's per-thread exception globals (as libstdc++ lays them out).
struct EhGlobals {
  void* caught;       // __cxa_exception* of the innermost handled exception
  unsigned uncaught;  // exceptions thrown and not yet caught
};

/// What a switched-out fiber holds of that state (16 bytes).
struct CarriedState {
  void* caught = nullptr;
  unsigned uncaught = 0;
  int err = 0; // errno
};

/// Where a thread keeps that state; the addresses never change for a thread.
struct ThreadState {
  EhGlobals* eh = nullptr;
  int* err = nullptr;
  /// The calling thread's.
  static ThreadState of_this_thread() noexcept {
    return {reinterpret_cast<EhGlobals*>(abi::__cxa_get_globals()), &errno};
  }
  /// Into the fiber leaving: its last act before the jump. (errno was saved
  /// where its suspension began: Worker::save_errno.)
  void save(CarriedState& s) const noexcept {
    s.caught = eh->caught;
    s.uncaught = eh->uncaught;
  }
  /// Whether the thread is inside a catch block or unwinding.
  bool handling() const noexcept { return eh->caught != nullptr || eh->uncaught != 0; }
  /// From the fiber arriving: after the runtime's last system call on its way
  /// back to user code (a wake-up's eventfd write would overwrite errno).
  void load(const CarriedState& s) const noexcept {
    eh->caught = s.caught;
    eh->uncaught = s.uncaught;
    *err = s.err;
  }
};

#if defined(__arm__) && !defined(__aarch64__)
#error "coresched: the ARM EH ABI's __cxa_eh_globals has a third field; carry it in CarriedState first"
#endif


} // namespace coresched::detail
