// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file stats.hpp
/// Scheduling statistics: per cookie, per core, per worker.

#include <coresched/cookie.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace coresched {

/// What one cookie did, summed over all cores.
struct CookieStats {
  /// The cookie these figures belong to.
  Cookie cookie;
  std::string name;                      ///< Its name (Cookie::create(name, weight)); empty if none.
  std::uint32_t weight = Cookie::kDefaultWeight; ///< Its weight at the snapshot.
  std::uint64_t cpu_ns = 0;              ///< Time its fibers ran, summed over PUs.
  std::uint64_t core_ns = 0;             ///< Time it held a core (SMT cores only), summed over cores.
  std::uint64_t forced_idle_suffered_ns = 0; ///< Sibling time idled while this cookie waited for a core.
  std::uint64_t forced_idle_caused_ns = 0;   ///< Sibling time idled because this cookie held the core.
  std::uint64_t runs = 0;                ///< Times one of its fibers was switched in.
};

/// What one physical core did.
struct CoreStats {
  /// Index into Topology::cores().
  unsigned core = 0;
  std::uint64_t cookie_switches = 0; ///< Times the core's running cookie changed.
  std::uint64_t forced_idle_ns = 0;  ///< Sibling time spent forced idle.
  /// Hand-overs: times the core changed cookie while the cookie it left still
  /// had fibers to run (it was preempted for fairness).
  std::uint64_t handovers = 0;
  /// The gap of a hand-over: from the change to the first fiber of the new
  /// cookie starting, when the core runs neither. Percentiles of all
  /// hand-overs so far (within 12.5 %), and the largest.
  std::uint64_t handover_gap_p50_ns = 0;
  std::uint64_t handover_gap_p99_ns = 0; ///< See handover_gap_p50_ns.
  std::uint64_t handover_gap_max_ns = 0; ///< See handover_gap_p50_ns.
  /// The cookie holding the core at the snapshot (SMT cores; false while the
  /// whole core idles, on single-PU cores, or when its lock stayed busy).
  bool has_owner = false;
  Cookie owner;                      ///< Valid when has_owner.
  unsigned forced_idle_pus = 0;      ///< Siblings forced idle at the snapshot.
  /// One queued fiber count per cookie at the snapshot.
  struct Queued {
    Cookie cookie;           ///< The cookie.
    std::uint64_t fibers = 0; ///< Its fibers queued on this core.
  };
  /// Fibers queued on the core per cookie at the snapshot (ascending cookie).
  std::vector<Queued> queued;
};

/// What one worker (PU) did.
struct WorkerStats {
  /// Worker index, equal to the PU's index in Topology::pus().
  unsigned worker = 0;
  std::uint64_t switches = 0; ///< Fibers switched in (a child run inline by its joiner is a call, not counted).
  std::uint64_t steals = 0;   ///< Fibers taken from other workers' queues.
  std::uint64_t sleeps = 0;   ///< Times the worker blocked for lack of work.
  std::uint64_t stalls = 0;   ///< Fibers reported for running past Options::stall_threshold without a preemption point.
  /// Fibers the slice ticker moved off this worker's queue to a worker that
  /// was switching, because this worker's fiber had run over a slice without
  /// reaching a preemption point and no idle worker of another core could
  /// steal them.
  std::uint64_t rescued = 0;
};

/// A snapshot of all statistics.
struct Stats {
  /// One entry per cookie that ran or held a core, by ascending cookie value.
  std::vector<CookieStats> cookies;
  /// One entry per core, in Topology::cores() order.
  std::vector<CoreStats> cores;
  /// One entry per worker, in Topology::pus() order.
  std::vector<WorkerStats> workers;
  std::uint64_t isolation_violations = 0; ///< Two cookies sharing a core; only counted with CORESCHED_ISOLATION_CHECK.
  /// Times the slice ticker's thread woke to tick: every quarter slice while
  /// something waits for it (a backlog, a forced-idle sibling, I/O in flight on
  /// a busy worker), every slice while busy workers have nothing behind them,
  /// none while all are idle. Each costs a timer wake-up (README "Slices").
  std::uint64_t ticks = 0;

  /// The entry for a cookie (zeros if it never ran).
  CookieStats cookie(Cookie c) const;
  /// Human-readable tables (times in ms), as printed by CORESCHED_STATS=1.
  std::string to_table() const;
};

} // namespace coresched
