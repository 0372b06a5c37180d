// SPDX-License-Identifier: Apache-2.0
// The C++ runtime's exception state, carried with each fiber.
//
// libstdc++ keeps the stack of caught exceptions (what std::current_exception()
// and `throw;` read) and the count of exceptions in flight (what
// std::uncaught_exceptions() reads) per thread, in __cxa_get_globals(). A fiber
// that suspends inside a catch block, or in a destructor during unwinding,
// and resumes later — possibly on another worker — must find its own state
// there, not that of whatever ran on the thread meanwhile. So every switch
// saves the thread's state into the fiber leaving and loads the one of the
// fiber arriving: two words each way.
//
// The layout is the Itanium C++ ABI's __cxa_eh_globals as libstdc++ and libc++abi
// define it on x86-64 and AArch64 (caughtExceptions, uncaughtExceptions); the
// ARM EH ABI adds a third field, which this build does not target. A test
// (test_fibers.cpp, "exception state follows the fiber") checks the layout
// against std::current_exception() and std::uncaught_exceptions().
#pragma once

#include <cxxabi.h>

namespace coresched::detail {

struct EhState {
  void* caught = nullptr;   // __cxa_exception* of the innermost handled exception
  unsigned uncaught = 0;    // exceptions thrown and not yet caught
};

#if defined(__arm__) && !defined(__aarch64__)
#error "coresched: the ARM EH ABI's __cxa_eh_globals has a third field; carry it in EhState first"
#endif

/// The calling thread's exception state (its address never changes for a thread).
inline EhState* thread_eh_state() noexcept { return reinterpret_cast<EhState*>(abi::__cxa_get_globals()); }

} // namespace coresched::detail
