// SPDX-License-Identifier: Apache-2.0
#include "platform/ticker.hpp"

#include <pthread.h>

namespace coresched::detail {

Ticker::Ticker(std::chrono::nanoseconds period, std::function<Seen(unsigned)> tick)
    : period_(period), tick_(std::move(tick)) {
  thread_ = std::thread([this] { run(); });
  pthread_setname_np(thread_.native_handle(), "coresched-tick");
}

Ticker::~Ticker() { stop(); }

void Ticker::poke() {
  std::lock_guard lk(mu_);
  hold_ = kFineHold;
  if (fine_.load(std::memory_order_relaxed)) return;
  fine_.store(true, std::memory_order_relaxed);
  cv_.notify_one(); // cuts a coarse wait short, or restarts a stopped ticker
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
  using clock = std::chrono::steady_clock;
  std::unique_lock lk(mu_);
  unsigned idle_units = 0;
  auto last = clock::now();
  while (!stop_) {
    if (!ticking_.load(std::memory_order_relaxed)) {
      cv_.wait(lk, [&] { return stop_ || fine_.load(std::memory_order_relaxed); });
      ticking_.store(true, std::memory_order_relaxed);
      last = clock::now(); // the time stopped is nobody's run: charge none of it
      continue;
    }
    // Sleep to the next tick; a poke() during a coarse sleep wakes us to
    // re-plan at the fine period, counted from the last tick.
    const bool fine = fine_.load(std::memory_order_relaxed);
    const auto due = last + period_ * (fine || soon_ ? 1u : kCoarseUnits);
    if (cv_.wait_until(lk, due, [&] { return stop_ || (!fine && fine_.load(std::memory_order_relaxed)); })) {
      if (stop_) break;
      // Poked while coarse: tick at the first fine boundary not yet passed.
      const auto next = last + period_ * ((clock::now() - last) / period_ + 1);
      if (cv_.wait_until(lk, next, [&] { return stop_; })) break;
    }
    const auto now = clock::now();
    const auto units = static_cast<unsigned>(std::max<std::int64_t>(1, (now - last + period_ / 2) / period_));
    last = now;
    wakeups_.store(wakeups_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); // one writer
    lk.unlock();
    const Seen seen = tick_(units);
    lk.lock();
    soon_ = seen.soon;
    if (seen.waiting) hold_ = kFineHold;
    else if (hold_ > 0) --hold_;
    fine_.store(hold_ > 0, std::memory_order_relaxed);
    // Stop after 64 quarter slices with no busy worker; poke() restarts it.
    // Not if poked during this tick (hold_ set again): that poke saw it
    // ticking and did not wake it.
    idle_units = seen.busy ? 0 : idle_units + units;
    if (idle_units > 64 && hold_ == 0) {
      idle_units = 0;
      fine_.store(false, std::memory_order_relaxed);
      ticking_.store(false, std::memory_order_seq_cst);
      // A worker that turned busy after this tick looked, and then read
      // ticking_ before the store above, did not poke. Look once more: with
      // its seq_cst busy store and load of ticking_ (Scheduler::note_busy),
      // either this look sees it busy or it sees the ticker stopped and
      // pokes (the store-then-load pattern on both sides, as Dekker's).
      std::atomic_thread_fence(std::memory_order_seq_cst);
      lk.unlock();
      const Seen again = tick_(0);
      lk.lock();
      if (again.busy && !ticking_.load(std::memory_order_relaxed)) {
        ticking_.store(true, std::memory_order_relaxed);
        fine_.store(true, std::memory_order_relaxed);
        hold_ = kFineHold;
        last = clock::now();
      }
    }
  }
}

} // namespace coresched::detail
