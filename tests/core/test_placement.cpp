// SPDX-License-Identifier: Apache-2.0
// Wakeup placement on scripted worker states (no threads): the idle mask and
// the scan choose the same PU, in the documented order.
#include "core/placement.hpp"

#include <catch2/catch.hpp>

#include <memory>
#include <mutex>
#include <random>

using namespace coresched;
using namespace coresched::detail;

namespace {
struct Machine {
  explicit Machine(const char* spec) : topo(Topology::discover(spec)) {
    std::vector<CoreCoordinator*> ptrs;
    for (const auto& c : topo.cores()) {
      cores.push_back(std::make_unique<CoreCoordinator>(c.index, c.pus, CoreConfig{}));
      ptrs.push_back(cores.back().get());
    }
    index = std::make_unique<PlacementIndex>(topo, ptrs);
  }
  // Worker `pu` is busy running `cookie`, or idle.
  void busy(unsigned pu, std::uint64_t cookie) {
    index->set_idle(pu, false);
    const auto& core = topo.cores()[topo.pus()[pu].core];
    const auto s = static_cast<unsigned>(std::find(core.pus.begin(), core.pus.end(), pu) - core.pus.begin());
    // The fixture passes through states the runtime never has (a PU made
    // busy with A before its sibling busy with B is made idle): the
    // test-only hook lets the coordinator publish them.
    testing::ignore_siblings = true;
    {
      std::lock_guard lk(cores[core.index]->lock());
      cores[core.index]->publish_locked(s, cookie);
    }
    testing::ignore_siblings = false;
  }
  void idle(unsigned pu) {
    const auto& core = topo.cores()[topo.pus()[pu].core];
    const auto s = static_cast<unsigned>(std::find(core.pus.begin(), core.pus.end(), pu) - core.pus.begin());
    {
      std::lock_guard lk(cores[core.index]->lock());
      cores[core.index]->publish_locked(s, kNoCookie);
    }
    index->set_idle(pu, true);
  }
  unsigned both(std::uint64_t cookie, unsigned prev) {
    const unsigned m = index->choose(cookie, prev, Placement::mask);
    const unsigned s = index->choose(cookie, prev, Placement::scan);
    CHECK(m == s);
    return m;
  }
  Topology topo;
  std::vector<std::unique_ptr<CoreCoordinator>> cores;
  std::unique_ptr<PlacementIndex> index;
};
constexpr std::uint64_t A = 11, B = 22, C = 33;
} // namespace

TEST_CASE("placement prefers a wholly idle core, then a core running the fiber's cookie", "[placement]") {
  Machine m("package:1 l3cache:1 core:4 pu:2");
  for (unsigned pu = 0; pu < 8; ++pu) m.busy(pu, B);
  m.busy(0, A);
  m.idle(1); // core 0: sibling runs A
  m.idle(4);
  m.idle(5); // core 2 wholly idle
  CHECK(m.both(A, 7) == 4);
  m.busy(4, C);
  m.busy(5, C); // no wholly idle core left
  CHECK(m.both(A, 7) == 1);
}

TEST_CASE("placement never picks an incompatible core while a compatible idle PU exists", "[placement]") {
  Machine m("package:1 l3cache:1 core:4 pu:2");
  for (unsigned pu = 0; pu < 8; ++pu) m.busy(pu, B);
  m.busy(2, A);
  m.idle(1); // core 0 runs B
  m.idle(3); // core 1 runs A
  CHECK(m.both(A, 6) == 3);
  CHECK(m.both(B, 6) == 1);
  CHECK(m.both(C, 6) == PlacementIndex::kNone); // only cores running other cookies are idle
}

TEST_CASE("placement keeps a fiber on its previous worker when that one is idle and compatible", "[placement]") {
  Machine m("package:1 l3cache:1 core:4 pu:2");
  for (unsigned pu = 0; pu < 8; ++pu) m.idle(pu);
  CHECK(m.both(A, 6) == 6);
  m.busy(7, B);
  CHECK(m.both(A, 6) == 0); // 6's sibling runs B: go to a wholly idle core instead
}

TEST_CASE("mask and scan choose equally on random states up to 192 PUs", "[placement]") {
  for (const char* spec : {"package:1 l3cache:1 core:8 pu:2", "package:1 l3cache:1 core:96 pu:2",
                           "package:1 l3cache:1 core:16 pu:4"}) {
    Machine m(spec);
    const auto n = static_cast<unsigned>(m.topo.pus().size());
    std::minstd_rand rng(7);
    for (int round = 0; round < 300; ++round) {
      const unsigned busy_pct = 25 * (1 + round % 4);
      for (const auto& core : m.topo.cores()) {
        const std::uint64_t cookie = rng() % 3; // siblings of a core run one cookie
        for (unsigned pu : core.pus) {
          if (rng() % 100 < busy_pct) m.busy(pu, cookie);
          else m.idle(pu);
        }
      }
      for (int k = 0; k < 10; ++k) m.both(rng() % 4, static_cast<unsigned>(rng() % n));
    }
  }
}

TEST_CASE("placement looks in other LLCs when its own has no idle PU", "[placement]") {
  Machine m("package:1 l3cache:2 core:2 pu:2");
  for (unsigned pu = 0; pu < 8; ++pu) m.busy(pu, B);
  m.idle(6);
  m.idle(7); // core 3, in the other LLC, wholly idle
  CHECK(m.both(A, 1) == 6);
}
