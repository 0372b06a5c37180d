// SPDX-License-Identifier: Apache-2.0
// The helper threads that run blocking calls (blocking_call.cpp): one per
// call in flight, kept for later calls once idle, so a call costs a hand-over
// to a waiting thread rather than a thread's creation. Unbounded on purpose:
// a call queued behind busy threads would keep its core claimed for its
// cookie (CoreCoordinator::hold_locked) while nothing of it ran.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace coresched::detail {

class CallThreads {
public:
  CallThreads() = default;
  /// Joins every thread; each call handed over must have returned (its fiber
  /// waits for it, and the runtime waits for its fibers).
  ~CallThreads();
  CallThreads(const CallThreads&) = delete;
  CallThreads& operator=(const CallThreads&) = delete;

  /// Runs `fn(arg)` on a thread of its own, now (any thread may call it).
  void run(void (*fn)(void*) noexcept, void* arg);

  /// Threads started so far (for tests and statistics).
  std::size_t threads();

private:
  struct Call {
    void (*fn)(void*) noexcept;
    void* arg;
  };
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Call> calls_;
  std::size_t idle_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

} // namespace coresched::detail
