// SPDX-License-Identifier: Apache-2.0
// The simulated core (sim_core.hpp): the models of the workers and the ticker
// around the real CoreCoordinator, step by step on the simulated clock.
#include "sim_core.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace sim {

namespace {
// The simulated clock the coordinator reads through CoreConfig::clock. One
// simulation at a time (Catch2 runs test cases one after another).
std::uint64_t g_now = 0;
bool g_in_use = false;
std::uint64_t sim_clock() noexcept { return g_now; }

std::vector<unsigned> workers(unsigned n) {
  std::vector<unsigned> w(n);
  for (unsigned i = 0; i < n; ++i) w[i] = i;
  return w;
}

// Worker::find_work spins kIdleSpinRounds (256) rounds with a spinner slot,
// kUnclaimedSpinRounds or kForcedIdleSpinRounds (16) without; ~0.2 us a
// round (256 rounds are ~50 us). A simulated step stands for 16 rounds.
constexpr int kRoundsPerStep = 16;
constexpr std::uint64_t kRoundNs = 200;
constexpr std::uint64_t kTick = kSlice / 4; // Scheduler: Ticker(slice / 4)
} // namespace

std::uint64_t Rng::exp(std::uint64_t mean) noexcept {
  const double u = static_cast<double>(next() >> 11) * 0x1.0p-53;
  return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(-std::log1p(-u) * static_cast<double>(mean)));
}

CoreSim::CoreSim(unsigned pus, FairnessPolicy policy, std::uint64_t seed)
    : rng_(seed), core_(0, workers(pus), CoreConfig{policy, kSlice / 2, &sim_clock}), n_(pus), policy_(policy) {
  if (g_in_use) throw std::logic_error("one CoreSim at a time");
  g_in_use = true;
  // Any start will do but 0, which the coordinator takes for "never checkpointed".
  g_now = 1'000'000'000 + rng_.range(0, kSlice);
  t0_ = g_now;
  next_tick_ = g_now + rng_.range(1, kTick);
  last_tick_ = next_tick_ - kTick;
  next_check_ = g_now + kTick;
  for (unsigned s = 0; s < n_; ++s) pus_[s].next = g_now; // workers start in find_work
}

CoreSim::~CoreSim() { g_in_use = false; }

std::uint64_t CoreSim::now() const noexcept { return g_now; }

int CoreSim::add(const FiberSpec& spec, std::uint64_t at) {
  const int i = static_cast<int>(fibers_.size());
  Fiber& r = records_.emplace_back();
  r.id = static_cast<std::uint64_t>(i);
  r.cookie = spec.cookie;
  r.pinned = spec.pinned;
  r.last_worker =
      spec.pinned != kNotPinned ? static_cast<unsigned>(spec.pinned) : static_cast<unsigned>(rng_.range(0, n_ - 1));
  SimFiber& f = fibers_.emplace_back();
  f.spec = spec;
  f.burst_left = spec.run_mean ? length(spec.run_mean, spec.exact) : kNever;
  f.storm_left = spec.storm_mean ? length(spec.storm_mean, spec.exact) : kNever;
  timers_.push({std::max(at, g_now), timer_seq_++, i});
  return i;
}

void CoreSim::depart(int i) {
  SimFiber& f = fibers_[i];
  if (f.st == St::done) return;
  f.leaving = true;
  if (f.st == St::running)
    for (unsigned s = 0; s < n_; ++s)
      if (pus_[s].fiber == i) pus_[s].stop_at = std::min(pus_[s].stop_at, g_now + rng_.range(kUs, 20 * kUs));
}

void CoreSim::fail(const std::string& what) {
  if (!failure_.empty()) return;
  char head[160];
  std::snprintf(head, sizeof head, "%s (%u PUs, %s, t = %.3f ms, %llu events)\nlast events:\n", what.c_str(), n_,
                coresched::to_string(policy_), static_cast<double>(g_now - t0_) / 1e6,
                static_cast<unsigned long long>(events_));
  failure_ = head;
  static const char* names[] = {"place",      "preempt flag", "yield", "park", "finish",
                                "set_cookie", "pick",         "sleep", "wake"};
  const std::size_t k = std::min(trace_n_, trace_.size());
  for (std::size_t j = trace_n_ - k; j < trace_n_; ++j) {
    const Trace& e = trace_[j % trace_.size()];
    char line[160];
    const double t = static_cast<double>(e.t - t0_) / 1e6;
    if (e.what == 6) // a pick in find_work that found nothing to run
      std::snprintf(line, sizeof line, "  %.6f ms  pu %d  %s %llu\n", t, e.pu,
                    e.fiber == -2 ? "forced idle, wants cookie" : "idle", static_cast<unsigned long long>(e.cookie));
    else
      std::snprintf(line, sizeof line, "  %.6f ms  pu %d  %-12s fiber %d cookie %lld\n", t, e.pu, names[e.what],
                    e.fiber, e.cookie == kNoCookie ? -1LL : static_cast<long long>(e.cookie));
    failure_ += line;
  }
}

// CORESCHED_SIM_MEASURE=1: latency bounds are measured (CORESCHED_SIM_VERBOSE
// prints them), not enforced; for tuning a scenario.
void CoreSim::fail_bound(const std::string& what) {
  static const bool measure = [] {
    const char* m = std::getenv("CORESCHED_SIM_MEASURE");
    return m && *m == '1';
  }();
  if (!measure) fail(what);
}

void CoreSim::trace(unsigned pu, int what, int fiber) {
  const std::uint64_t c = fiber >= 0 ? records_[static_cast<std::size_t>(fiber)].cookie : kNoCookie;
  trace_[trace_n_++ % trace_.size()] = Trace{g_now, static_cast<int>(pu), what, fiber, c};
}

// ---------------------------------------------------------------- bookkeeping

void CoreSim::queued(int i) {
  SimFiber& f = fibers_[i];
  const std::uint64_t c = records_[static_cast<std::size_t>(i)].cookie;
  CookieState& cs = cookies_[c];
  // Arrival: the cookie had nothing queued or running on the core.
  if (cs.queued == 0 && cs.running == 0 && published_ != c && cs.arrived == kNever) {
    cs.arrived = g_now;
    ++cs.log.arrivals;
    std::uint64_t others = 0;
    for (const auto& o : cookies_) others += &o != &cs && (o.queued > 0 || o.running > 0);
    const std::uint64_t ahead = others < 2 ? 0 : policy_ == FairnessPolicy::core_vruntime ? 1 : others - 1;
    cs.deadline = arrival_bound == kNever ? kNever : g_now + arrival_bound + ahead * turn;
  }
  if (published_ != c && cs.waiting_since == kNever) cs.waiting_since = g_now;
  ++cs.queued;
  ++queued_total_;
  f.st = St::queued;
  f.since = g_now;
}

void CoreSim::unqueued(int i) {
  max_fiber_wait_ = std::max(max_fiber_wait_, g_now - fibers_[static_cast<std::size_t>(i)].since);
  --cookies_[records_[static_cast<std::size_t>(i)].cookie].queued;
  --queued_total_;
}

void CoreSim::set_running(int i, unsigned s) {
  SimFiber& f = fibers_[i];
  f.st = St::running;
  f.since = g_now;
  ++cookies_[records_[static_cast<std::size_t>(i)].cookie].running;
  records_[static_cast<std::size_t>(i)].last_worker = s;
  Pu& p = pus_[s];
  p.st = PuSt::running;
  p.fiber = i;
  p.notice_at = kNever; // pick_locked cleared its preempt flag
  const std::uint64_t left = f.leaving ? rng_.range(kUs, 20 * kUs) : std::min(f.burst_left, f.storm_left);
  p.stop_at = left == kNever ? kNever : g_now + left;
}

void CoreSim::set_idle(unsigned s, bool on) {
  if (pus_[s].idle == on) return;
  pus_[s].idle = on;
  idle_count_ += on ? 1 : -1;
}

std::uint64_t CoreSim::wake_latency() noexcept {
  if (slow_wakes) return rng_.range(100 * kUs, 300 * kUs);
  // An eventfd write to a worker sleeping in io_uring: 10-90 us on the VM, rarely more.
  return rng_.chance(0.02) ? rng_.range(90 * kUs, 300 * kUs) : rng_.range(5 * kUs, 90 * kUs);
}

std::uint64_t CoreSim::tick_lateness() noexcept {
  if (tick_late_max == 0) return 0;
  return rng_.chance(0.1) ? rng_.range(0, tick_late_max) : rng_.range(0, std::min<std::uint64_t>(50 * kUs, tick_late_max));
}

std::uint64_t CoreSim::length(std::uint64_t mean, bool exact) noexcept { return exact ? mean : rng_.exp(mean); }

std::uint64_t CoreSim::notice_latency(const SimFiber& f) noexcept { return rng_.range(0, f.spec.pp_gap); }

void CoreSim::advance(std::uint64_t t) {
  if (published_ != kNoCookie) {
    cookies_[published_].log.owned_ns += t - g_now;
    const auto it = std::find(tracked_.begin(), tracked_.end(), published_);
    const auto k = static_cast<std::size_t>(it - tracked_.begin());
    for (std::uint64_t from = g_now; it != tracked_.end() && from < t;) {
      const std::size_t slice = (from - track_start_) / kSlice;
      const std::uint64_t end = std::min(t, track_start_ + (slice + 1) * kSlice);
      if (track_slices_.size() <= slice) track_slices_.resize(slice + 1, {});
      track_slices_[slice][k] += static_cast<std::uint32_t>(end - from);
      from = end;
    }
  }
  g_now = t;
}

// ---------------------------------------------------------------- lock sections

void CoreSim::notify(WakeList& w) {
  w.notify();
  for (unsigned s = 0; s < n_; ++s) {
    Pu& p = pus_[s];
    if (p.st == PuSt::asleep && core_.sibling(s).wake_word.load(std::memory_order_relaxed) != p.epoch) {
      p.st = PuSt::waking;
      p.turn_end = 0; // woken: sleep_once returns, its timer with it
      p.next = g_now + wake_latency();
      trace(s, 8, -1);
    }
  }
}

Pick CoreSim::pick(unsigned s) {
  WakeList w;
  const Pick p = core_.pick_locked(s, w);
  notify(w);
  return p;
}

// Scheduler::place: a woken or new fiber goes to its pinned PU, else to its
// last PU or (as the placement index would find an idle one) another.
void CoreSim::place(int i) {
  Fiber& r = records_[static_cast<std::size_t>(i)];
  const unsigned to = r.pinned != kNotPinned ? static_cast<unsigned>(r.pinned)
                      : rng_.chance(0.5)     ? r.last_worker
                                             : static_cast<unsigned>(rng_.range(0, n_ - 1));
  trace(to, 0, i);
  WakeList w;
  const bool needs_tick = core_.enqueue_locked(to, &r, w);
  queued(i);
  notify(w);
  if (needs_tick) want_fine_ticks();
}

// Scheduler::want_fine_ticks and Ticker::poke: a coarse ticker ticks at the
// first quarter-slice boundary not yet passed; a stopped one restarts.
void CoreSim::want_fine_ticks() {
  if (tick_fine_ && !tick_stopped_) return;
  tick_hold_ = 8;
  tick_fine_ = true;
  if (tick_stopped_) {
    tick_stopped_ = false;
    last_tick_ = g_now;
    next_tick_ = g_now + kTick;
    return;
  }
  next_tick_ = last_tick_ + kTick * ((g_now - last_tick_) / kTick + 1) + tick_lateness();
}

// Worker::yield: requeue_locked, then pick_locked, under one lock.
void CoreSim::yield(unsigned s) {
  const int i = pus_[s].fiber;
  trace(s, 2, i);
  --cookies_[records_[static_cast<std::size_t>(i)].cookie].running;
  pus_[s].fiber = -1;
  WakeList w;
  core_.requeue_locked(s, &records_[static_cast<std::size_t>(i)]);
  queued(i);
  const Pick p = core_.pick_locked(s, w);
  notify(w);
  after_pick(s, p);
}

// Worker::park / a finishing fiber: pick() only.
void CoreSim::stop(unsigned s, bool park) {
  const int i = pus_[s].fiber;
  SimFiber& f = fibers_[static_cast<std::size_t>(i)];
  trace(s, park ? 3 : 4, i);
  --cookies_[records_[static_cast<std::size_t>(i)].cookie].running;
  pus_[s].fiber = -1;
  const Pick p = pick(s);
  if (park) {
    f.st = St::parked;
    f.burst_left = length(f.spec.run_mean, f.spec.exact);
    timers_.push({g_now + length(f.spec.sleep_mean, f.spec.exact), timer_seq_++, i});
  } else {
    f.st = St::done;
  }
  after_pick(s, p);
}

// Worker::set_cookie: under the lock the fiber takes its new cookie; if a
// sibling runs another one, the fiber yields at once.
void CoreSim::set_cookie(unsigned s) {
  const int i = pus_[s].fiber;
  SimFiber& f = fibers_[static_cast<std::size_t>(i)];
  Fiber& r = records_[static_cast<std::size_t>(i)];
  f.storm_left = length(f.spec.storm_mean, f.spec.exact);
  const std::uint64_t first = f.spec.storm_first;
  const std::uint64_t to = !first                                                 ? rng_.range(1, f.spec.storm_cookies)
                           : r.cookie < first || r.cookie >= f.spec.storm_cookies ? first
                                                                                   : r.cookie + 1;
  trace(s, 5, i);
  if (to != r.cookie) {
    --cookies_[r.cookie].running;
    r.cookie = to;
    ++cookies_[to].running;
    WakeList w;
    const bool ok = core_.change_running_cookie_locked(s, to, w);
    notify(w);
    if (!ok) return yield(s);
  }
  Pu& p = pus_[s];
  const std::uint64_t left = std::min(f.burst_left, f.storm_left);
  p.stop_at = left == kNever ? kNever : g_now + left;
}

void CoreSim::after_pick(unsigned s, const Pick& p) {
  Pu& pu = pus_[s];
  if (p.kind == Pick::Kind::run) {
    start(s, static_cast<int>(p.fiber->id));
    return;
  }
  // The worker switches to its idle context, whose find_work picks again.
  pu.st = PuSt::spinning;
  pu.rounds = 0;
  find_work(s);
}

void CoreSim::start(unsigned s, int i) {
  Pu& pu = pus_[s];
  if (pu.spinning) {
    pu.spinning = false;
    --spinners_;
  }
  pu.forced = false;
  set_idle(s, false);
  if (tick_stopped_) want_fine_ticks(); // Scheduler::note_busy restarts it
  unqueued(i);
  set_running(i, s);
  ++pu.switches; // Worker::begin_run, or yield's "nothing else to run"
}

// One round of Worker::find_work (and sleep_once once the rounds are spent).
void CoreSim::find_work(unsigned s) {
  Pu& pu = pus_[s];
  for (int again = 0; again < 8; ++again) {
    const Pick p = pick(s);
    trace_[trace_n_++ % trace_.size()] =
        Trace{g_now, static_cast<int>(s), 6, p.kind == Pick::Kind::forced_idle ? -2 : -1, p.wanted};
    if (p.kind == Pick::Kind::run) {
      // A forced-idle sibling that goes on while the cookie it waited behind
      // still owns the core (it took that cookie's fiber): its turn-end timer
      // (if it slept) no longer times the turn, so with fibers still queued it
      // asks the ticker for its fine period (Worker::leave_forced_idle). After
      // a hand-over the owner is another cookie, and nothing is asked.
      if (pu.forced && core_.published_owner() == pu.blocker) {
        ++forced_took_owner_;
        if (fine_ticks_on_leave && core_.queued_hint() > 0) want_fine_ticks();
      }
      start(s, static_cast<int>(p.fiber->id));
      if (core_.queued_hint() > 0) wake_helper(s);
      return;
    }
    if (p.kind == Pick::Kind::forced_idle && !pu.forced) pu.blocker = p.blocker; // Worker::enter_forced_idle
    pu.forced = p.kind == Pick::Kind::forced_idle;
    set_idle(s, true);
    if (!pu.spinning && !pu.forced && spinners_ * 2 < idle_count_) { // Scheduler::try_start_spinning
      pu.spinning = true;
      ++spinners_;
    }
    const int limit = pu.forced ? 16 : pu.spinning ? 256 : 16;
    if (pu.rounds < limit) {
      pu.rounds += kRoundsPerStep;
      pu.st = PuSt::spinning;
      pu.next = g_now + kRoundsPerStep * kRoundNs;
      return;
    }
    if (pu.spinning) {
      pu.spinning = false;
      --spinners_;
    }
    WakeList w;
    const Pick q = core_.pick_locked(s, w);
    if (q.kind == Pick::Kind::run) { // work arrived after all: put it back and loop
      core_.requeue_locked(s, q.fiber);
      core_.publish_locked(s, kNoCookie);
      notify(w);
      continue;
    }
    core_.prepare_sleep_locked(s);
    // Worker::sleep_once: forced idle, it sleeps at most until the owner's
    // turn ends; an overdue end it already acted on is asked again and then
    // slept through (sleep_until_turn_end's once-per-turn's-end guard).
    pu.turn_end = pu.forced ? core_.turn_due_locked(s) : 0;
    pu.next = kNever;
    if (pu.turn_end != 0) {
      pu.blocker = core_.published_owner();
      if (pu.turn_end == pu.turn_end_seen) {
        core_.request_stop(pu.blocker);
        pu.turn_end = 0;
      } else {
        pu.next = std::max(pu.turn_end, g_now) + wake_latency(); // a timer never fires early
      }
    }
    pu.epoch = core_.sibling(s).wake_word.load(std::memory_order_acquire);
    pu.st = PuSt::asleep;
    trace(s, 7, -1);
    notify(w);
    return;
  }
  fail("find_work: sleep_once found work 8 times in a row");
}

// Scheduler::wake_helper: more work queued here than this worker took, and
// no spinner to find it: wake an idle worker (here, a sleeping sibling).
void CoreSim::wake_helper(unsigned from) {
  if (spinners_ > 0) return;
  for (unsigned t = 0; t < n_; ++t) {
    Sibling& o = core_.sibling(t);
    if (t == from || !pus_[t].idle || !o.sleeping) continue;
    WakeList w;
    o.sleeping = false;
    w.add(core_, t);
    notify(w);
    return;
  }
}

// Worker::sleep_until_turn_end: the forced-idle sibling's timer fired at the
// owner's turn's end. It asks the owner to stop, watches for the hand-over
// (find_work's forced-idle rounds stand for the bounded watch) and picks.
void CoreSim::turn_end_timer(unsigned s) {
  Pu& pu = pus_[s];
  pu.turn_end_seen = pu.turn_end;
  pu.turn_end = 0;
  core_.request_stop(pu.blocker);
  core_.sibling(s).sleeping = false; // sleep_once clears it under the lock when it wakes itself
  pu.st = PuSt::spinning;
  pu.rounds = 0;
  find_work(s);
}

void CoreSim::pu_event(unsigned s) {
  Pu& pu = pus_[s];
  if (pu.st == PuSt::asleep) return turn_end_timer(s);
  if (pu.st != PuSt::running) {
    if (pu.st == PuSt::waking) pu.rounds = 0;
    pu.st = PuSt::spinning;
    return find_work(s);
  }
  SimFiber& f = fibers_[static_cast<std::size_t>(pu.fiber)];
  const std::uint64_t ran = g_now - f.since;
  f.since = g_now;
  if (f.burst_left != kNever) f.burst_left -= std::min(f.burst_left, ran);
  if (f.storm_left != kNever) f.storm_left -= std::min(f.storm_left, ran);
  if (pu.notice_at <= pu.stop_at) return yield(s);
  if (f.leaving) return stop(s, false);
  if (f.storm_left == 0) return set_cookie(s);
  stop(s, true);
}

// Scheduler::tick, at the period Ticker::run chooses.
void CoreSim::tick() {
  const auto units = static_cast<unsigned>(std::max<std::uint64_t>(1, (g_now - last_tick_ + kTick / 2) / kTick));
  last_tick_ = g_now;
  const bool sibling_waits = core_.forced_idle_count() > 0;
  bool busy = false, waiting = false, idle = false;
  for (unsigned s = 0; s < n_; ++s) idle |= pus_[s].st != PuSt::running;
  for (unsigned s = 0; s < n_; ++s) {
    Pu& p = pus_[s];
    if (p.st == PuSt::running) {
      busy = true;
      // Queued fibers need the fine period while this runner has not
      // switched since the last tick, or while a PU idles (Scheduler::tick).
      waiting |= core_.queued_hint() > 0 && !sibling_waits && (p.switches == p.tick_seen || idle);
    }
    if (p.st != PuSt::running || p.switches != p.tick_seen) {
      p.tick_seen = p.switches;
      p.ticks_same = 0;
      continue;
    }
    p.ticks_same += static_cast<int>(units);
    if (p.ticks_same >= 4 || (sibling_waits && p.ticks_same >= 2)) {
      if (!core_.sibling(s).preempt.load(std::memory_order_relaxed)) trace(s, 1, p.fiber);
      core_.sibling(s).ask_preempt();
    }
  }
  if (waiting) tick_hold_ = 8;
  else if (tick_hold_ > 0) --tick_hold_;
  tick_fine_ = tick_hold_ > 0;
  tick_idle_units_ = busy ? 0 : tick_idle_units_ + units;
  if (tick_idle_units_ > 64) { // stopped until a sibling starts a fiber (start)
    tick_stopped_ = true;
    tick_idle_units_ = 0;
    next_tick_ = kNever;
    return;
  }
  // Ticker::run counts the next period from when this tick ran.
  next_tick_ = g_now + kTick * (tick_fine_ ? 1 : 4) + tick_lateness();
}

void CoreSim::run_until(std::uint64_t t_end) {
  while (!failed()) {
    std::uint64_t t = next_check_;
    int which = -3; // the checks
    if (next_tick_ < t) {
      t = next_tick_;
      which = -1; // the ticker
    }
    if (!timers_.empty() && timers_.top().at < t) {
      t = timers_.top().at;
      which = -2;
    }
    for (unsigned s = 0; s < n_; ++s) {
      const Pu& p = pus_[s];
      const std::uint64_t e = p.st == PuSt::running ? std::min(p.notice_at, p.stop_at) : p.next;
      if (e < t) {
        t = e;
        which = static_cast<int>(s);
      }
    }
    if (t > t_end) {
      advance(t_end);
      return;
    }
    advance(t);
    ++events_;
    if (t != burst_at_) {
      burst_at_ = t;
      event_burst_ = 0;
    } else if (++event_burst_ > 100'000) {
      return fail("livelock: 100000 events at one instant");
    }
    if (which == -3) {
      next_check_ += kTick;
      check_fibers();
    } else if (which == -1) {
      tick();
    } else if (which == -2) {
      const int i = timers_.top().fiber;
      timers_.pop();
      place(i);
    } else {
      pu_event(static_cast<unsigned>(which));
    }
    observe();
  }
}

bool CoreSim::drain(std::uint64_t limit) {
  for (std::size_t i = 0; i < fibers_.size(); ++i) depart(static_cast<int>(i));
  const std::uint64_t deadline = g_now + limit;
  while (!failed() && g_now < deadline) {
    run_until(std::min(deadline, g_now + kSlice));
    bool all_done = true;
    for (const auto& f : fibers_) all_done &= f.st == St::done;
    bool all_asleep = true;
    for (unsigned s = 0; s < n_; ++s) all_asleep &= pus_[s].st == PuSt::asleep;
    if (all_done && all_asleep) {
      for (unsigned s = 0; s < n_; ++s)
        if (core_.sibling(s).running.load() != kNoCookie) fail("(d) an idle core still publishes a cookie");
      if (core_.queued_hint() != 0) fail("(d) an idle core counts queued fibers");
      return !failed();
    }
  }
  if (!failed()) {
    std::size_t left = 0;
    for (const auto& f : fibers_) left += f.st != St::done;
    fail("(d) drain: " + std::to_string(left) + " fibers never finished");
  }
  return false;
}

} // namespace sim
