// SPDX-License-Identifier: Apache-2.0
// A worker forced idle: its accounting, how it ends the owner's turn on time,
// and how it gets ready for the hand-over.
//
// The end of the turn. The core changes cookie only at a pick, so the owner's
// fibers must be asked to stop once the waiting cookie is due (the kernel's
// tick does this for a forced-idle sibling). The due time is known in advance
// (CoreCoordinator::turn_due_locked), so the forced-idle PU arms its own ring
// timer for it, on its own idle CPU, and asks the owner then: one timer
// wake-up per turn, where a quarter-slice ticker would wake four to six times
// and, on a VM, cost the busy CPUs ~50 us each (Ticker).
//
// The hand-over gap. A forced-idle PU that sleeps in its ring starts only a
// wake-up (tens of us on a VM, several on bare metal) once the core changes
// cookie, and the core runs neither cookie meanwhile. So, woken at the turn's
// end, it spins for at most one wake-up latency before it sleeps again, where
// its siblings are synthetic (on real SMT siblings it sleeps at once). With
// Options::handover_spin the PU wakes its own learned timer latency before
// the due time and spins (with `pause`, reading one word) through the
// hand-over, for at most a quarter slice, so that forced idle does not become
// a busy loop.
#include "sched/worker.hpp"

#include "platform/clock.hpp"
#include "sched/worker_host.hpp"
#include "platform/trace.hpp"

#include <immintrin.h>

namespace coresched::detail {

namespace {
constexpr std::uint64_t kReadyMarginNs = 10'000; // woken this much before the expected wake-up latency ends
} // namespace

// The span is in the cookie books, so that a snapshot counts a forced idle
// in progress: beside an owner that runs on, it never ends, and would read as
// none.
void Worker::enter_forced_idle(const Pick& p) {
  if (!books_.forced()) books_.enter_forced(now_ns(), p.wanted, p.blocker);
}

// sleep_until_turn_end has set this PU to watch for the hand-over (for one
// wake-up latency after the turn's end, or with handover_spin from just
// before it to a quarter slice past it).
bool Worker::handover_due() const noexcept {
  const std::uint64_t until = sib_->spin_until.load(std::memory_order_relaxed);
  return until != 0 && now_ns() < until;
}

// Spins, reading only the core's published owner (no lock, no store: the
// owner's sibling keeps running undisturbed), while a hand-over is due and
// the core still belongs to the cookie this PU waits behind; asks that cookie
// to stop when its turn ends. True if it spun, to pick again.
bool Worker::await_handover() noexcept {
  if (!handover_due()) return false;
  const std::uint64_t until = sib_->spin_until.load(std::memory_order_relaxed);
  const std::uint64_t blocker = books_.blocker();
  for (unsigned i = 1; core_.published_owner() == blocker; ++i) {
    _mm_pause();
    if (i % 64 != 0) continue;
    const std::uint64_t now = now_ns();
    if (stop_owner_at_ != 0 && now >= stop_owner_at_) {
      core_.request_stop(blocker);
      stop_owner_at_ = 0;
    }
    if (now >= until || host_.exiting()) break;
  }
  return true;
}

void Worker::leave_forced_idle() {
  if (!books_.forced()) return;
  stop_owner_at_ = 0;
  sib_->spin_until.store(0, std::memory_order_relaxed);
  // Leaving forced idle while the cookie it waited behind still owns the
  // core (it took that cookie's fibers, stolen from another core, or one
  // that became runnable here): its timer no longer ends that turn. If
  // fibers still wait on the core, only the ticker's preemption request will
  // (CoreCoordinator::enqueue_locked), so ask for its fine period. After a
  // hand-over the owner is the cookie it waited for, and this is skipped.
  if (core_.published_owner() == books_.blocker() && core_.queued_hint() > 0) host_.want_fine_ticks();
  const CookieBooks::Span s = books_.leave_forced(now_ns());
  core_.forced_idle_ns.fetch_add(s.ns, std::memory_order_relaxed);
  if (trace_) [[unlikely]]
    trace_->record({s.since, s.ns, 0, s.wanted, s.blocker, TraceKind::forced_idle});
}

void Worker::trace_handover(const Pick& p) noexcept {
  const std::uint64_t now = now_ns();
  trace_->record({now - p.handover_gap_ns, p.handover_gap_ns, 0, p.fiber->cookie, p.handover_from, TraceKind::handover});
}


// Forced idle: sleeps until a wake-up, a completion, or the end of the
// owner's turn at `due` (turn_due_locked), then sets `due` to 0. At the
// turn's end it asks the owner to stop and returns true, set to watch for the
// hand-over (await_handover) for at most its wake-up latency; false if it
// already did so for this turn's end (the caller then sleeps until the
// hand-over wakes it). With handover_spin it wakes its learned timer latency
// earlier and watches until a quarter slice past `due`, asking the owner to
// stop at `due`; once that stretch has passed (an owner without preemption
// points) it goes the default way. False if woken or completed first.
bool Worker::sleep_until_turn_end(std::uint64_t& due) {
  const std::uint64_t end = due;
  const bool spin = host_.handover_spin();
  const std::uint64_t lead = spin ? wake_latency_ns_ + kReadyMarginNs : 0;
  const std::uint64_t wake_at = due > lead ? due - lead : 0;
  std::uint64_t now = now_ns();
  if (wake_at > now) {
    if (!io_->wait_for(io_done_, wake_at - now)) return false; // woken, or a completion
    now = now_ns();
    wake_latency_ns_ = (7 * wake_latency_ns_ + (now - wake_at)) / 8; // how late the timer woke us
  }
  due = 0;
  std::uint64_t watch_until = end + host_.slice_ns() / 4;
  if (spin && now < watch_until) {
    stop_owner_at_ = end; // await_handover asks the owner to stop then
  } else {
    // A timer never fires early, so the owner's vruntime is past the due
    // time when it reads the flag: its pick hands over.
    core_.request_stop(books_.blocker());
    // Awake anyway: watch for the hand-over for at most one wake-up latency,
    // once per turn's end, then sleep. If it comes within that stretch the
    // new cookie starts at once; if not, the spin costs no more than the
    // wake-up that sleeping costs (rent or buy). An overdue turn keeps its due
    // time, so an owner that never stops costs one such stretch, not one per
    // look.
    // Not on real SMT siblings: there the spinning thread shares the core
    // with the owner it waits for, in the very turn the owner's cookie is
    // paying for, and the kernel's forced-idle sibling halts instead. What
    // the watch costs real SMT hardware an emulated SMT guest cannot show
    // (docs/design.md, "The watch at the turn's end on real siblings"),
    // so this follows the kernel.
    // On synthetic siblings, other CPUs, it costs the owner nothing.
    if (end == turn_end_spun_ || !host_.watch_turn_end()) return false;
    turn_end_spun_ = end;
    watch_until = now + wake_latency_ns_;
  }
  sib_->spin_until.store(watch_until, std::memory_order_relaxed);
  return true;
}

} // namespace coresched::detail
