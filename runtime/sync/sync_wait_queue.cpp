// SPDX-License-Identifier: Apache-2.0
// The lock and wait queue under every primitive of sync.hpp.
#include "sync/waiter.hpp"

#include "platform/deadline_timer.hpp"
#include "sched/scheduler.hpp"

#include <coresched/sync.hpp>

#include <immintrin.h>
#include <sched.h>

namespace coresched::detail {

// The lock guards a few words, so it is normally free within a few pauses. If
// not, its holder was probably preempted by the OS (a plain thread, or a
// worker on an oversubscribed machine): yield the CPU rather than spin.
void SyncLock::lock_slow() noexcept {
  for (int i = 0;; ++i) {
    if (!flag_.load(std::memory_order_relaxed) && !flag_.exchange(true, std::memory_order_acquire)) return;
    if (i < 64) _mm_pause();
    else sched_yield();
  }
}

void WaitQueue::push(Waiter* w, void* slot, const char* what) noexcept {
  w->slot = slot;
  w->what = what;
  w->object = this;
  w->prepare();
  if (tail_) tail_->next = w;
  else head_ = w;
  tail_ = w;
}

void WaitQueue::wait(SyncLock& lock, void* slot, void (*after_unlock)(void*), void* arg, const char* what) {
  Waiter w;
  push(&w, slot, what);
  lock.unlock();
  if (after_unlock) after_unlock(arg);
  w.block();
}

namespace {

// What ends a timed or stoppable wait early. Its deadline fires on the
// runtime's timer thread and a stop callback on whoever calls
// request_stop(); either takes the waiter off the queue under the
// primitive's lock and wakes it, unless a waker dequeued it first (then the
// waker's notify() is on its way, and that outcome stands).
struct Expiry {
  Deadline deadline; // first: fire() gets its address
  SyncLock* lock;
  WaitQueue* queue;
  Waiter* waiter;

  void end(WaitOutcome why) noexcept {
    lock->lock();
    const bool mine = queue->unlink(waiter);
    if (mine) waiter->outcome = why;
    lock->unlock();
    if (mine) waiter->notify();
  }
  static void fire(Deadline* d) noexcept { reinterpret_cast<Expiry*>(d)->end(WaitOutcome::timed_out); }
};

struct StopEnds {
  Expiry* expiry;
  void operator()() const noexcept { expiry->end(WaitOutcome::stopped); }
};

} // namespace

WaitOutcome WaitQueue::wait_until(SyncLock& lock, std::uint64_t deadline_ns, const std::stop_token* stop, void* slot,
                                  void (*after_unlock)(void*), void* arg, const char* what) {
  const bool stopped = stop && stop->stop_requested();
  if (stopped || (deadline_ns != kNever && deadline_ns <= steady_now_ns())) {
    lock.unlock();
    if (after_unlock) after_unlock(arg);
    return stopped ? WaitOutcome::stopped : WaitOutcome::timed_out;
  }
  Waiter w;
  push(&w, slot, what);
  lock.unlock();
  if (after_unlock) after_unlock(arg);

  Expiry expiry{{}, &lock, this, &w};
  DeadlineTimer* timer = nullptr;
  if (deadline_ns != kNever && w.fiber) {
    // A parked fiber cannot watch its own clock: the timer thread fires it.
    timer = &Worker::current()->scheduler().deadlines();
    expiry.deadline.at_ns = deadline_ns;
    expiry.deadline.fire = &Expiry::fire;
    timer->arm(&expiry.deadline);
  }
  {
    // Registers nothing for a token without a stop source. May run at once,
    // here (a stop requested meanwhile): then it dequeues and wakes us
    // before we park, which the park protocol allows.
    const std::stop_callback<StopEnds> on_stop(stop ? *stop : std::stop_token{}, StopEnds{&expiry});
    if (w.fiber || deadline_ns == kNever) {
      w.block();
    } else if (!w.block_until(deadline_ns)) { // a thread watches its own clock
      lock.lock();
      const bool mine = unlink(&w);
      if (mine) w.outcome = WaitOutcome::timed_out;
      lock.unlock();
      if (!mine) w.block(); // dequeued by a waker or a stop: its notify() is coming
    }
    // Neither the timer nor the stop callback may refer to `w` once we
    // return: the disarm and the callback's destructor wait for them.
    if (timer) timer->disarm(&expiry.deadline);
  }
  return w.outcome;
}

bool WaitQueue::unlink(Waiter* w) noexcept {
  Waiter* prev = nullptr;
  for (Waiter* p = head_; p; prev = p, p = p->next) {
    if (p != w) continue;
    (prev ? prev->next : head_) = w->next;
    if (tail_ == w) tail_ = prev;
    w->next = nullptr;
    return true;
  }
  return false;
}

// A select's case is taken only if this claims the select for it; one that
// another case (or the select's deadline or stop) claimed first is dropped
// as if it had never been queued: the select withdraws it anyway.
Waiter* WaitQueue::pop() noexcept {
  while (Waiter* w = head_) {
    head_ = w->next;
    if (!head_) tail_ = nullptr;
    w->next = nullptr;
    if (!w->group || w->group->claim(w->case_index)) [[likely]]
      return w;
  }
  return nullptr;
}

Waiter* WaitQueue::pop_all() noexcept {
  Waiter* chain = nullptr;
  Waiter** link = &chain;
  for (Waiter* w = head_; w;) {
    Waiter* next = w->next;
    w->next = nullptr;
    if (!w->group || w->group->claim(w->case_index)) {
      *link = w;
      link = &w->next;
    }
    w = next;
  }
  head_ = tail_ = nullptr;
  return chain;
}

void* WaitQueue::slot(const Waiter* w) noexcept { return w->slot; }

void WaitQueue::wake(Waiter* w) noexcept { w->notify(); }

void WaitQueue::wake_all(Waiter* chain) noexcept {
  while (chain) {
    Waiter* next = chain->next; // read before notify: the waiter's frame may go at once
    chain->notify();
    chain = next;
  }
}

} // namespace coresched::detail
