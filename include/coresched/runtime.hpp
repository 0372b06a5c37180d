// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime.hpp
/// The Runtime: one pinned worker thread per PU running fibers.

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
  /// @throws TopologyError on a bad topology, UsageError on bad options.
  explicit Runtime(Options options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// Runs `f` on a new fiber; callable from fibers and plain threads alike.
  /// @throws UsageError after shutdown or for a zero stack size.
  template <class F>
  JoinHandle<std::invoke_result_t<std::decay_t<F>&>> spawn(F&& f, const SpawnOptions& opts = {}) {
    using R = std::invoke_result_t<std::decay_t<F>&>;
    return JoinHandle<R>(detail::spawn_callable(sched_.get(), std::forward<F>(f), opts));
  }

  /// Waits for all fibers to finish (waking sleeping ones early), then joins
  /// the workers. Idempotent; the destructor calls it.
  void shutdown();

  /// The topology in use.
  const Topology& topology() const noexcept;
  /// The options in force (after environment overrides).
  const Options& options() const noexcept;
  /// A snapshot of the scheduling statistics.
  Stats stats() const;

  /// The runtime the calling fiber runs in, or null on a plain thread.
  static Runtime* current() noexcept;

private:
  std::unique_ptr<detail::Scheduler> sched_;
};

/// Spawns onto the runtime of the calling fiber.
/// @throws UsageError when called from a plain thread.
template <class F>
JoinHandle<std::invoke_result_t<std::decay_t<F>&>> spawn(F&& f, const SpawnOptions& opts = {}) {
  Runtime* rt = Runtime::current();
  if (!rt) throw UsageError("coresched::spawn() called outside a fiber; use Runtime::spawn()");
  return rt->spawn(std::forward<F>(f), opts);
}

} // namespace coresched
