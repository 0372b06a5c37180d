// SPDX-License-Identifier: Apache-2.0
// The public Runtime and the join-handle plumbing, over the scheduler.
#include "futex.hpp"
#include "scheduler.hpp"

#include <coresched/runtime.hpp>

namespace coresched {

Runtime::Runtime(Options options) : sched_(std::make_unique<detail::Scheduler>(std::move(options), this)) {}

Runtime::~Runtime() {
  try {
    shutdown();
  } catch (const UsageError&) {
    std::terminate(); // destroying a runtime from its own fiber cannot work
  }
}

void Runtime::shutdown() { sched_->shutdown(); }
const Topology& Runtime::topology() const noexcept { return sched_->topology(); }
const Options& Runtime::options() const noexcept { return sched_->options(); }
Stats Runtime::stats() const { return sched_->stats(); }
void Runtime::dump(std::FILE* out) const { sched_->dump(out); }

Runtime* Runtime::current() noexcept {
  detail::Worker* w = detail::Worker::current();
  return w ? w->scheduler().owner() : nullptr;
}

namespace detail {

Task* spawn_task(Scheduler* sched, const SpawnOptions& opts, std::size_t task_size, std::size_t task_align,
                 void (*construct)(void*, void*), void* arg) {
  return sched->spawn(opts, task_size, task_align, construct, arg);
}

void join_task(Task* t) {
  Fiber* f = Fiber::of(t);
  if (f->done.load(std::memory_order_acquire)) return;
  Worker* w = Worker::current();
  if (!w || !w->in_task()) {
    f->join_lock.lock();
    f->thread_joiner = true;
    f->join_lock.unlock();
    while (!f->done.load(std::memory_order_acquire)) futex_wait(f->done, 0);
    return;
  }
  Fiber* self = w->running();
  if (self == f) throw UsageError("coresched: a fiber cannot join itself");
  if (w->run_inline(f)) return;
  f->join_lock.lock();
  if (f->done.load(std::memory_order_acquire)) {
    f->join_lock.unlock();
    return;
  }
  if (f->joiner) {
    f->join_lock.unlock();
    throw UsageError("coresched: two fibers join the same fiber");
  }
  self->state.store(FiberState::parking, std::memory_order_release);
  f->joiner = self;
  f->join_lock.unlock();
  w->park({.kind = detail::WaitKind::join, .what = "join", .arg = static_cast<std::int64_t>(f->id)});
}

// The handle goes (detach, or after join). If the fiber has not finished, it
// will destroy its own result under its own cookie (Worker::run_to_completion);
// if it has, the result is the handle owner's and is destroyed here, in the
// owner's context — never by whoever frees the record last, which may be the
// fiber's worker running another fiber by then.
void release_task(Task* t) noexcept {
  Fiber* f = Fiber::of(t);
  bool finished = f->done.load(std::memory_order_acquire) != 0; // `done` never goes back: no lock after join
  if (!finished) {
    f->join_lock.lock();
    finished = f->done.load(std::memory_order_relaxed) != 0;
    if (!finished) f->handle_gone = true;
    f->join_lock.unlock();
  }
  if (finished) t->discard_result();
  release_fiber(f);
}

void release_joined(Task* t) noexcept { release_fiber(Fiber::of(t)); }

std::uint64_t task_fiber_id(const Task* t) noexcept { return Fiber::of(t)->id; }

} // namespace detail
} // namespace coresched
