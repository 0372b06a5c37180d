// SPDX-License-Identifier: Apache-2.0
// How the simulation's scenarios are run (sim_run.hpp): seeds, policies, core
// sizes, the per-run report and the totals printed at exit.
#include "sim_run.hpp"

#include "test_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace sim {

namespace {

struct Budget {
  std::uint64_t scenarios = 0, runs = 0, slices = 0, events = 0;
  double wall_s = 0;
};
Budget g_total;

// Printed once at exit: what the closing note of a test run quotes.
struct Summary {
  ~Summary() {
    if (g_total.runs)
      std::printf("[sim] coordinator simulation: %llu scenarios x 2 policies x 2- and 4-PU cores, %llu runs, %llu "
                  "simulated slices (%.0f s simulated), %llu events, %.2f s wall\n",
                  static_cast<unsigned long long>(g_total.scenarios), static_cast<unsigned long long>(g_total.runs),
                  static_cast<unsigned long long>(g_total.slices),
                  static_cast<double>(g_total.slices) * static_cast<double>(kSlice) / 1e9,
                  static_cast<unsigned long long>(g_total.events), g_total.wall_s);
  }
} g_summary;

std::uint64_t base_seed() {
  const char* s = std::getenv("CORESCHED_SIM_SEED");
  return s ? std::strtoull(s, nullptr, 0) : 0x5eed'c0de'2024ull;
}

std::uint64_t mix(std::uint64_t a, std::uint64_t b) { return Rng(a ^ (b * 0x9e3779b97f4a7c15ull)).next(); }

std::uint64_t hash(const char* s) {
  std::uint64_t h = 1469598103934665603ull;
  while (*s) h = (h ^ static_cast<unsigned char>(*s++)) * 1099511628211ull;
  return h;
}

void collect(CoreSim& sim, Report& rep) {
  for (std::uint64_t c = 0; c < kMaxCookies; ++c) {
    rep.worst_arrival = std::max(rep.worst_arrival, sim.log(c).max_arrival_ns);
    rep.worst_wait = std::max(rep.worst_wait, sim.log(c).max_wait_ns);
  }
  rep.worst_fiber = sim.max_fiber_wait();
}

} // namespace

bool verbose() {
  const char* s = std::getenv("CORESCHED_SIM_VERBOSE");
  return s && *s == '1';
}

FiberSpec busy(std::uint64_t cookie, Rng& rng, int pinned) {
  FiberSpec f;
  f.cookie = cookie;
  f.pinned = pinned;
  // Preempt points 1-100 us apart: the bound in (a) is granularity + a tick
  // slice (1.25 slices) + two preempt-point gaps.
  f.pp_gap = rng.range(1, 100) * kUs;
  return f;
}

std::vector<int> spawn(CoreSim& sim, Rng& rng, std::uint64_t cookie, int n, int pinned) {
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back(sim.add(busy(cookie, rng, pinned), sim.now() + rng.range(0, 20) * kUs));
  return ids;
}

void depart_all(CoreSim& sim, const std::vector<int>& ids) {
  for (int i : ids) sim.depart(i);
}

void run_for(CoreSim& sim, std::uint64_t ns) { sim.run_until(sim.now() + ns); }

/// Runs until every fiber in `ids` finished (departed fibers finish at their next run).
void settle(CoreSim& sim, const std::vector<int>& ids) {
  for (int k = 0; k < 1000 && !sim.failed(); ++k) {
    bool all = true;
    for (int i : ids) all &= sim.done(i);
    if (all) return;
    run_for(sim, kSlice);
  }
  sim.fail("(d) departed fibers never finished");
}

/// Tracks A against B for `slices`, then checks (b) on every 20-slice window.
void fair_pair(CoreSim& sim, Report& rep, std::uint64_t a, std::uint64_t b, std::uint64_t slices) {
  sim.track_pair(a, b);
  run_for(sim, slices * kSlice);
  if (!sim.failed()) sim.check_pair_windows(20, 0.10, rep.worst_share);
}



/// Runs `body` under both policies on 2- and 4-PU cores, `reps` seeds each
/// (scaled, but at least `min_reps`).
void simulate(const char* name, Scenario body, int reps, int min_reps) {
  const auto t0 = std::chrono::steady_clock::now();
  Budget b;
  const int n = std::max(min_reps, static_cast<int>(reps * test_support::stress_scale() + 0.5));
  const char* only = std::getenv("CORESCHED_SIM_POLICY");
  for (auto policy : {FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance}) {
    if (only && std::string(only) != coresched::to_string(policy)) continue;
    for (unsigned pus : {2u, 4u}) {
      for (int r = 0; r < n; ++r) {
        const std::uint64_t seed = mix(mix(mix(base_seed(), hash(name)), static_cast<std::uint64_t>(policy) * 8 + pus),
                                       static_cast<std::uint64_t>(r));
        CoreSim sim(pus, policy, seed);
        Rng rng(~seed);
        Report rep;
        body(sim, rng, pus, rep);
        if (!sim.failed()) sim.drain(2000 * kSlice);
        collect(sim, rep);
        b.runs += 1;
        b.slices += sim.elapsed() / kSlice;
        b.events += sim.events();
        if (verbose())
          std::printf("[sim] %s %s %u PUs run %d: worst share %.3f, worst arrival %.0f us, worst wait %.0f us, worst "
                      "fiber wait %.0f us\n",
                      name, coresched::to_string(policy), pus, r, rep.worst_share,
                      static_cast<double>(rep.worst_arrival) / kUs, static_cast<double>(rep.worst_wait) / kUs,
                      static_cast<double>(rep.worst_fiber) / kUs);
        if (sim.failed()) {
          char head[256];
          std::snprintf(head, sizeof head,
                        "scenario %s, policy %s, %u PUs, run %d, seed 0x%llx (base seed 0x%llx: "
                        "CORESCHED_SIM_SEED=0x%llx reruns it)\n",
                        name, coresched::to_string(policy), pus, r, static_cast<unsigned long long>(seed),
                        static_cast<unsigned long long>(base_seed()), static_cast<unsigned long long>(base_seed()));
          FAIL(head << sim.failure());
        }
      }
    }
  }
  b.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[sim] %s: %llu runs, %llu simulated slices, %llu events, %.2f s wall\n", name,
              static_cast<unsigned long long>(b.runs), static_cast<unsigned long long>(b.slices),
              static_cast<unsigned long long>(b.events), b.wall_s);
  g_total.scenarios += 1;
  g_total.runs += b.runs;
  g_total.slices += b.slices;
  g_total.events += b.events;
  g_total.wall_s += b.wall_s;
  CHECK(b.runs > 0);
}

} // namespace sim
