// SPDX-License-Identifier: Apache-2.0
// Running the simulation's scenarios (sim_run.cpp): each scenario body gets a
// CoreSim, a seeded Rng and the core's size, and reports its worst figures;
// simulate() runs it under both fairness policies on 2- and 4-PU cores.
#pragma once

#include "sim_core.hpp"

#include <cstdint>
#include <vector>

namespace sim {

/// What a scenario reports besides pass/fail.
struct Report {
  double worst_share = 0.5;        // the lowest share in any checked window
  std::uint64_t worst_arrival = 0; // ns
  std::uint64_t worst_wait = 0;    // ns
  std::uint64_t worst_fiber = 0;   // ns
};

using Scenario = void (*)(CoreSim&, Rng&, unsigned pus, Report&);

/// CORESCHED_SIM_VERBOSE=1: print each run's figures.
bool verbose();
/// A busy fiber of `cookie`: preempt points 1-100 us apart.
FiberSpec busy(std::uint64_t cookie, Rng& rng, int pinned = kNotPinned);
/// `n` busy fibers of `cookie`, arriving within 20 us; their indices.
std::vector<int> spawn(CoreSim& sim, Rng& rng, std::uint64_t cookie, int n, int pinned = kNotPinned);
void depart_all(CoreSim& sim, const std::vector<int>& ids);
void run_for(CoreSim& sim, std::uint64_t ns);
/// Runs until every fiber in `ids` finished (departed fibers finish at their next run).
void settle(CoreSim& sim, const std::vector<int>& ids);
/// Tracks A against B for `slices`, then checks (b) on every 20-slice window.
void fair_pair(CoreSim& sim, Report& rep, std::uint64_t a, std::uint64_t b, std::uint64_t slices);
/// Runs `body` under both policies on 2- and 4-PU cores, `reps` seeds each
/// (scaled by CORESCHED_STRESS_SCALE, but at least `min_reps`).
void simulate(const char* name, Scenario body, int reps, int min_reps = 1);

} // namespace sim
