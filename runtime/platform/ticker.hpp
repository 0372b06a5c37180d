// SPDX-License-Identifier: Apache-2.0
// The slice tick: one thread per runtime that lets the scheduler flag fibers
// that ran past their slice, reap for busy workers, and share backlogs.
//
// Its period adapts, because on a virtual machine a timer wake-up is far from
// free: each one costs ~40-60 us of CPU here (bench/micro, docs/performance.md
// "The ticker's period"), so a tick every quarter slice would take 8-15 %
// from two CPU-bound workers that have nothing to share. So:
// - fine, every quarter slice, while something waits for a tick: I/O in
//   flight on a busy worker whose ring cannot flag completions, a fiber woken
//   to preempt at the next tick, and for a hold of kFineHold ticks after the
//   last such sighting or poke() (a fiber queued behind another cookie, I/O
//   begun on a busy worker, a restart);
// - a quarter slice on, without a hold, after a tick that saw fibers queued
//   behind a worker whose runs last a quarter slice or more (at most one
//   switch per quarter since the last tick: the current run may be long, and
//   the ticks time its slice end), or beside an idle worker; not beside a
//   forced-idle sibling, which times the owner's turn itself. A worker that
//   switches more often runs short fibers, and its queue needs no tick; with
//   a hold, every run that outlasted a quarter slice would keep an I/O
//   server's ticker fine for good (its workers, descheduled by the kernel for
//   a while, look like long runs), at a few per cent of its throughput;
// - coarse, every whole slice, while every busy worker just runs its fiber with
//   nothing behind it (a slice-end preemption then only reschedules it), or
//   switches often;
// - stopped, once no worker has been busy for a while, so an idle runtime
//   costs no CPU.
// The tick function is told how many quarter slices passed since the last tick
// (one when fine, four when coarse, or what a poke cut short), so the fibers'
// virtual runtime, charged in those units, stays right on average.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace coresched::detail {

class Ticker {
public:
  /// What a tick reports: whether any worker is busy, whether something
  /// waits that needs the fine period (and its hold), or just the next tick.
  struct Seen {
    bool busy = false;
    bool waiting = false;
    /// The next tick a quarter slice on, but no hold.
    bool soon = false;
  };
  /// Fine ticks kept after the last tick that saw something waiting (two
  /// slices): a workload whose queues empty and fill between ticks stays fine.
  static constexpr int kFineHold = 8;
  /// Quarter slices in a coarse tick.
  static constexpr unsigned kCoarseUnits = 4;

  /// `tick(units)`: `units` quarter slices have passed since the last tick
  /// (0: a last look for busy workers before it stops, which must not count
  /// as time).
  Ticker(std::chrono::nanoseconds period, std::function<Seen(unsigned units)> tick);
  ~Ticker();
  Ticker(const Ticker&) = delete;
  Ticker& operator=(const Ticker&) = delete;

  /// Ticks at the fine period from now on (for a hold), restarting a stopped
  /// ticker: something may wait for a tick. A system call when it is not
  /// fine: test fine() or ticking() first.
  void poke();
  /// Whether it ticks at the fine period (false: coarse or stopped).
  bool fine() const noexcept { return fine_.load(std::memory_order_relaxed); }
  /// Whether it ticks at all (false: stopped, no worker was busy). seq_cst:
  /// a worker that turns busy stores its flag seq_cst and then reads this,
  /// which pairs with the ticker's last look before it stops (ticker.cpp).
  bool ticking() const noexcept { return ticking_.load(std::memory_order_seq_cst); }
  void stop();
  /// Ticks run so far (Stats::ticks).
  std::uint64_t wakeups() const noexcept { return wakeups_.load(std::memory_order_relaxed); }

private:
  void run();

  std::chrono::nanoseconds period_;
  std::function<Seen(unsigned)> tick_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int hold_ = kFineHold;  // guarded: fine ticks left without a sighting
  bool soon_ = false;     // guarded: the last tick's Seen::soon
  std::atomic<bool> fine_{true};
  // False once no worker was busy for a while; poke() restarts it. Written
  // only by the ticker's thread under mu_, read without it by ticking().
  std::atomic<bool> ticking_{true};
  std::atomic<std::uint64_t> wakeups_{0};
  std::thread thread_;
};

} // namespace coresched::detail
