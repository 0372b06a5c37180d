// SPDX-License-Identifier: Apache-2.0
// What a worker may ask of the scheduler that owns it, and nothing more: the
// seam between the two halves of the sched layer. A worker reads a few words
// of shared state (shutting down, idle workers, the slice) inline, and asks
// for placing, waking, stealing and its start-up resources through the
// calls below. The Scheduler implements them; a worker never sees its
// options, ticker, statistics or shutdown, so the scheduler's internals can
// change without touching the worker, and the worker's needs are listed here.
//
// The calls are virtual: none is on a path an instruction budget measures
// (a spawn, a yield or a join goes through Scheduler itself, which is final).
#pragma once

#include "core/core_coordinator.hpp"

#include <coresched/options.hpp>
#include <coresched/topology.hpp>

#include <atomic>
#include <cstdint>
#include <exception>

namespace coresched::detail {

class BlockingPool;
class SharedStackPool;
class Trace;
class Worker;
struct Fiber;

/// Reserves `n` consecutive fiber ids (process-wide, never 0); returns the first.
std::uint64_t new_fiber_ids(std::uint64_t n) noexcept;

class WorkerHost {
public:
  // ---- shared state, read inline by the workers
  /// Shutdown has begun: no new fibers; sleeping and blocked ones are cancelled.
  bool stopping() const noexcept { return stopping_.load(std::memory_order_acquire); }
  /// No fiber is left: the workers leave their loops.
  bool exiting() const noexcept { return exiting_.load(std::memory_order_acquire); }
  /// Whether some worker is idle (a relaxed hint).
  bool idle_hint() const noexcept { return idle_count_.load(std::memory_order_relaxed) > 0; }
  /// Whether an idle worker may spin now (at most half of the idle ones).
  bool try_start_spinning() noexcept {
    int s = spinning_.load(std::memory_order_relaxed);
    for (;;) {
      if (s * 2 >= idle_count_.load(std::memory_order_relaxed)) return false;
      if (spinning_.compare_exchange_weak(s, s + 1, std::memory_order_relaxed)) return true;
    }
  }
  void stop_spinning() noexcept { spinning_.fetch_sub(1, std::memory_order_relaxed); }
  std::uint64_t slice_ns() const noexcept { return slice_ns_; }
  /// Options::handover_spin (or CORESCHED_HANDOVER_SPIN=1).
  bool handover_spin() const noexcept { return handover_spin_; }
  /// Ticks so far: the unit fibers are charged in (fiber_vtime.hpp).
  const std::atomic<std::uint32_t>& tick_counter() const noexcept { return ticks_; }
  /// Published cookies found overlapping (the isolation check's count).
  std::atomic<std::uint64_t> isolation_violations{0};

  // ---- placing and waking
  /// Places a runnable fiber on a worker and queues it there.
  virtual void place(Fiber* f, Arrival why = Arrival::woken) = 0;
  /// Most fibers one steal takes.
  static constexpr unsigned kStealBatch = 128;
  /// Takes fibers from another core for `thief`, nearest core first, into
  /// `out` (up to kStealBatch, half the victim's queue); returns how many.
  virtual unsigned steal_for(Worker& thief, const Pick& p, Fiber** out) = 0;
  /// Why wake_helper is called.
  enum class Help : std::uint8_t {
    /// Fibers wait in the caller's core queue.
    queued,
    /// The caller has just put a fiber on its spawn ring. A single-PU worker
    /// about to sleep looks at the other cores once more (sleep_once), so
    /// one that does not yet say it sleeps is passed by without its lock.
    spawned,
    /// The slice tick's rule, for a runner that reaches no preemption point:
    /// only a worker of another core that can steal any cookie (no sibling
    /// of its core runs one), and a spinner does not count (it may be limited
    /// to one cookie); the caller then relies on it to take the backlog.
    backlog,
  };
  /// Called by a worker whose own core has a backlog: wake a sleeping one,
  /// unless one spins. Returns whether one was woken or spins.
  virtual bool wake_helper(const Worker& from, Help why = Help::queued) = 0;
  /// Whether another single-PU core has fibers queued (its spawn ring's
  /// included), which `w` may be able to steal: a worker about to sleep looks
  /// once more (Worker::sleep_once).
  virtual bool queued_elsewhere(const Worker& w) const noexcept = 0;
  /// A worker enters or leaves the idle loop.
  virtual void note_idle(const Worker& w, bool idle) noexcept = 0;
  /// A worker became busy: make sure the tick runs.
  virtual void note_busy() = 0;
  /// Completions or a turn's end must be seen within a quarter slice: the
  /// tick must run at its fine period.
  virtual void want_fine_ticks() = 0;
  /// Whether a forced-idle PU woken at the end of the owner's turn watches
  /// for the hand-over a while before it sleeps again (forced_idle.cpp).
  virtual bool watch_turn_end() const noexcept = 0;
  /// An exception ended a fiber nobody will join. Called in that fiber.
  virtual void report_detached_exception(std::exception_ptr e) noexcept = 0;

  // ---- what a worker is built from and gives back to
  virtual const Topology& topology() const noexcept = 0;
  /// The I/O backend every worker uses (chosen once, at construction).
  virtual IoBackend io_backend() const noexcept = 0;
  /// Threads for the epoll backend's blocking work.
  virtual BlockingPool& blocking_pool() noexcept = 0;
  /// The stacks every worker's pool gives back to (and the fail reserve).
  virtual SharedStackPool& shared_stacks() noexcept = 0;
  /// Fibers of this runtime that have finished so far.
  virtual std::uint64_t retired_fibers() const noexcept = 0;
  /// The scheduling trace, or null when not tracing.
  virtual Trace* trace() const noexcept = 0;

protected:
  WorkerHost() = default;
  ~WorkerHost() = default;
  WorkerHost(const WorkerHost&) = delete;
  WorkerHost& operator=(const WorkerHost&) = delete;

  std::atomic<bool> stopping_{false};
  std::atomic<bool> exiting_{false};
  std::atomic<std::uint32_t> ticks_{0}; // written by the ticker alone
  std::atomic<int> spinning_{0};
  std::atomic<int> idle_count_{0};
  std::uint64_t slice_ns_ = 0;
  bool handover_spin_ = false;
};

} // namespace coresched::detail
