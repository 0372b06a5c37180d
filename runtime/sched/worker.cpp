// SPDX-License-Identifier: Apache-2.0
#include "sched/worker.hpp"

#include "platform/clock.hpp"
#include "platform/cookie_registry.hpp"
#include "fiber/fiber_vtime.hpp"
#include "platform/hwloc_handle.hpp"
#include "platform/log.hpp"
#include "fiber/sanitizer.hpp"
#include "sched/worker_host.hpp"
#include "sched/stack_guard.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <string>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>

namespace coresched::detail {

constinit thread_local Worker* tls_worker = nullptr;
namespace {
constinit const std::atomic<bool> kNeverPreempt{false};
constinit const unsigned kNoIoFlags = 0;
constinit const unsigned kAskBackFlags = Reactor::kReapFlags;
} // namespace
constinit thread_local PreemptWatch tls_watch{&kNeverPreempt, &kNoIoFlags};

void watch_worker(Worker* w) noexcept {
  if (!w) {
    tls_watch = {&kNeverPreempt, &kNoIoFlags};
    return;
  }
  tls_watch.flag = &w->sibling().preempt;
  watch_ring(*w, false);
}

void watch_ring(Worker& w, bool ask_back) noexcept {
  if (ask_back) tls_watch.io_flags = &kAskBackFlags;
  else tls_watch.io_flags = w.io_watch_word();
}

bool watching_for_ask_back() noexcept { return tls_watch.io_flags == &kAskBackFlags; }

namespace {
// Sets one of the worker's flags about the wake-ups made in its scope (the
// runtime's own: Worker::waking_for_runtime; collected at a preemption point:
// Worker::collecting_early), until the scope ends however it ends.
class FlagScope {
public:
  explicit FlagScope(bool& flag) noexcept : flag_(flag) { flag_ = true; }
  ~FlagScope() { flag_ = false; }
  FlagScope(const FlagScope&) = delete;
  FlagScope& operator=(const FlagScope&) = delete;

private:
  bool& flag_;
};
} // namespace

Worker::Worker(WorkerHost& host, const PuInfo& pu, CoreCoordinator& core, unsigned sibling,
               SharedStackPool& stacks, RecordDepot& records)
    : host_(host), pu_(pu), index_(pu.index), core_(core), sibling_(sibling), sib_(&core.sibling(sibling)),
      ring_spawns_(core.single_pu() && host.topology().pus().size() > 1), stacks_(stacks), records_(records),
      steal_grace_(host.topology().cores().size()),
      ticks_(&host.tick_counter()),
      trace_(host.trace() ? &host.trace()->ring(pu.index) : nullptr) {
  idle_ctx_.is_task = false;
  idle_ctx_.fresh = false;
}

void Worker::reserve_fiber_ids() noexcept {
  // Ids come in blocks, so a spawn takes no shared atomic.
  constexpr std::uint64_t kIdBlock = 256;
  next_id_ = new_fiber_ids(kIdBlock);
  id_end_ = next_id_ + kIdBlock;
}

std::uint64_t Worker::thread_cpu_ns() const noexcept {
  timespec ts{};
  if (clock_gettime(cpu_clock_, &ts) != 0) return 0;
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

// A futex wait is a lock (the application's, the C++ runtime's, a
// sanitizer's), and the calls that change the memory map wait only for the
// process's memory-map lock (the runtime maps and returns fiber stacks
// between fibers, a sanitizer its shadow): the lock's holder is what to look
// at. On a loaded machine a holder descheduled for tens of ms had a worker
// reported as blocked in madvise by the fiber it had just switched from.
bool Worker::blocks_worker(long syscall_nr) noexcept {
  switch (syscall_nr) {
  case SYS_futex:
  case SYS_mmap:
  case SYS_munmap:
  case SYS_mprotect:
  case SYS_madvise:
  case SYS_process_madvise:
  case SYS_mremap:
  case SYS_brk:
    return false;
  default:
    return syscall_nr >= 0;
  }
}

// /proc/<tid>/syscall reads "running" (also while it waits for a CPU),
// "-1 ..." (blocked outside a system call) or the number of the call the
// thread is blocked in, then its arguments.
int Worker::blocking_syscall() const noexcept {
  char path[64], text[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/syscall", static_cast<int>(tid_));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return -1;
  text[n] = '\0';
  char* end = nullptr;
  const long nr = std::strtol(text, &end, 10);
  if (end == text || !blocks_worker(nr)) return -1;
  return static_cast<int>(nr);
}

__attribute__((noinline)) Worker* Worker::current() noexcept {
  Worker* w = tls_worker;
  asm volatile("" ::: "memory");
  return w;
}

void Worker::start() {
  thread_ = std::thread([this] { thread_main(); });
}

std::string Worker::wait_ready() {
  while (ready_.load(std::memory_order_acquire) == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  return ready_.load(std::memory_order_acquire) > 0 ? std::string() : init_error_;
}

void Worker::join() {
  if (thread_.joinable()) thread_.join();
}

void Worker::bind_to_cpu() {
  const std::string name = "coresched-w" + std::to_string(pu_.index);
  pthread_setname_np(pthread_self(), name.c_str());
  const auto& hw = host_.topology().platform();
  if (hw) {
    // Real machine: bind with hwloc to the PU's cpuset.
    hwloc_obj_t obj = hwloc_get_pu_obj_by_os_index(hw->topo, pu_.os_index);
    if (obj && hwloc_set_cpubind(hw->topo, obj->cpuset, HWLOC_CPUBIND_THREAD) == 0) return;
    log().warn("worker {}: hwloc could not bind to PU {}; falling back to sched_setaffinity", pu_.index,
               pu_.os_index);
  }
  // Synthetic PUs are not CPUs (hwloc binding on them does nothing): pin to the mapped real CPU.
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(pu_.cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0)
    log().warn("worker {}: cannot pin to CPU {}", pu_.index, pu_.cpu);
}

void Worker::thread_main() {
  const AltSignalStack alt_stack; // where the stack overflow report runs
  pthread_getcpuclockid(pthread_self(), &cpu_clock_);
  tid_ = static_cast<pid_t>(::syscall(SYS_gettid));
  tls_worker = this;
  current_ = &idle_ctx_;
  thread_state_ = ThreadState::of_this_thread();
  san::adopt_thread(idle_ctx_);
  bind_to_cpu();
  try {
    make_reactor(io_, host_.io_backend(), host_.blocking_pool());
  } catch (const std::exception& e) {
    init_error_ = e.what();
    ready_.store(-1, std::memory_order_release);
    return;
  }
  sibling().ring.store(io_.get(), std::memory_order_release);
  io_watch_word_ = io_->flags_completions() ? io_->kernel_flags() : &kNoIoFlags;
  watch_worker(this); // (the ring's flags exist from here)
  log().debug("worker {} started on CPU {} (core {}, sibling {}), I/O {}", pu_.index, pu_.cpu, pu_.core,
              sibling_, io_->describe());
  ready_.store(1, std::memory_order_release);
  idle_loop();
  drain_ring();
  books_.close_segment(now_ns());
  if (trace_) trace_run(nullptr);
  tls_worker = nullptr;
  watch_worker(nullptr);
}

// ---------------------------------------------------------------- switching

void Worker::begin_run(Fiber* f) {
  f->state.store(FiberState::running, std::memory_order_relaxed);
  publish_vtime(f);
  f->last_worker = index_;
  running_id.store(f->id, std::memory_order_relaxed);
  if (books_.needs_segment(f->cookie)) [[unlikely]]
    open_segment(f->cookie);
  books_.count_run();
  if (trace_) [[unlikely]]
    trace_run(f);
  check_isolation(f);
}

// Within-cookie fairness (fiber_vtime.hpp): `f` starts or goes on running
// here, so the PU's floor is at least its vtime.
void Worker::publish_vtime(const Fiber* f) noexcept {
  if (vtime::before(sib_->vfloor.load(std::memory_order_relaxed), f->vtime))
    sib_->vfloor.store(f->vtime, std::memory_order_relaxed);
}

// The ticks that passed since `f` started (or was last charged): its run,
// sampled (fiber_vtime.hpp). At most kMaxLead per run: `f` started at or
// below the floor, so it never goes back to a queue more than kMaxLead ahead
// of it (a fiber that ran for seconds without a preemption point must not
// then wait for seconds).
void Worker::charge(Fiber* f) noexcept {
  const std::uint32_t t = ticks_->load(std::memory_order_relaxed);
  const std::uint32_t ran = t - run_tick_;
  f->vtime += ran < vtime::kMaxLead ? ran : vtime::kMaxLead;
  run_tick_ = t;
}

// Trace: ends the open run span and, for a task fiber, opens the next one.
void Worker::trace_run(const Fiber* f) noexcept {
  const std::uint64_t now = now_ns();
  if (trace_open_) trace_->record({trace_since_, now - trace_since_, trace_fiber_, trace_cookie_, 0, TraceKind::run});
  trace_open_ = f != nullptr;
  if (!f) return;
  trace_since_ = now;
  trace_fiber_ = f->id;
  trace_cookie_ = f->cookie;
  if (f->cookie != trace_last_cookie_) {
    trace_last_cookie_ = f->cookie;
    trace_->record({now, 0, 0, f->cookie, 0, TraceKind::cookie_change});
  }
}

// The isolation checker (test builds): called whenever this PU publishes a
// cookie and resumes user code with it.
void Worker::check_isolation([[maybe_unused]] const Fiber* f) {
#ifdef CORESCHED_ISOLATION_CHECK
  if (core_.sibling_conflict(sibling_, f->cookie)) {
    host_.isolation_violations.fetch_add(1, std::memory_order_relaxed);
    log().error("isolation violation: core {} sibling {} runs cookie {} beside another cookie", core_.index(),
                sibling_, cookie_label(f->cookie));
  }
#endif
}

void Worker::switch_to(Fiber* next, After after) {
  if (next->fresh && !give_stack(next)) [[unlikely]] {
    wait_for_stack(next);
    if (!current_->is_task) return; // the idle loop picks again after a pause
    next = &idle_ctx_;
  }
  prev_ = current_;
  after_ = after;
  current_ = next;
  if (next->is_task) {
    if (!prev_->is_task) {
      busy.store(true, std::memory_order_seq_cst); // pairs with the ticker's last look before it stops (ticker.cpp)
      host_.note_busy();
      run_tick_ = ticks_->load(std::memory_order_relaxed); // from a task fiber, charge() has just set it
    }
    count_switch();
    begin_run(next);
  } else {
    busy.store(false, std::memory_order_relaxed);
    if (trace_) [[unlikely]]
      trace_run(nullptr);
  }
  // A fiber queued by yield() may still be saving its context on its old worker.
  while (!next->context_saved.load(std::memory_order_acquire)) _mm_pause();
  jump(*prev_, *next, after == After::retire);
}

// The one fiber-to-fiber jump. The thread's exception state and errno go with
// the fiber that owns them (eh_state.hpp); the sanitizers are told about the stacks.
void Worker::jump(Fiber& from, Fiber& to, bool from_ends) {
  thread_state_.save(from.carried);
  san::before_switch(from, to, from_ends);
  ctx::transfer_t t = ctx::jump_fcontext(to.context, nullptr);
  // We may now be on another worker's thread: re-read it.
  Worker::current()->after_resume(t.fctx);
}

// Runs on the context that was switched to: saves the previous context and
// finishes what the previous fiber could not do while still on its stack.
void Worker::after_resume(ctx::fcontext_t from) {
  Fiber* p = prev_;
  if (from) san::after_switch(*current_, *p);
  p->context = from;
  switch (after_) {
  case After::none:
    break;
  case After::requeue:
    p->context_saved.store(true, std::memory_order_release);
    break;
  case After::park: {
    FiberState expected = FiberState::parking;
    if (!p->state.compare_exchange_strong(expected, FiberState::parked, std::memory_order_acq_rel)) {
      p->state.store(FiberState::runnable, std::memory_order_relaxed); // woken while parking
      const FlagScope own(waking_for_runtime_); // its waker is elsewhere, not the fiber that runs now
      host_.place(p);
    }
    break;
  }
  case After::retire:
    san::retire(*p);
    if (p->stack) p->stack.header()->running.store(nullptr, std::memory_order_release);
    stacks_.put(std::exchange(p->stack, Stack{}));
    recycle(p);
    count_retired();
    break;
  }
  after_ = After::none;
  thread_state_.load(current_->carried); // last: nothing after this may make a system call
}

// The owner-only queue may hold fibers only while no other worker could run
// them: none is idle, or every one of them (and `adding`) is pinned here.
bool Worker::local_ok(const Fiber* adding) const noexcept {
  if (!core_.single_pu() || core_.queued_hint() != 0 || io_->inflight() != 0) return false;
  if (!host_.idle_hint()) return true;
  return local_.unpinned() == 0 && (!adding || adding->pinned != kNotPinned);
}

// Reaps I/O completions and wakes their fibers. Called at every scheduling
// point while operations are in flight, and by the idle loop.
void Worker::poll_io() {
  // Deferred SQEs without an operation in flight: a cancel whose target has
  // just completed, a re-armed wake-up. They still need their submission, as
  // does work another thread posted (a moved RecvStream's old buffers to
  // unregister; on the single-PU fast path, which does not come here, they
  // wait for the worker's next I/O or idle spell: memory, not a fiber, waits).
  if (io_->inflight() == 0 && !io_->deferring() && !io_->remote_pending()) return;
  if (host_.stopping() && !stop_cancelled_) {
    io_->cancel_all(); // shutdown: sleeping and blocked fibers return operation_canceled
    stop_cancelled_ = true;
  }
  // One io_uring_enter per operation cost more CPU per request than an epoll
  // server spends. While other fibers are runnable here their I/O joins the
  // queue, and the batch goes in one call when the worker runs dry, or once
  // the oldest has waited IoRing::kMaxDeferNs (a fiber that runs on
  // meanwhile is asked back at its first preemption point: ask_back_for_io).
  const bool runnable_here = !local_.empty() || core_.queued_hint() > 0;
  reap_and_wake(!runnable_here);
}

std::size_t Worker::reap_and_wake(bool submit_now) {
  io_->reap(io_done_, submit_now);
  const std::size_t n = io_done_.size();
  {
    const FlagScope own(waking_for_runtime_);
    for (Fiber* f : io_done_) wake_fiber(f);
  }
  io_done_.clear();
  return n;
}

// From a preemption point: the kernel holds completions for this ring, or
// SQEs wait here. The fiber has reached a point where it may stop, so this is
// where both go through, at once.
// Returns true when nothing asks the fiber to stop: it runs on. A fiber
// woken by what the runner collects as it submits what was held back for it
// (the I/O of the fibers that ran just before it) asks it only at the next
// tick (Arrival::collected). A completion that comes later (a timer, data
// on a socket) preempts at once.
__attribute__((noinline)) bool Worker::collect_io() {
  const bool ask_back = watching_for_ask_back();
  watch_ring(*this, false);
  if (ask_back) {
    const FlagScope collecting(collecting_);
    reap_and_wake(true);
  } else {
    reap_and_wake(true);
  }
  restore_errno();
  return !sibling().preempt.load(std::memory_order_relaxed);
}

// The worker leaves its loop once no fiber is live, but a request whose fiber
// is gone may still be in the kernel: the multishot recv of a RecvStream
// destroyed as the runtime shut down, whose last completion frees the
// stream's state and buffers. Cancel what is left and reap it here, on the
// ring's own thread, for at most a second (the kernel answers a cancellation
// at once; the bound only keeps a misbehaving kernel from hanging shutdown).
void Worker::drain_ring() {
  io_->cancel_all();
  const std::uint64_t deadline = now_ns() + 1'000'000'000;
  while (io_->inflight() > 0 && now_ns() < deadline) {
    io_->wait_for(io_done_, 10'000'000);
    io_done_.clear(); // no fiber is live: nothing to wake
  }
  io_->reap(io_done_, true); // work posted meanwhile (buffers to unregister)
  io_done_.clear();
}

void Worker::spill_local_locked() {
  while (Fiber* f = local_.pop()) core_.requeue_locked(sibling_, f);
}

bool Worker::enqueue_spawned(Fiber* f) {
  f->vtime = sib_->vfloor.load(std::memory_order_relaxed); // Arrival::spawned, as enqueue_locked gives it
  // A fiber another worker may run goes on the spawn ring, where a thief
  // finds it without the core lock (spawn_ring.hpp). Always, not only while
  // a worker is idle: a worker that goes idle just after the spawn must still
  // see it. On the private queue, a spawner that runs on without a
  // preemption point would keep them from a worker that went to sleep
  // meanwhile, for the whole run, and from the rescue ("fibers spawned while
  // another worker idles are stolen while their spawner runs on").
  if (ring_spawns_ && f->pinned == kNotPinned) {
    if (core_.push_spawned(f)) return true;
  } else if (local_ok(f)) {
    local_.push(f); // pinned here, or the runtime's only worker
    return false;
  }
  WakeList wakes;
  core_.lock().lock();
  spill_local_locked();
  core_.drain_spawned_locked(sibling_); // the ring is full: it goes first, in spawn order
  const bool needs_tick = core_.enqueue_locked(sibling_, f, wakes, Arrival::spawned);
  core_.lock().unlock();
  wakes.notify();
  if (needs_tick) host_.want_fine_ticks();
  return false;
}

Pick Worker::pick() {
  affine_pending_ = false; // the running fiber blocks or ends: what it woke runs next
  poll_io();
  if (!local_.empty() && local_ok()) {
    Pick p;
    p.kind = Pick::Kind::run;
    p.fiber = local_.pop();
    Sibling& me = sibling();
    if (me.preempt.load(std::memory_order_relaxed)) me.preempt.store(false, std::memory_order_relaxed);
    core_.publish_single_pu(me, p.fiber->cookie); // local_ok(): a single-PU core
    ask_back_for_io();
    return p;
  }
  WakeList wakes;
  core_.lock().lock();
  spill_local_locked();
  Pick p = core_.pick_locked(sibling_, wakes);
  core_.lock().unlock();
  wakes.notify();
  if (trace_ && p.handover_gap_ns != Pick::kNoGap) [[unlikely]] trace_handover(p);
  return p.kind == Pick::Kind::run ? before_run(p) : p;
}

// A fiber is about to run while this worker holds SQEs back for a batch. If
// it last stopped at a preemption point that asked it to (a runner), no
// batch forms behind it: the SQEs go in now, and if their completions woke a
// fiber, the pick is made again in vtime order, where the woken one may
// lead. Two fibers passing a byte through pipes beside a runner on one PU
// then take turns with it as the kernel's threads do (0.44 of the runner's
// work, 270-290 k round trips a second, coresched-io-beside-bench), where
// each round trip waited for the runner's tick (1.4-1.5 k a second).
// Otherwise the fiber submits them at its first preemption point.
Pick Worker::before_run(Pick p) {
  if (io_->deferring() && p.fiber->ran_out && reap_and_wake(true) > 0) [[unlikely]] {
    WakeList wakes;
    core_.lock().lock();
    p = core_.requeue_and_pick_locked(sibling_, p.fiber, Requeue::preempted, wakes);
    core_.lock().unlock();
    wakes.notify();
    if (p.kind != Pick::Kind::run) return p;
  }
  ask_back_for_io();
  return p;
}

// ---------------------------------------------------------------- fiber calls

void Worker::reschedule(Requeue how) {
  Fiber* self = current_;
  charge(self);
  if (!local_ok(self)) return reschedule_shared(self, how);
  // Single-PU fast path: nothing shared to look at, nobody idle to share with.
  Sibling& me = sibling();
  if (me.preempt.load(std::memory_order_relaxed)) me.preempt.store(false, std::memory_order_relaxed);
  if (local_.empty()) {
    count_switch();
    publish_vtime(self);
    return;
  }
  // As requeue_and_pick_locked, on the private queue (charge() keeps the
  // vtime within kMaxLead of the floor). A yield always lets the next one run.
  Fiber* next;
  if (how == Requeue::preempted) {
    local_.insert(self, self->vtime - vtime::kGranularity);
    next = local_.pop();
    if (next == self) { // it still leads the others by less than the granularity
      count_switch();
      publish_vtime(self);
      return;
    }
    if (next->fresh && !give_stack(next)) [[unlikely]] {
      local_.push(next); // no memory for its stack yet: `self` runs on
      local_.remove(self);
      return;
    }
  } else {
    next = local_.pop();
    if (next->fresh && !give_stack(next)) [[unlikely]] {
      local_.push(next); // no memory for its stack yet: `self` runs on
      return;
    }
    local_.push_behind_all(self);
  }
  core_.publish_single_pu(me, next->cookie); // local_ok(): a single-PU core
  // `self` is invisible to other workers until its context is saved.
  prev_ = self;
  after_ = After::none;
  current_ = next;
  count_switch();
  begin_run(next);
  jump(*self, *next, false);
}

// The running fiber woke a fiber onto this worker and runs on rather than
// block: both are runnable here while a worker elsewhere idles. Wake one to
// steal (after the thieves' grace, affine_grace.hpp), as Go's wakep would have
// at the wake-up itself; deferred to here, a waker that blocks pays nothing.
__attribute__((noinline)) void Worker::share_after_affine_wake() {
  affine_pending_ = false;
  if (core_.queued_hint() > 0 && host_.idle_hint()) host_.wake_helper(*this); // (not if a thief took it)
}

// Out of line: its locks and pick must not cost the fast path above a frame
// of its own and five saved registers.
__attribute__((noinline)) void Worker::reschedule_shared(Fiber* self, Requeue how) {
  // (A fiber woken wake-affine sits in the core's queue, so a waker that runs
  // on always comes this way, not the private-queue path above.)
  if (affine_pending_) [[unlikely]]
    share_after_affine_wake();
  poll_io();
  self->context_saved.store(false, std::memory_order_relaxed);
  self->state.store(FiberState::runnable, std::memory_order_relaxed);
  WakeList wakes;
  core_.lock().lock();
  spill_local_locked();
  Pick p = core_.requeue_and_pick_locked(sibling_, self, how, wakes);
  core_.lock().unlock();
  wakes.notify();
  if (trace_ && p.handover_gap_ns != Pick::kNoGap) [[unlikely]] trace_handover(p);
  if (p.kind == Pick::Kind::run) {
    if (p.fiber == self) ask_back_for_io();
    else p = before_run(p);
  }
  if (p.fiber == self) { // nothing else to run here, or it still leads by less than the granularity
    self->context_saved.store(true, std::memory_order_relaxed);
    self->state.store(FiberState::running, std::memory_order_relaxed);
    count_switch();
    publish_vtime(self);
    check_isolation(self); // it republished its cookie under the lock
    restore_errno();          // poll_io and the wake-ups made system calls
    return;
  }
  switch_to(p.kind == Pick::Kind::run ? p.fiber : &idle_ctx_, After::requeue);
}

void Worker::park(const WaitInfo& why) {
  save_errno();
  charge(current_);
  current_->ran_out = false;
  WaitInfo& w = current_->stack.header()->wait; // read by the dump while the fiber is parked
  w = why;
  w.since_ns = coarse_now_ns(); // for the dump only: a coarse read is a tenth of a precise one
  // The frame walk starts here, not at the saved context: the switch below
  // is built without frame pointers (it is on the yield path) and may use rbp
  // for data. Taking the address gives park() a frame of its own.
  w.frame = __builtin_frame_address(0);
  const Pick p = pick();
  switch_to(p.kind == Pick::Kind::run ? p.fiber : &idle_ctx_, After::park);
  asm volatile("" ::: "memory"); // not a tail call: park's frame must stay below its caller's while parked
}

} // namespace coresched::detail
