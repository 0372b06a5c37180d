// SPDX-License-Identifier: Apache-2.0
// Rescue: fibers queued behind a runner that reaches no preemption point.
//
// Scheduling is cooperative: a fiber keeps its PU until it reaches a
// preemption point (a yield, a wait, preempt_point() once its slice is over),
// and the fibers queued behind one that runs on wait for it. An idle worker
// steals them (tick()'s backlog rule wakes one), but when every worker is busy
// nobody steals: a busy worker that switches takes from its own queue (on an
// SMT core from its sibling's only when its own is empty). A fiber queued
// behind a 10 ms loop would wait the whole 10 ms while the PU beside it takes
// turns among fibers of its own.
//
// The kernel preempts such a runner with its timer interrupt, and Go's sysmon
// preempts a goroutine that has run for 10 ms; a fiber cannot be preempted. So
// the ticker moves what waits instead, as the kernel's load balancer pulls
// queued tasks off a busy runqueue: once a runner has let a whole tick pass
// after being asked to stop, one queued fiber per tick goes to a busy worker
// that is switching. It joins that worker's queue in vtime order, as a stolen
// fiber does (Arrival::moved), and runs at one of its next switches.
//
// Where it goes, and why:
//  - A sibling on the same core first, if one is switching: the cheapest move
//    (no cache line crosses a core), and the core's books do not change. Only
//    the runner's own cookie can move there: that sibling may run nothing else
//    while the runner holds the core.
//  - Otherwise another core, the one with the fewest fibers queued, nearest
//    first among equals, and one whose cookie allows it (single-PU, or running
//    the fiber's cookie or nothing): the isolation rule would hold anyway (the
//    core's pick enforces it wherever a fiber waits), but a fiber that must
//    wait for a cookie change there gains nothing by the move.
//  - What waits on the runner's own queue first, then other cookies' fibers
//    queued on a sibling that is forced idle beside it: they wait for the
//    runner too, for the core's change of cookie at its next switch.
//  - Pinned fibers stay. Idle workers are not targets: where the backlog rule
//    has woken an idle worker of another core to steal this backlog (half
//    the queue in one go), the rescue leaves the worker alone.
#include "sched/scheduler.hpp"

#include <array>
#include <climits>

namespace coresched::detail {

namespace {

// tick() asks a runner to stop when it has not switched for four ticks (a
// slice); one more tick without a switch and it has ignored the request.
constexpr int kRescueAfterTicks = 5;

bool switching(const Worker& w) noexcept {
  return w.busy.load(std::memory_order_relaxed) && w.ticks_same < kRescueAfterTicks;
}

} // namespace

void Scheduler::rescue_queued() {
  for (auto& wp : workers_) {
    Worker& w = *wp;
    // backlog_shared: the backlog rule woke an idle worker of another core
    // that may steal any cookie, which takes half of this run's backlog at once.
    // Not a global "someone is idle": a sibling forced idle beside a runner of
    // another cookie is idle too, and cannot take what waits here.
    if (w.busy.load(std::memory_order_relaxed) && w.ticks_same >= kRescueAfterTicks && !w.backlog_shared &&
        w.core().queued_hint() > 0)
      rescue_one(w);
  }
}

// A busy worker that switches, on the core with the fewest fibers queued
// (nearest first among equals), whose cookie lets a fiber of `cookie` run
// there now; null if none. Reads only the other cores' hints: no lock.
Worker* Scheduler::rescue_target(const Worker& stuck, std::uint64_t cookie) {
  Worker* to = nullptr;
  int fewest = INT_MAX;
  for (unsigned ci : steal_order_[stuck.index()]) {
    const CoreCoordinator& c = *cores_[ci];
    const std::uint64_t running = c.running_cookie();
    if (!c.single_pu() && running != kNoCookie && running != cookie) continue;
    const int queued = c.queued_hint();
    if (queued >= fewest) continue;
    for (unsigned s = 0; s < c.size(); ++s) {
      Worker& w = *workers_[c.sibling(s).worker];
      if (!switching(w)) continue;
      to = &w;
      fewest = queued;
      break;
    }
  }
  return to;
}

void Scheduler::rescue_one(Worker& stuck) {
  CoreCoordinator& home = stuck.core();
  const unsigned from = stuck.sibling_index();
  WakeList wakes;
  Worker* to = nullptr;
  Fiber* f = nullptr;
  home.lock().lock();
  home.drain_spawned_locked(from); // the runner's spawns wait on its ring, which only its own pick drains
  for (unsigned s = 0; s < home.size(); ++s) {
    if (s == from || !switching(*workers_[home.sibling(s).worker])) continue;
    if (home.move_queued_locked(from, s, wakes)) {
      home.lock().unlock();
      wakes.notify();
      stuck.rescued.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  // Another core. The cookie is chosen before the fiber leaves: taking the
  // last queued fiber of a cookie off the core's books and putting it back
  // would place the cookie afresh, losing what it is owed here.
  const std::uint64_t runner_cookie = home.sibling(from).running.load(std::memory_order_relaxed);
  auto take_from = [&](unsigned s, bool other_cookies_only) {
    std::array<std::uint64_t, 8> cookies;
    std::size_t n = 0;
    home.sibling(s).queue.for_each_cookie([&](std::uint64_t c, std::size_t) {
      if (n < cookies.size() && !(other_cookies_only && c == runner_cookie)) cookies[n++] = c;
    });
    for (std::size_t i = 0; i < n && !f; ++i) {
      to = rescue_target(stuck, cookies[i]);
      if (to) f = home.evict_locked(s, cookies[i]); // null if all its fibers are pinned
    }
  };
  take_from(from, false);
  // Then a sibling that is not running (forced idle beside the runner): the
  // other cookies queued there wait for the core to change cookie, which only
  // the runner's next switch can bring. The runner's own cookie is not taken
  // there: that sibling may run it now, and is about to.
  for (unsigned s = 0; s < home.size() && !f; ++s)
    if (s != from && !workers_[home.sibling(s).worker]->busy.load(std::memory_order_relaxed)) take_from(s, true);
  home.lock().unlock();
  if (!f) return;
  enqueue_on(to->index(), f, Arrival::moved);
  stuck.rescued.fetch_add(1, std::memory_order_relaxed);
}

} // namespace coresched::detail
