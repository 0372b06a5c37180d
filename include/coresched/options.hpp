// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file options.hpp
/// Runtime configuration.

#include <chrono>
#include <cstddef>
#include <string>

namespace coresched {

/// How the core-wide pick chooses between cookies competing for one core.
enum class FairnessPolicy {
  /// Default. Each cookie accrues a core-wide virtual runtime (the wall time it
  /// owned the core); the cookie with the smallest one runs next.
  core_vruntime,
  /// The cookie that has suffered the most forced-idle time on the core runs next.
  forceidle_balance,
};

/// How a woken fiber finds an idle worker.
enum class Placement {
  mask, ///< Default: read the LLC's atomic idle mask (constant time).
  scan, ///< Walk every worker of the LLC, as the kernel did before the idle mask.
};

/// Default fiber stack size: 64 KiB usable plus one guard page.
inline constexpr std::size_t default_stack_size = 64 * 1024;

/// Everything a Runtime can be told at start. Every field has a sensible default.
struct Options {
  /// Topology source: "" or "auto" for the real machine (unless the
  /// CORESCHED_TOPOLOGY environment variable names another), an hwloc synthetic
  /// description such as "package:1 l3cache:1 core:2 pu:2", or a path ending in
  /// ".xml" (an hwloc XML export).
  std::string topology;

  /// Fairness between cookies on a core.
  FairnessPolicy policy = FairnessPolicy::core_vruntime;

  /// Wakeup placement strategy.
  Placement placement = Placement::mask;

  /// Cooperative time slice: after about this long, preempt_point() yields.
  std::chrono::microseconds slice{1000};

  /// A fiber that runs this long without reaching a preemption point (a yield,
  /// a wait, or preempt_point() once its slice is over) is logged as a stall,
  /// with its id and cookie, and counted in WorkerStats::stalls. Zero disables.
  std::chrono::milliseconds stall_threshold{25};

  /// Stack size for fibers that do not name one in SpawnOptions.
  std::size_t stack_size = default_stack_size;

  /// Also tag the runtime's threads with one kernel core-scheduling cookie
  /// (PR_SCHED_CORE) so other processes cannot share our cores. Where the kernel
  /// refuses, this is logged once and ignored.
  bool kernel_cookie = false;

  /// Write a scheduling trace (Chrome trace-event JSON, for Perfetto UI or
  /// chrome://tracing) to this path at shutdown; empty means CORESCHED_TRACE
  /// or no trace. Each worker keeps its last CORESCHED_TRACE_EVENTS events
  /// (default 65536).
  std::string trace_path;

  /// Log level ("trace" ... "off"); empty means CORESCHED_LOG or "warn".
  std::string log_level;
};

/// Name of a policy, as used on command lines ("core_vruntime", "forceidle_balance").
const char* to_string(FairnessPolicy p) noexcept;
/// Name of a placement ("mask", "scan").
const char* to_string(Placement p) noexcept;

} // namespace coresched
