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
  Cookie cookie;
  std::uint64_t cpu_ns = 0;              ///< Time its fibers ran, summed over PUs.
  std::uint64_t core_ns = 0;             ///< Time it held a core (SMT cores only), summed over cores.
  std::uint64_t forced_idle_suffered_ns = 0; ///< Sibling time idled while this cookie waited for a core.
  std::uint64_t forced_idle_caused_ns = 0;   ///< Sibling time idled because this cookie held the core.
  std::uint64_t runs = 0;                ///< Times one of its fibers was switched in.
};

/// What one physical core did.
struct CoreStats {
  unsigned core = 0;
  std::uint64_t cookie_switches = 0; ///< Times the core's running cookie changed.
  std::uint64_t forced_idle_ns = 0;  ///< Sibling time spent forced idle.
};

/// What one worker (PU) did.
struct WorkerStats {
  unsigned worker = 0;
  std::uint64_t switches = 0; ///< Fibers switched in.
  std::uint64_t steals = 0;   ///< Fibers taken from other workers' queues.
  std::uint64_t sleeps = 0;   ///< Times the worker blocked for lack of work.
  std::uint64_t stalls = 0;   ///< Fibers reported for running past Options::stall_threshold without a preemption point.
};

/// A snapshot of all statistics.
struct Stats {
  std::vector<CookieStats> cookies;
  std::vector<CoreStats> cores;
  std::vector<WorkerStats> workers;
  std::uint64_t isolation_violations = 0; ///< Only counted in checker builds (CORESCHED_ISOLATION_CHECK).

  /// The entry for a cookie (zeros if it never ran).
  CookieStats cookie(Cookie c) const;
  /// Human-readable tables.
  std::string to_table() const;
};

} // namespace coresched
