// SPDX-License-Identifier: Apache-2.0
// Fairness between the fibers of one cookie on one PU, as CFS shares a CPU
// between tasks (kernel/sched/fair.c: vruntime, min_vruntime, place_entity,
// check_preempt_wakeup). Between cookies the core coordinator decides; this
// orders the fibers inside each cookie's queue.
//
// - Each fiber carries a virtual runtime (`Fiber::vtime`): the CPU it has used,
//   in ticks of the slice ticker (a quarter slice each). The switch path reads
//   no clock: a fiber is charged the ticks that passed while it ran, so a run
//   too short to see a tick costs nothing and one that straddles k ticks costs
//   k; on average that is the run's length (a run of length d sees d / tick
//   ticks in expectation, wherever it falls).
// - Queues are ordered by vtime, FIFO among equals (run_queue.hpp,
//   local_queue.hpp); each PU keeps a floor, the largest vtime it has started
//   (CFS's monotonic min_vruntime).
// - A fiber that wakes is placed no further back than `kSleeperCredit` behind
//   the floor (CFS's sleeper credit: it did not run while it slept, but may not
//   bank unlimited credit), and no further ahead than `kMaxLead` (a fiber that
//   ran far ahead elsewhere must not wait for ever here). If that puts it
//   behind the floor, the fiber running on its PU is asked to stop at its next
//   preemption point (check_preempt_wakeup): otherwise a woken client (latt)
//   waits behind CPU-bound fibers and is then interleaved with them.
// - At the end of a slice the runner keeps the PU while it is less than
//   `kGranularity` ahead of the next fiber (sched_min_granularity). Fibers
//   woken together take first turns of at least that length; equal CPU-bound
//   fibers then alternate with the lead swinging from -kGranularity to
//   +kGranularity, and the ticker asks again only a slice after each keep, so
//   their turns are 3-6 slices (coresched-turn-bench: 5.3 ms for two at a 1 ms
//   slice; kernel threads here: 4 ms).
// - An explicit this_fiber::yield() still goes behind every fiber of its
//   cookie (a yield means "let the others run", CFS's yield skip).
//
// Units are 32-bit ticks compared by signed difference, so they may wrap: the
// spread within one queue is bounded by kSleeperCredit + kMaxLead.
#pragma once

#include <cstdint>

namespace coresched::detail::vtime {

/// Ticks (quarter slices) a runner may lead the next fiber of its cookie and keep the PU.
inline constexpr std::uint32_t kGranularity = 6;
/// Ticks a woken fiber may be placed behind the floor. More than the
/// granularity: a runner near the floor that stops for a woken fiber (the
/// wake-up preemption, or the tick asking it to reap a completion) must not
/// keep the PU by the granularity rule. (CFS's credit is half its latency
/// period: 6 ms on two CPUs; this is 3 slices, 3 ms by default.)
inline constexpr std::uint32_t kSleeperCredit = 12;
/// Ticks a fiber arriving on a PU may be ahead of its floor.
inline constexpr std::uint32_t kMaxLead = kGranularity;

/// a < b, for wrapping tick counts.
inline bool before(std::uint32_t a, std::uint32_t b) noexcept { return static_cast<std::int32_t>(a - b) < 0; }

/// A woken or migrated fiber's vtime on a PU with `floor`: within [floor - credit, floor + lead].
inline std::uint32_t placed(std::uint32_t v, std::uint32_t floor) noexcept {
  if (before(v, floor - kSleeperCredit)) return floor - kSleeperCredit;
  if (before(floor + kMaxLead, v)) return floor + kMaxLead;
  return v;
}

/// A fiber that ran on this PU and goes back to its queue: not more than kMaxLead ahead.
inline std::uint32_t capped(std::uint32_t v, std::uint32_t floor) noexcept {
  return before(floor + kMaxLead, v) ? floor + kMaxLead : v;
}

} // namespace coresched::detail::vtime
