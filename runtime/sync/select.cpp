// SPDX-License-Identifier: Apache-2.0
// select (select.hpp): as Go's selectgo. Every case's lock is taken (in
// address order, each once, so two selects over the same primitives cannot
// deadlock), the cases are tried in a random order, and the first that needs
// no wait happens. Otherwise a Waiter per case joins that case's queue, all
// in one SelectGroup, the locks are released and the caller blocks on the
// group. Whoever dequeues a case claims the group first (WaitQueue::pop), so
// exactly one case happens; the deadline and a stop request claim it too.
// Once woken, the caller withdraws its other waiters, one lock at a time.
#include "sync/waiter.hpp"

#include "platform/deadline_timer.hpp"
#include "sched/scheduler.hpp"

#include <coresched/select.hpp>

#include <algorithm>
#include <memory>
#include <random>

namespace coresched::detail {

namespace {

// Per thread: a selecting fiber reads and steps it between two switches.
std::uint32_t next_random() noexcept {
  thread_local std::minstd_rand rng{static_cast<std::uint32_t>(steady_now_ns()) ^
                                    static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(&rng))};
  return static_cast<std::uint32_t>(rng());
}

// The select's deadline and stop request: each claims the group and wakes
// its caller unless a case (or the other) claimed it first.
struct Expiry {
  Deadline deadline; // first: fire() gets its address
  SelectGroup* group;
  static void fire(Deadline* d) noexcept {
    SelectGroup& g = *reinterpret_cast<Expiry*>(d)->group;
    if (g.claim(kSelectTimedOut)) g.primary.notify();
  }
};

struct StopEnds {
  SelectGroup* group;
  void operator()() const noexcept {
    if (group->claim(kSelectStopped)) group->primary.notify();
  }
};

// Small selects keep their scratch on the stack.
template <class T, std::size_t N> class Scratch {
public:
  explicit Scratch(std::size_t n) : heap_(n > N ? std::make_unique<T[]>(n) : nullptr) {}
  T& operator[](std::size_t i) noexcept { return heap_ ? heap_[i] : local_[i]; }

private:
  T local_[N];
  std::unique_ptr<T[]> heap_;
};

} // namespace

int select_impl(const SelectCase* cases, std::size_t n, std::uint64_t deadline_ns, const std::stop_token* stop) {
  const bool stoppable = stop && stop->stop_possible();
  if (n == 0 && deadline_ns == kNever && !stoppable)
    throw UsageError("coresched::select: no case, no deadline and no stop token: it would wait for ever");
  if (n > static_cast<std::size_t>(INT32_MAX)) throw UsageError("coresched::select: too many cases");

  // Each lock once, in address order.
  Scratch<SyncLock*, 8> locks(n);
  std::size_t nlocks = 0;
  for (std::size_t i = 0; i < n; ++i) locks[nlocks++] = cases[i].lock_;
  std::sort(&locks[0], &locks[0] + nlocks);
  nlocks = static_cast<std::size_t>(std::unique(&locks[0], &locks[0] + nlocks) - &locks[0]);
  auto lock_all = [&] {
    for (std::size_t i = 0; i < nlocks; ++i) locks[i]->lock();
  };
  auto unlock_all = [&] {
    for (std::size_t i = nlocks; i-- > 0;) locks[i]->unlock();
  };

  // A random order (Fisher-Yates), so that among ready cases each is as likely.
  Scratch<std::uint32_t, 8> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::uint32_t>(i);
  for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[next_random() % i]);

  lock_all();
  for (std::size_t i = 0; i < n; ++i)
    if (cases[i].clear_) cases[i].clear_(cases[i]);
  for (std::size_t k = 0; k < n; ++k) {
    const SelectCase& c = cases[order[k]];
    Waiter* wake = nullptr;
    if (c.try_now_(c, wake)) {
      unlock_all();
      if (wake) WaitQueue::wake(wake);
      return static_cast<int>(order[k]);
    }
  }
  const bool stopped = stoppable && stop->stop_requested();
  if (deadline_ns == 0 || stopped || (deadline_ns != kNever && deadline_ns <= steady_now_ns())) {
    unlock_all();
    return deadline_ns == 0 ? kSelectNone : stopped ? kSelectStopped : kSelectTimedOut;
  }

  SelectGroup group;
  Scratch<Waiter, 8> nodes(n);
  Scratch<SendSlot, 8> sends(n);
  for (std::size_t i = 0; i < n; ++i) {
    const SelectCase& c = cases[i];
    nodes[i].group = &group;
    nodes[i].case_index = static_cast<int>(i);
    void* slot = c.data_;
    if (c.send_) {
      sends[i].value = c.data_;
      slot = &sends[i];
    }
    c.queue_->push(&nodes[i], slot, c.what_);
  }
  group.primary.what = "select";
  group.primary.prepare();
  unlock_all();

  Expiry expiry{{}, &group};
  DeadlineTimer* timer = nullptr;
  if (deadline_ns != kNever && group.primary.fiber) {
    timer = &Worker::current()->scheduler().deadlines();
    expiry.deadline.at_ns = deadline_ns;
    expiry.deadline.fire = &Expiry::fire;
    timer->arm(&expiry.deadline);
  }
  {
    const std::stop_callback<StopEnds> on_stop(stoppable ? *stop : std::stop_token{}, StopEnds{&group});
    if (group.primary.fiber || deadline_ns == kNever) {
      group.primary.block();
    } else if (!group.primary.block_until(deadline_ns)) { // a thread watches its own clock
      if (!group.claim(kSelectTimedOut)) group.primary.block(); // a case or a stop claimed it: its notify() is coming
    }
    if (timer) timer->disarm(&expiry.deadline);
  }

  // Withdraw the cases that did not happen (a waker that lost the claim has
  // dropped its own already; the chosen one was dequeued by its waker).
  const int chosen = group.chosen.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    if (static_cast<int>(i) == chosen) continue;
    cases[i].lock_->lock();
    cases[i].queue_->unlink(&nodes[i]);
    cases[i].lock_->unlock();
  }
  if (chosen >= 0 && cases[chosen].send_) *cases[chosen].sent_ = sends[static_cast<std::size_t>(chosen)].taken;
  return chosen;
}

} // namespace coresched::detail
