// SPDX-License-Identifier: Apache-2.0
// A worker: one thread pinned to one PU. It runs fibers by switching directly
// from fiber to fiber (one Boost.Context jump); when its core has nothing for
// it, it switches to its idle context (the thread's own stack), which spins
// briefly, steals, and then sleeps on a futex.
#pragma once

#include "core/affine_grace.hpp"
#include "platform/clock.hpp"
#include "core/core_coordinator.hpp"
#include "fiber/fiber.hpp"
#include "reactor/reactor.hpp"
#include "sched/cookie_books.hpp"
#include "sched/local_queue.hpp"
#include "platform/record_cache.hpp"
#include "fiber/stack_pool.hpp"
#include "platform/trace.hpp"

#include <coresched/stats.hpp>
#include <coresched/topology.hpp>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <sys/types.h>
#include <vector>
#include <thread>
#include <unordered_map>

namespace coresched::detail {

class Scheduler;
class Worker;
class WorkerHost;

namespace testing {
/// Benchmarks and tests only: idle workers never sleep (after their spin
/// window they sched_yield in a loop). Valgrind 3.19 runs a thread blocked in
/// io_uring_enter while holding its global lock, so a sleeping worker would
/// stall every other thread (bench/budget); a test uses it to keep workers in
/// their idle loop.
extern std::atomic<bool> idle_never_sleeps;
} // namespace testing

/// The calling thread's worker (null on plain threads). Read it only where no
/// fiber switch can intervene; elsewhere use Worker::current().
extern thread_local constinit Worker* tls_worker;

/// What this_fiber::preempt_point() reads, two words and no test for null:
/// the worker's preempt flag, and the word in which the kernel says that
/// completions wait in the worker's ring (Reactor::kernel_flags(), as Seastar's
/// need_preempt() also watches its I/O ring). On plain threads, and where the
/// ring does not raise the flag, they point at words that stay zero.
struct PreemptWatch {
  const std::atomic<bool>* flag;
  const unsigned* io_flags;
};
extern thread_local constinit PreemptWatch tls_watch;
/// Points this thread's watch at `w`'s words, or back at the zero words.
void watch_worker(Worker* w) noexcept;
/// Points the watch's second word at `w`'s ring, or (`ask_back`) at a word
/// that always reads as "completions wait", so that the running fiber stops
/// at its next preemption point to submit what `w` holds back, without
/// touching the shared preempt flag (Worker::ask_back_for_io).
void watch_ring(Worker& w, bool ask_back) noexcept;
/// Whether the watch was pointed at the ask-back word.
bool watching_for_ask_back() noexcept;

class Worker {
public:
  Worker(WorkerHost& host, const PuInfo& pu, CoreCoordinator& core, unsigned sibling, SharedStackPool& stacks,
         RecordDepot& records);
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  /// Starts the thread; wait_ready() then says whether its io_uring came up.
  void start();
  /// Blocks until the worker is running; returns an error text if it failed to start.
  std::string wait_ready();
  void join();

  /// The worker running the calling thread, or null. Never inlined: a fiber
  /// may resume on another thread, and the compiler must not cache the TLS
  /// address across a switch.
  static Worker* current() noexcept;
  /// The runtime's scheduler, for the layers above (api, sync, io); the
  /// worker itself asks only its WorkerHost (defined in scheduler.hpp).
  Scheduler& scheduler() noexcept;
  /// A fresh fiber id, from a block this worker reserved (worker thread only).
  std::uint64_t new_fiber_id() noexcept {
    if (next_id_ == id_end_) [[unlikely]]
      reserve_fiber_ids();
    return next_id_++;
  }
  /// Counts a fiber spawned on this worker (worker thread only).
  void count_spawned() noexcept { spawned_.store(spawned_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  /// Counts a fiber that finished on this worker (worker thread only).
  void count_retired() noexcept { retired_.store(retired_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  /// Fibers spawned and retired on this worker so far; each only grows
  /// (see Scheduler::live_fibers).
  std::uint64_t spawned_count() const noexcept { return spawned_.load(std::memory_order_acquire); }
  std::uint64_t retired_count() const noexcept { return retired_.load(std::memory_order_acquire); }
  /// This worker's free kRecordBytes blocks: fiber records and join blocks
  /// (use only on this worker's thread).
  RecordCache& records() noexcept { return records_; }
  /// Frees a retired fiber's scheduling record into this worker's cache
  /// (this worker's thread; every fiber record is a kRecordBytes block).
  void recycle(Fiber* f) noexcept {
    f->~Fiber();
    records_.put(f);
  }
  /// What this worker, as a thief, has seen of wake-affine placements (its thread only).
  AffineGrace& steal_grace() noexcept { return steal_grace_; }
  /// This worker's reactor: its I/O, timers and sleep (use only on this
  /// worker's thread, once it has started).
  Reactor& reactor() noexcept { return *io_.get(); }
  /// The word preempt_point() watches for this worker's completions: the
  /// reactor's flags word, or one that stays zero where it raises none
  /// (cached: read at every switch).
  const unsigned* io_watch_word() const noexcept { return io_watch_word_; }

  /// No fiber waits to run here (this worker's thread; its core's count is a hint).
  bool nothing_queued() const noexcept { return local_.empty() && core_.queued_hint() == 0; }
  /// The fiber running now (a task fiber, or the idle context).
  Fiber* running() const noexcept { return current_; }
  bool in_task() const noexcept { return current_ && current_->is_task; }

  // ---- called on the running fiber ----
  /// this_fiber::yield(): behind every other fiber of its cookie here.
  void yield() {
    save_errno();
    reschedule(Requeue::yielded);
  }
  /// A preemption point that found its flag set, or completions waiting in
  /// the ring (or SQEs held back: ask_back_for_io): what the ring holds is
  /// collected and SQEs held back go in; then, if the flag asks it to, the
  /// fiber goes back in vtime order, else it runs on.
  void preempt() {
    save_errno();
    if ((io_->needs_attention() || watching_for_ask_back()) && collect_io()) [[unlikely]]
      return;
    if (young_turn_holds()) [[unlikely]] {
      restore_errno();
      return;
    }
    current_->ran_out = true;
    reschedule(Requeue::preempted);
  }
  /// A pick kept the core's owner only for the rest of its least turn and
  /// asked to pick again once that has passed (Sibling::repick_at): until
  /// then a preemption point runs on, without the lock. One clock read.
  bool young_turn_holds() const noexcept {
    std::atomic_thread_fence(std::memory_order_acquire); // after preempt_point's read of the flag (ask_preempt)
    const std::uint64_t until = sib_->repick_at.load(std::memory_order_relaxed);
    return until != 0 && now_ns() < until;
  }
  /// yield() or preempt() without saving errno first (the caller saved it).
  void reschedule(Requeue how);
  /// errno is the fiber's own across every suspension: saved where a
  /// suspension begins, before the runtime's own system calls, and loaded
  /// when the fiber resumes (after_resume) or returns without a switch.
  void save_errno() noexcept { current_->carried.err = *thread_state_.err; }
  void restore_errno() noexcept { *thread_state_.err = current_->carried.err; }
  void restore_errno_of(const Fiber* f) noexcept { *thread_state_.err = f->carried.err; }
  /// Suspends the running fiber; its state must already be `parking`. `why`
  /// is what the fiber dump reports it waits for.
  void park(const WaitInfo& why);
  /// Runs `f`, the fiber of `j` that the running fiber is about to join, right
  /// here if it has not started and sits in this worker's queue with the same
  /// cookie: a call instead of two switches. Returns false if it could not.
  /// `f` may be stale (freed, or another fiber's by now): it is only compared
  /// until it is found queued here with `j` as its join record.
  bool run_inline(Fiber* f, const JoinRecord* j);
  /// The running fiber has just woken a fiber onto this worker to run next
  /// (Scheduler::place_affine) while a worker elsewhere is idle. If it blocks
  /// at its next scheduling point, the woken fiber runs here at once; if it
  /// runs on instead (reaches reschedule()), an idle worker is woken to share
  /// the work.
  void note_affine_wake() noexcept { affine_pending_ = true; }
  /// Fibers the runtime wakes itself (I/O completions it reaps; a wake-up
  /// that came while the fiber was still parking, placed once it has
  /// switched out) are not placed wake-affine: the running fiber did not wake
  /// them and may well run on.
  bool waking_for_runtime() const noexcept { return waking_for_runtime_; }
  /// The running fiber, just switched in, is submitting at its first
  /// preemption point what this worker held back for it (ask_back_for_io):
  /// the fibers the completions collected with it wake wait for the next
  /// tick to preempt it (Arrival::collected).
  bool collecting_early() const noexcept { return collecting_; }
  /// Queues a new fiber spawned by the running fiber on this worker. Returns
  /// whether it went on the core's spawn ring.
  bool enqueue_spawned(Fiber* f);
  /// Changes the running fiber's cookie, yielding if a sibling conflicts.
  void set_cookie(std::uint64_t cookie);
  /// The isolation rule's one gate back into user code that did not come
  /// through a pick: the running fiber resumes only once this PU publishes
  /// its cookie (republished under the core lock if it differs, or the fiber
  /// yields until a pick publishes it).
  void publish_running();

  unsigned index() const noexcept { return pu_.index; }
  unsigned sibling_index() const noexcept { return sibling_; }
  const PuInfo& pu() const noexcept { return pu_; }
  CoreCoordinator& core() noexcept { return core_; }
  Sibling& sibling() noexcept { return *sib_; }

  // ---- read by the scheduler and the ticker ----
  std::atomic<std::uint64_t> switches{0};
  std::atomic<bool> busy{false};   // running a task fiber
  std::atomic<std::uint64_t> running_id{0}; // id of the task fiber switched in last (for stall reports)
  std::uint64_t tick_seen = 0;     // ticker-private: switch count at the last tick that saw it move
  int ticks_same = 0;              // ticker-private
  bool stall_reported = false;     // ticker-private: this run was already reported
  bool backlog_shared = false;     // ticker-private: this run's backlog was offered to an idle worker
  std::uint64_t stall_cpu_base = 0; // ticker-private: thread CPU time when the run was first seen stuck (0: not yet)
  std::uint64_t stall_wall_base = 0; // ticker-private: the time then
  /// CPU time this worker's thread has used (a syscall; callable from any thread).
  std::uint64_t thread_cpu_ns() const noexcept;
  /// The system call the worker's thread is blocked in now (its number), or
  /// -1 if it runs, waits for a CPU, or waits in a call that blocks_worker()
  /// leaves out: callable from any thread; reads one /proc file.
  int blocking_syscall() const noexcept;
  /// Whether a thread asleep in system call `syscall_nr` is blocked by it (a
  /// stall to report), rather than waiting for a lock another thread holds.
  static bool blocks_worker(long syscall_nr) noexcept;
  std::atomic<std::uint64_t> stalls{0};
  std::atomic<std::uint64_t> rescued{0}; // fibers the ticker moved off this worker (rescue.cpp)

  /// Trace: this worker made `f` runnable on worker `to` (no-op when not tracing).
  void trace_wakeup(const Fiber& f, unsigned to) noexcept {
    if (trace_) [[unlikely]]
      trace_->record({now_ns(), 0, f.id, f.cookie, to, TraceKind::wakeup});
  }

  /// Any thread: this worker has I/O completions to collect or SQEs to
  /// submit, or (epoll) has not looked at its waits for a while.
  bool io_needs_attention(std::uint64_t now) const noexcept {
    const Reactor* r = sib_->ring.load(std::memory_order_acquire);
    return r && r->overdue(now);
  }
  /// Whether this worker's completions need the ticker (any thread): only
  /// where its reactor cannot flag them to preempt_point(); an epoll worker
  /// only while it does not look by itself.
  bool io_wants_ticks(std::uint64_t now) const noexcept {
    const Reactor* r = sib_->ring.load(std::memory_order_acquire);
    return r && r->inflight() > 0 && !r->flags_completions() && (r->pokes_ticker() || r->overdue(now));
  }

  /// Adds this worker's statistics to the snapshot.
  void collect(std::unordered_map<std::uint64_t, CookieStats>& cookies, WorkerStats& ws);

  /// What the fiber dump shows of a worker: its own fields, read from another
  /// thread without any lock (a stuck worker must not block the dump), so
  /// each may be a moment stale.
  struct View {
    const Fiber* running; // its current fiber (the idle context in the idle loop): not read here,
                          // the record may be recycled by the time the dump reads it
    bool idle, forced;
    std::uint64_t forced_since_ns, forced_wanted, forced_blocker;
    bool local_queue; // fibers on its private queue (single-PU cores)
  };
  View view() const noexcept;

private:
  enum class After { none, requeue, park, retire };

  void thread_main();
  void bind_to_cpu();
  void idle_loop();
  Fiber* find_work();
  bool steal_and_adopt(const Pick& p, bool unsleep);
  bool sleep_once();
  void switch_to(Fiber* next, After after);
  void jump(Fiber& from, Fiber& to, bool from_ends);
  void after_resume(ctx::fcontext_t from);
  bool give_stack(Fiber* f) noexcept;
  bool stack_deadlocked() noexcept;
  void wait_for_stack(Fiber* f);
  static void run_to_completion(Fiber* f, bool by_handle) noexcept;
  static void complete(Fiber* f, bool by_handle) noexcept;
  /// An exception ended a fiber nobody will join (in that fiber).
  [[gnu::cold, gnu::noinline]] static void report_detached(const std::exception_ptr& e) noexcept;
  static void run_next_after(Fiber* f);
  bool may_run_inline(const Fiber* parent, const Fiber* child) const noexcept;
  void begin_run(Fiber* f); // the caller counts the switch (count_switch), or not
  // One more fiber switched in: the slice tick's measure of a worker that
  // picks (Scheduler::tick). An inline join's child is not one (run_inline).
  void count_switch() noexcept { switches.store(switches.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  void reschedule_shared(Fiber* self, Requeue how);
  void share_after_affine_wake();
  void charge(Fiber* f) noexcept;
  void publish_vtime(const Fiber* f) noexcept;
  void check_isolation(const Fiber* f);
  Pick pick();
  [[noreturn]] static void fiber_main(ctx::transfer_t t);
  [[noreturn]] static void fiber_fail_main(ctx::transfer_t t);
  [[noreturn]] static void fiber_loop();
  [[gnu::cold]] void open_segment(std::uint64_t cookie); // cold: keeps begin_run's frame light
  void trace_run(const Fiber* f) noexcept;
  void enter_forced_idle(const Pick& p);
  bool handover_due() const noexcept;
  bool await_handover() noexcept;
  bool sleep_until_turn_end(std::uint64_t& due);
  void trace_handover(const Pick& p) noexcept;
  void leave_forced_idle();
  void set_idle(bool on);
  void poll_io();
  /// At exit: cancels and reaps the requests still in the kernel.
  void drain_ring();

  WorkerHost& host_; // the scheduler, as far as a worker may see it
  const PuInfo& pu_;
  unsigned index_; // pu_.index, cached for the switch path
  CoreCoordinator& core_;
  unsigned sibling_;
  Sibling* sib_; // this PU's slot in its core (cached: read on every yield)
  // Unpinned spawns go on the core's spawn ring: a single-PU core in a
  // runtime of more than one worker (SMT cores queue them under the lock).
  const bool ring_spawns_;
  StackPool stacks_;
  RecordCache records_;
  AffineGrace steal_grace_;
  // Written only by this worker, so a spawn on one worker and the fiber's end
  // on another touch no shared counter (a global one costs 8-14 % of a 1M
  // spawn run in cache misses).
  std::atomic<std::uint64_t> spawned_{0}, retired_{0};
  std::uint64_t next_id_ = 0, id_end_ = 0; // this worker's block of fiber ids
  void reserve_fiber_ids() noexcept;
  std::thread thread_;
  ReactorSlot io_; // built in the worker's thread (a DEFER_TASKRUN ring is waited on by its creator only)
  const unsigned* io_watch_word_ = nullptr;
  std::vector<Fiber*> io_done_; // scratch: fibers whose I/O completed
  bool stop_cancelled_ = false; // in-flight I/O was cancelled for shutdown
  std::atomic<int> ready_{0};   // 1 running, -1 failed (init_error_ says why)
  clockid_t cpu_clock_{};       // this thread's CPU-time clock, set before ready_
  pid_t tid_ = 0;               // this thread's id, set before ready_
  std::string init_error_;

  // Single-PU cores only: fibers only this worker may run (pinned here, or
  // spawned in a runtime of one worker), and the running fiber as it yields
  // while nothing else is queued. Owner-only, so yield and spawn+join take no
  // lock; spilled to the core's queue at a locked pick.
  LocalQueue local_;
  bool local_ok(const Fiber* adding = nullptr) const noexcept;
  std::size_t reap_and_wake(bool submit_now);
  Pick before_run(Pick p);
  bool collect_io();
  /// A fiber about to run while this worker holds SQEs back (poll_io's
  /// batching) stops at its first preemption point, where preempt() submits
  /// them and lets it run on: if it runs long they must not wait for it, and
  /// the ticker no longer looks for them. One that blocks first submits them
  /// with its own I/O. Through the watch's ring word, not the preempt flag:
  /// the fiber is not asked to yield, and nobody else's request is cleared.
  void ask_back_for_io() noexcept { watch_ring(*this, io_->deferring() && io_->asks_back()); }
  void spill_local_locked();

  Fiber idle_ctx_;
  ThreadState thread_state_;   // this thread's exception state and errno (eh_state.hpp)
  bool stack_starved_ = false; // a fiber could not get a stack: the idle loop backs off
  std::uint64_t starved_since_ = 0;   // when stacks last began to fail here (0: they do not), ns
  std::uint64_t starved_retired_ = 0; // the runtime's retired count then
  bool affine_pending_ = false; // see note_affine_wake
  bool waking_for_runtime_ = false; // see waking_for_runtime
  bool collecting_ = false;         // see collecting_early (set by collect_io for an ask-back)
  Fiber* current_ = nullptr;
  Fiber* prev_ = nullptr;
  std::uint32_t run_tick_ = 0; // the scheduler's tick count when the running fiber was last charged
  const std::atomic<std::uint32_t>* ticks_; // the scheduler's tick count (cached: read on every switch)
  After after_ = After::none;

  bool idle_ = false; // in the idle loop (published through the scheduler's placement index)
  std::uint64_t wake_latency_ns_ = 20'000; // EWMA of how late this worker's ring timer wakes it
  std::uint64_t stop_owner_at_ = 0; // spinning forced idle: when to ask the owner to stop (0: done or none)
  std::uint64_t turn_end_spun_ = 0; // forced idle: the turn's end last spun for (once each)

  TraceRing* trace_ = nullptr; // null unless tracing
  std::uint64_t trace_since_ = 0, trace_fiber_ = 0, trace_cookie_ = 0;
  bool trace_open_ = false;
  std::uint64_t trace_last_cookie_ = ~std::uint64_t{0};

  CookieBooks books_; // cpu time by run segment, forced idle suffered and caused
  std::atomic<std::uint64_t> steals_{0}, sleeps_{0};
};

} // namespace coresched::detail
