// SPDX-License-Identifier: Apache-2.0
// The helper threads that run blocking calls (blocking_call.cpp): one per
// call in flight, so a call never waits behind another (queued, it would keep
// its core claimed for its cookie while nothing of it ran:
// CoreCoordinator::hold_locked). Up to kKeepIdle of them stay for later calls
// once idle, so a call costs a hand-over to a waiting thread, not a thread's
// creation; the rest end, so a burst of calls does not keep its threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstddef>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace coresched::detail {

/// On a helper thread while it runs a blocking call: the call's cookie, which
/// the fibers it spawns inherit (Scheduler::spawn); null elsewhere.
extern thread_local constinit const std::uint64_t* tls_call_cookie;

namespace testing {
/// Test-only: while set, CallThreads cannot start a thread (as when the
/// process is out of threads or address space).
extern std::atomic<bool> call_thread_start_fails;
} // namespace testing

class CallThreads {
public:
  static constexpr std::size_t kKeepIdle = 16;

  CallThreads() = default;
  /// Joins every thread; each call handed over must have returned.
  ~CallThreads();
  CallThreads(const CallThreads&) = delete;
  CallThreads& operator=(const CallThreads&) = delete;

  /// Runs `fn(arg)` on a thread of its own, now (any thread may call it).
  /// Throws std::system_error, with nothing queued, if no thread can be
  /// started for it.
  void run(void (*fn)(void*) noexcept, void* arg);

  /// Waits until no call runs (the runtime's shutdown: a call's last steps,
  /// after it woke its fiber, still touch the runtime).
  void wait_idle();

  /// Threads alive now (for tests).
  std::size_t threads();

private:
  struct Call {
    void (*fn)(void*) noexcept;
    void* arg;
  };
  void loop();
  void join_finished(std::unique_lock<std::mutex>& lk);

  std::mutex mu_;
  std::condition_variable cv_;      // calls queued, or stop_
  std::condition_variable idle_cv_; // running_ fell to 0
  std::deque<Call> calls_;
  std::size_t idle_ = 0;    // threads waiting for a call
  std::size_t running_ = 0; // calls taken and not yet returned
  bool stop_ = false;
  std::vector<std::thread> threads_;
  std::vector<std::thread> finished_; // ended threads, to be joined
};

} // namespace coresched::detail
