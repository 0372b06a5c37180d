// SPDX-License-Identifier: Apache-2.0
// Deterministic simulation of the REAL CoreCoordinator on a simulated clock
// (sim_core.hpp says what is modelled). Every scenario runs under both
// fairness policies, on 2-PU and 4-PU cores, with seeded random run lengths,
// preempt-point gaps and wake-up latencies. Checked at every step or window:
//   (a) a cookie that becomes runnable beside one other owns the core (some
//       sibling publishes it) within 2 slices; beside more, within further
//       turns (CoreSim::arrival_bound says how many). Not for a sleeper or a
//       set_cookie coming back just after its turn: it owes the others its
//       lead first; for those, every cookie with queued work owns the core
//       within a turn of each cookie (CoreSim::wait_bound);
//   (b) two cookies with equal demand each get 50 % +- 10 % of the core's
//       owned time over every window of 20 slices;
//   (c) at most one cookie is published across the core's siblings, and a
//       sibling running a fiber publishes that fiber's cookie;
//   (d) nothing is lost: the coordinator counts what was queued, every queued
//       fiber runs within a bound, the core never idles for a slice with
//       fibers queued, and at the end all fibers finish and the core sleeps.
// CORESCHED_SIM_SEED overrides the base seed; CORESCHED_STRESS_SCALE scales
// the repetitions (sanitizer builds run 0.2); CORESCHED_SIM_VERBOSE=1 prints
// each run's worst latencies and shares; CORESCHED_SIM_POLICY=<name> runs one
// policy only; CORESCHED_SIM_MEASURE=1 reports latency bounds instead of
// failing on them (for tuning).
#include "sim_run.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

using namespace sim;

namespace {

// ---------------------------------------------------------------- scenarios

// A long solo run: cookie A runs alone for seconds, then B arrives. B must
// own the core within 2 slices and the two must split it evenly from then on.
void late_arrival(CoreSim& sim, Rng& rng, unsigned pus, Report& rep) {
  const int n = rng.chance(0.5) ? 2 : static_cast<int>(pus); // two busy fibers, or one per PU
  sim.wait_bound = 2 * sim.turn;
  spawn(sim, rng, 1, n);
  for (int cycle = 0; cycle < 3 && !sim.failed(); ++cycle) {
    run_for(sim, rng.range(1000, 3000) * kSlice); // A alone, seconds
    const auto b = spawn(sim, rng, 2, n);
    fair_pair(sim, rep, 1, 2, 60);
    depart_all(sim, b);
    settle(sim, b);
  }
}

// Cookies come and go: with two present the split is even, and each one that
// comes back after an absence owns the core within the bound.
void departures(CoreSim& sim, Rng& rng, unsigned pus, Report& rep) {
  const int n = static_cast<int>(rng.range(1, pus));
  sim.wait_bound = 3 * sim.turn;
  std::vector<std::vector<int>> present(4);
  present[1] = spawn(sim, rng, 1, n);
  present[2] = spawn(sim, rng, 2, n);
  for (int epoch = 0; epoch < 12 && !sim.failed(); ++epoch) {
    std::vector<std::uint64_t> here;
    for (std::uint64_t c = 1; c <= 3; ++c)
      if (!present[c].empty()) here.push_back(c);
    if (here.size() == 2)
      fair_pair(sim, rep, here[0], here[1], rng.range(40, 200));
    else
      run_for(sim, rng.range(20, 500) * kSlice);
    const std::uint64_t c = rng.range(1, 3);
    if (present[c].empty()) {
      present[c] = spawn(sim, rng, c, n);
    } else {
      depart_all(sim, present[c]);
      settle(sim, present[c]);
      present[c].clear();
    }
  }
}

// Fibers that run briefly and park for random times, woken by timers: the
// core keeps changing hands; isolation, arrivals and progress are checked.
void sleepers(CoreSim& sim, Rng& rng, unsigned pus, Report&) {
  const auto cookies = rng.range(2, 3);
  // A sleeper that parked just after its turn comes back ahead in vruntime
  // (or behind in waited) and owes the others that lead first: no (a) here,
  // but no cookie waits longer than a turn of every cookie.
  sim.arrival_bound = kNever;
  sim.wait_bound = cookies * sim.turn;

  for (std::uint64_t c = 1; c <= cookies; ++c) {
    const auto fibers = rng.range(1, 2 * pus);
    for (std::uint64_t i = 0; i < fibers; ++i) {
      FiberSpec f = busy(c, rng, rng.chance(0.25) ? static_cast<int>(rng.range(0, pus - 1)) : kNotPinned);
      f.run_mean = rng.range(20, 800) * kUs;
      f.sleep_mean = rng.range(100, 5000) * kUs;
      sim.add(f, sim.now() + rng.range(0, 1000) * kUs);
    }
  }
  run_for(sim, rng.range(2000, 4000) * kSlice);
}

// A cookie that holds the core long (preempt points 20-60 ms apart) against
// two rivals that take turns, one of them a single fiber that sleeps and
// wakes: each long turn leaves it far behind in `waited`,
// and it must still own the core again within a few of its own turns.
void debtor(CoreSim& sim, Rng& rng, unsigned pus, Report&) {
  const std::uint64_t gap = rng.range(20, 60) * 1000 * kUs;
  sim.arrival_bound = kNever;
  sim.wait_bound = 6 * gap + 4 * sim.turn;
  sim.fiber_bound = kNever;
  FiberSpec slow;
  slow.cookie = 1;
  slow.pp_gap = gap;
  for (unsigned i = 0; i < (rng.chance(0.5) ? 1u : pus); ++i) sim.add(slow, sim.now());
  spawn(sim, rng, 2, static_cast<int>(rng.range(2, 3)));
  // The other rival's fiber sleeps and wakes: every wake-up is an arrival.
  FiberSpec sleeper = busy(3, rng);
  sleeper.run_mean = rng.range(50, 400) * kUs;
  sleeper.sleep_mean = rng.range(50, 400) * kUs;
  sim.add(sleeper, sim.now());
  run_for(sim, rng.range(1000, 3000) * kSlice);
  if (!sim.failed() && sim.log(1).owned_ns == 0) sim.fail("debtor: cookie 1 never owned the core");
}

// A debtor beside two sleepers: forceidle_balance places a cookie arriving
// or waking at the back of the line, not level with the owner (waited 0),
// and this case starves otherwise (`debtor` above passes either way). Here
// cookie 1 gets into debt by a long turn of its own (preempt points 5-10 ms
// apart), and both rivals are single fibers that run briefly (~100-300 us,
// under the granularity) and sleep ~1 us: every turn ends with the owner
// parking, and the other rival wakes ~1 us into that turn. Put level with
// the owner, it would be ahead of the debtor; the two would then gain alike,
// and set_owner's rebase at the hand-over would take back what the debtor
// had gained: ~1 us a turn against milliseconds of debt, the core only when
// a sleep happens to outlast the owner's burst (27-123 ms here). Joining the
// back of the line, the waking rival queues behind the debtor, which owns
// the core at the next hand-over (within ~3 ms here). `debtor` misses it
// because its busy rival stays runnable, keeps its waited across turns, and
// loses a whole turn to the debtor every turn. The bound is core_vruntime's:
// the debtor waits until both rivals have owned what it owned, two of its
// turns (up to ~19 ms here). That is also why its turns are 5-10 ms, not the
// 20-60 ms of `debtor`: the chance that ends the starvation does not grow
// with them.
void debtor_sleepers(CoreSim& sim, Rng& rng, unsigned pus, Report&) {
  const std::uint64_t gap = rng.range(5, 10) * 1000 * kUs;
  sim.arrival_bound = kNever; // a rival waking just after its turn owes the others first: see sleepers
  sim.wait_bound = 2 * gap + 4 * sim.turn;
  FiberSpec slow;
  slow.cookie = 1;
  slow.pp_gap = gap;
  for (unsigned i = 0; i < (rng.chance(0.5) ? 1u : pus); ++i) sim.add(slow, sim.now());
  for (std::uint64_t c = 2; c <= 3; ++c) {
    FiberSpec f = busy(c, rng);
    f.run_mean = rng.range(100, 300) * kUs;
    f.sleep_mean = kUs;
    sim.add(f, sim.now());
  }
  run_for(sim, rng.range(1000, 3000) * kSlice);
  if (!sim.failed() && sim.log(1).owned_ns == 0) sim.fail("debtor_sleepers: cookie 1 never owned the core");
}

// Each cookie's fibers are all pinned to one sibling (its own, the same one,
// or only one cookie pinned): hand-overs go through forced idle and wake-ups.
void pinned(CoreSim& sim, Rng& rng, unsigned pus, Report& rep) {
  const auto last = static_cast<int>(pus - 1);
  const auto mode = rng.range(0, 2);
  const int pa = mode == 0 ? 0 : mode == 1 ? last : kNotPinned;
  const int pb = mode == 0 ? 1 : last;
  sim.wait_bound = 2 * sim.turn;
  spawn(sim, rng, 1, 2, pa);
  for (int cycle = 0; cycle < 3 && !sim.failed(); ++cycle) {
    run_for(sim, rng.range(300, 1500) * kSlice);
    const auto b = spawn(sim, rng, 2, 2, pb);
    fair_pair(sim, rep, 1, 2, 100);
    depart_all(sim, b);
    settle(sim, b);
  }
}

// Many cookies with equal demand: every one gets its share and none waits
// for more than a round of the others.
void many_cookies(CoreSim& sim, Rng& rng, unsigned pus, Report&) {
  const std::uint64_t n = std::uint64_t{8} << rng.range(0, 2); // 8, 16 or 32
  const int per = static_cast<int>(rng.range(1, 2));
  sim.arrival_bound = kNever; // all arrive at once: they queue behind each other
  sim.wait_bound = (n + 1) * sim.turn;
  sim.fiber_bound = 2 * per * (n + 1) * sim.turn;
  for (std::uint64_t c = 1; c <= n; ++c)
    spawn(sim, rng, c, per, rng.chance(0.2) ? static_cast<int>(rng.range(0, pus - 1)) : kNotPinned);
  run_for(sim, 50 * kSlice); // warm-up: all arrived at once, so arrivals queue behind each other
  sim.reset_logs();
  const std::uint64_t slices = 40 * n;
  run_for(sim, slices * kSlice);
  const double fair = static_cast<double>(slices * kSlice) / static_cast<double>(n);
  for (std::uint64_t c = 1; c <= n && !sim.failed(); ++c) {
    const double got = static_cast<double>(sim.log(c).owned_ns);
    if (got < 0.6 * fair || got > 1.4 * fair)
      sim.fail("many cookies: cookie " + std::to_string(c) + " owned " + std::to_string(got / fair) +
               " of its fair share");
  }
  // A newcomer among them.
  sim.arrival_bound = 2 * kSlice;
  spawn(sim, rng, n + 1, per);
  run_for(sim, 4 * n * kSlice);
}

// One fiber of A against twenty of B: A can use one sibling only, yet owns
// the core half the time; either may be the late arrival.
void one_vs_twenty(CoreSim& sim, Rng& rng, unsigned, Report& rep) {
  const bool a_late = rng.chance(0.5);
  sim.wait_bound = 2 * sim.turn;
  std::vector<int> a, b;
  if (!a_late)
    a = spawn(sim, rng, 1, 1);
  else
    b = spawn(sim, rng, 2, 20);
  for (int cycle = 0; cycle < 2 && !sim.failed(); ++cycle) {
    run_for(sim, rng.range(500, 2000) * kSlice);
    auto& late = a_late ? a : b;
    late = a_late ? spawn(sim, rng, 1, 1) : spawn(sim, rng, 2, 20);
    fair_pair(sim, rep, 1, 2, 100);
    depart_all(sim, late);
    settle(sim, late);
  }
}

// Fibers keep changing cookie (change_running_cookie_locked; refused, the
// fiber yields), busy or parking: isolation and progress must hold.
void cookie_storms(CoreSim& sim, Rng& rng, unsigned pus, Report&) {
  const auto cookies = rng.range(2, 4);
  const auto fibers = rng.range(2, 3 * pus);
  sim.arrival_bound = kNever; // a refused set_cookie brings back a cookie that just ran: see sleepers
  sim.wait_bound = cookies * sim.turn;
  for (std::uint64_t i = 0; i < fibers; ++i) {
    FiberSpec f =
        busy(rng.range(1, cookies), rng, rng.chance(0.2) ? static_cast<int>(rng.range(0, pus - 1)) : kNotPinned);
    f.storm_mean = rng.range(5, 500) * kUs;
    f.storm_cookies = cookies;
    if (rng.chance(0.5)) {
      f.run_mean = rng.range(20, 800) * kUs;
      f.sleep_mean = rng.range(50, 3000) * kUs;
    }
    sim.add(f, sim.now() + rng.range(0, 500) * kUs);
  }
  run_for(sim, rng.range(1000, 3000) * kSlice);
}

// set_cookie into a cookie that was away for seconds, while the fiber runs
// alone (so the change is granted at once): the cookie must be placed at the
// floor as an arrival is, or its stale vruntime starves the others.
void stale_set_cookie(CoreSim& sim, Rng& rng, unsigned, Report&) {
  sim.arrival_bound = kNever; // the sleeper: see sleepers
  sim.wait_bound = 2 * sim.turn;
  const auto c = spawn(sim, rng, 2, 1);
  run_for(sim, rng.range(500, 2000) * kSlice); // cookie 2 runs, then leaves for seconds
  depart_all(sim, c);
  settle(sim, c);
  FiberSpec x = busy(1, rng);
  x.storm_mean = rng.range(200, 1000) * kSlice; // now and then it takes cookie 2 (or 1) for a long while
  x.storm_cookies = 2;
  sim.add(x, sim.now());
  FiberSpec y = busy(1, rng); // a sleeper of cookie 1 beside it
  y.run_mean = rng.range(50, 500) * kUs;
  y.sleep_mean = rng.range(200, 3000) * kUs;
  sim.add(y, sim.now());
  run_for(sim, rng.range(3000, 6000) * kSlice);
}

// A forced-idle sibling that stops waiting because the owner's own fiber
// woke onto it: cookie 1 runs a busy fiber pinned to every sibling but 1 and
// a fiber pinned to sibling 1 that sleeps and then runs for slices; cookie
// 2's fibers can run on any sibling. While cookie 1 owns the core with its
// sleeper asleep, sibling 1 alone is forced idle and times the turn's end;
// when the sleeper wakes there, it leaves forced idle and its timer goes with
// it (the scenario checks that this happened).
// Only the ticker then ends cookie 1's turn, so sibling 1 asks it for its
// fine period as it leaves forced idle (Worker::leave_forced_idle). Without
// that, its next coarse tick sees fibers waiting behind busy siblings with
// none forced idle and flags the runners that have not switched since the
// tick before; the per-run worst waits on the same seeds then have a higher
// median, both within the bound. The test case checks that median. The bound is two turns, as
// for `pinned`: cookie 1 owned the core with all its siblings, and the wait
// after its sleeper's long bursts includes cookie 2's catching up.
std::vector<std::uint64_t> g_owner_wakes_worst; // each run's worst wait, for the median check below
bool g_fine_ticks_on_leave = true;

void owner_wakes_beside(CoreSim& sim, Rng& rng, unsigned pus, Report&) {
  sim.fine_ticks_on_leave = g_fine_ticks_on_leave;
  sim.arrival_bound = kNever; // the sleeper coming back owes the others its lead first: see sleepers
  sim.wait_bound = 2 * sim.turn;
  for (unsigned s = 0; s < pus; ++s)
    if (s != 1) sim.add(busy(1, rng, static_cast<int>(s)), sim.now());
  FiberSpec sleeper = busy(1, rng, 1);
  sleeper.run_mean = rng.range(2, 20) * kSlice;
  sleeper.sleep_mean = rng.range(1, 5) * kSlice;
  sim.add(sleeper, sim.now());
  spawn(sim, rng, 2, static_cast<int>(rng.range(1, 2)));
  run_for(sim, rng.range(2000, 4000) * kSlice);
  if (!sim.failed() && sim.forced_took_owner() == 0)
    sim.fail("owner_wakes_beside: the sleeper never woke onto its forced-idle sibling while its cookie owned the core");
  g_owner_wakes_worst.push_back(std::max(sim.log(1).max_wait_ns, sim.log(2).max_wait_ns));
}

} // namespace

TEST_CASE("sim: a cookie arriving after a long solo run of another", "[sim]") {
  simulate("late_arrival", late_arrival, 24);
}
TEST_CASE("sim: cookies departing and coming back", "[sim]") { simulate("departures", departures, 32); }
TEST_CASE("sim: sleepers waking on timers", "[sim]") { simulate("sleepers", sleepers, 8); }
TEST_CASE("sim: cookies pinned to one sibling", "[sim]") { simulate("pinned", pinned, 24); }
TEST_CASE("sim: a cookie with long turns against two rivals", "[sim]") { simulate("debtor", debtor, 16); }
TEST_CASE("sim: a cookie in debt against two rivals that sleep and wake", "[sim]") {
  simulate("debtor_sleepers", debtor_sleepers, 16);
}
TEST_CASE("sim: the owner's fiber waking onto a forced-idle sibling", "[sim]") {
  // The request for fine ticks as sibling 1 leaves forced idle, measured
  // against the same seeds without it (CoreSim::fine_ticks_on_leave): the
  // median of the runs' worst waits must be lower with it. Eight base seeds
  // (0x5eedc0de2024, 1-7): 2.60-2.67 ms with it, 2.76-2.79 ms without; a
  // fixed bound would move with the sleeper credit, so the two are compared.
  // The bound above holds either way.
  auto median_of_worst = [](bool fine) {
    g_owner_wakes_worst.clear();
    g_fine_ticks_on_leave = fine;
    // 16 runs per policy and core size at any scale: with 3 (the sanitizer
    // suites' 0.2), the two medians cross on 2 of 8 base seeds.
    simulate(fine ? "owner_wakes_beside" : "owner_wakes_beside (no fine ticks on leave)", owner_wakes_beside, 16, 16);
    g_fine_ticks_on_leave = true;
    auto& w = g_owner_wakes_worst;
    REQUIRE(!w.empty());
    std::nth_element(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(w.size() / 2), w.end());
    return static_cast<double>(w[w.size() / 2]) / kUs;
  };
  const double with_us = median_of_worst(true), without_us = median_of_worst(false);
  INFO("median of the runs' worst waits " << with_us << " us with the request, " << without_us << " us without");
  CHECK(with_us < without_us);
}
TEST_CASE("sim: many cookies", "[sim]") { simulate("many_cookies", many_cookies, 12); }
TEST_CASE("sim: one fiber of A against twenty of B", "[sim]") { simulate("one_vs_twenty", one_vs_twenty, 24); }
TEST_CASE("sim: set_cookie storms", "[sim]") {
  simulate("cookie_storms", cookie_storms, 8);
  simulate("stale_set_cookie", stale_set_cookie, 8);
}
