// SPDX-License-Identifier: Apache-2.0
#include "core/core_coordinator.hpp"

#include "platform/clock.hpp"
#include "platform/cookie_registry.hpp"
#include "fiber/fiber_vtime.hpp"
#include "platform/invariant.hpp"
#include "reactor/reactor.hpp"

#include <algorithm>
#include <immintrin.h>

namespace coresched::detail {

namespace testing {
std::atomic<bool> ignore_siblings{false};
}

void WakeList::notify() noexcept {
  for (std::uint64_t left = sleepers_; left != 0; left &= left - 1) {
    Sibling& s = core_->sibling(static_cast<unsigned>(__builtin_ctzll(left)));
    s.wake_word.fetch_add(1, std::memory_order_release);
    if (Reactor* r = s.ring.load(std::memory_order_acquire)) r->wake();
  }
  sleepers_ = 0;
}

CoreCoordinator::CoreCoordinator(unsigned index, const std::vector<unsigned>& workers, CoreConfig cfg)
    : index_(index), cfg_(cfg) {
  for (unsigned w : workers) {
    auto s = std::make_unique<Sibling>();
    s->worker = w;
    siblings_.push_back(std::move(s));
  }
  single_pu_ = siblings_.size() == 1;
}

CoreCoordinator::CookieEntry& CoreCoordinator::entry(std::uint64_t cookie) {
  for (auto& e : cookies_)
    if (e.cookie == cookie) return e;
  if (cookies_.size() >= 32) {
    // Forget cookies with nothing queued or running; they restart at the floor.
    std::erase_if(cookies_, [&](const CookieEntry& e) {
      if (e.runnable || e.cookie == owner_) return false;
      for (auto& sib : siblings_)
        if (sib->running.load(std::memory_order_relaxed) == e.cookie) return false;
      if (e.owned_ns) owned_ns_[e.cookie] += e.owned_ns; // its statistics outlive it
      return true;
    });
  }
  CookieEntry& e = cookies_.emplace_back(CookieEntry{cookie});
  e.vruntime = min_vruntime_;
  e.weight = cookie_weight(cookie);
  weighted_ |= e.weight != kDefaultWeight;
  return e;
}

void CoreCoordinator::count_queued(std::uint64_t cookie, int delta) {
  // A locked add: the worker of a single-PU core also adds the fibers it puts
  // on the spawn ring, and thieves subtract what they take from it, without
  // the lock.
  queued_.fetch_add(delta, std::memory_order_relaxed);
  if (single_pu()) return;
  CookieEntry& e = entry(cookie);
  if (delta > 0 && e.runnable == 0 && cookie != owner_) arrive(e);
  e.runnable = static_cast<std::size_t>(static_cast<long>(e.runnable) + delta);
}

// The one scan of the published cookies: the first cookie other than
// kNoCookie and `same` that a sibling other than `except` (size(): none
// excepted) publishes, else a blocking call's hold if it differs from `same`,
// else kNoCookie.
std::uint64_t CoreCoordinator::published_other(unsigned except, std::uint64_t same, std::memory_order o) const noexcept {
  for (unsigned t = 0; t < size(); ++t) {
    if (t == except) continue;
    const std::uint64_t r = siblings_[t]->running.load(o);
    if (r != kNoCookie && r != same) return r;
  }
  const std::uint64_t h = held_.load(o);
  return h != same ? h : kNoCookie;
}

std::uint64_t CoreCoordinator::other_running(unsigned s) const noexcept {
  if (testing::ignore_siblings.load(std::memory_order_relaxed)) return kNoCookie;
  return published_other(s, kNoCookie, std::memory_order_relaxed); // by the invariant, all running siblings agree
}

bool CoreCoordinator::compatible_locked(unsigned s, std::uint64_t cookie) const noexcept {
  return published_other(s, cookie, std::memory_order_relaxed) == kNoCookie;
}

void CoreCoordinator::publish_locked(unsigned s, std::uint64_t cookie) noexcept {
  CORESCHED_INVARIANT(lock_.is_locked());
  CORESCHED_INVARIANT(cookie == kNoCookie || single_pu() || testing::ignore_siblings.load(std::memory_order_relaxed) ||
                      compatible_locked(s, cookie));
  siblings_[s]->running.store(cookie);
}

void CoreCoordinator::requeue_locked(unsigned s, Fiber* f) {
  siblings_[s]->queue.push(f);
  count_queued(f->cookie, +1);
}

Pick CoreCoordinator::requeue_and_pick_locked(unsigned s, Fiber* f, Requeue how, WakeList& wakes) {
  Sibling& me = *siblings_[s];
  // Fibers `f` spawned go first: a yield must let them run, and one of them
  // drained after `f` went back, at `f`'s own vtime, would queue behind it.
  drain_spawned_locked(s);
  f->vtime = vtime::capped(f->vtime, me.vfloor.load(std::memory_order_relaxed));
  if (how == Requeue::yielded) me.queue.push_behind_all(f);
  else me.queue.insert(f, f->vtime - vtime::kGranularity);
  if (!single_pu()) {
    count_queued(f->cookie, +1);
    return pick_locked(s, wakes);
  }
  // One PU: `f` went on the queue and one fiber comes off it, so the count
  // ends where it began. Neither locked add is needed (a yield between
  // fibers of one worker takes 15 % longer with them).
  me.preempt.store(false, std::memory_order_relaxed);
  return pick_single_pu(s, false);
}

void CoreCoordinator::adopt_locked(unsigned s, Fiber* f) {
  Sibling& me = *siblings_[s];
  f->vtime = vtime::placed(f->vtime, me.vfloor.load(std::memory_order_relaxed));
  me.queue.push(f);
  count_queued(f->cookie, +1);
}

bool CoreCoordinator::enqueue_locked(unsigned s, Fiber* f, WakeList& wakes, Arrival why) {
  Sibling& target = *siblings_[s];
  const std::uint32_t floor = target.vfloor.load(std::memory_order_relaxed);
  f->vtime = why == Arrival::spawned ? floor : vtime::placed(f->vtime, floor);
  target.queue.push(f);
  count_queued(f->cookie, +1);
  if (why != Arrival::moved && !single_pu_ && f->cookie != owner_ && owner_ != kNoCookie)
    preempt_owner_for(f->cookie);
  if (target.sleeping) {
    target.sleeping = false;
    wakes.add(*this, s);
    return false;
  }
  // A woken fiber placed behind the floor (it slept while others ran, and
  // the runner is at the floor or just below) need not wait for the runner's
  // slice to end: ask the runner to stop at its next preemption point (CFS's
  // wake-up preemption); the vtime order then decides. Between cookies on an
  // SMT core the core's pick decides, not this.
  // A fiber woken by a completion that the runner itself collected as it
  // started (Arrival::collected) asks only at the next tick, as CFS's
  // wake-up granularity spares a task that has just started. Otherwise a
  // runner beside two fibers that ping-pong through pipes would be switched
  // in, collect their completions at its first preemption point, and be
  // switched out again, twice per round trip: a small part of its work done
  // alone for most of the CPU charged to it.
  if ((why == Arrival::woken || why == Arrival::collected) && vtime::before(f->vtime, floor)) {
    const std::uint64_t running = target.running.load(std::memory_order_relaxed);
    if (running != kNoCookie && (single_pu_ || running == f->cookie)) {
      if (why == Arrival::collected) target.wake_waits.store(true, std::memory_order_relaxed);
      else target.ask_preempt();
    }
  }
  if (f->pinned == kNotPinned) {
    // The target is busy: a sleeping sibling that can run this cookie takes it.
    for (unsigned t = 0; t < size(); ++t) {
      Sibling& o = *siblings_[t];
      if (t != s && o.sleeping && compatible_locked(t, f->cookie)) {
        o.sleeping = false;
        wakes.add(*this, t);
        return false;
      }
    }
  }
  // Waiting behind another cookie with no forced-idle sibling to time its
  // turn's end: while the ticker ticks once a slice, a runner that switched
  // just before its tick would be asked only two slices later, past the
  // arrival bound the simulation checks (tests/sim).
  const std::uint64_t owner = published_owner();
  return !single_pu_ && owner != kNoCookie && owner != f->cookie && forced_idle_count() == 0;
}

Fiber* CoreCoordinator::take(unsigned s, std::uint64_t cookie) {
  Fiber* f = siblings_[s]->queue.pop(cookie);
  for (unsigned t = 0; !f && t < size(); ++t)
    if (t != s) f = siblings_[t]->queue.steal(cookie, false);
  if (f) count_queued(cookie, -1);
  return f;
}

void CoreCoordinator::set_forced(unsigned s, bool on) noexcept {
  Sibling& me = *siblings_[s];
  if (me.forced_idle == on) return;
  me.forced_idle = on;
  forced_.fetch_add(on ? 1 : -1, std::memory_order_relaxed);
}

void CoreCoordinator::wake_sleepers(WakeList& wakes, unsigned except, bool only_with_work) {
  for (unsigned t = 0; t < size(); ++t) {
    Sibling& o = *siblings_[t];
    if (t == except || !o.sleeping) continue;
    if (only_with_work && !o.forced_idle && o.queue.empty()) continue;
    o.sleeping = false;
    wakes.add(*this, t);
  }
}

void CoreCoordinator::start(unsigned s, Fiber* f, WakeList& wakes, Pick& p) {
  set_forced(s, false);
  publish_locked(s, f->cookie);
  if (single_pu()) return;
  if (awaited_ != 0 && f->cookie == owner_) [[unlikely]] { // reserved_ is a subset of awaited_
    awaited_ &= ~(std::uint64_t{1} << s);
    if (reserved_ >> s & 1) reserved_ = 0; // the turn has begun where it was reserved
  }
  if (f->cookie != owner_) {
    checkpoint(cfg_.clock());
    set_owner(f->cookie, s);
    if (handover_since_ != 0) { // this sibling hands over to itself: no gap
      p.handover_gap_ns = 0;
      p.handover_from = handover_from_;
      handover_gaps_.record(0);
      handover_since_ = 0;
    }
    wake_sleepers(wakes, s, true); // the core changed cookie: waiting siblings re-pick
  } else if (handover_since_ != 0) [[unlikely]] {
    // The first fiber of the core's new cookie after a hand-over (one clock
    // read per hand-over). It is measured from the change, when the old
    // cookie had stopped everywhere, so the gap is the time the core ran
    // neither: a wake-up of a sleeping sibling, or a spinning one's next look.
    const std::uint64_t now = cfg_.clock();
    p.handover_gap_ns = now > handover_since_ ? now - handover_since_ : 0;
    p.handover_from = handover_from_;
    handover_gaps_.record(p.handover_gap_ns);
    handover_since_ = 0;
    owner_started(now);
    if (entry(f->cookie).runnable > 0) wake_sleepers(wakes, s, true);
    return;
  } else {
    if (weighted_ && !owner_started_) [[unlikely]]
      owner_started(cfg_.clock());
    if (entry(f->cookie).runnable > 0) wake_sleepers(wakes, s, true); // more of this cookie queued: let idle siblings help
  }
}

Pick CoreCoordinator::stop_and_idle(unsigned s, std::uint64_t running_elsewhere, WakeList& wakes) {
  set_forced(s, false);
  if (running_elsewhere == kNoCookie) wake_sleepers(wakes, s, true);
  Pick p;
  p.kind = Pick::Kind::idle;
  p.steal = running_elsewhere == kNoCookie ? Pick::Steal::any : Pick::Steal::cookie;
  p.steal_cookie = running_elsewhere;
  return p;
}

void CoreCoordinator::move_spawned_locked(unsigned s) {
  // Already counted in queued_ when they went on the ring. Only single-PU
  // cores have a ring, so no cookie's books need updating either.
  Fiber* batch[32];
  while (const unsigned n = spawned_.take(batch, 32, false))
    for (unsigned i = 0; i < n; ++i) siblings_[s]->queue.push(batch[i]);
}

// A single PU has no sibling to agree with: the oldest fiber of the lowest
// vtime runs, whatever its cookie. `count`: take it off the queued count.
Pick CoreCoordinator::pick_single_pu(unsigned s, bool count) {
  Sibling& me = *siblings_[s];
  Pick p;
  if ((p.fiber = me.queue.pop_oldest())) {
    if (count) count_queued(p.fiber->cookie, -1);
    p.kind = Pick::Kind::run;
    publish_locked(s, p.fiber->cookie);
    return p;
  }
  p.steal = Pick::Steal::any;
  return p;
}

Pick CoreCoordinator::pick_locked(unsigned s, WakeList& wakes) {
  Sibling& me = *siblings_[s];
  drain_spawned_locked(s);
  publish_locked(s, kNoCookie);
  me.preempt.store(false, std::memory_order_relaxed);
  if (single_pu()) return pick_single_pu(s, true);
  const std::uint64_t elsewhere = other_running(s);
  std::uint64_t want = 0;
  std::uint64_t kept_until = 0;
  // While a blocking call holds the core (hold_locked) its cookie is the only
  // one that may run, whoever leads: idling for a leader that cannot start
  // until the call returns would give it nothing.
  if (holds_ != 0) [[unlikely]]
    want = held_.load(std::memory_order_relaxed);
  else if (!choose_cookie(elsewhere, want, kept_until))
    return stop_and_idle(s, elsewhere, wakes);
  // The owner kept while another cookie waits, for the rest of its least
  // turn or until the waiting one leads: this sibling picks again at its
  // first preemption point after that (repick_at, Worker::preempt), and that
  // pick hands the core over. The earlier points run on without the lock: re-picking at each
  // of them would have both siblings take the core lock every few hundred ns
  // for the rest of the turn.
  // (A stale repick_at is harmless: every other request clears it.)
  if (kept_until != 0) [[unlikely]] {
    me.repick_at.store(kept_until, std::memory_order_relaxed);
    me.preempt.store(true, std::memory_order_relaxed);
  }
  if ((want != owner_ || reserved_ != 0) && elsewhere == kNoCookie && holds_ == 0) [[unlikely]] {
    if (want != owner_ ? hand_to_missed(s, want, wakes) : reserved_elsewhere(s)) return forced_idle(s, want, want);
  }
  if (elsewhere != kNoCookie && want != elsewhere) {
    // Another cookie is due: ask the siblings running `elsewhere` to stop at
    // their next preemption point (this one publishes none), and idle until they have.
    request_stop(elsewhere);
    return forced_idle(s, want, elsewhere);
  }
  Pick p;
  if ((p.fiber = take(s, want))) {
    p.kind = Pick::Kind::run;
    start(s, p.fiber, wakes, p);
    return p;
  }
  // The core's cookie is `want` but no fiber of it is ours to run.
  std::uint64_t other = kNoCookie;
  for (auto& e : cookies_)
    if (e.runnable && e.cookie != want) other = e.cookie;
  if (other == kNoCookie) return stop_and_idle(s, elsewhere, wakes);
  if (elsewhere == kNoCookie) {
    // `want` is queued but pinned to a sibling: hand the core to it.
    if (owner_ != want) {
      checkpoint(cfg_.clock());
      set_owner(want, kNoSibling);
    }
    wake_sleepers(wakes, s, true);
  }
  p = forced_idle(s, other, want);
  p.steal = Pick::Steal::cookie; // like the kernel's try_steal_cookie
  p.steal_cookie = want;
  return p;
}

// Sibling `s` idles, wanting `wanted`, while `blocker` holds the core (runs
// on its siblings, or is about to start on one of them).
Pick CoreCoordinator::forced_idle(unsigned s, std::uint64_t wanted, std::uint64_t blocker) {
  set_forced(s, true);
  Pick p;
  p.kind = Pick::Kind::forced_idle;
  p.wanted = wanted;
  p.blocker = blocker;
  return p;
}

std::uint64_t CoreCoordinator::holders(std::uint64_t cookie, unsigned except) const noexcept {
  std::uint64_t mask = 0;
  for (unsigned t = 0; t < size(); ++t)
    if (t != except && siblings_[t]->queue.count(cookie) > 0) mask |= std::uint64_t{1} << t;
  return mask;
}

// Every sibling that holds a cookie's fibers gets to run one in its turns.
// A light cookie's turn is the least turn (62.5 us at the default), shorter
// than a sibling's wake-up on a VM, or than the wait for a CPU that synthetic
// siblings share with a busy one. Otherwise the sibling that begins each turn
// runs the cookie's fibers it holds, the turn ends before the woken one runs,
// and the fibers pinned there never run (weights 25 and 2,500 on core:1 pu:4,
// test_weights.cpp). So a turn's end records the siblings that held the
// cookie's fibers through it and started none (`missed`, set_owner), and the
// next turn begins on one of them: on this sibling if it missed it, else on
// the next of them in turn (`next_missed`), to which this one hands the core
// and idles instead of running the fibers it holds, as it does for a cookie
// pinned elsewhere; the turn is booked from that sibling's first start
// (owner_started). Idle, this one also leaves a CPU it may share with it.
// A sibling that keeps missing a cookie's turns so begins one of every
// 2 x (siblings - 1) of them at least. True if the core was handed over;
// `s` is then forced idle.
bool CoreCoordinator::hand_to_missed(unsigned s, std::uint64_t want, WakeList& wakes) {
  CookieEntry& e = entry(want);
  const std::uint64_t missed = e.missed & holders(want, kNoSibling);
  e.missed = 0;
  if (missed == 0 || (missed >> s & 1)) return false; // none, or it begins here
  unsigned t = e.next_missed % size();
  while (!(missed >> t & 1)) t = (t + 1) % size();
  e.next_missed = t + 1;
  checkpoint(cfg_.clock());
  set_owner(want, kNoSibling);
  reserved_ = std::uint64_t{1} << t;
  wake_sleepers(wakes, s, true);
  return true;
}

// While a turn is reserved for a sibling that missed the last one, the
// others wait for it to begin the turn, for at most a granularity; then
// they run it themselves (turn_due_locked times that).
bool CoreCoordinator::reserved_elsewhere(unsigned s) {
  if (reserved_ >> s & 1) return false;
  if (cfg_.clock() - turn_start_ < cfg_.granularity_ns) return true;
  reserved_ = 0;
  return false;
}

bool CoreCoordinator::remove_unstarted_locked(unsigned s, Fiber* f, const JoinRecord* j) {
  drain_spawned_locked(s); // the child may still be on the ring
  RunQueue& q = siblings_[s]->queue;
  if (!q.contains(f) || f->join != j || !f->fresh) return false;
  q.remove(f);
  count_queued(f->cookie, -1);
  return true;
}

unsigned CoreCoordinator::steal_locked(std::uint64_t cookie, bool any, Fiber** out, unsigned max) {
  // Half, as Go's runqsteal takes: one fiber per steal would leave a thief
  // paying two locks for every empty fiber that a spawner queued (with 1M
  // spawns the queue grows faster than one thief drains it).
  // The spawn ring's fibers join the queue first, so a thief that may take
  // only one cookie finds those of its cookie too (the lock-free steal from
  // the ring is for thieves that may take any).
  drain_spawned_locked(0);
  const unsigned half = static_cast<unsigned>(std::max(queued_.load(std::memory_order_relaxed), 1) + 1) / 2;
  max = std::min(max, half);
  unsigned n = 0;
  for (auto& s : siblings_) {
    while (n < max) {
      Fiber* f = s->queue.steal(cookie, any);
      if (!f) break;
      count_queued(f->cookie, -1);
      out[n++] = f;
      cookie = f->cookie; // one cookie per batch: the thief's core runs it together
      any = false;
    }
  }
  return n;
}

Fiber* CoreCoordinator::evict_locked(unsigned s, std::uint64_t cookie) {
  Fiber* f = siblings_[s]->queue.steal(cookie, false);
  if (f) count_queued(f->cookie, -1);
  return f;
}

bool CoreCoordinator::move_queued_locked(unsigned from, unsigned to, WakeList& wakes) {
  const std::uint64_t cookie = siblings_[from]->running.load(std::memory_order_relaxed);
  if (cookie == kNoCookie || !compatible_locked(to, cookie)) return false;
  Fiber* f = siblings_[from]->queue.steal(cookie, false);
  if (!f) return false;
  Sibling& target = *siblings_[to];
  f->vtime = vtime::placed(f->vtime, target.vfloor.load(std::memory_order_relaxed));
  target.queue.push(f);
  if (target.sleeping) {
    target.sleeping = false;
    wakes.add(*this, to);
  }
  return true;
}

bool CoreCoordinator::change_running_cookie_locked(unsigned s, std::uint64_t cookie, WakeList& wakes) {
  if (!compatible_locked(s, cookie)) return false;
  publish_locked(s, cookie);
  if (!single_pu() && cookie != owner_) {
    checkpoint(cfg_.clock());
    // The fiber brings its new cookie to the core without queueing it, so
    // count_queued never sees it arrive: place it here, or a vruntime left
    // from a visit long ago is credit against every cookie that ran since
    // (set_cookie into a cookie that had been away for seconds would starve
    // the fiber's old cookie while the new one runs). It
    // carries on from the old cookie's place (place: no sleeper credit). A
    // cookie with fibers queued here is on the books already.
    CookieEntry& e = entry(cookie);
    if (e.runnable == 0) place(e, true);
    set_owner(cookie, s); // its fiber runs on
    wake_sleepers(wakes, s, true);
  }
  return true;
}

void CoreCoordinator::prepare_sleep_locked(unsigned s) {
  siblings_[s]->sleeping = true;
  if (single_pu() || owner_ == kNoCookie) return;
  if (published_other(size(), kNoCookie, std::memory_order_relaxed) == kNoCookie) forget_idle_owner();
}

// No sibling runs anything: unless a blocking call holds the core, the core
// idles, so stop charging its owner for the idle time.
void CoreCoordinator::forget_idle_owner() {
  if (holds_ != 0) return;
  // Except while a hand-over is in flight: pick_locked gave the core to a cookie queued
  // only for a sibling it woke (pinned there), and that sibling has not run
  // yet. Keep the owner, or the woken sibling chooses afresh, without the
  // hysteresis of a current owner: the owner just charged for the wake-up
  // is no longer lowest, the core goes to a cookie pinned back here, this
  // sibling is woken to hand over again, and so on: two siblings wake each
  // other for ever and no fiber runs (tests/sim/, many cookies, some pinned).
  for (auto& e : cookies_)
    if (e.cookie == owner_ && e.runnable > 0) return;
  checkpoint(cfg_.clock());
  owner_ = kNoCookie;
  owner_pub_.store(kNoCookie, std::memory_order_relaxed);
}

void CoreCoordinator::hold_locked(std::uint64_t cookie) {
  // The caller's fiber runs `cookie` here, so the core's owner is `cookie`
  // and every sibling runs it or nothing; a hold already in place is of the
  // same cookie, since it keeps every other cookie off the core.
  CORESCHED_INVARIANT(owner_ == cookie && (holds_ == 0 || held_.load(std::memory_order_relaxed) == cookie));
  ++holds_;
  held_.store(cookie, std::memory_order_release);
}

bool CoreCoordinator::try_hold_locked(std::uint64_t cookie) {
  checkpoint(cfg_.clock());
  const CookieEntry& own = entry(cookie);
  for (const auto& e : cookies_)
    if (e.runnable > 0 && e.cookie != cookie && leads(e, own)) return false;
  hold_locked(cookie);
  return true;
}

void CoreCoordinator::release_hold_locked(WakeList& wakes) {
  CORESCHED_INVARIANT(holds_ > 0);
  if (--holds_ != 0) return;
  held_.store(kNoCookie, std::memory_order_release);
  // Siblings forced idle for the call's cookie pick again; if none runs
  // anything, the owner is the call's cookie with nothing left to run.
  wake_sleepers(wakes, size(), true);
  if (published_other(size(), kNoCookie, std::memory_order_relaxed) == kNoCookie) forget_idle_owner();
}

bool CoreCoordinator::sibling_conflict(unsigned s, std::uint64_t cookie) const noexcept {
  return published_other(s, cookie, std::memory_order_acquire) != kNoCookie;
}

std::uint64_t CoreCoordinator::running_cookie() const noexcept {
  return published_other(size(), kNoCookie, std::memory_order_relaxed);
}

CoreCoordinator::Handovers CoreCoordinator::handovers() {
  lock_.lock();
  const Handovers h{handover_gaps_.count(), handover_gaps_.quantile(0.5), handover_gaps_.quantile(0.99),
                    handover_gaps_.max()};
  lock_.unlock();
  return h;
}

} // namespace coresched::detail
