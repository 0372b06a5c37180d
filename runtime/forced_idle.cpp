// SPDX-License-Identifier: Apache-2.0
// A worker forced idle: its accounting, and how it gets ready for the
// hand-over. A forced-idle PU that sleeps in its ring starts only a wake-up
// (tens of us on a VM, several on bare metal) once the core changes cookie,
// and the core runs neither cookie meanwhile: the hand-over gap. Two things
// shorten it, each bounded so that forced idle does not become a busy loop:
//  * the ticker, as it asks the owner to stop for a waiting cookie, wakes the
//    forced-idle PUs and has them spin (Scheduler::prewake_forced), for when
//    the owner takes a while to reach its preemption point;
//  * a forced-idle PU going to sleep while the core's turns have a steady
//    length arms its ring timer to wake its own wake-up latency (learned from
//    its timed wake-ups) before the expected hand-over, and spins from there,
//    for when the owner stops as soon as it is asked.
#include "worker.hpp"

#include "clock.hpp"
#include "scheduler.hpp"
#include "trace.hpp"

#include <immintrin.h>

namespace coresched::detail {

namespace {
constexpr std::uint64_t kReadyMarginNs = 10'000; // woken this much before the expected wake-up latency ends
} // namespace

void Worker::enter_forced_idle(const Pick& p) {
  if (forced_) return;
  forced_ = true;
  forced_since_ = now_ns();
  forced_wanted_ = p.wanted;
  forced_blocker_ = p.blocker;
}

// The ticker (Scheduler::prewake_forced) or this PU's own timer
// (sleep_until_handover) has said that a hand-over to it is due.
bool Worker::handover_due() const noexcept {
  const std::uint64_t until = sib_->spin_until.load(std::memory_order_relaxed);
  return until != 0 && now_ns() < until;
}

// Spins, reading only the core's published owner (no lock, no store: the
// owner's sibling keeps running undisturbed), while a hand-over is due and
// the core still belongs to the cookie this PU waits behind. True if it
// spun, to pick again.
bool Worker::await_handover() noexcept {
  if (!handover_due()) return false;
  const std::uint64_t until = sib_->spin_until.load(std::memory_order_relaxed);
  for (unsigned i = 1; core_.published_owner() == forced_blocker_; ++i) {
    _mm_pause();
    if (i % 64 == 0 && (now_ns() >= until || sched_.exiting())) break;
  }
  return true;
}

void Worker::leave_forced_idle() {
  if (!forced_) return;
  forced_ = false;
  sib_->spin_until.store(0, std::memory_order_relaxed);
  const std::uint64_t span = now_ns() - forced_since_;
  core_.forced_idle_ns.fetch_add(span, std::memory_order_relaxed);
  if (trace_) [[unlikely]]
    trace_->record({forced_since_, span, 0, forced_wanted_, forced_blocker_, TraceKind::forced_idle});
  std::lock_guard lk(stats_mu_);
  cookie_stats_[forced_wanted_].suffered_ns += span;
  cookie_stats_[forced_blocker_].caused_ns += span;
}

void Worker::trace_handover(const Pick& p) noexcept {
  const std::uint64_t now = now_ns();
  trace_->record({now - p.handover_gap_ns, p.handover_gap_ns, 0, p.fiber->cookie, p.handover_from, TraceKind::handover});
}


// Sleeps until a wake-up, a completion, or the time to get ready for the
// hand-over expected at `handover`; true in the last case, with this PU set to
// spin (find_work) until a quarter slice past the expected time.
bool Worker::sleep_until_handover(std::uint64_t handover) {
  const std::uint64_t quarter = sched_.slice_ns() / 4;
  const std::uint64_t now = now_ns();
  if (now >= handover + quarter) { // the prediction has passed: sleep as usual
    ring_.wait(io_done_);
    return false;
  }
  const std::uint64_t lead = wake_latency_ns_ + kReadyMarginNs;
  const std::uint64_t ready = handover > lead ? handover - lead : 0;
  if (ready > now) {
    if (!ring_.wait_for(io_done_, ready - now)) return false; // woken, or a completion
    const std::uint64_t late = now_ns() - ready;                // how late the timer woke us
    wake_latency_ns_ = (7 * wake_latency_ns_ + late) / 8;
  }
  sib_->spin_until.store(handover + quarter, std::memory_order_relaxed);
  return true;
}

} // namespace coresched::detail
