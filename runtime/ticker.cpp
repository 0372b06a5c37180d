// SPDX-License-Identifier: Apache-2.0
#include "ticker.hpp"

#include <pthread.h>

namespace coresched::detail {

Ticker::Ticker(std::chrono::nanoseconds period, std::function<bool()> tick) : period_(period), tick_(std::move(tick)) {
  thread_ = std::thread([this] { run(); });
  pthread_setname_np(thread_.native_handle(), "coresched-tick");
}

Ticker::~Ticker() { stop(); }

void Ticker::poke() {
  std::lock_guard lk(mu_);
  if (!ticking_.load(std::memory_order_relaxed)) {
    ticking_.store(true, std::memory_order_relaxed);
    cv_.notify_one();
  }
}

void Ticker::stop() {
  {
    std::lock_guard lk(mu_);
    if (stop_) return;
    stop_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void Ticker::run() {
  std::unique_lock lk(mu_);
  int idle_ticks = 0;
  while (!stop_) {
    if (!ticking_.load(std::memory_order_relaxed)) {
      cv_.wait(lk, [&] { return stop_ || ticking_.load(std::memory_order_relaxed); });
      continue;
    }
    if (cv_.wait_for(lk, period_, [&] { return stop_; })) break;
    lk.unlock();
    // Stop after a stretch with no busy worker; poke() restarts the tick.
    idle_ticks = tick_() ? 0 : idle_ticks + 1;
    lk.lock();
    if (idle_ticks > 64) {
      ticking_.store(false, std::memory_order_relaxed);
      idle_ticks = 0;
    }
  }
}

} // namespace coresched::detail
