// SPDX-License-Identifier: Apache-2.0
// One thread per runtime that fires fiber timers (sleep_for) and drives the
// slice tick: every slice/4 it lets the scheduler flag fibers that ran too long.
// With no busy worker it stops ticking, so an idle runtime costs no CPU.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

namespace coresched::detail {

struct Fiber;

class TimerThread {
public:
  using Clock = std::chrono::steady_clock;
  /// `fire` wakes a fiber; `tick` returns whether any worker is busy.
  TimerThread(std::chrono::nanoseconds tick, std::function<void(Fiber*)> fire, std::function<bool()> tick_fn);
  ~TimerThread();
  TimerThread(const TimerThread&) = delete;
  TimerThread& operator=(const TimerThread&) = delete;

  /// Wakes `f` at `deadline`.
  void add(Clock::time_point deadline, Fiber* f);
  /// Restarts the slice tick if it stopped (called when a worker gets busy).
  void poke();
  /// True while the tick is stopped.
  bool ticking() const noexcept { return ticking_.load(std::memory_order_relaxed); }
  /// Fires every pending timer now and every future one at once (shutdown).
  void expire_all();
  /// Stops the thread; pending timers fire first.
  void stop();

private:
  struct Entry {
    Clock::time_point deadline;
    std::uint64_t seq;
    Fiber* fiber;
    bool operator>(const Entry& o) const { return deadline != o.deadline ? deadline > o.deadline : seq > o.seq; }
  };
  void run();

  std::chrono::nanoseconds tick_;
  std::function<void(Fiber*)> fire_;
  std::function<bool()> tick_fn_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap_;
  std::uint64_t seq_ = 0;
  bool stop_ = false;
  bool expire_all_ = false;
  std::atomic<bool> ticking_{true};
  std::thread thread_;
};

} // namespace coresched::detail
