// SPDX-License-Identifier: Apache-2.0
// Oracle scenarios, blocking_call: the call's body runs on a helper thread
// that may be on any PU of the core its fiber called from, so it is stamped
// for that whole core (CallScope). Until the call returns no PU of the core
// may run a fiber of another cookie, while fibers of other cookies burn in
// stamped intervals beside the calls, and fibers of the call's own cookie
// may run beside it.
#include "harness.hpp"

#include <catch2/catch.hpp>

#include <memory>
#include <optional>
#include <thread>

using namespace coresched;
using namespace guarantees;
using namespace std::chrono_literals;

TEST_CASE("oracle unit: a blocking call is checked against every PU of its core and the core's other calls",
          "[oracle]") {
  const Topology t = Topology::discover("core:2 pu:2");
  Oracle o(t);
  const auto& c0 = t.cores()[0].pus;
  const auto& c1 = t.cores()[1].pus;
  const int p0 = static_cast<int>(c0[0]), p1 = static_cast<int>(c0[1]), q0 = static_cast<int>(c1[0]);
  REQUIRE(o.core_of(p0) == 0);
  REQUIRE(o.core_of(q0) == 1);
  {
    CallScope call(o, 0, Cookie::from_value(7), "call");
    REQUIRE(call.slot() >= 0);
    o.stamp(p0, 7, "same cookie on the call's core");
    o.stamp(q0, 9, "other cookie on another core");
    CHECK(o.violations == 0);
    o.restore(p0, 7, Oracle::kEmpty, "leave");
    o.restore(q0, 9, Oracle::kEmpty, "leave");
    // A PU's stamp sees the call: the PU side of the violation.
    o.stamp(p1, 9, "other cookie beside the call");
    REQUIRE(o.violations == 1);
    Violation v = o.first_violations().back();
    CHECK((!v.mine_call && v.other_call && v.pu == static_cast<unsigned>(p1) && v.mine == 9 && v.other == 7));
    // The call's check sees the PU: the call side.
    o.check_call(0, call.slot(), 7, "call");
    REQUIRE(o.violations == 2);
    v = o.first_violations().back();
    CHECK((v.mine_call && !v.other_call && v.other_pu == static_cast<unsigned>(p1) && v.mine == 7 && v.other == 9));
    o.restore(p1, 9, Oracle::kEmpty, "leave");
    {
      CallScope same(o, 0, Cookie::from_value(7), "second call of the same cookie");
      CHECK(same.slot() != call.slot());
    }
    CHECK(o.violations == 2);
    {
      CallScope other(o, 0, Cookie::from_value(9), "another cookie's call on the same core");
      REQUIRE(o.violations == 3);
      v = o.first_violations().back();
      CHECK((v.mine_call && v.other_call && v.mine == 9 && v.other == 7));
    }
  }
  // Every slot was given back: the core takes any cookie again.
  o.stamp(p1, 9, "after the calls");
  CHECK(o.violations == 3);
  o.restore(p1, 9, Oracle::kEmpty, "leave");
  CHECK(o.call_scopes == 3);
  CHECK(o.slot_mismatches == 0);
  // More calls than slots: the last is still checked, and counted.
  std::vector<std::unique_ptr<CallScope>> many;
  for (unsigned k = 0; k <= Oracle::kCallSlots; ++k)
    many.push_back(std::make_unique<CallScope>(o, 1, Cookie::from_value(5), "one of many"));
  CHECK(many.back()->slot() == -1);
  CHECK(o.call_slots_full == 1);
  o.check_call(1, -1, 6, "unslotted call of another cookie");
  CHECK(o.violations == 3 + Oracle::kCallSlots);
  many.clear();
  CHECK(o.slot_mismatches == 0);
}

TEST_CASE("oracle unit: a blocking call on a core of one PU is checked against nothing", "[oracle]") {
  // Its helper and the core's worker share one CPU in turns: they never run at once.
  const Topology t = Topology::discover("core:2 pu:1");
  Oracle o(t);
  const int p = static_cast<int>(t.cores()[0].pus[0]);
  CallScope call(o, 0, Cookie::from_value(7), "call");
  o.stamp(p, 9, "the core's one PU, another cookie");
  o.check_call(0, call.slot(), 7, "call");
  CHECK(o.violations == 0);
  o.restore(p, 9, Oracle::kEmpty, "leave");
}

// Three cookies of burner fibers (stamped, switching through wrapped yields,
// preemption points and sleeps) and three caller fibers making blocking calls
// of 200 us to 2 ms: burning in the call, sleeping in it, throwing out of it,
// nesting one; one caller changes cookie between its calls. Without the hold
// a burner of another cookie runs on a sibling during a call and the call's
// burn or the burner's check sees it.
//
// A call is stamped for the core its fiber ran on as it called, but the call
// may wait for its cookie's turn first, and an unpinned fiber can move to
// another core meanwhile: where there are several cores the callers are
// pinned (two of them to the same core), so the core of the call is known.
TEST_CASE("blocking calls keep their core for their cookie while other cookies burn beside them",
          "[oracle][blocking]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const std::vector<Cookie> cookies{Cookie::create(), Cookie::create(), Cookie::create()};
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> progress[3]{}; // burn rounds of each cookie's burners
  std::vector<JoinHandle<void>> burners;
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < 2; ++i)
      burners.push_back(h.rt.spawn([&, k, i] {
        Scope s(h.oracle, cookies[k], "burner");
        for (unsigned n = 0; !stop.load(std::memory_order_relaxed); ++n) {
          s.burn(std::chrono::microseconds(20 + 15 * i));
          progress[k].fetch_add(1);
          if (n % 5 == 4) s.sleep_for(50us);
          else if (n % 2) s.yield();
          else s.preempt_point();
        }
      }, SpawnOptions{.cookie = cookies[k]}));

  const int calls = scaled(30);
  std::atomic<int> made{0}, thrown{0}, wrong{0}, beside{0};
  auto caller = [&](int id) {
    int mine = id == 1 ? 1 : 0; // callers 0 and 2 start as cookie 0, caller 1 is cookie 1
    Scope s(h.oracle, cookies[mine], "caller");
    for (int i = 0; i < calls; ++i) {
      s.burn(10us);
      // Where the fiber is as it calls: the call's core (the helper starts after the hold).
      const unsigned core = h.oracle.core_of(s.pu());
      const Cookie cookie = s.cookie();
      const auto burn = std::chrono::microseconds(200 + (i * 397 + id * 131) % 1800);
      const int kind = (i + id) % 5; // 0: sleeps in the call, 1: throws, 2: nests a call, else burns only
      const std::uint64_t tag = static_cast<std::uint64_t>(id) * 1000 + static_cast<std::uint64_t>(i);
      try {
        const int r = s.around([&] {
          return blocking_call([&] {
            CallScope cs(h.oracle, core, cookie);
            if (this_fiber::in_fiber()) wrong.fetch_add(1);
            const std::uint64_t before = progress[mine].load();
            cs.burn(burn / 2);
            if (kind == 0) std::this_thread::sleep_for(300us); // the core stays held while the call sleeps
            if (kind == 2)
              blocking_call([&] { // runs in place, in a call slot of its own
                CallScope nested(h.oracle, core, cookie, "nested blocking call");
                nested.burn(50us);
              });
            cs.burn(burn / 2);
            if (progress[mine].load() != before) beside.fetch_add(1);
            if (kind == 1) throw Tagged{tag};
            return i;
          });
        });
        if (kind == 1 || r != i) wrong.fetch_add(1);
      } catch (const Tagged& t) {
        if (kind != 1 || t.tag != tag) wrong.fetch_add(1);
        else thrown.fetch_add(1);
      }
      made.fetch_add(1);
      if (i % 4 == 3) s.sleep_for(100us);
      if (id == 2 && i % 3 == 2) { // a caller that changes cookie between calls, onto a core another call may hold
        mine = 1 - mine;
        s.set_cookie(cookies[mine]);
      }
    }
  };
  std::vector<JoinHandle<void>> callers;
  const auto& cores = h.rt.topology().cores();
  for (int id = 0; id < 3; ++id) {
    std::optional<unsigned> pin; // several cores: caller 0 on the first, callers 1 and 2 on the last
    if (cores.size() > 1) pin = id == 0 ? cores.front().pus[0] : cores.back().pus[static_cast<unsigned>(id - 1)];
    const Cookie start = cookies[id == 1 ? 1 : 0];
    callers.push_back(h.rt.spawn([&, id] { caller(id); }, SpawnOptions{.cookie = start, .pin_to_pu = pin}));
  }
  for (auto& c : callers) c.join();
  // Every cookie runs again once the calls are over: no hold is left behind.
  std::uint64_t after[3];
  for (int k = 0; k < 3; ++k) after[k] = progress[k].load();
  const bool resumed = wait_for([&] {
    for (int k = 0; k < 3; ++k)
      if (progress[k].load() == after[k]) return false;
    return true;
  }, 10s);
  stop.store(true);
  for (auto& b : burners) b.join();
  INFO(made.load() << " calls, " << thrown.load() << " thrown, " << beside.load()
                   << " with their own cookie's burners running during the call");
  CHECK(resumed);
  CHECK(made == 3 * calls);
  CHECK(wrong == 0);
  int throwing = 0; // the calls of kind 1
  for (int id = 0; id < 3; ++id)
    for (int i = 0; i < calls; ++i) throwing += (i + id) % 5 == 1;
  CHECK(thrown == throwing);
  CHECK(h.oracle.call_scopes.load() >= static_cast<std::uint64_t>(3 * calls));
  CHECK(h.oracle.call_slots_full.load() == 0);
  CHECK(beside.load() > 0); // the hold keeps other cookies off, not the call's own
  CHECK_ISOLATED(h);
}
