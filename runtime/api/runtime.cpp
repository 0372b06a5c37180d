// SPDX-License-Identifier: Apache-2.0
// The public Runtime and the join-handle plumbing, over the scheduler.
#include "platform/futex.hpp"
#include "platform/log.hpp"
#include "sched/scheduler.hpp"

#include <coresched/runtime.hpp>

#include <thread>

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
IoBackend Runtime::io_backend() const noexcept { return sched_->io_backend(); }
const std::string& Runtime::io_backend_reason() const noexcept { return sched_->io_backend_reason(); }
Stats Runtime::stats() const { return sched_->stats(); }
void Runtime::dump(std::FILE* out) const {
  if (!out) throw UsageError("coresched: Runtime::dump needs a stream to write to (got a null FILE*)");
  // From a fiber: on a thread of its own. The symbolizer (libdw) needs more
  // stack than a fiber's default 64 KiB (most dumps from a fiber would
  // overflow it); the worker waits meanwhile, as for any blocking call.
  if (detail::Worker::current()) {
    std::thread([&] { sched_->dump(out); }).join();
    return;
  }
  sched_->dump(out);
}

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
  JoinRecord* j = JoinRecord::of(t);
  if (j->done.load(std::memory_order_acquire)) return;
  Worker* w = Worker::current();
  if (!w || !w->in_task()) {
    j->lock.lock();
    j->thread_joiner = true;
    j->lock.unlock();
    while (!j->done.load(std::memory_order_acquire)) futex_wait(j->done, 0);
    return;
  }
  Fiber* self = w->running();
  if (self->join == j) throw UsageError("coresched: a fiber cannot join itself");
  // Still queued here and never started: run it inline. Its record may be
  // finishing elsewhere right now, or retired, so run_inline only compares it
  // until it has found it in this worker's queue.
  if (w->run_inline(j->fiber, j)) return;
  j->lock.lock();
  if (j->done.load(std::memory_order_acquire)) {
    j->lock.unlock();
    return;
  }
  if (j->joiner) {
    j->lock.unlock();
    throw UsageError("coresched: two fibers join the same fiber");
  }
  self->state.store(FiberState::parking, std::memory_order_release);
  j->joiner = self;
  j->lock.unlock();
  w->park({.kind = detail::WaitKind::join, .what = "join", .arg = static_cast<std::int64_t>(j->id)});
}

// The handle goes (detach, or after join). If the fiber has not finished, it
// will destroy its own result under its own cookie (Worker::run_to_completion);
// if it has, the result is the handle owner's and is destroyed here, in the
// owner's context — never by whoever frees the record last, which may be the
// fiber's worker running another fiber by then.
namespace {
void release(Task* t, bool detaching) noexcept {
  JoinRecord* j = JoinRecord::of(t);
  bool finished = j->done.load(std::memory_order_acquire) != 0; // `done` never goes back: no lock after join
  if (!finished) {
    j->lock.lock();
    finished = j->done.load(std::memory_order_relaxed) != 0;
    if (!finished) j->handle_gone = true;
    j->lock.unlock();
  }
  if (finished && detaching && t->error)
    log().error("fiber {} was detached after an exception had ended it, which nobody will see now: {}", j->id,
                describe_exception(t->error));
  if (finished) t->discard_result();
  release_join(j);
}
} // namespace

void release_task(Task* t) noexcept { release(t, false); }

void detach_task(Task* t) noexcept { release(t, true); }

void release_joined(Task* t) noexcept { release_join(JoinRecord::of(t)); }

std::uint64_t task_fiber_id(const Task* t) noexcept { return JoinRecord::of(t)->id; }

} // namespace detail
} // namespace coresched
