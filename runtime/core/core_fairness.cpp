// SPDX-License-Identifier: Apache-2.0
// The core's fairness books: which cookie owns the core next, and when. Each
// cookie on an SMT core has an entry (CoreCoordinator::CookieEntry) with its
// core-wide virtual runtime (the wall time it owned the core) and, for
// forceidle_balance, the time it waited while another cookie owned it. The
// pick (core_coordinator.cpp) asks choose_cookie; arrivals are placed here;
// a forced-idle sibling asks turn_due_locked when the owner's turn ends.
// All of it runs under the core lock.
//
// Weights (Cookie::set_weight) enter in two places. Time is weighted as it is
// booked: a cookie's vruntime grows by wall x 100 / weight, as the kernel's
// by delta x NICE_0_LOAD / weight. `waited` is a lag: over a span the owner
// owns, each competing cookie is owed span x w / W of it (W: the competing
// cookies' total weight) and the owner pays the span; relative to the owner,
// who stays at 0, a waiter gains span x (W + w - w_owner) / W (wait_rate()).
// (Gaining span x w / 100 instead would starve a light cookie beside two
// heavy ones that take turns: each hand-over between them would cost it more
// than it gains.) With equal weights both are plain wall time. So where
// cookies compete, each owns the core in proportion to its weight.
// And the hysteresis is the heaviest competing cookie's granularity
// (hysteresis()): between busy rivals a cookie's turn lasts 2g x w / w_max of
// wall time (g: the granularity; at least the least turn, g / 8), so the
// heaviest's turn is 2g, as every cookie's is with equal weights, and a
// lighter one's is shorter, not its waits longer. A hysteresis of g for
// every cookie would give a cookie of weight 80 beside ones of 3,800 turns
// whose lead the heavy ones then take 250 ms to make up. docs/design.md
// ("Weights") derives the bounds.
#include "core/core_coordinator.hpp"

#include "platform/cookie_registry.hpp"

#include <algorithm>

namespace coresched::detail {

namespace {

__extension__ typedef unsigned __int128 Wide; // ns x 10,000 outgrows 64 bits after 21 days
__extension__ typedef __int128 SignedWide;

// ns x mul / div, exact for the default weight (mul == div).
std::uint64_t scale(std::uint64_t ns, std::uint32_t mul, std::uint32_t div) noexcept {
  if (mul == div) return ns;
  return static_cast<std::uint64_t>(static_cast<Wide>(ns) * mul / div);
}

} // namespace

// A cookie coming (back) to the core is placed at the floor, as CFS places a
// waking task: old history neither starves it nor lets it starve others.
//
// The floor must be current. While one cookie runs alone no pick reads the
// clock (choose_cookie's single-candidate shortcut, and a same-cookie start),
// so the owner's vruntime and min_vruntime_ are as old as the last
// checkpoint: seconds, after a long solo run. A newcomer placed at that stale
// floor would be as far behind the owner as the solo run was long, and the
// owner would then get none of the core for as long (cookie A alone for T,
// then B: A starved for T). So an arrival beside an owner first brings the
// books up to date: one clock read, on this rare path only; a single
// cookie's yields, wake-ups and picks still read none. The kernel handles the
// same class of bug in c6047c2e3af6 ("sched/fair: Snapshot the min_vruntime
// of CPUs on force idle"). Without an owner the books are current: prepare_sleep_locked
// checkpointed when the core went idle, and nothing accrues without one.
//
// forceidle_balance: the checkpoint also ends the span the other runnable
// cookies waited so far, so the newcomer's `waited` (0: level with the owner)
// counts from its arrival exactly. (Skipping its first, stale span instead
// would also drop the wait between its arrival and the next checkpoint.)
void CoreCoordinator::arrive(CookieEntry& e) {
  if (owner_ != kNoCookie) checkpoint(cfg_.clock());
  place(e);
}

// Call with the books current (after a checkpoint, or with no owner).
//
// The sleeper credit. A cookie that comes back is placed up to two
// granularities below the floor, as CFS places a waking task up to half a
// latency behind min_vruntime, but never further below the floor than its
// own vruntime was: the lead is what it is owed, capped. It then leads the
// owner by more than choose_cookie's hysteresis and takes the core at the
// next pick. Placed level with the owner instead, a cookie that runs briefly
// and sleeps (a request tenant beside a compute tenant) would wait out the
// hysteresis at every wake-up and get about a third of what it asks for (the
// simulation's sleeper_share). The credit cannot
// add up: it is measured from the floor, which every runnable cookie is at
// or above, and a cookie that runs moves up from it; so a cookie that sleeps
// and wakes for ever leads the others by at most the credit. A cookie new to
// the core (or forgotten by entry()) gets none: it has no history to bound
// it, so a new cookie per request, each with the credit, would keep an owner
// off the core for as long as they kept coming. It is placed level with the
// owner, as CFS places a new task no earlier than min_vruntime.
//
// forceidle_balance places it the same lead ahead of the owner (0), but
// never ahead of a cookie already waiting: it joins the back of the line.
// Placed ahead, a cookie whose fibers sleep and wake again and again would
// jump ahead of a cookie that owes time (negative `waited`, after a long
// turn) at every wake-up; both would then gain the same until the newcomer
// owned the core, and set_owner's rebase would take back exactly what the
// debtor had gained: two such rivals would starve it for good. The lead is
// bounded by the vruntime books here too (both policies keep them): `waited`
// forgets what a cookie ran, so a full credit at every wake-up would let one
// that runs 1.4 ms and sleeps 65 µs own 93 % of the core beside a busy one
// (in the simulation).
//
// `carried`: set_cookie, whose fiber carries on under the new cookie
// (change_running_cookie_locked, before the change of owner). That is no
// wake-up, so no credit: the new cookie is placed no lower than the owner it
// replaces, which keeps the running fiber's place. With the credit (or at
// the floor), a fiber that calls set_cookie back and forth would take a lead
// at every call and keep a busy cookie off the core for good (under
// forceidle_balance, and under either policy with 40 cookies, which entry()
// forgets and which so come back at the floor, below the waiting cookie).
//
// Weighted, the credit is at most twice the pair's hysteresis against the
// owner (hysteresis()), in each book's units, so that a returning cookie
// leads at once whatever the weights; the `waited` credit is the vruntime
// credit turned into the cookie's own wall time.
void CoreCoordinator::place(CookieEntry& e, bool carried) {
  const CookieEntry* own = &e;
  for (const auto& o : cookies_)
    if (o.cookie == owner_) own = &o;
  std::uint64_t lead = 0; // in waited units
  if (carried) {
    e.vruntime = std::max({e.vruntime, min_vruntime_, own->vruntime});
  } else {
    std::uint64_t lead_v = 0;
    if (e.placed && e.vruntime < min_vruntime_)
      lead_v = std::min(2 * hysteresis(e, *own, FairnessPolicy::core_vruntime), min_vruntime_ - e.vruntime);
    e.vruntime = std::max(e.vruntime, min_vruntime_ - lead_v);
    lead = std::min(2 * hysteresis(e, *own, FairnessPolicy::forceidle_balance),
                    scale(lead_v, e.weight, kDefaultWeight));
  }
  e.placed = true;
  e.earned = 0;
  auto floor = static_cast<std::int64_t>(lead);
  for (const auto& o : cookies_)
    if (&o != &e && o.runnable && o.cookie != owner_) floor = std::min(floor, o.waited - 1);
  e.waited = floor;
}

// Core-wide virtual runtime: the cookie's owned wall time. Forced-idle
// balance: the time it waited while another cookie held the core.
bool CoreCoordinator::prefer(const CookieEntry& a, const CookieEntry& b) const noexcept {
  if (cfg_.policy == FairnessPolicy::core_vruntime) return a.vruntime < b.vruntime;
  return a.waited > b.waited;
}

// checkpoint() with weights: time booked at each cookie's rate (the top of
// this file), and each cookie's `earned` lag (settle_departure). A turn is
// booked from its first fiber's start (owner_started): until then the span
// counts in the owner's statistics only.
void CoreCoordinator::book_weighted(std::uint64_t now, std::int64_t span) {
  const std::uint64_t total = competing_weight();
  const auto wide_total = static_cast<std::int64_t>(total);
  std::uint32_t w_owner = 0;
  for (const auto& e : cookies_)
    if (e.cookie == owner_) w_owner = e.weight;
  for (auto& e : cookies_) {
    if (e.cookie == owner_) {
      const std::uint64_t owned = now - owner_since_;
      e.owned_ns += owned;
      if (!owner_started_) continue;
      e.vruntime += scale(owned, kDefaultWeight, e.weight);
      e.earned -= span * static_cast<std::int64_t>(total - e.weight) / wide_total; // owed w / W of it, ran all
    } else if (owner_started_ && e.runnable && owner_ != kNoCookie) {
      e.waited += span * wait_rate(e.weight, w_owner, total) / wide_total;
      e.earned += span * e.weight / wide_total;
    }
  }
}

void CoreCoordinator::checkpoint(std::uint64_t now) {
  if (last_checkpoint_ == 0) last_checkpoint_ = now;
  const auto span = static_cast<std::int64_t>(now - last_checkpoint_);
  if (weighted_) [[unlikely]] {
    book_weighted(now, span);
  } else {
    for (auto& e : cookies_) {
      if (e.cookie == owner_) {
        const std::uint64_t owned = now - owner_since_;
        e.vruntime += owned;
        e.owned_ns += owned;
      } else if (e.runnable && owner_ != kNoCookie) {
        e.waited += span; // runnable since the last checkpoint at least: see arrive()
      }
    }
  }
  owner_since_ = now;
  last_checkpoint_ = now;
  update_min_vruntime();
  // After booking: what ran until now ran under the weights it had.
  if (weights_generation() != weights_seen_) [[unlikely]]
    refresh_weights();
}

// A change of weight forgives: every cookie on the books keeps at most twice
// the new hysteresis of lead or debt (what place() gives a returning
// cookie), in both books. A cookie's lead is a wait for the others at their
// rate, so leads taken under the old weights could outlast the new bound:
// scaled to keep their wall time (x old / new, as the kernel's
// reweight_entity scales vlag), a cookie made ten times lighter would wait
// ten times its old lead, without the core for longer than the bound of
// either weighting (the simulation's weight_changes); and made 1,000 times
// lighter, one owed 0.1 ms would go below zero, wrap to the top and never
// run again (coresched-fuzz, set_weight).
void CoreCoordinator::refresh_weights() {
  weights_seen_ = weights_generation(); // before the reads: a change after it is seen next time
  bool changed = false;
  weighted_ = false;
  for (auto& e : cookies_) {
    const std::uint32_t w = cookie_weight(e.cookie);
    changed |= w != e.weight;
    e.weight = w;
    weighted_ |= w != kDefaultWeight;
  }
  if (!changed) return;
  for (auto& e : cookies_) e.earned = 0; // the forgiveness below ends every lag's history
  const CookieEntry* own = nullptr;
  for (const auto& e : cookies_)
    if (e.cookie == owner_) own = &e;
  for (auto& e : cookies_) {
    const CookieEntry& o = own ? *own : e;
    const std::uint64_t span_v = 2 * hysteresis(e, o, FairnessPolicy::core_vruntime);
    e.vruntime = std::clamp(e.vruntime, min_vruntime_ - std::min(span_v, min_vruntime_), min_vruntime_ + span_v);
    if (&e == own) continue; // the owner sits at 0
    const auto span_w = static_cast<std::int64_t>(2 * hysteresis(e, o, FairnessPolicy::forceidle_balance));
    e.waited = std::clamp(e.waited, -span_w, span_w);
  }
}

void CoreCoordinator::update_min_vruntime() {
  std::uint64_t m = kNoCookie;
  for (auto& e : cookies_)
    if (e.runnable || e.cookie == owner_) m = std::min(m, e.vruntime);
  if (m != kNoCookie) min_vruntime_ = std::max(min_vruntime_, m);
}

// forceidle_balance, weighted: a cookie that leaves the core (no fiber left
// to run here) takes its lag with it, and the others settle it by weight.
// While it competed, every other cookie's lag moved at a rate that counts its
// weight in W, as if it would be paid (or pay back) later; it never is, since
// place() gives it a new lag when it returns. Kept, that unpaid lag would be
// a tax on the others in proportion to how long each ran, not to its weight,
// and would move the busy cookies' shares towards equal (in the simulation's
// weighted_busy, a cookie of sleepers would give a light busy cookie up to
// twice its share over a window). So what the leaver earned while it competed
// (`earned`: owed less overrun, from place() on) is spread over the others in
// proportion to their weights, as EEVDF moves its virtual time when an
// entity with lag leaves. The lag place() gave it is not: it was nobody's
// debt. (Settling its whole `waited` against the mean would still give a
// light cookie a third over its share: the back-of-the-line placement would
// come back as a debt charged by weight.) With equal weights nothing is booked.
// `next`: a cookie taken to own the core, counted as competing.
void CoreCoordinator::settle_departure(CookieEntry& leaver, std::uint64_t next) {
  const std::int64_t lag = leaver.earned;
  leaver.earned = 0;
  if (cfg_.policy != FairnessPolicy::forceidle_balance || lag == 0) return;
  auto competes = [&](const CookieEntry& e) {
    return &e != &leaver && (e.runnable || e.cookie == owner_ || e.cookie == next);
  };
  std::uint64_t others = 0;
  for (const auto& e : cookies_)
    if (competes(e)) others += e.weight;
  if (others == 0) return;
  std::int64_t owner_share = 0;
  for (auto& e : cookies_)
    if (competes(e)) {
      const auto share = static_cast<std::int64_t>(static_cast<SignedWide>(lag) * e.weight / others);
      e.waited += share;
      e.earned += share;
      if (e.cookie == owner_) owner_share = share;
    }
  for (auto& e : cookies_) e.waited -= owner_share; // the owner stays at 0
}

// Weighted: the time from a change of owner to its first fiber's start (a
// sibling's wake-up, tens of us on a VM) is booked to nobody: checkpoint()
// charges the owner no vruntime for it and credits no waiter. Booked to the
// owner, as it owns the core from the pick, it would cost a cookie 100 / w
// per ns: a cookie of weight 1 pinned to a sleeping sibling beside one of
// 1,000 would be charged its whole turn (a few us of wall time at that rate)
// while the sibling woke, lose the core before its fiber started, and never
// run (test_weights.cpp). The span stays in owned_ns, the statistics: the
// core was kept for it. With equal weights every hand-over costs each cookie
// alike, and nothing is left out of the books.
void CoreCoordinator::owner_started(std::uint64_t now) {
  if (weighted_) [[unlikely]] {
    if (now > owner_since_) checkpoint(now); // books nothing: owner_started_ is still false
    turn_start_ = now;                       // its least turn runs from here too (least_turn_end)
  }
  owner_started_ = true;
}

// A weighted turn lasts at least the least turn from its first fiber's start.
// A light cookie's weighted turn is a few us of wall time (2g x w / w_max):
// left at that, each turn ended at its fiber's first preemption point, and
// the turn's fixed costs (the switches, the picks under the lock, booked to
// the owner) were a third of it; at 1 : 1,000 that third is paid 1,000 times
// over by the light cookie, which ran 0.7 of its share (test_weights.cpp).
std::uint64_t CoreCoordinator::least_turn_end() const noexcept {
  return weighted_ && owner_started_ ? turn_start_ + (cfg_.granularity_ns >> kMinTurnShift) : 0;
}

// Call after checkpoint(). Forced-idle balance keeps the owner at 0, so a
// cookie's `waited` says how far ahead of the owner it is.
void CoreCoordinator::set_owner(std::uint64_t cookie, unsigned starts_on) {
  // A hand-over when the cookie left still has work (it was preempted for
  // fairness, not out of fibers): its gap runs until the new cookie starts.
  handover_since_ = 0;
  CookieEntry* leaver = nullptr;
  CookieEntry* next = nullptr;
  for (auto& e : cookies_) {
    if (e.cookie == cookie) next = &e;
    if (e.cookie != owner_) continue;
    e.missed = awaited_; // its turn's end (hand_to_missed)
    if (e.runnable > 0) handover_since_ = owner_since_; // checkpoint() set it to now
    else leaver = &e;                                   // out of fibers: it leaves the core
  }
  if (leaver && weighted_) [[unlikely]]
    settle_departure(*leaver, cookie);
  const std::int64_t base = next ? next->waited : 0;
  handover_from_ = owner_;
  turn_start_ = last_checkpoint_;
  owner_started_ = starts_on != kNoSibling;
  awaited_ = holders(cookie, starts_on);
  reserved_ = 0;
  owner_ = cookie;
  owner_pub_.store(cookie, std::memory_order_relaxed);
  cookie_switches.fetch_add(1, std::memory_order_relaxed);
  for (auto& e : cookies_) e.waited -= base;
}

bool CoreCoordinator::choose_cookie(std::uint64_t running, std::uint64_t& out, std::uint64_t& kept_until) {
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
  // A turn has a least length (kMinTurnShift: an eighth of a granularity):
  // within it, a sibling that looks for work while the owner runs on another
  // sibling (`running`) runs the owner's work rather than go forced idle for
  // a cookie that leads. A cookie that wakes with the sleeper credit (place)
  // leads the owner at once; without a least turn, the siblings woken for the
  // owner's new turn would find it leading before they had looked, go forced
  // idle, and the owner's one running fiber would be all of it that ran. In
  // the simulation's debtor_sleepers scenario (owner fibers with preemption
  // points 5-10 ms apart, rivals sleeping 1 µs), a fiber of the owner would
  // then stay queued for 100 ms. (A sibling with no owner fiber running beside
  // it starts the leader at once: nobody is forced idle.)
  // A cookie that leads and waits out the least turn must not then wait for
  // the tick as well: the pick that keeps the owner asks its own sibling to
  // pick again at its first preemption point after the turn's least length
  // (`kept_until`, pick_locked).
  if (cur && best != cur) {
    if (!leads(*best, *cur)) {
      // Kept while `best` waits: nothing else times when it leads (see
      // preempt_owner_for), so this sibling picks again at its first
      // preemption point after that.
      kept_until = leads_at(*best, *cur);
      best = cur;
    } else if (running == owner_ && last_checkpoint_ - turn_start_ < (cfg_.granularity_ns >> kMinTurnShift)) {
      best = cur; // young
      kept_until = turn_start_ + (cfg_.granularity_ns >> kMinTurnShift);
    } else if (last_checkpoint_ < least_turn_end()) {
      best = cur; // a weighted turn younger than its least length, from its start
      kept_until = least_turn_end();
    }
  }
  if (weighted_ && kept_until == 0) time_weighted_turn(*best, kept_until);
  out = best->cookie;
  return true;
}

// An owner's turn, weighted, is 2g x w / w_max: shorter than the slice
// after which the ticker asks a busy fiber to stop (2g), for all but the
// heaviest cookie. So every pick that runs the owner while another cookie
// waits also times the turn's end for its sibling: when the next cookie will
// lead (`kept_until`, as for a kept owner). Left to the ticker, a cookie of
// weight 96 beside one of 1,632 would hold the core a whole slice per turn,
// and the heavy one then run 17 slices to make it up: shares would hold over
// seconds but not over windows of 200 slices. Timed by the hand-over's pick
// alone, the owner's other siblings would still run to the tick.
// The earliest of the waiting cookies, not the one preferred now: under
// forceidle_balance a heavier waiter's lag grows faster and may lead first.
void CoreCoordinator::time_weighted_turn(const CookieEntry& owner, std::uint64_t& kept_until) const noexcept {
  for (const auto& e : cookies_)
    if (&e != &owner && e.runnable) {
      const std::uint64_t at = leads_at(e, owner);
      if (kept_until == 0 || at < kept_until) kept_until = at;
    }
}

// Hysteresis: the core leaves its current cookie only when another is ahead
// by a granularity, so two busy cookies alternate in slices, not per yield.
bool CoreCoordinator::leads(const CookieEntry& a, const CookieEntry& owner) const noexcept {
  const std::uint64_t h = weighted_ ? hysteresis(a, owner, cfg_.policy) : cfg_.granularity_ns;
  if (cfg_.policy == FairnessPolicy::core_vruntime) return a.vruntime + h < owner.vruntime;
  return a.waited > owner.waited + static_cast<std::int64_t>(h);
}

// The granularity between `a` and `b` in the policy's book, such that the
// owner's turn between them lasts 2g x w_owner / w_max of wall time (w_max:
// the heaviest cookie competing for the core). The owner's vruntime moves,
// at 100 / w_owner per ns: g x 100 / w_max of vruntime. Between two
// cookies, a waiter's lag moves at 2 w_waiter / (w_a + w_b):
// 2g x w_a x w_b / (w_max (w_a + w_b)) of lag. Equal weights: g.
std::uint64_t CoreCoordinator::hysteresis(const CookieEntry& a, const CookieEntry& b, FairnessPolicy book) const noexcept {
  if (!weighted_) return cfg_.granularity_ns;
  std::uint64_t heaviest = std::max(a.weight, b.weight);
  for (const auto& e : cookies_)
    if (e.runnable || e.cookie == owner_) heaviest = std::max<std::uint64_t>(heaviest, e.weight);
  const Wide g = cfg_.granularity_ns;
  return static_cast<std::uint64_t>(book == FairnessPolicy::core_vruntime
                                        ? g * kDefaultWeight / heaviest
                                        : 2 * g * a.weight * b.weight / (heaviest * (a.weight + b.weight)));
}

// The total weight of the cookies competing for the core: runnable, or the owner.
std::uint64_t CoreCoordinator::competing_weight() const noexcept {
  std::uint64_t total = 0;
  for (const auto& e : cookies_)
    if (e.runnable || e.cookie == owner_) total += e.weight;
  return std::max<std::uint64_t>(total, 1);
}

// How fast a waiter's lag grows relative to the owner's, per unit of
// `total` (see the top of this file): W + w - w_owner, over W.
std::int64_t CoreCoordinator::wait_rate(std::uint32_t w, std::uint32_t w_owner, std::uint64_t total) noexcept {
  return static_cast<std::int64_t>(total + w) - static_cast<std::int64_t>(std::min<std::uint64_t>(w_owner, total));
}

// Wall time from the last checkpoint until `a` leads `owner` (leads()), while
// nothing else changes: only the moving side moves, with wall time (the
// owner's vruntime at 100 / w_owner per ns, or a's wait at w_a / 100).
// Negative: it led that long ago. One past the hysteresis: leads() is strict.
std::int64_t CoreCoordinator::until_leads(const CookieEntry& a, const CookieEntry& owner) const noexcept {
  const auto h = static_cast<std::int64_t>(hysteresis(a, owner, cfg_.policy));
  if (cfg_.policy == FairnessPolicy::core_vruntime) {
    const std::int64_t left = static_cast<std::int64_t>(a.vruntime - owner.vruntime) + h + 1;
    return left * owner.weight / static_cast<std::int64_t>(kDefaultWeight);
  }
  const std::int64_t left = owner.waited + h + 1 - a.waited;
  if (!weighted_) return left;
  const std::uint64_t total = competing_weight();
  return left * static_cast<std::int64_t>(total) / wait_rate(a.weight, owner.weight, total);
}

// Wake-up preemption between cookies, as the kernel reschedules a sibling
// when a wake-up changes the core-wide pick. A cookie that wakes (or gets a
// fiber spawned) with the sleeper credit (place) leads the owner at once, but
// the core's pick runs only when a sibling stops: an owner whose fibers reach
// preemption points without yielding would keep the core until the slice
// ticker flagged them (a slice without a switch), and the woken cookie would
// wait that out at every wake-up. So the owner is asked to stop now (request_stop:
// the pick under the lock still decides). The pick keeps an owner whose turn
// is younger than its least length (kMinTurnShift: an eighth of a
// granularity, 62.5 µs at the default), so each turn a wake-up ends has
// lasted that long: a waking cookie takes the core from a busy one at most
// once per least turn plus its own burst, each time two hand-overs (there,
// and back as its burst ends), each a sibling's wake-up, µs on bare metal and
// tens of µs on a VM (in the simulation, three cookies waking every
// 65-100 µs for 5-20 µs bursts cause 12,000-33,000 changes of cookie a second
// and get 10-36 % of the core, about what they ask). In a younger turn the
// owner is asked all the same:
// each pick that keeps it for the rest of its least turn asks its own sibling
// to pick again at its first preemption point after that (choose_cookie's
// `kept_until`, pick_locked), and that pick hands over. (Left to wait for
// the tick instead, such a cookie would lose most of its share: its fibers'
// preemption points collect the owner's timers, so a sleep shorter than the
// least turn ends inside it, as for the guarantee test's sleeper beside
// owner fibers that never yield.) In the simulation (sleeper_share: a cookie
// that runs and sleeps 50-400 µs at a time beside a busy one) the median
// share over what it asks is 0.85 (worst 0.70-0.77, four seeds).
void CoreCoordinator::preempt_owner_for(std::uint64_t cookie) {
  const CookieEntry* e = nullptr;
  const CookieEntry* own = nullptr;
  for (const auto& c : cookies_) {
    if (c.cookie == cookie) e = &c;
    else if (c.cookie == owner_) own = &c;
  }
  // runnable == 1: it has just arrived (count_queued placed it, the books
  // current); one that was already waiting has its turn timed already.
  if (!e || !own || e->runnable != 1) return;
  if (leads(*e, *own)) return request_stop(owner_);
  // It does not lead yet (a cookie new to the core has no sleeper credit): it
  // leads once the owner has run the granularity longer, and the siblings
  // running the owner pick again at their first preemption point after that
  // (Sibling::repick_at, one clock read per point until then). Left to the
  // slice ticker, the turn would end only when a runner had gone a whole
  // slice without switching, and later when the ticker's thread, which shares
  // the busy CPUs, woke late: arrivals of fresh cookies beside a busy owner
  // would wait 1.4-1.6 slices (p50) and 4.4-8 (p99) from spawn() to their
  // first instruction (coresched-arrival-bench).
  const std::uint64_t due = leads_at(*e, *own);
  for (auto& sp : siblings_) {
    if (sp->running.load(std::memory_order_relaxed) != owner_) continue;
    const std::uint64_t at = sp->repick_at.load(std::memory_order_relaxed);
    if (sp->preempt.load(std::memory_order_relaxed) && (at == 0 || at <= due)) continue; // asked as soon already
    sp->repick_at.store(due, std::memory_order_relaxed);
    sp->preempt.store(true, std::memory_order_release); // after repick_at: see Sibling::ask_preempt
  }
}

// The first instant at which `a` leads `owner` (leads()), the books current
// (last_checkpoint_ is now): only the moving side moves, with wall time (the
// owner's vruntime, or the waiters' wait), so it is exact while nothing else
// changes. One past the granularity: leads() compares strictly.
std::uint64_t CoreCoordinator::leads_at(const CookieEntry& a, const CookieEntry& owner) const noexcept {
  return last_checkpoint_ + static_cast<std::uint64_t>(std::max<std::int64_t>(until_leads(a, owner), 1));
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
  // choose_cookie leaves the owner once `next` leads it, after a checkpoint
  // that brings the moving side up to date (the owner's vruntime grows from
  // owner_since_, the waiters' `waited` from the last checkpoint: both are
  // the last checkpoint's time). Overdue (negative): when it was due, not
  // the checkpoint's time, which each checkpoint moves to now (a forced-idle
  // PU would otherwise wait for a turn's end that is always just now, and
  // spin for ever beside an owner that never stops).
  std::int64_t until = until_leads(*next, *own);
  // An owner that has not started yet is not charged (owner_started): its
  // turn's end does not come closer, so look again a least turn later, not
  // at once and again.
  if (!owner_started_ && weighted_)
    until = std::max(until, static_cast<std::int64_t>(cfg_.granularity_ns >> kMinTurnShift));
  auto due = std::max(static_cast<std::int64_t>(last_checkpoint_) + until, static_cast<std::int64_t>(least_turn_end()));
  if (reserved_ != 0) [[unlikely]] // the turn waits for them to begin it, for at most a granularity (hand_to_missed)
    due = std::max(due, static_cast<std::int64_t>(turn_start_ + cfg_.granularity_ns));
  return due > 0 ? static_cast<std::uint64_t>(due) : 1;
}

std::vector<CoreCoordinator::CookieTime> CoreCoordinator::ownership() {
  std::vector<CookieTime> out;
  lock_.lock();
  if (!single_pu() && owner_ != kNoCookie) checkpoint(cfg_.clock());
  std::unordered_map<std::uint64_t, std::uint64_t> sum = owned_ns_;
  for (const auto& e : cookies_)
    if (e.owned_ns) sum[e.cookie] += e.owned_ns;
  for (auto& [cookie, ns] : sum) out.push_back({cookie, ns});
  lock_.unlock();
  return out;
}

} // namespace coresched::detail
