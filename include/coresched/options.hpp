// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file options.hpp
/// Runtime configuration.

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>

namespace spdlog {
/// spdlog's logger (<spdlog/spdlog.h>), for Options::logger.
class logger;
} // namespace spdlog

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

/// The kernel interface the workers use for fiber I/O (coresched::io),
/// sleeps, timeouts and idle sleeping. Chosen once, at construction; every
/// operation then goes to that backend.
enum class IoBackend {
  /// Default: io_uring where the kernel allows it and has every opcode the
  /// runtime uses, else epoll; one log line (warn level on falling back) says
  /// which and why.
  automatic,
  /// io_uring (liburing). Where it cannot start (Docker's default seccomp
  /// profile, kernel.io_uring_disabled, a kernel without an opcode) the
  /// Runtime constructor throws UsageError naming the reason.
  io_uring,
  /// epoll, eventfd and a timer heap per worker; regular-file I/O, openat and
  /// fsync run on a small thread pool (docs/io-backends.md). Works wherever
  /// io_uring is forbidden.
  epoll,
};

/// Default fiber stack size: 64 KiB usable plus one guard page.
inline constexpr std::size_t default_stack_size = 64 * 1024;

/// Everything a Runtime can be told at start. Every field has a sensible default.
struct Options {
  /// Topology source: "" or "auto" for the real machine (unless the
  /// CORESCHED_TOPOLOGY environment variable names another), an hwloc synthetic
  /// description such as "package:1 l3cache:1 core:2 pu:2", or a path ending in
  /// ".xml" (an hwloc XML export). A bad one makes the Runtime constructor
  /// throw TopologyError.
  std::string topology;
  /// The PUs this runtime may use, as a list of their OS indexes ("0-3,8";
  /// for a synthetic or XML topology, the PU numbers hwloc gives it); empty
  /// means every PU of the topology (on the real machine, within the
  /// process's affinity mask). Runtimes alive at the same time in one process
  /// must not share a core of more than one PU, or a fiber of each could run a
  /// different cookie on two siblings at once: the second one's constructor
  /// throws UsageError naming the core. Give each runtime its own cores here.
  /// A list that does not parse or names a PU the topology lacks is a
  /// TopologyError.
  std::string cpus;

  /// Fairness between cookies on a core.
  FairnessPolicy policy = FairnessPolicy::core_vruntime;

  /// Wakeup placement strategy.
  Placement placement = Placement::mask;

  /// The I/O backend. `automatic` also reads CORESCHED_IO_BACKEND ("auto",
  /// "io_uring" or "epoll"; another value is a UsageError at construction).
  IoBackend io_backend = IoBackend::automatic;

  /// Cooperative time slice: after about this long on one worker (half of it
  /// while a sibling PU is forced idle), preempt_point() yields. Must be
  /// positive (else UsageError).
  std::chrono::microseconds slice{1000};

  /// A fiber that runs this long without reaching a preemption point (a yield,
  /// a wait, or preempt_point() once its slice is over) is logged as a stall,
  /// with its id and cookie, and counted in WorkerStats::stalls. Zero disables.
  /// Measured in the worker thread's CPU time (time the kernel deschedules it
  /// does not count), checked every quarter slice, reported once per run at
  /// warn level. Negative is a UsageError.
  std::chrono::milliseconds stall_threshold{25};

  /// Usable stack size in bytes for fibers that do not name one in
  /// SpawnOptions; rounded up to whole pages (twice it is mapped: see
  /// SpawnOptions::stack_size). Zero or more than 1 GiB is a UsageError.
  std::size_t stack_size = default_stack_size;

  /// Also tag the runtime's threads with one kernel core-scheduling cookie
  /// (PR_SCHED_CORE) so other processes cannot share our cores. Where the kernel
  /// refuses (old kernel, no SMT support, no permission), a warning is logged
  /// and the runtime runs without it.
  bool kernel_cookie = false;

  /// Get forced-idle PUs ready for the core's next hand-over: a forced-idle PU
  /// sets its ring timer to wake its own timer latency before the owner's turn
  /// ends (it always wakes at that end, to ask the owner to stop), then spins
  /// (with `pause`, reading one word) through the hand-over, for at most a
  /// quarter slice past it. The hand-over gap falls from a wake-up (50-130 us
  /// p50 on the development VM) to ~2 us, at the price of CPU time on the
  /// spinning PU and of what a spinning PU takes from its SMT sibling (not
  /// measurable on the development VM, whose siblings are synthetic), hence off
  /// by default; see docs/performance.md. Also on with CORESCHED_HANDOVER_SPIN=1.
  bool handover_spin = false;

  /// Wake-affine placement: a fiber woken by a running fiber of its own
  /// cookie, on a worker with nothing else queued, waits there to run next
  /// (Go's `runnext`), so a waker that then blocks hands its worker over
  /// within a microsecond instead of a cross-CPU wake-up; thieves leave such
  /// a fiber alone for 5 us. Off: a woken fiber goes to an idle worker, or
  /// back to its previous one (see README, "How it works"). Also off with
  /// CORESCHED_WAKE_AFFINE=0 (another value than 0 or 1 is a UsageError).
  bool wake_affine = true;

  /// Write a scheduling trace (Chrome trace-event JSON, for Perfetto UI or
  /// chrome://tracing) to this path at shutdown; empty means CORESCHED_TRACE
  /// or no trace. Each worker keeps its last CORESCHED_TRACE_EVENTS events
  /// (default 65536) in a ring, so memory stays bounded; a warning counts the
  /// dropped ones. A bad CORESCHED_TRACE_EVENTS is a UsageError at
  /// construction; a file that cannot be written is logged, not thrown.
  std::string trace_path;

  /// Log level ("trace", "debug", "info", "warn", "error", "critical", "off").
  /// The log is shared by the whole process, so a non-empty value sets the
  /// level for every runtime from construction on; empty leaves the level as
  /// it is (initially CORESCHED_LOG, else "warn").
  std::string log_level;

  /// The application's spdlog logger, to write the library's lines with its
  /// sinks, pattern and level (log_level, when set, sets its level). Like
  /// the level, the library's logger is one per process: a non-null logger
  /// replaces it from this runtime's construction on, for every runtime;
  /// null leaves it as it is (initially its own, on stderr).
  std::shared_ptr<spdlog::logger> logger;

  /// Called with the exception that ends a fiber nobody will join (spawned
  /// detached, or detach()ed before it ended), in that fiber, under its
  /// cookie: this_fiber::id() and cookie() name it. Empty: an error log line
  /// with the fiber's id, its cookie and name, and what(). What the handler
  /// throws is logged and dropped. (A fiber detach()ed after it ended had
  /// kept its exception for the handle: detach() logs it, in the caller.)
  std::function<void(std::exception_ptr)> on_detached_exception;

  /// How long shutdown() (and so ~Runtime) waits for fibers still alive
  /// before it logs, at warn level, what each waits for (their fiber-dump
  /// lines); it keeps waiting, and reports again each time this much more
  /// has passed. 0: never report. Outside 0 to 24 hours: a UsageError.
  std::chrono::milliseconds shutdown_report_after{5000};

  /// A signal (e.g. SIGUSR2) that makes the runtime write a fiber dump
  /// (Runtime::dump) to stderr; 0 means CORESCHED_DUMP_SIGNAL (a name such
  /// as "SIGUSR2" or "USR2", or a number) or none. The handler only writes a
  /// byte to a pipe; a thread of the runtime library writes the dump, so it is
  /// safe whatever the signal interrupts. SIGKILL, SIGSTOP, the fault signals
  /// (SIGSEGV, which reports a fiber's stack overflow; SIGBUS, SIGILL,
  /// SIGFPE) and unknown names or numbers are a UsageError.
  int dump_signal = 0;
};

/// Name of a policy, as used on command lines ("core_vruntime", "forceidle_balance").
const char* to_string(FairnessPolicy p) noexcept;
/// Name of a placement ("mask", "scan").
const char* to_string(Placement p) noexcept;
/// Name of an I/O backend ("auto", "io_uring", "epoll").
const char* to_string(IoBackend b) noexcept;

} // namespace coresched
