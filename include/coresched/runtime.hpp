// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime.hpp
/// The Runtime: one pinned worker thread per PU running fibers.

#include <cstdio>
#include <coresched/join_handle.hpp>
#include <coresched/options.hpp>
#include <coresched/stats.hpp>
#include <coresched/topology.hpp>

#include <memory>
#include <type_traits>

namespace coresched {

/// An M:N fiber runtime with core scheduling. Construct it to start the
/// workers; destroy it (or call shutdown()) to wait for every fiber and join
/// the workers. Several runtimes may exist in one process.
class Runtime {
public:
  /// Discovers the topology and starts one pinned worker per PU.
  /// @throws TopologyError on a bad topology, UsageError on bad options,
  /// std::runtime_error when a worker cannot start (its io_uring, say).
  explicit Runtime(Options options = {});
  /// Calls shutdown(). Destroying a runtime from one of its own fibers cannot
  /// work and calls std::terminate().
  ~Runtime();
  /// Not copyable or movable: workers and fibers refer to the runtime by address.
  Runtime(const Runtime&) = delete;
  /// Not assignable, for the same reason.
  Runtime& operator=(const Runtime&) = delete;

  /// Runs `f` (moved or copied into the fiber) on a new fiber; callable from
  /// fibers and plain threads alike. A fiber spawned by a fiber of this runtime
  /// is queued on the spawner's worker (idle workers steal it); other spawns
  /// are spread over the workers, preferring idle ones.
  /// @throws UsageError after shutdown, for a zero stack size, an out-of-range
  /// pin_to_pu, or a callable aligned beyond alignof(std::max_align_t).
  template <class F>
  JoinHandle<std::invoke_result_t<std::decay_t<F>&>> spawn(F&& f, const SpawnOptions& opts = {}) {
    using R = std::invoke_result_t<std::decay_t<F>&>;
    return JoinHandle<R>(detail::spawn_callable(sched_.get(), std::forward<F>(f), opts));
  }

  /// Waits for all fibers to finish, then joins the workers, writes the trace
  /// (if any) and prints the statistics when CORESCHED_STATS=1. Sleeping fibers
  /// wake early, and I/O that does not complete at once, in flight or begun
  /// after shutdown began, returns operation_canceled: finish I/O that must
  /// complete before calling it, and stop loops on operation_canceled.
  /// Idempotent; the destructor calls it. Spawning afterwards is a UsageError.
  /// @throws UsageError when called from one of this runtime's own fibers.
  void shutdown();

  /// The topology in use.
  const Topology& topology() const noexcept;
  /// The options in force: `topology` holds the spec actually used (after
  /// CORESCHED_TOPOLOGY); the other fields are as given (environment
  /// fallbacks such as CORESCHED_TRACE are not written back).
  const Options& options() const noexcept;
  /// The I/O backend in use (never IoBackend::automatic: what it chose).
  IoBackend io_backend() const noexcept;
  /// Why that backend: "requested", "io_uring available", or why io_uring
  /// could not be used ("io_uring_setup: Operation not permitted", "the
  /// kernel's io_uring lacks opcode(s) ...").
  const std::string& io_backend_reason() const noexcept;
  /// A snapshot of the scheduling statistics; callable from any thread, before
  /// or after shutdown().
  Stats stats() const;
  /// Writes a fiber dump to `out`: per core its owner cookie, what each
  /// sibling runs or why it is forced idle, the queued fibers; then every
  /// started fiber with its cookie, state, worker, what a parked fiber waits
  /// for (join, a sync primitive, an io operation, a sleep) and for how long,
  /// and its frames (from its saved context, named with elfutils). Callable
  /// from any thread or fiber (a fiber's worker waits while a thread of its
  /// own writes it), also while the runtime is stuck: it never waits more
  /// than a moment for a lock, and what it reads may be a moment stale.
  /// Options::dump_signal makes a signal write one to stderr.
  /// @throws UsageError if `out` is null.
  void dump(std::FILE* out) const;

  /// The runtime the calling fiber runs in, or null on a plain thread.
  static Runtime* current() noexcept;

private:
  std::unique_ptr<detail::Scheduler> sched_;
};

/// Spawns onto the runtime of the calling fiber; see Runtime::spawn.
/// @throws UsageError when called from a plain thread.
template <class F>
JoinHandle<std::invoke_result_t<std::decay_t<F>&>> spawn(F&& f, const SpawnOptions& opts = {}) {
  Runtime* rt = Runtime::current();
  if (!rt) throw UsageError("coresched::spawn() called outside a fiber; use Runtime::spawn()");
  return rt->spawn(std::forward<F>(f), opts);
}

} // namespace coresched
