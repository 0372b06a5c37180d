// SPDX-License-Identifier: Apache-2.0
#include "core_coordinator.hpp"

#include "clock.hpp"
#include "fiber_vtime.hpp"
#include "io_ring.hpp"

#include <algorithm>
#include <immintrin.h>

namespace coresched::detail {

namespace testing {
std::atomic<bool> ignore_siblings{false};
}

void WakeList::notify() noexcept {
  for (std::size_t i = 0; i < n_; ++i) {
    sleepers_[i]->wake_word.fetch_add(1, std::memory_order_release);
    if (IoRing* r = sleepers_[i]->ring.load(std::memory_order_acquire)) r->wake();
  }
  n_ = 0;
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
      return true;
    });
  }
  CookieEntry& e = cookies_.emplace_back(CookieEntry{cookie});
  e.vruntime = min_vruntime_;
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

// A cookie coming (back) to the core is placed at the floor, as CFS places a
// waking task: old history neither starves it nor lets it starve others.
//
// The floor must be today's. While one cookie runs alone no pick reads the
// clock (choose_cookie's single-candidate shortcut, and a same-cookie start),
// so the owner's vruntime and min_vruntime_ are as old as the last
// checkpoint: seconds, after a long solo run. A newcomer placed at that stale
// floor was as far behind the owner as the solo run was long, and the owner
// then got none of the core for as long (cookie A alone for T, then B: A
// starved for T). So an arrival beside an owner first brings the books up to
// date: one clock read, on this rare path only; a single cookie's yields,
// wake-ups and picks still read none. The kernel fixed the same class of bug
// in c6047c2e3af6 ("sched/fair: Snapshot the min_vruntime of CPUs on force
// idle"). Without an owner the books are current: prepare_sleep_locked
// checkpointed when the core went idle, and nothing accrues without one.
//
// forceidle_balance: the checkpoint also ends the span the other runnable
// cookies waited so far, so the newcomer's `waited` (0: level with the owner)
// counts from its arrival exactly. (A `fresh` flag used to skip its first,
// stale span instead, which also dropped the wait between its arrival and the
// next checkpoint.)
void CoreCoordinator::arrive(CookieEntry& e) {
  if (owner_ != kNoCookie) checkpoint(cfg_.clock());
  place(e);
}

// Call with the books current (after a checkpoint, or with no owner).
//
// forceidle_balance places a newcomer level with the owner (0), but never
// ahead of a cookie already waiting: it joins the back of the line. Placed at
// 0, a cookie whose fibers sleep and wake again and again jumped ahead of a
// cookie that owed time (negative `waited`, after a long turn) at every
// wake-up; both then gained the same until the newcomer owned the core, and
// set_owner's rebase took back exactly what the debtor had gained: two such
// rivals starved it for good (fuzzer seed 1161: 5 s without a run, its
// `waited` stuck at -135 ms in the fiber dump).
void CoreCoordinator::place(CookieEntry& e) {
  e.vruntime = std::max(e.vruntime, min_vruntime_);
  std::int64_t floor = 0;
  for (const auto& o : cookies_)
    if (&o != &e && o.runnable && o.cookie != owner_) floor = std::min(floor, o.waited - 1);
  e.waited = floor;
}

std::uint64_t CoreCoordinator::other_running(unsigned s) const noexcept {
  if (testing::ignore_siblings.load(std::memory_order_relaxed)) return kNoCookie;
  for (unsigned t = 0; t < size(); ++t) {
    if (t == s) continue;
    const std::uint64_t r = siblings_[t]->running.load(std::memory_order_relaxed);
    if (r != kNoCookie) return r; // by the invariant, all running siblings agree
  }
  return kNoCookie;
}

bool CoreCoordinator::compatible_locked(unsigned s, std::uint64_t cookie) const noexcept {
  for (unsigned t = 0; t < size(); ++t) {
    if (t == s) continue;
    const std::uint64_t r = siblings_[t]->running.load(std::memory_order_relaxed);
    if (r != kNoCookie && r != cookie) return false;
  }
  return true;
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
  // fibers of one worker took 15 % longer with them).
  me.preempt.store(false, std::memory_order_relaxed);
  return pick_single_pu(me, false);
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
  if (target.sleeping) {
    target.sleeping = false;
    wakes.add(&target);
    return false;
  }
  // A woken fiber placed behind the floor (it slept while others ran, and
  // the runner is at the floor or just below) need not wait for the runner's
  // slice to end: ask the runner to stop at its next preemption point (CFS's
  // wake-up preemption); the vtime order then decides. Between cookies on an
  // SMT core the core's pick decides, not this.
  if (why == Arrival::woken && vtime::before(f->vtime, floor)) {
    const std::uint64_t running = target.running.load(std::memory_order_relaxed);
    if (running != kNoCookie && (single_pu_ || running == f->cookie))
      target.preempt.store(true, std::memory_order_relaxed);
  }
  if (f->pinned == kNotPinned) {
    // The target is busy: a sleeping sibling that can run this cookie takes it.
    for (unsigned t = 0; t < size(); ++t) {
      Sibling& o = *siblings_[t];
      if (t != s && o.sleeping && compatible_locked(t, f->cookie)) {
        o.sleeping = false;
        wakes.add(&o);
        return false;
      }
    }
  }
  // Waiting behind another cookie with no forced-idle sibling to time its
  // turn's end: while the ticker ticks once a slice, a runner that switched
  // just before its tick was asked only two slices later, past the arrival
  // bound the simulation checks (tests/sim: 2.04-2.09 ms against 2).
  const std::uint64_t owner = published_owner();
  return !single_pu_ && owner != kNoCookie && owner != f->cookie && forced_idle_count() == 0;
}

// Core-wide virtual runtime: the cookie's owned wall time. Forced-idle
// balance: the time it waited while another cookie held the core.
bool CoreCoordinator::prefer(const CookieEntry& a, const CookieEntry& b) const noexcept {
  if (cfg_.policy == FairnessPolicy::core_vruntime) return a.vruntime < b.vruntime;
  return a.waited > b.waited;
}

void CoreCoordinator::checkpoint(std::uint64_t now) {
  if (last_checkpoint_ == 0) last_checkpoint_ = now;
  const auto span = static_cast<std::int64_t>(now - last_checkpoint_);
  for (auto& e : cookies_) {
    if (e.cookie == owner_) {
      const std::uint64_t owned = now - owner_since_;
      e.vruntime += owned;
      owned_ns_[owner_] += owned;
    } else if (e.runnable && owner_ != kNoCookie) {
      e.waited += span; // runnable since the last checkpoint at least: see arrive()
    }
  }
  owner_since_ = now;
  last_checkpoint_ = now;
  update_min_vruntime();
}

void CoreCoordinator::update_min_vruntime() {
  std::uint64_t m = kNoCookie;
  for (auto& e : cookies_)
    if (e.runnable || e.cookie == owner_) m = std::min(m, e.vruntime);
  if (m != kNoCookie) min_vruntime_ = std::max(min_vruntime_, m);
}

// Call after checkpoint(). Forced-idle balance keeps the owner at 0, so a
// cookie's `waited` says how far ahead of the owner it is.
void CoreCoordinator::set_owner(std::uint64_t cookie) {
  // A hand-over when the cookie left still has work (it was preempted for
  // fairness, not out of fibers): its gap runs until the new cookie starts.
  handover_since_ = 0;
  std::int64_t base = 0;
  for (const auto& e : cookies_) {
    if (e.cookie == cookie) base = e.waited;
    else if (e.cookie == owner_ && e.runnable > 0) handover_since_ = owner_since_; // checkpoint() set it to now
  }
  handover_from_ = owner_;
  owner_ = cookie;
  owner_pub_.store(cookie, std::memory_order_relaxed);
  cookie_switches.fetch_add(1, std::memory_order_relaxed);
  for (auto& e : cookies_) e.waited -= base;
}

bool CoreCoordinator::choose_cookie(std::uint64_t running, std::uint64_t& out) {
  CookieEntry* only = nullptr;
  int candidates = 0;
  for (auto& e : cookies_) {
    if (e.runnable == 0 && e.cookie != running) continue;
    ++candidates;
    only = &e;
  }
  if (running != kNoCookie && candidates == 0) {
    out = running;
    return true;
  }
  if (candidates == 0) return false;
  if (candidates == 1) { // the common case: no clock read
    out = only->cookie;
    return true;
  }
  checkpoint(cfg_.clock());
  CookieEntry* best = nullptr;
  CookieEntry* cur = nullptr;
  for (auto& e : cookies_) {
    if (e.runnable == 0 && e.cookie != running) continue;
    if (!best || prefer(e, *best)) best = &e;
    if (e.cookie == owner_) cur = &e;
  }
  // Hysteresis: the core leaves its current cookie only when another is
  // ahead by a granularity, so two busy cookies alternate in slices, not per yield.
  if (cur && best != cur) {
    const bool ahead = cfg_.policy == FairnessPolicy::core_vruntime
                           ? best->vruntime + cfg_.granularity_ns < cur->vruntime
                           : best->waited > cur->waited + static_cast<std::int64_t>(cfg_.granularity_ns);
    if (!ahead) best = cur;
  }
  out = best->cookie;
  return true;
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
    wakes.add(&o);
  }
}

void CoreCoordinator::start(unsigned s, Fiber* f, WakeList& wakes, Pick& p) {
  Sibling& me = *siblings_[s];
  set_forced(s, false);
  me.running.store(f->cookie, std::memory_order_release);
  if (single_pu()) return;
  if (f->cookie != owner_) {
    checkpoint(cfg_.clock());
    set_owner(f->cookie);
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
    if (entry(f->cookie).runnable > 0) wake_sleepers(wakes, s, true);
    return;
  } else if (entry(f->cookie).runnable > 0) {
    wake_sleepers(wakes, s, true); // more of this cookie queued: let idle siblings help
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
Pick CoreCoordinator::pick_single_pu(Sibling& me, bool count) {
  Pick p;
  if ((p.fiber = me.queue.pop_oldest())) {
    if (count) count_queued(p.fiber->cookie, -1);
    p.kind = Pick::Kind::run;
    me.running.store(p.fiber->cookie, std::memory_order_release);
    return p;
  }
  p.steal = Pick::Steal::any;
  return p;
}

Pick CoreCoordinator::pick_locked(unsigned s, WakeList& wakes) {
  Sibling& me = *siblings_[s];
  drain_spawned_locked(s);
  me.running.store(kNoCookie, std::memory_order_release);
  me.preempt.store(false, std::memory_order_relaxed);
  if (single_pu()) return pick_single_pu(me, true);
  const std::uint64_t elsewhere = other_running(s);
  std::uint64_t want = 0;
  if (!choose_cookie(elsewhere, want)) return stop_and_idle(s, elsewhere, wakes);
  Pick p;
  if (elsewhere != kNoCookie && want != elsewhere) {
    // Another cookie is due: ask the siblings running `elsewhere` to stop at
    // their next preemption point, and idle until they have.
    for (unsigned t = 0; t < size(); ++t)
      if (t != s && siblings_[t]->running.load(std::memory_order_relaxed) == elsewhere)
        siblings_[t]->preempt.store(true, std::memory_order_relaxed);
    set_forced(s, true);
    p.kind = Pick::Kind::forced_idle;
    p.wanted = want;
    p.blocker = elsewhere;
    return p;
  }
  if ((p.fiber = take(s, want))) {
    p.kind = Pick::Kind::run;
    start(s, p.fiber, wakes, p);
    return p;
  }
  // The core's cookie is `want` but no fiber of it is ours to run.
  bool other_work = false;
  for (auto& e : cookies_)
    if (e.runnable && e.cookie != want) { other_work = true; p.wanted = e.cookie; }
  if (!other_work) return stop_and_idle(s, elsewhere, wakes);
  if (elsewhere == kNoCookie) {
    // `want` is queued but pinned to a sibling: hand the core to it.
    if (owner_ != want) {
      checkpoint(cfg_.clock());
      set_owner(want);
    }
    wake_sleepers(wakes, s, true);
  }
  set_forced(s, true);
  p.kind = Pick::Kind::forced_idle;
  p.blocker = want;
  p.steal = Pick::Steal::cookie; // like the kernel's try_steal_cookie
  p.steal_cookie = want;
  return p;
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
  // Half, as Go's runqsteal takes: one fiber per steal left a thief paying two
  // locks for every empty fiber that a spawner queued (1M spawns: the queue
  // grew faster than one thief drained it).
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
    wakes.add(&target);
  }
  return true;
}

bool CoreCoordinator::change_running_cookie_locked(unsigned s, std::uint64_t cookie, WakeList& wakes) {
  if (!compatible_locked(s, cookie)) return false;
  siblings_[s]->running.store(cookie, std::memory_order_release);
  if (!single_pu() && cookie != owner_) {
    checkpoint(cfg_.clock());
    // The fiber brings its new cookie to the core without queueing it, so
    // count_queued never sees it arrive: place it here as any arrival, or a
    // vruntime left from a visit long ago is credit against every cookie
    // that ran since (found by the simulation: set_cookie into a cookie that
    // had been away for seconds starved the fiber's old cookie while the
    // new one ran). A cookie with fibers queued here is on the books already.
    CookieEntry& e = entry(cookie);
    if (e.runnable == 0) place(e);
    set_owner(cookie);
    wake_sleepers(wakes, s, true);
  }
  return true;
}

void CoreCoordinator::prepare_sleep_locked(unsigned s) {
  siblings_[s]->sleeping = true;
  if (single_pu() || owner_ == kNoCookie) return;
  for (auto& o : siblings_)
    if (o->running.load(std::memory_order_relaxed) != kNoCookie) return;
  // A hand-over is in flight: pick_locked gave the core to a cookie queued
  // only for a sibling it woke (pinned there), and that sibling has not run
  // yet. Keep the owner, or the woken sibling chooses afresh, without the
  // hysteresis of a current owner: the owner just charged for the wake-up
  // is no longer lowest, the core goes to a cookie pinned back here, this
  // sibling is woken to hand over again, and so on. Found by the simulation
  // (tests/sim/, many cookies, some pinned): two siblings woke each other
  // for ever and no fiber ran.
  for (auto& e : cookies_)
    if (e.cookie == owner_ && e.runnable > 0) return;
  // The whole core idles: stop charging its last cookie for the idle time.
  checkpoint(cfg_.clock());
  owner_ = kNoCookie;
  owner_pub_.store(kNoCookie, std::memory_order_relaxed);
}

bool CoreCoordinator::sibling_conflict(unsigned s, std::uint64_t cookie) const noexcept {
  for (unsigned t = 0; t < size(); ++t) {
    if (t == s) continue;
    const std::uint64_t r = siblings_[t]->running.load(std::memory_order_acquire);
    if (r != kNoCookie && r != cookie) return true;
  }
  return false;
}

std::uint64_t CoreCoordinator::running_cookie() const noexcept {
  for (const auto& s : siblings_) {
    const std::uint64_t r = s->running.load(std::memory_order_relaxed);
    if (r != kNoCookie) return r;
  }
  return kNoCookie;
}

std::uint64_t CoreCoordinator::turn_due_locked(unsigned s) const noexcept {
  if (!siblings_[s]->forced_idle || owner_ == kNoCookie) return 0;
  const CookieEntry* own = nullptr;
  const CookieEntry* next = nullptr;
  for (const auto& e : cookies_) {
    if (e.cookie == owner_) own = &e;
    else if (e.runnable > 0 && (!next || prefer(e, *next))) next = &e;
  }
  if (!own || !next) return 0;
  // choose_cookie leaves the owner once `next` is ahead by the granularity,
  // after a checkpoint that brings the moving side up to date.
  const auto gran = static_cast<std::int64_t>(cfg_.granularity_ns);
  std::int64_t left; // from `since`, how long the moving side still has to move
  std::uint64_t since;
  if (cfg_.policy == FairnessPolicy::core_vruntime) {
    // The owner's vruntime grows from owner_since_; the others' stand still.
    left = static_cast<std::int64_t>(next->vruntime - own->vruntime) + gran;
    since = owner_since_;
  } else {
    // The waiters' `waited` grows from the last checkpoint; the owner's stands.
    left = own->waited + gran - next->waited;
    since = last_checkpoint_;
  }
  // Overdue (left < 0): when it was due, not `since`, which each checkpoint
  // moves to now (a forced-idle PU would otherwise wait for a turn's end that
  // is always just now, and spin for ever beside an owner that never stops).
  const auto due = static_cast<std::int64_t>(since) + left;
  return due > 0 ? static_cast<std::uint64_t>(due) : 1;
}

CoreCoordinator::Handovers CoreCoordinator::handovers() {
  lock_.lock();
  const Handovers h{handover_gaps_.count(), handover_gaps_.quantile(0.5), handover_gaps_.quantile(0.99),
                    handover_gaps_.max()};
  lock_.unlock();
  return h;
}

std::vector<CoreCoordinator::CookieTime> CoreCoordinator::ownership() {
  std::vector<CookieTime> out;
  lock_.lock();
  if (!single_pu() && owner_ != kNoCookie) checkpoint(cfg_.clock());
  for (auto& [cookie, ns] : owned_ns_) out.push_back({cookie, ns});
  lock_.unlock();
  return out;
}

} // namespace coresched::detail
