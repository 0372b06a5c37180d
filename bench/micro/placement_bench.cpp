// SPDX-License-Identifier: Apache-2.0
// coresched-placement-bench (seed 001): the cost of choosing an idle PU for a
// woken fiber, with the per-LLC idle masks vs scanning every worker, on
// synthetic topologies up to 192 PUs at rising load. Worker states are
// scripted (no threads), so the figure is the placement decision alone.
#include "core/placement.hpp"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace {
using namespace coresched;
using namespace coresched::detail;
using Clock = std::chrono::steady_clock;

struct Machine {
  explicit Machine(const std::string& spec) : topo(Topology::discover(spec)) {
    std::vector<CoreCoordinator*> ptrs;
    for (const auto& c : topo.cores()) {
      cores.push_back(std::make_unique<CoreCoordinator>(c.index, c.pus, CoreConfig{}));
      ptrs.push_back(cores.back().get());
    }
    index = std::make_unique<PlacementIndex>(topo, ptrs);
  }
  // Random load: each core runs one cookie on its busy PUs; `busy_pct` of PUs are busy.
  void load(unsigned busy_pct, std::minstd_rand& rng) {
    for (const auto& core : topo.cores()) {
      const std::uint64_t cookie = rng() % 4;
      for (unsigned s = 0; s < core.pus.size(); ++s) {
        const bool busy = rng() % 100 < busy_pct;
        std::lock_guard lk(cores[core.index]->lock());
        cores[core.index]->publish_locked(s, busy ? cookie : kNoCookie);
        index->set_idle(core.pus[s], !busy);
      }
    }
  }
  Topology topo;
  std::vector<std::unique_ptr<CoreCoordinator>> cores;
  std::unique_ptr<PlacementIndex> index;
};

// ns per choose(), averaged over `iters` wake-ups of random cookies from busy workers.
double time_choose(Machine& m, Placement how, long iters, std::minstd_rand rng) {
  const auto n = static_cast<unsigned>(m.topo.pus().size());
  std::vector<std::pair<std::uint64_t, unsigned>> wakes(4096);
  for (auto& w : wakes) w = {rng() % 4, static_cast<unsigned>(rng() % n)};
  unsigned sink = 0;
  const auto t0 = Clock::now();
  for (long i = 0; i < iters; ++i) {
    const auto& w = wakes[static_cast<std::size_t>(i) & 4095];
    sink += m.index->choose(w.first, w.second, how);
  }
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(iters);
  if (sink == 42) std::puts(""); // keep the loop
  return ns;
}
} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched-placement-bench: idle-mask vs scan wakeup placement, ns per decision"};
  long iters = 200'000;
  std::string json;
  std::vector<unsigned> sizes{48, 96, 192};
  app.add_option("-n,--iterations", iters, "placements per measurement")->check(CLI::PositiveNumber);
  app.add_option("--pus", sizes, "topology sizes in PUs (SMT-2, one LLC)")->check(CLI::Range(2u, 4096u));
  app.add_option("--json", json, "write the figures as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  std::printf("placement cost (scripted worker states; synthetic SMT-2 topologies, one LLC)\n");
  std::printf("%6s %6s %10s %10s %8s\n", "PUs", "busy%", "mask ns", "scan ns", "ratio");
  std::string rows;
  for (unsigned pus : sizes) {
    Machine m("package:1 l3cache:1 core:" + std::to_string(pus / 2) + " pu:2");
    for (unsigned busy : {25u, 50u, 75u, 100u}) {
      // Average over many random machine states, so no layout's luck decides.
      std::minstd_rand rng(pus * 100 + busy);
      double mask = 0, scan = 0;
      constexpr int kStates = 32;
      for (int st = 0; st < kStates; ++st) {
        m.load(busy, rng);
        mask += time_choose(m, Placement::mask, iters / kStates, rng) / kStates;
        scan += time_choose(m, Placement::scan, iters / kStates, rng) / kStates;
      }
      std::printf("%6u %6u %10.1f %10.1f %8.3f\n", pus, busy, mask, scan, mask / scan);
      rows += (rows.empty() ? "" : ",\n") + std::string("    {\"pus\": ") + std::to_string(pus) +
              ", \"busy_pct\": " + std::to_string(busy) + ", \"mask_ns\": " + std::to_string(mask) +
              ", \"scan_ns\": " + std::to_string(scan) + ", \"ratio\": " + std::to_string(mask / scan) + "}";
    }
  }
  if (!json.empty()) {
    std::ofstream out(json);
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", json.c_str());
      return 2;
    }
    out << "{\n  \"benchmark\": \"placement\",\n  \"unit\": \"ns per placement\",\n  \"rows\": [\n" << rows << "\n  ]\n}\n";
  }
  return 0;
}
