// SPDX-License-Identifier: Apache-2.0
// The scheduler: owns the workers, the per-core coordinators, the per-LLC idle
// masks and the timer thread; places new and woken fibers; steals for idle
// workers; shuts down in order.
#pragma once

#include "reactor/blocking_pool.hpp"
#include "platform/call_threads.hpp"
#include "core/core_claim.hpp"
#include "core/core_coordinator.hpp"
#include "platform/deadline_timer.hpp"
#include "fiber/fiber.hpp"
#include "core/placement.hpp"
#include "reactor/reactor.hpp"
#include "fiber/stack_pool.hpp"
#include "platform/ticker.hpp"
#include "platform/trace.hpp"
#include "sched/worker.hpp"
#include "sched/worker_host.hpp"

#include <coresched/options.hpp>
#include <coresched/runtime.hpp>
#include <coresched/stats.hpp>
#include <coresched/topology.hpp>

#include "sched/debug_registry.hpp"

#include <atomic>
#include <cstdio>
#include <memory>
#include <vector>

namespace coresched::detail {

/// Throws UsageError for a cookie value the runtime reserves (kNoCookie).
void check_cookie(std::uint64_t value);

/// The cookie a fiber spawned from a plain thread without one gets: the
/// blocking call's that the thread runs (tls_call_cookie), else untagged.
std::uint64_t plain_thread_cookie() noexcept;

class Scheduler final : public WorkerHost {
public:
  Scheduler(Options options, Runtime* owner);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const Options& options() const noexcept { return options_; }
  /// The I/O backend every worker uses, and why (chosen at construction).
  IoBackend io_backend() const noexcept override { return io_choice_.backend; }
  const std::string& io_backend_reason() const noexcept { return io_choice_.reason; }
  /// Threads for the epoll backend's blocking work (started on first use).
  BlockingPool& blocking_pool() noexcept override { return blocking_pool_; }
  /// Threads for coresched::blocking_call.
  CallThreads& call_threads() noexcept { return call_threads_; }
  const Topology& topology() const noexcept override { return topology_; }
  Runtime* owner() const noexcept { return owner_; }

  /// Allocates a fiber around a task and queues it.
  Task* spawn(const SpawnOptions& opts, std::size_t size, std::size_t align, void (*construct)(void*, void*),
              void* arg);
  /// Places a runnable fiber on a worker and queues it there.
  void place(Fiber* f, Arrival why = Arrival::woken) override;
  /// Queues `f` on worker `w`.
  void enqueue_on(unsigned w, Fiber* f, Arrival why);
  unsigned steal_for(Worker& thief, const Pick& p, Fiber** out) override;
  /// An exception ended a fiber nobody will join: Options::on_detached_exception,
  /// or a log line. Called in that fiber.
  void report_detached_exception(std::exception_ptr e) noexcept override;
  /// Where the fibers' timed sync waits keep their deadlines.
  DeadlineTimer& deadlines() noexcept { return deadlines_; }
  /// Fibers spawned and not yet finished (exact once nothing can spawn).
  std::uint64_t live_fibers() const noexcept;
  /// Fibers of this runtime that have finished so far.
  std::uint64_t retired_fibers() const noexcept override;
  /// The stacks every worker's pool gives back to (and the fail reserve).
  SharedStackPool& shared_stacks() noexcept override { return shared_stacks_; }
  // WorkerHost (documented there).
  bool wake_helper(const Worker& from, Help why = Help::queued) override;
  bool queued_elsewhere(const Worker& w) const noexcept override;
  void note_idle(const Worker& w, bool idle) noexcept override;
  /// The slice tick, `units` quarter slices after the last one (Ticker).
  Ticker::Seen tick(unsigned units);
  /// Ticks so far: the unit fibers are charged in (fiber_vtime.hpp).
  std::uint32_t ticks() const noexcept { return ticks_.load(std::memory_order_relaxed); }
  /// A worker became busy: make sure the tick runs (a restart ticks at the
  /// fine period for a hold). Not a poke each time: this is on the wake-up
  /// path, and a busy worker's backlog is seen at the next tick, fine or coarse.
  void note_busy() override { if (!ticker_->ticking()) ticker_->poke(); }
  /// A fiber begins I/O on a busy worker: its completion must be reaped
  /// within a quarter slice, so the tick must be fine (one relaxed load when it is).
  void want_fine_ticks() override { if (!ticker_->fine()) ticker_->poke(); }

  /// Chooses a worker for a woken fiber (mask or scan).
  unsigned choose_worker(const Fiber& f, unsigned prev) const;


  void shutdown();
  /// Wakes every sleeping worker (shutdown, start-up failure).
  void wake_all_workers();
  /// Whether a forced-idle PU woken at the end of the owner's turn watches
  /// for the hand-over a while before it sleeps again (forced_idle.cpp): only
  /// where its siblings are synthetic (other CPUs), not real SMT threads.
  bool watch_turn_end() const noexcept override { return !topology_.real_siblings(); }
  Stats stats();
  /// Writes every live fiber and every core to `out` (fiber_dump.cpp).
  void dump(std::FILE* out);
  /// The scheduling trace, or null when not tracing.
  Trace* trace() const noexcept override { return trace_.get(); }

private:
  void start_workers();
  void maybe_kernel_cookie();
  Worker* affine_worker(const Fiber& f) const noexcept;
  void place_affine(Worker& here, Fiber* f);
  void check_stall(Worker& w);
  static void reset_run(Worker& w) noexcept;
  /// The ticker moves fibers queued behind runners that ignore their
  /// preempt request (rescue.cpp).
  void rescue_queued();
  void rescue_one(Worker& stuck);
  Worker* rescue_target(const Worker& stuck, std::uint64_t cookie);
  void trace_wakeup(const Fiber& f, unsigned to) noexcept;
  void write_trace();
  /// Waits until no fiber is alive, reporting every Options::shutdown_report_after.
  void wait_for_fibers();

  Options options_;
  Runtime* owner_;
  Topology topology_;
  CoreClaim claim_; // before any worker starts; given back once they have stopped
  SharedStackPool shared_stacks_; // outlives the workers' pools, which give back to it
  std::unique_ptr<Trace> trace_; // null unless tracing
  IoBackendChoice io_choice_;
  // Declared before the workers: destroyed after them (a worker's reactor
  // hands it work until the worker ends).
  BlockingPool blocking_pool_;
  // Joined after the workers stop; shutdown first waits for the calls in
  // flight, whose last steps touch the cores and the workers.
  CallThreads call_threads_;
  std::vector<std::unique_ptr<CoreCoordinator>> cores_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unique_ptr<PlacementIndex> placement_;
  std::vector<std::vector<unsigned>> steal_order_;     // per worker: other cores, nearest first
  std::unique_ptr<Ticker> ticker_;
  DeadlineTimer deadlines_;
  std::uint64_t stall_ns_ = 0; // Options::stall_threshold; 0 = off
  bool wake_affine_ = true; // Options::wake_affine (or CORESCHED_WAKE_AFFINE=0)
  std::size_t default_stack_ = 0; // Options::stack_size in whole pages
  std::atomic<std::uint64_t> external_spawned_{0}; // spawns from threads that are not its workers
  std::atomic<unsigned> next_external_{0};
  bool shut_down_ = false;
  coresched_debug_runtime debug_{}; // this runtime in the process's list (debug_registry.hpp)
  std::mutex shutdown_mu_;
};

inline Scheduler& Worker::scheduler() noexcept { return static_cast<Scheduler&>(host_); }

} // namespace coresched::detail
