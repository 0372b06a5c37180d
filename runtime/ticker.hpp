// SPDX-License-Identifier: Apache-2.0
// The slice tick: one thread per runtime that, every slice/4 while any worker
// is busy, lets the scheduler flag fibers that ran past their slice. With no
// busy worker it stops ticking, so an idle runtime costs no CPU.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace coresched::detail {

class Ticker {
public:
  /// `tick` returns whether any worker is busy.
  Ticker(std::chrono::nanoseconds period, std::function<bool()> tick);
  ~Ticker();
  Ticker(const Ticker&) = delete;
  Ticker& operator=(const Ticker&) = delete;

  /// Restarts the tick if it stopped (called when a worker gets busy).
  void poke();
  bool ticking() const noexcept { return ticking_.load(std::memory_order_relaxed); }
  void stop();

private:
  void run();

  std::chrono::nanoseconds period_;
  std::function<bool()> tick_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<bool> ticking_{true};
  std::thread thread_;
};

} // namespace coresched::detail
