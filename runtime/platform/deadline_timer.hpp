// SPDX-License-Identifier: Apache-2.0
// The deadlines of a runtime's timed waits (Mutex::try_lock_for, Event::
// wait_for, Channel::recv_for, ...): one thread that sleeps until the earliest
// deadline and fires it. Firing takes the waiter off its primitive's queue and
// wakes its fiber, unless a waker took it first.
//
// A thread of its own, not the worker's reactor: firing must touch the
// primitive's lock and queue, which a reactor completion on a busy or
// sleeping worker could not do in time, and a wait notified before its
// deadline must withdraw the deadline synchronously (disarm()), since the
// entry lives in the waiting frame.
#pragma once

#include "platform/indexed_heap.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace coresched::detail {

/// One armed deadline. Lives in the waiting frame, from arm() until disarm()
/// has returned.
struct Deadline {
  std::uint64_t at_ns = 0;           // CLOCK_MONOTONIC (the steady clock)
  void (*fire)(Deadline*) = nullptr; // runs on the timer thread, outside its lock
  int heap_index = -1;               // its place in the heap; guarded by the timer's lock
  std::atomic<bool> firing{false};   // fire() is running or about to
};

class DeadlineTimer {
public:
  /// Starts the timer's thread: arm() must not fail once a waiter is queued.
  DeadlineTimer();
  ~DeadlineTimer();
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  /// Arms `d` (at_ns below kNever); its fire() runs once `d->at_ns` has
  /// passed, or at once (on the timer thread) once expire_all() has been
  /// called. Out of memory for the heap, it terminates: its caller has a
  /// waiter queued and parking, which no exception could unwind.
  void arm(Deadline* d) noexcept;
  /// Withdraws `d`. Returns once the timer no longer refers to it: if it is
  /// firing, after fire() has returned.
  void disarm(Deadline* d) noexcept;
  /// Fires every armed deadline now and every one armed later at once (the
  /// runtime is shutting down: timed waits end, timed out).
  void expire_all();

private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  IndexedHeap<Deadline, &Deadline::at_ns, &Deadline::heap_index> heap_;
  bool expire_all_ = false, exit_ = false;
  std::thread thread_;
};

} // namespace coresched::detail
