// SPDX-License-Identifier: Apache-2.0
// The oracle is worth something only if it fires on a real break. The one
// white-box file here: it reaches the runtime's test-only hook that makes the
// core coordinator ignore what siblings run, and checks that the oracle (not
// the runtime's own checker) reports the overlaps, with their details.
#include "harness.hpp"

#include "core/core_coordinator.hpp" // detail::testing::ignore_siblings

#include <catch2/catch.hpp>

using namespace coresched;
using namespace guarantees;
using namespace std::chrono_literals;

TEST_CASE("the oracle fires when the coordinator ignores siblings", "[oracle][fires]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const Cookie a = Cookie::create(), b = Cookie::create();
  struct Hook { // restored even if a check throws: later tests must see a sound runtime
    Hook() { detail::testing::ignore_siblings = true; }
    ~Hook() { detail::testing::ignore_siblings = false; }
  };
  {
    const Hook hook;
    std::vector<JoinHandle<void>> hs;
    // Both PUs of core 0, one cookie each: with the hook they run side by side.
    const auto& core0 = h.rt.topology().cores()[0].pus;
    for (unsigned k = 0; k < 2; ++k)
      hs.push_back(h.rt.spawn([&, k] {
        Scope s(h.oracle, k ? b : a, "deliberately broken");
        // Long stamped stretches (20 ms) between yields: the two intervals overlap
        // as soon as both fibers run, however slowly the workers get through
        // their picks (in a TCG guest each of the runtime checker's 900-odd log
        // lines goes to an emulated serial console, and with 50 us stretches
        // the oracle can see no overlap).
        const auto until = std::chrono::steady_clock::now() + 300ms;
        while (std::chrono::steady_clock::now() < until && h.oracle.violations.load() < 100) {
          s.burn(20ms);
          s.yield();
        }
      }, SpawnOptions{.cookie = k ? b : a, .pin_to_pu = core0[k]}));
    for (auto& x : hs) x.join();
  }
  INFO(h.summary());
  CHECK(h.oracle.violations.load() > 0);
  REQUIRE_FALSE(h.oracle.first_violations().empty());
  const Violation v = h.oracle.first_violations().front();
  CHECK(v.core == 0);
  CHECK(v.pu != v.other_pu);
  CHECK(((v.mine == a.value() && v.other == b.value()) || (v.mine == b.value() && v.other == a.value())));
  CHECK(h.oracle.slot_mismatches.load() == 0);
}
