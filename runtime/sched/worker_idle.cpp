// SPDX-License-Identifier: Apache-2.0
// A worker with nothing to run: it picks, steals and spins a while, then
// sleeps in its ring until a waker, a completion or a timer needs it. The
// spin is the bet that work comes sooner than a wake-up would take; the
// spinner slots keep that bet from burning more than half the idle CPUs.
#include "sched/worker.hpp"

#include "platform/clock.hpp"
#include "sched/worker_host.hpp"

#include <atomic>
#include <chrono>
#include <immintrin.h>
#include <thread>

namespace coresched::detail {

namespace testing {
std::atomic<bool> idle_never_sleeps{false};
} // namespace testing

namespace {
// Idle spinning: rounds of (pick, steal, a few pauses) before sleeping,
// ~50 us in all here: long enough to catch a quick hand-off (a wake to a
// sleeping worker costs 10-90 us on this VM), short enough not to burn a CPU.
// At most half the idle workers hold a spinner slot; a worker refused one
// still spins a few rounds, so a transient count (a spinner that has found
// work but not yet left the idle set) does not send it straight to sleep.
constexpr int kIdleSpinRounds = 256;
constexpr int kUnclaimedSpinRounds = 16;
constexpr int kForcedIdleSpinRounds = 16; // forced idle must not burn the sibling's pipeline
constexpr int kPausesPerRound = 8;

} // namespace

void Worker::idle_loop() {
  while (Fiber* f = find_work()) switch_to(f, After::none);
}

void Worker::set_idle(bool on) {
  if (idle_ == on) return;
  idle_ = on;
  host_.note_idle(*this, on);
}

// From here until it returns a fiber the worker runs none, so the last
// fiber's run segment ends now: left open through the idle loop's picks,
// steals and spins, it counted that time as the cookie's run, on top of the
// forced idle the same span books (a turn's end cost each cookie its idle
// spin as run time, which pulled weighted shares towards 1:1).
Fiber* Worker::find_work() {
  books_.close_segment(now_ns());
  if (stack_starved_) [[unlikely]] {
    // A picked fiber found no memory for its stack and went back to the
    // queue: give other fibers time to finish and free theirs.
    stack_starved_ = false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  int rounds = 0;
  bool spinning = false;
  std::uint64_t grace_spin_since = 0; // spinning past the round limit for a thieves' grace, since (ns)
  for (;;) {
    const Pick p = pick();
    if (p.kind == Pick::Kind::run) {
      if (spinning) host_.stop_spinning();
      leave_forced_idle();
      set_idle(false);
      if (core_.queued_hint() > 0) host_.wake_helper(*this); // more here: wake a helper, as Go's last spinner does
      return p.fiber;
    }
    if (p.kind == Pick::Kind::forced_idle) enter_forced_idle(p);
    else leave_forced_idle();
    set_idle(true);
    if (host_.exiting()) {
      if (spinning) host_.stop_spinning();
      return nullptr;
    }
    poll_io();
    if (steal_and_adopt(p, false)) continue;
    if (!spinning && !books_.forced()) spinning = host_.try_start_spinning();
    const int limit = books_.forced() ? kForcedIdleSpinRounds : spinning ? kIdleSpinRounds : kUnclaimedSpinRounds;
    if (rounds < limit) {
      ++rounds;
      for (int i = 0; i < kPausesPerRound; ++i) _mm_pause();
      continue;
    }
    // The last steal left a wake-affine fiber alone for the thieves' grace
    // (affine_grace.hpp): stay for the grace, at most one grace in all, so a
    // fiber whose waker runs on is taken now rather than at the slice tick.
    if (steal_grace_.refused() && !books_.forced()) {
      const std::uint64_t now = now_ns();
      if (grace_spin_since == 0) grace_spin_since = now;
      if (now - grace_spin_since < AffineGrace::kGraceNs + 1'000) {
        for (int i = 0; i < kPausesPerRound; ++i) _mm_pause();
        continue;
      }
    }
    if (books_.forced() && await_handover()) continue;
    if (testing::idle_never_sleeps.load(std::memory_order_relaxed)) {
      // Valgrind runs one thread at a time and switches at the end of a
      // quantum, which may fall inside this worker's core lock; a waker then
      // spins until its own yield. Yielding here, outside every lock, hands
      // valgrind a switch point where the lock is free.
      sched_yield();
      continue;
    }
    if (spinning) {
      host_.stop_spinning();
      spinning = false;
    }
    if (!sleep_once()) continue;
    rounds = 0;
    grace_spin_since = 0;
  }
}

// Steals for pick `p` and queues what it took on this PU. `unsleep`: this
// worker has said it sleeps (sleep_once's last look) and now does not.
bool Worker::steal_and_adopt(const Pick& p, bool unsleep) {
  Fiber* stolen[WorkerHost::kStealBatch];
  const unsigned n = host_.steal_for(*this, p, stolen);
  if (n == 0) return false;
  steals_.fetch_add(n, std::memory_order_relaxed);
  core_.lock().lock();
  if (unsleep) sibling().sleeping = false;
  for (unsigned i = 0; i < n; ++i) core_.adopt_locked(sibling_, stolen[i]);
  core_.lock().unlock();
  return true;
}

// Sleeps unless work arrived. The pick and the `sleeping` flag are set under
// the core lock, and every waker queues under that lock and then checks the
// flag, so a wake-up cannot fall between the check and the sleep.
bool Worker::sleep_once() {
  WakeList wakes;
  core_.lock().lock();
  const Pick p = core_.pick_locked(sibling_, wakes);
  if (p.kind == Pick::Kind::run) {
    // Work arrived after all: put it back and let the loop take it.
    core_.requeue_locked(sibling_, p.fiber);
    core_.publish_locked(sibling_, kNoCookie);
    core_.lock().unlock();
    wakes.notify();
    return false;
  }
  core_.prepare_sleep_locked(sibling_);
  std::uint64_t turn_end = books_.forced() ? core_.turn_due_locked(sibling_) : 0;
  if (turn_end != 0) books_.wait_behind(core_.published_owner()); // the cookie to ask (it may have changed)
  const std::uint32_t epoch = sibling().wake_word.load(std::memory_order_acquire);
  core_.lock().unlock();
  wakes.notify();
  if (host_.exiting()) return true;
  // Shutdown may have begun after this worker's last poll_io but before it was
  // marked sleeping here, so wake_all_workers passed it by; asleep now, it would
  // never cancel its in-flight I/O (a fiber in a long io::sleep_until would
  // keep shutdown waiting for ever). The core lock orders the
  // two: either the waker saw `sleeping`, or this load sees `stopping`.
  if (host_.stopping() && !stop_cancelled_ && (io_->inflight() != 0 || io_->deferring())) return true;
  // A spawner on another single-PU core passes this worker by unless it says
  // it sleeps (Scheduler::wake_helper, Help::spawned). So, now that `sleeping`
  // is published, look at the other single-PU cores once more (the fence
  // pairs with the spawner's seq_cst add: see LockedFlag) and steal rather
  // than sleep if one has fibers this worker can take, as Go's M looks at
  // every P's queue once more before it stops. This also covers a spawn
  // between this worker's last steal and its lock above. If nothing can be
  // taken (pinned fibers, a thieves' grace, another thief was first) it
  // sleeps: a later spawner sees `sleeping`. Only a worker that may take any
  // cookie from the rings: a single-PU core's.
  if (ring_spawns_ && p.steal == Pick::Steal::any) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (host_.queued_elsewhere(*this) && steal_and_adopt(p, true)) return false;
  }
  sleeps_.fetch_add(1, std::memory_order_relaxed);
  // Sleep in the io_uring: an I/O completion or a waker's eventfd write ends
  // it; forced idle, also the end of the owner's turn (forced_idle.cpp).
  bool woke_early = false;
  while (sibling().wake_word.load(std::memory_order_acquire) == epoch && !host_.exiting()) {
    if (turn_end != 0) woke_early = sleep_until_turn_end(turn_end);
    else io_->wait(io_done_);
    if (!io_done_.empty() || woke_early) break;
  }
  if (!io_done_.empty() || woke_early) {
    core_.lock().lock();
    sibling().sleeping = false; // awake for our own completions: wakers need not write the eventfd
    core_.lock().unlock();
    for (Fiber* f : io_done_) wake_fiber(f);
    io_done_.clear();
  }
  return true;
}

} // namespace coresched::detail
