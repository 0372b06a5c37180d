// SPDX-License-Identifier: Apache-2.0
// The simulation (sim_core.hpp, sim_run.hpp) of cookies that sleep and come
// back, and of fibers that change cookie: the sleeper credit and wake-up
// preemption between cookies (runtime/core/core_fairness.cpp) must give a cookie
// that sleeps between bursts most of what it asks, and nothing more than its
// share, whatever its bursts, and a fiber's set_cookie calls must never earn
// credit. Without those rules set_cookie_cycle starves cookie 1 (its share
// 0.000), and long_bursts gives the sleeper 93 % of the core under
// forceidle_balance.
#include "sim_run.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <vector>

using namespace sim;

namespace {

// Cookie 1 busy on every sibling and `f` beside it: after a warm-up of 100
// slices, the share of the next 1000-2000 slices that `cookie` owned; a
// negative one if a bound failed (the failure is the test's).
double share_beside_busy(CoreSim& sim, Rng& rng, unsigned pus, std::uint64_t wait_bound, const FiberSpec& f,
                         std::uint64_t cookie) {
  sim.arrival_bound = kNever; // a cookie back just after its turn owes the others its lead: see sleepers
  sim.wait_bound = wait_bound;
  for (unsigned s = 0; s < pus; ++s) sim.add(busy(1, rng), sim.now());
  sim.add(f, sim.now());
  run_for(sim, 100 * kSlice);
  sim.reset_logs();
  const std::uint64_t t0 = sim.now();
  run_for(sim, rng.range(1000, 2000) * kSlice);
  if (sim.failed()) return -1;
  return static_cast<double>(sim.log(cookie).owned_ns) / static_cast<double>(sim.now() - t0);
}

// A request tenant beside a compute tenant: cookie 1 keeps every sibling
// busy, cookie 2 is one fiber that runs briefly and sleeps (runnable a
// fraction d of the time, were it never kept waiting). A fair core gives it
// what it asks for, up to half: min(d, 0.5). Each run records the share it
// got over that; the test case checks the runs' median and worst. It waits
// for the core at every wake-up, so it never gets all it asks: with the
// sleeper credit, wake-up preemption between cookies and a wake-up inside
// the owner's least turn handing over when that ends, the median reads 0.85
// and the worst 0.70-0.77 (four seeds); without the hand-over at the turn's
// end they would read 0.79-0.80 and 0.52-0.57; placed level with the owner
// and waiting for the tick, 0.34 and 0.16 (the default seed).
std::vector<double> g_sleeper_ratio;

void sleeper_share(CoreSim& sim, Rng& rng, unsigned pus, Report&) {
  FiberSpec b = busy(2, rng);
  b.run_mean = rng.range(50, 400) * kUs;
  b.sleep_mean = rng.range(50, 400) * kUs;
  const double share = share_beside_busy(sim, rng, pus, 2 * sim.turn, b, 2);
  if (share < 0) return;
  const double demand = static_cast<double>(b.run_mean) / static_cast<double>(b.run_mean + b.sleep_mean);
  g_sleeper_ratio.push_back(share / std::min(demand, 0.5));
  if (verbose())
    std::printf("[sim] sleeper_share: run %llu us, sleep %llu us, share %.3f of %.3f asked\n",
                static_cast<unsigned long long>(b.run_mean / kUs), static_cast<unsigned long long>(b.sleep_mean / kUs),
                share, std::min(demand, 0.5));
}

// A cookie that runs long (1-1.4 ms) and sleeps just past the least turn
// (65-150 us), exactly, beside a busy cookie 1: each wake-up is an arrival
// that may preempt. It asks for ~90 % of the core, so a fair core gives it
// half; with a full credit at every wake-up under forceidle_balance (whose
// `waited` forgets what a cookie ran) it would get 0.83-0.93. Its share must stay
// within the credit of half: at most 0.6 over every run.
std::vector<double> g_long_share;

void long_bursts(CoreSim& sim, Rng& rng, unsigned pus, Report&) {
  FiberSpec b = busy(2, rng);
  b.exact = true;
  b.pp_gap = 5 * kUs;
  b.run_mean = rng.range(1000, 1400) * kUs;
  b.sleep_mean = rng.range(65, 150) * kUs;
  const double share = share_beside_busy(sim, rng, pus, 2 * sim.turn, b, 2);
  if (share >= 0) g_long_share.push_back(share);
}

// One fiber calls set_cookie every 50-300 us (exactly), going round 2, 4 or
// 40 cookies in turn, beside cookie 1 busy on every sibling. A set_cookie is
// no wake-up: it must earn no credit, and with 40 cookies (more than the
// core's books keep, so each comes back as new) none may come back below
// cookie 1. Otherwise cookie 1 waits for good: its share is 0.000 under
// forceidle_balance with 2 cookies, and under both policies with 40.
// Cookie 1 must own the core within
// a few turns of the cycle's cookies, and own a share of it.
std::vector<double> g_cycle_share;

void set_cookie_cycle(CoreSim& sim, Rng& rng, unsigned pus, Report&) {
  const std::uint64_t kinds[] = {2, 4, 40};
  FiberSpec f = busy(2, rng);
  f.exact = true;
  f.pp_gap = 5 * kUs;
  f.storm_mean = rng.range(50, 300) * kUs;
  f.storm_first = 2;
  f.storm_cookies = 1 + kinds[rng.range(0, 2)]; // cookies 2 .. 1 + k
  const double share = share_beside_busy(sim, rng, pus, 4 * sim.turn, f, 1);
  if (share >= 0) g_cycle_share.push_back(share);
}

} // namespace

TEST_CASE("sim: a cookie that sleeps between bursts beside a busy one", "[sim]") {
  g_sleeper_ratio.clear();
  simulate("sleeper_share", sleeper_share, 16, 16);
  auto& r = g_sleeper_ratio;
  REQUIRE(!r.empty());
  std::sort(r.begin(), r.end());
  const double median = r[r.size() / 2], worst = r.front();
  INFO("share over what it asked: median " << median << ", worst " << worst << " over " << r.size() << " runs");
  CHECK(median > 0.7);
  CHECK(worst > 0.3); // runs that ask for little lose most to the wait
}

TEST_CASE("sim: a cookie with long bursts and short sleeps beside a busy one", "[sim]") {
  g_long_share.clear();
  simulate("long_bursts", long_bursts, 8, 8);
  REQUIRE(!g_long_share.empty());
  const double most = *std::max_element(g_long_share.begin(), g_long_share.end());
  INFO("the sleeper's largest share " << most << " over " << g_long_share.size() << " runs");
  CHECK(most < 0.6);
}

TEST_CASE("sim: a fiber that goes round cookies with set_cookie beside a busy one", "[sim]") {
  g_cycle_share.clear();
  simulate("set_cookie_cycle", set_cookie_cycle, 12, 8);
  REQUIRE(!g_cycle_share.empty());
  const double least = *std::min_element(g_cycle_share.begin(), g_cycle_share.end());
  INFO("cookie 1's smallest share " << least << " over " << g_cycle_share.size() << " runs");
  CHECK(least > 0.2);
}
