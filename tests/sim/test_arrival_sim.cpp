// SPDX-License-Identifier: Apache-2.0
// The simulation (sim_core.hpp, sim_run.hpp) of cookies new to the core
// arriving one at a time beside a busy owner whose fibers never block and
// reach preemption points every few microseconds, while the slice ticker's
// wake-ups come late (CoreSim::tick_late_max): its thread shares the CPUs
// the busy workers hold. A new cookie has no sleeper credit, so it does not
// lead the owner when it arrives; it must still own the core within 2
// slices. Unless the runners are asked to pick again when the newcomer
// leads (CoreCoordinator::preempt_owner_for, Sibling::repick_at), only the
// ticker ends the owner's turn, and a late tick keeps the newcomer waiting
// past the bound (p99 4.4-8 slices in coresched-arrival-bench).
#include "sim_run.hpp"

#include <catch2/catch.hpp>

#include <vector>

using namespace sim;

namespace {

void fresh_arrivals(CoreSim& sim, Rng& rng, unsigned pus, Report&) {
  sim.tick_late_max = 3 * kSlice;
  const unsigned n = rng.chance(0.5) ? 2 : pus; // the owner's fibers
  for (unsigned i = 0; i < n; ++i) {
    FiberSpec f = busy(1, rng, rng.chance(0.5) ? static_cast<int>(i % pus) : kNotPinned);
    f.pp_gap = rng.range(1, 5) * kUs;
    sim.add(f, sim.now());
  }
  run_for(sim, rng.range(5, 50) * kSlice);
  // Cookies 2 .. 63 in turn: the coordinator keeps 32 cookies on its books,
  // so each one comes back forgotten, as new as Cookie::create()'s.
  std::uint64_t c = 2;
  for (int k = 0; k < 60 && !sim.failed(); ++k) {
    FiberSpec f = busy(c, rng, rng.chance(0.3) ? static_cast<int>(rng.range(0, pus - 1)) : kNotPinned);
    f.pp_gap = rng.range(1, 5) * kUs;
    const int i = sim.add(f, sim.now() + rng.range(0, kSlice));
    sim.depart(i); // it ends a few us after it starts, as the benchmark's fiber stamps its first instruction
    run_for(sim, rng.range(2, 5) * kSlice + kSlice); // (a) is checked as it runs
    settle(sim, std::vector<int>{i});
    c = c + 1 == kMaxCookies ? 2 : c + 1;
  }
}

} // namespace

TEST_CASE("sim: new cookies arriving beside a busy owner while ticks come late", "[sim]") {
  simulate("fresh_arrivals", fresh_arrivals, 8);
}
