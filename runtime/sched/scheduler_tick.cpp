// SPDX-License-Identifier: Apache-2.0
// The scheduler's time: the slice tick that asks runners to yield and moves
// work off stuck workers, and the report of a worker stalled in a system call.
#include "sched/scheduler.hpp"

#include "platform/cookie_registry.hpp"
#include "platform/log.hpp"

#include <cstdio>

namespace coresched::detail {

// ---------------------------------------------------------------- time

// The slice tick. A worker whose switch count has not moved for a whole slice
// (or half of one while a sibling is forced idle, the kernel's rule) is asked
// to yield at its next preemption point. Counted in quarter slices, `units` of
// which passed since the last tick (one, unless the ticker was coarse).
Ticker::Seen Scheduler::tick(unsigned units) {
  ticks_.store(ticks_.load(std::memory_order_relaxed) + units, std::memory_order_relaxed); // only the ticker writes it
  Ticker::Seen seen;
  const std::uint64_t now = now_ns();
  for (auto& wp : workers_) {
    Worker& w = *wp;
    const bool busy = w.busy.load(std::memory_order_relaxed);
    if (!busy) {
      w.tick_seen = w.switches.load(std::memory_order_relaxed);
      reset_run(w);
      continue;
    }
    seen.busy = true;
    const bool sibling_waits = w.core().forced_idle_count() > 0;
    // What the fine period is for: a slice end to flag or a backlog to share
    // or rescue, completions to reap. With none of these on any busy worker a
    // slice-end preemption would only reschedule the runner (Ticker). Fibers
    // queued beside a forced-idle sibling wait for the owner's turn to end,
    // which that sibling times itself (forced_idle.cpp).
    // Completions on a ring that raises IORING_SQ_TASKRUN need no tick: the
    // running fiber's next preemption point sees the flag (preempt_point),
    // and SQEs held back make the worker ask its fiber back itself
    // (Worker::ask_back_for_io). A timer wake-up costs the busy CPUs tens of
    // us here, and an I/O server is always busy with I/O in flight: ticking
    // at the fine period for it cost the echo server ~9 % of its CPU.
    // Fibers queued behind a worker need the next tick while its runs last a
    // quarter slice or more (it switched at most once per quarter since the
    // last tick, or not at all): the current one may be long, and its slice
    // end is counted in quarters. Likewise while a worker idles (a backlog to
    // share). Not the fine period's hold (Ticker). A worker that switched
    // more often serves its queue itself, as an I/O server's do every few us
    // with fibers always queued; a long run that begins there is flagged at
    // the next coarse tick, after one to two slices rather than one to one
    // and a quarter. (A rate, not a count: a count against windows of one
    // and four quarters would keep fine ticks fine for runs in between.)
    const std::uint64_t sw = w.switches.load(std::memory_order_relaxed);
    if (w.core().queued_hint() > 0 && !sibling_waits && (sw - w.tick_seen <= units || idle_hint())) seen.soon = true;
    // (A fiber that waits for the next tick to preempt the runner is one.)
    const bool wake_waits = w.sibling().wake_waits.load(std::memory_order_relaxed);
    seen.waiting |= wake_waits || w.io_wants_ticks(now);
    // A busy worker collects its I/O and timer completions, and submits the
    // SQEs it deferred, only at scheduling points: ask for one as soon as it
    // has either (the fallback, at whatever period the ticker runs; and the
    // only way where the ring cannot flag completions).
    if (w.io_needs_attention(now)) w.sibling().ask_preempt();
    // A fiber woken by a completion its runner collected as it started
    // (Arrival::collected) preempts it now, a tick later.
    if (wake_waits) {
      w.sibling().wake_waits.store(false, std::memory_order_relaxed);
      w.sibling().ask_preempt();
    }
    if (sw != w.tick_seen) {
      w.tick_seen = sw;
      reset_run(w);
      continue;
    }
    w.ticks_same += static_cast<int>(units);
    // A forced-idle sibling asks the owner to stop at the end of its turn;
    // this is the fallback, should its timer not have (the turn's end moved
    // earlier, or the sibling was busy with completions).
    if (w.ticks_same >= 4 || (sibling_waits && w.ticks_same >= 2)) w.sibling().ask_preempt();
    // Fibers queued behind a fiber that has kept its worker for a tick, while
    // a worker elsewhere is idle: wake one to steal them (once per run; Go's
    // sysmon retakes a P for the same reason). Without this, a backlog whose
    // wake-up at spawn or placement time was skipped (a wake-affine fiber
    // whose waker ran on without a preemption point) or found nothing yet
    // waited for the runner's next switch.
    // A sleeping worker of another core that can take any cookie
    // (wake_helper's for_backlog); if none could be woken, the next tick
    // tries again, and the rescue may move the backlog meanwhile.
    if (!w.backlog_shared && w.core().queued_hint() > 0 && idle_hint()) w.backlog_shared = wake_helper(w, Help::backlog);
    if (w.ticks_same >= 4 && stall_ns_ > 0 && !w.stall_reported) check_stall(w);
  }
  // After the loop: every worker's ticks_same is this tick's.
  if (seen.busy) rescue_queued();
  return seen;
}

// A new run (or none): the tick's per-run state starts again.
void Scheduler::reset_run(Worker& w) noexcept {
  w.ticks_same = 0;
  w.stall_reported = false;
  w.stall_cpu_base = 0;
  w.stall_wall_base = 0;
  w.backlog_shared = false;
}

// A worker that has not switched for a whole slice has its preempt flag set;
// if its fiber still reaches no preemption point for stall_ns_, report it,
// once per run, in one of two ways:
// - it ran stall_ns_ of the thread's own CPU time: CPU time, not wall time,
//   because a thread the kernel or the hypervisor has descheduled is not
//   stalling (two synthetic siblings share each real CPU here);
// - stall_ns_ of wall time passed, the thread used less than half of it and
//   sleeps in a system call now (not a lock wait: Worker::blocks_worker): a
//   blocking call (usleep, a blocking read, a client library's socket) made
//   outside coresched::blocking_call, which holds up the worker's other
//   fibers and timers as surely, and uses no CPU to show it.
// A syscall or two per stuck worker per tick; workers that switch cost nothing.
void Scheduler::check_stall(Worker& w) {
  const std::uint64_t cpu = w.thread_cpu_ns();
  const std::uint64_t now = now_ns();
  // 0, or less than the base: the thread's clock is gone (its worker exited
  // at shutdown); the difference wrapped into a stall of 584 years.
  if (cpu == 0 || cpu < w.stall_cpu_base) return;
  if (w.stall_cpu_base == 0) {
    w.stall_cpu_base = cpu;
    w.stall_wall_base = now;
    return;
  }
  const std::uint64_t ran = cpu - w.stall_cpu_base + slice_ns_; // it had run a slice when the base was taken
  const std::uint64_t wall = now - w.stall_wall_base + slice_ns_;
  const bool busy = ran >= stall_ns_;
  const int syscall_nr = busy || wall < stall_ns_ || ran >= wall / 2 ? -1 : w.blocking_syscall();
  if (!busy && syscall_nr < 0) return;
  w.stall_reported = true;
  w.stalls.fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t fiber = w.running_id.load(std::memory_order_relaxed);
  const std::string cookie = cookie_label(w.sibling().running.load(std::memory_order_relaxed));
  if (busy)
    log().warn("stall: fiber {} (cookie {}) has run {} ms on worker {} (CPU {}) without a preemption point", fiber,
               cookie, ran / 1'000'000, w.index(), w.pu().cpu);
  else
    log().warn("stall: fiber {} (cookie {}) has blocked worker {} (CPU {}) in system call {} for {} ms, holding up "
               "its other fibers and timers (coresched::io and coresched::blocking_call do not block the worker)",
               fiber, cookie, w.index(), w.pu().cpu, syscall_nr, wall / 1'000'000);
}

} // namespace coresched::detail
