// SPDX-License-Identifier: Apache-2.0
// A fiber's life on its worker: it gets a stack, runs its user code, finishes,
// and hands its stack on. Everything here exists to keep one rule:
//
//   Every piece of a fiber's user code — its body, the destruction of its
//   callable, of a result and exception nobody will collect, a child run
//   inline — runs while its PU publishes that code's cookie.
//
// So user code runs in exactly one function, run_to_completion(), which returns
// only when nothing of the fiber's user state is left for the runtime to
// destroy; the worker picks what runs next only after it. The one other way
// back into user code without a pick — a joiner resuming after its child ran
// inline — passes through publish_running().
#include "fiber/local_values.hpp"
#include "platform/futex.hpp"
#include "platform/log.hpp"
#include "fiber/sanitizer.hpp"
#include "sched/worker_host.hpp"
#include "sched/worker.hpp"

#include <chrono>
#include <climits>
#include <cstdint>
#include <new>
#include <string>

namespace coresched::detail {

// ---------------------------------------------------------------- stacks

// A fiber gets its stack when it first runs. Each started fiber holds two
// kernel mappings (stack and guard page), so tens of thousands of started
// fibers can meet vm.max_map_count; the fiber then waits in the queue, under
// no cookie, until others finish — its user code has not begun, so nothing
// of it can run beside the wrong sibling, and nothing throws into the fiber
// that happened to be switching out.
//
// Waiting is right only while fibers do finish. Once none of the runtime has
// for kStackDeadlockNs, every fiber that could free a stack may be waiting for
// this one (a join chain that alternates cookies, so that no child runs
// inline, hangs at ~32,700 fibers): the fiber then fails instead. It starts on
// the runtime's reserve stack, where its callable is destroyed unrun, under
// its own cookie like any fiber's user code, and its join throws StackError.
namespace {
constexpr std::uint64_t kStackDeadlockNs = 1'000'000'000;
} // namespace

bool Worker::give_stack(Fiber* f) noexcept {
  try {
    f->stack = stacks_.get(mapped_stack_bytes(f->stack_size));
  } catch (const std::bad_alloc&) {
    if (!stack_deadlocked() || !host_.shared_stacks().take_reserve(f->stack)) {
      stack_starved_ = true;
      return false;
    }
    f->unstartable = true;
  }
  starved_since_ = 0;
  f->fresh = false;
  f->stack.header()->running.store(f, std::memory_order_release);
  san::assign_stack(*f, f->stack.base, f->stack.size);
  f->context = ctx::make_fcontext(f->stack.frames_top(), f->stack.size - kStackHeaderBytes,
                                  f->unstartable ? &Worker::fiber_fail_main : &Worker::fiber_main);
  return true;
}

// True once no fiber of the runtime has finished for kStackDeadlockNs while
// stacks failed here; any fiber finishing starts the wait again.
bool Worker::stack_deadlocked() noexcept {
  const std::uint64_t now = now_ns();
  const std::uint64_t retired = host_.retired_fibers();
  if (starved_since_ == 0 || retired != starved_retired_) {
    starved_since_ = now;
    starved_retired_ = retired;
    return false;
  }
  return now - starved_since_ >= kStackDeadlockNs;
}

void Worker::wait_for_stack(Fiber* f) {
  static std::atomic<std::uint64_t> last_warning{0};
  const std::uint64_t now = now_ns();
  std::uint64_t last = last_warning.load(std::memory_order_relaxed);
  if (now - last > 1'000'000'000 && last_warning.compare_exchange_strong(last, now))
    log().warn("no memory for the {} KiB stack of fiber {} (mmap failed: memory, address space, or "
               "vm.max_map_count where each stack holds its own mappings): it waits until other fibers finish, "
               "and fails with StackError if none does for a second", mapped_stack_bytes(f->stack_size) / 1024, f->id);
  core_.lock().lock();
  core_.requeue_locked(sibling_, f);
  core_.lock().unlock();
}

// The entry of a fiber that could not get a stack (give_stack): on the
// reserve stack, under its cookie, it fails instead of running, then the
// worker goes on as after any fiber that finished.
void Worker::fiber_fail_main(ctx::transfer_t t) {
  Worker::current()->after_resume(t.fctx);
  Fiber* f = Worker::current()->current_;
  { // destroyed before the loop below, which never returns
    const std::string what = "coresched: fiber " + std::to_string(f->id) + " never ran: no memory for its " +
                             std::to_string(mapped_stack_bytes(f->stack_size) / 1024) +
                             " KiB stack (mmap failed) and no fiber finished for a second to free one; where "
                             "each stack holds its own mappings (before Linux 6.13, or a stack of another size), "
                             "raise vm.max_map_count (sysctl); or keep fewer fibers started at once";
    log().error("{}", what);
    f->join->task()->fail(std::make_exception_ptr(StackError(what)));
  }
  complete(f, false);
  run_next_after(f);
  fiber_loop();
}

// ---------------------------------------------------------------- user code

// The only place a fiber's user code runs, and where its life as a fiber
// ends. Task::run() calls the callable and destroys it; a result or exception
// that no handle will collect is destroyed here too, under the fiber's
// cookie, before the fiber is marked done (a handle dropped after that
// destroys it in its owner's context: release_task). Only then is the joiner
// woken, and only after this returns does the worker pick anything else.
// Static: the fiber may have migrated in any of it, so no worker is cached.
//
// `by_handle`: run inline by the joiner (run_inline), which holds the handle
// and is waiting in join() right beneath on this stack. Then nobody else can
// be waiting for the fiber, drop its handle or collect its result until this
// returns, so the handshake below has nobody to meet: `done` is set and the
// fiber's reference dropped with plain stores (spawn+join pays for every
// instruction here).
void Worker::run_to_completion(Fiber* f, bool by_handle) noexcept {
  JoinRecord* j = f->join;
  j->task()->run();
  if (j->locals) [[unlikely]]
    destroy_locals(*j); // the fiber's own code too: here, under its cookie
  complete(f, by_handle);
}

// What follows a fiber's user code (or its failure to start): it is done, its
// joiner is woken. Inlined into run_to_completion, the path every fiber takes.
[[gnu::always_inline]] inline void Worker::complete(Fiber* f, bool by_handle) noexcept {
  JoinRecord* j = f->join;
  if (by_handle) {
    f->state.store(FiberState::done, std::memory_order_relaxed);
    j->done.store(1, std::memory_order_relaxed);
    j->refs.store(1, std::memory_order_relaxed); // the handle's
    return;
  }
  j->lock.lock();
  if (j->handle_gone) {
    // handle_gone never goes back to false, and with the handle gone nobody
    // can read the result or wait for `done` meanwhile.
    j->lock.unlock();
    if (j->task()->error) [[unlikely]]
      report_detached(j->task()->error);
    j->task()->discard_result();
    j->lock.lock();
  }
  // Only now: the report and the result's destructors above are the fiber's
  // own code, and may suspend it like any code of the fiber.
  f->state.store(FiberState::done, std::memory_order_relaxed);
  j->done.store(1, std::memory_order_release);
  Fiber* joiner = std::exchange(j->joiner, nullptr);
  const bool thread_waits = j->thread_joiner;
  j->lock.unlock();
  if (thread_waits) futex_wake(j->done, INT_MAX); // a plain thread is blocked in join
  if (joiner) wake_fiber(joiner);
  // The fiber's reference goes last: the futex word above lives in `j`. If the
  // handle is gone too, this frees the block (only empty task state is left).
  release_join(j);
}

void Worker::report_detached(const std::exception_ptr& e) noexcept {
  Worker::current()->host_.report_detached_exception(e);
}

void Worker::fiber_main(ctx::transfer_t t) {
  Worker::current()->after_resume(t.fctx);
  fiber_loop();
}

// The body of every fiber stack. When a fiber finishes and the next one has
// never run, the next one is adopted onto this same stack: no switch, no new
// context. That makes spawn+join of short fibers little more than a call.
void Worker::fiber_loop() {
  for (;;) {
    Fiber* f = Worker::current()->current_;
    run_to_completion(f, false);
    run_next_after(f);
  }
}

// After `f` finished on this stack: a next fiber that has never run is adopted
// onto it (return: the caller runs it), anything else is switched to (no return).
[[gnu::always_inline]] inline void Worker::run_next_after(Fiber* f) {
  Worker* w = Worker::current(); // the fiber may have migrated
  const Pick p = w->pick();
  Fiber* next = p.kind == Pick::Kind::run ? p.fiber : &w->idle_ctx_;
  if (next->fresh && mapped_stack_bytes(next->stack_size) == f->stack.size) {
    next->fresh = false;
    next->stack = std::exchange(f->stack, Stack{});
    next->stack.header()->running.store(next, std::memory_order_release);
    san::hand_over_stack(*f, *next);
    w->prev_ = f;
    w->after_ = After::retire;
    w->current_ = next;
    w->count_switch();
    w->begin_run(next);
    w->after_resume(nullptr);
    return;
  }
  w->switch_to(next, After::retire);
  __builtin_unreachable();
}

// ---------------------------------------------------------------- inline join

// A child runs inline on its joiner's frame only where nothing observable
// differs from running it on its own: the same cookie (the PU already
// publishes it), at least the stack it asked for left below the joiner's
// frame (it runs there; mapped_stack_bytes says why there usually is), its
// own exception state and errno (run_inline swaps them), and the joiner's pin (if the child blocks, the joiner's frame goes wherever the
// child resumes). An unpinned child of a pinned joiner is pinned with it for
// that run: it may run anywhere, so here is fine. The room is measured here,
// on the joiner's stack (an inline child's `stack` is the one it borrowed),
// less kInlineSlack for the frames between this one and the child's body.
// Comparing the child's ask with the joiner's whole stack instead would let
// a chain of inline joins overflow stacks that each fit its ask.
namespace {
// The stack pointer: one instruction, where __builtin_frame_address would
// make the caller set up a frame pointer.
inline std::uintptr_t stack_pointer() noexcept {
#if defined(__x86_64__)
  std::uintptr_t sp;
  asm("mov %%rsp, %0" : "=r"(sp));
  return sp;
#else
  return reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
#endif
}
} // namespace

bool Worker::may_run_inline(const Fiber* parent, const Fiber* child) const noexcept {
  constexpr std::uintptr_t kInlineSlack = 1024;
  const std::uintptr_t here = stack_pointer();
  const auto base = reinterpret_cast<std::uintptr_t>(parent->stack.base);
  // No overflow: addresses are below 2^48 and an ask at most kMaxStackBytes.
  return child->cookie == parent->cookie && base + child->stack_size + kInlineSlack <= here &&
         (child->pinned == kNotPinned || child->pinned == parent->pinned);
}

bool Worker::run_inline(Fiber* f, const JoinRecord* j) {
  // Asked to stop (a slice end, another cookie due on the core): the joiner
  // parks instead, and the pick that follows reconsiders the core; the child,
  // still queued, runs in its turn. So a join is a preemption point, and a
  // loop that spawns and joins without one is not left running for ever.
  if (sib_->preempt.load(std::memory_order_relaxed)) return false;
  Fiber* parent = current_;
  // Only a child still queued here is certainly not running elsewhere; its
  // fields may be read only once that is established. Then `join` says
  // whether it is still the fiber of `j`: the record may have been freed and
  // reused by another fiber since the joiner read it.
  bool mine = false;
  if (local_.find_and_remove(f, [j](const Fiber* x) { return x->join == j && x->fresh; }, mine)) {
  } else if (core_.take_spawned_if_oldest(f)) {
    // Off the spawn ring without the lock (spawned while another worker
    // idled, and not stolen): the fiber there is ours now, so its fields may
    // be read. Another fiber reusing the address goes back.
    mine = f->join == j && f->fresh;
    if (!mine) [[unlikely]] {
      core_.lock().lock();
      core_.requeue_locked(sibling_, f);
      core_.lock().unlock();
    }
  } else {
    core_.lock().lock();
    mine = core_.remove_unstarted_locked(sibling_, f, j);
    core_.lock().unlock();
  }
  if (!mine) return false;
  if (!may_run_inline(parent, f)) {
    enqueue_spawned(f); // it runs on its own; the joiner waits for it
    return false;
  }
  f->pinned = parent->pinned;
  // The child borrows the parent's stack. If it blocks, the parent (which
  // is waiting for it anyway) is suspended underneath it.
  f->fresh = false;
  san::borrow_stack(*parent, *f);
  f->stack = parent->stack; // borrowed: named in a stack overflow report, never freed by the child
  parent->inline_child = f; // the fiber dump finds the child through its joiner
  // The child starts as on a stack of its own: outside the joiner's catch
  // blocks and unwinding, and the joiner gets its own state back after.
  save_errno();
  const bool handling = thread_state_.handling(); // rarely: then swap the exception state too
  if (handling) [[unlikely]] {
    thread_state_.save(parent->carried);
    thread_state_.load(CarriedState{});
  }
  current_ = f;
  // Not a switch for the slice tick (Scheduler::tick), which asks a worker to
  // yield once its switch count has stood still for a slice: an inline run is
  // a call, and no pick reconsiders the core's cookie or queue. Counted, it
  // would keep a joiner that spawns and joins between preemption points from
  // ever being asked to stop: with every sibling of a core running such
  // joiners of one cookie, a waiting cookie would never own the core, and
  // fibers queued behind one would wait as long (the rescue too reads the
  // count). The child's own switches, if it blocks, are counted.
  begin_run(f);
  run_to_completion(f, true);
  Worker* w = Worker::current(); // the child may have migrated, and the parent with it
  if (handling) [[unlikely]]
    w->thread_state_.load(parent->carried);
  else
    w->restore_errno_of(parent);
  f->stack = Stack{};
  parent->inline_child = nullptr;
  w->current_ = parent;
  w->running_id.store(parent->id, std::memory_order_relaxed);
  if (w->trace_) [[unlikely]]
    w->trace_run(parent);
  parent->state.store(FiberState::running, std::memory_order_relaxed);
  parent->last_worker = w->pu_.index;
  w->recycle(f); // the runtime's part only: its user state went in run_to_completion
  w->count_retired();
  if (w->sib_->running.load(std::memory_order_relaxed) != parent->cookie)
    w->publish_running(); // the child changed its cookie
  return true;
}

// ---------------------------------------------------------------- cookies

void Worker::set_cookie(std::uint64_t cookie) {
  Fiber* self = current_;
  if (self->cookie == cookie) return;
  save_errno();
  core_.lock().lock();
  self->cookie = cookie; // under the lock: pickers compare it with what siblings publish
  core_.lock().unlock();
  publish_running();
}

void Worker::publish_running() {
  Fiber* self = current_;
  if (sibling().running.load(std::memory_order_relaxed) == self->cookie) return;
  WakeList wakes;
  core_.lock().lock();
  const bool ok = core_.change_running_cookie_locked(sibling_, self->cookie, wakes);
  core_.lock().unlock();
  wakes.notify();
  if (!ok) {
    reschedule(Requeue::preempted); // a sibling runs another cookie: resume only where this one may run
    return;
  }
  restore_errno(); // the wake-ups made system calls
  check_isolation(self);
  books_.open_segment(self->cookie, now_ns());
}

} // namespace coresched::detail
