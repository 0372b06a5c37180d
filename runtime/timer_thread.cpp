// SPDX-License-Identifier: Apache-2.0
#include "timer_thread.hpp"

#include <pthread.h>

namespace coresched::detail {

TimerThread::TimerThread(std::chrono::nanoseconds tick, std::function<void(Fiber*)> fire,
                         std::function<bool()> tick_fn)
    : tick_(tick), fire_(std::move(fire)), tick_fn_(std::move(tick_fn)) {
  thread_ = std::thread([this] { run(); });
  pthread_setname_np(thread_.native_handle(), "coresched-timer");
}

TimerThread::~TimerThread() { stop(); }

void TimerThread::add(Clock::time_point deadline, Fiber* f) {
  std::unique_lock lk(mu_);
  if (expire_all_) deadline = Clock::time_point::min();
  const bool earliest = heap_.empty() || deadline < heap_.top().deadline;
  heap_.push(Entry{deadline, seq_++, f});
  if (earliest) cv_.notify_one();
}

void TimerThread::poke() {
  std::lock_guard lk(mu_);
  if (!ticking_.load(std::memory_order_relaxed)) {
    ticking_.store(true, std::memory_order_relaxed);
    cv_.notify_one();
  }
}

void TimerThread::expire_all() {
  std::lock_guard lk(mu_);
  expire_all_ = true;
  cv_.notify_one();
}

void TimerThread::stop() {
  {
    std::lock_guard lk(mu_);
    if (stop_) return;
    stop_ = true;
    expire_all_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void TimerThread::run() {
  std::unique_lock lk(mu_);
  int idle_ticks = 0;
  auto next_tick = Clock::now() + tick_;
  std::vector<Fiber*> due;
  for (;;) {
    const auto now = Clock::now();
    while (!heap_.empty() && (expire_all_ || heap_.top().deadline <= now)) {
      due.push_back(heap_.top().fiber);
      heap_.pop();
    }
    const bool tick_due = ticking_.load(std::memory_order_relaxed) && now >= next_tick;
    if (!due.empty() || tick_due) {
      lk.unlock();
      for (Fiber* f : due) fire_(f);
      due.clear();
      if (tick_due) {
        // Stop ticking after a stretch with no busy worker; poke() restarts it.
        idle_ticks = tick_fn_() ? 0 : idle_ticks + 1;
        next_tick = now + tick_;
      }
      lk.lock();
      if (idle_ticks > 64) {
        ticking_.store(false, std::memory_order_relaxed);
        idle_ticks = 0;
      }
      continue;
    }
    if (stop_ && heap_.empty()) return;
    if (!ticking_.load(std::memory_order_relaxed)) next_tick = now + tick_;
    auto wake = Clock::time_point::max();
    if (!heap_.empty()) wake = heap_.top().deadline;
    if (ticking_.load(std::memory_order_relaxed)) wake = std::min(wake, next_tick);
    if (wake == Clock::time_point::max()) cv_.wait(lk);
    else cv_.wait_until(lk, wake);
  }
}

} // namespace coresched::detail
