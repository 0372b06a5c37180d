// SPDX-License-Identifier: Apache-2.0
// Oracle scenarios across runtimes: the promise holds between any two fibers
// of the process, whatever runtime each belongs to. Runtimes alive at once get
// cores of their own (Options::cpus); one oracle watches the whole machine
// they share out, so a fiber of one runtime beside another's on sibling PUs of
// a core would be seen. A runtime that would share a core with a live one is
// refused, and a fiber spawning into another runtime keeps its cookie.
#include "harness.hpp"

#include <catch2/catch.hpp>

#include <memory>

using namespace coresched;
using namespace guarantees;
using namespace std::chrono_literals;

namespace {

Options part_of(const std::string& spec, const std::string& cpus) {
  Options o = options_for(spec);
  o.cpus = cpus;
  return o;
}

// Fibers of both cookies in runtime `rt`, stamped on the shared oracle,
// burning and yielding until `stop`; half of them hop into `other` and back by
// spawning there (inheriting their cookie) and joining.
std::vector<JoinHandle<void>> tenants(Runtime& rt, Runtime& other, Oracle& o, const std::vector<Cookie>& cookies,
                                      std::atomic<bool>& stop, std::atomic<int>& wrong_cookie) {
  std::vector<JoinHandle<void>> hs;
  for (const Cookie c : cookies)
    for (int i = 0; i < 3; ++i)
      hs.push_back(rt.spawn([&, c, i] {
        Scope s(o, c, "tenant");
        for (unsigned n = 0; !stop.load(std::memory_order_relaxed); ++n) {
          s.burn(std::chrono::microseconds(20 + 10 * i));
          if (i == 0 && n % 8 == 0) {
            auto h = s.around([&] {
              return other.spawn([&, c] {
                Scope cs(o, c, "spawned into the other runtime");
                if (this_fiber::cookie() != c) wrong_cookie.fetch_add(1);
                cs.burn(30us);
                cs.yield();
                cs.burn(30us);
              });
            });
            s.join(h);
          } else if (n % 4 == 3) {
            s.preempt_point();
          } else {
            s.yield();
          }
        }
      }, SpawnOptions{.cookie = c}));
  return hs;
}

} // namespace

TEST_CASE("runtimes on cores of their own: no overlap across them", "[oracle][runtimes]") {
  // Two runtimes on one two-core machine, and three on a three-core one.
  const auto [spec, parts] = GENERATE(table<std::string, std::vector<std::string>>({
      {"core:2 pu:2", {"0-1", "2-3"}},
      {"package:1 core:3 pu:2", {"0-1", "2-3", "4-5"}},
  }));
  INFO(spec);
  const Topology machine = Topology::discover(spec);
  Oracle o(machine);
  std::vector<std::unique_ptr<Runtime>> rts;
  for (const auto& cpus : parts) rts.push_back(std::make_unique<Runtime>(part_of(spec, cpus)));
  for (auto& rt : rts) {
    REQUIRE(rt->topology().cores().size() == 1);
    o.prime(*rt);
  }
  const Cookie a = Cookie::create(), b = Cookie::create();
  std::atomic<bool> stop{false};
  std::atomic<int> wrong_cookie{0};
  std::vector<JoinHandle<void>> hs;
  for (std::size_t i = 0; i < rts.size(); ++i) {
    // Runtime i runs cookie a where i is even, b where odd, and both in the
    // last one, so neighbours differ and one core keeps changing hands.
    std::vector<Cookie> mine{i % 2 ? b : a};
    if (i + 1 == rts.size()) mine = {a, b};
    auto more = tenants(*rts[i], *rts[(i + 1) % rts.size()], o, mine, stop, wrong_cookie);
    for (auto& h : more) hs.push_back(std::move(h));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(scaled(400)));
  stop.store(true);
  for (auto& h : hs) h.join();
  for (auto& rt : rts) rt->shutdown();
  INFO(o.report());
  CHECK(o.violations.load() == 0);
  CHECK(o.slot_mismatches.load() == 0);
  CHECK(o.unattributed.load() == 0);
  CHECK(o.checks.load() > 1000);
  CHECK(wrong_cookie.load() == 0);
}

TEST_CASE("a runtime that would share a core with a live one is refused", "[runtimes]") {
  Runtime first(options_for("core:2 pu:2"));
  // The same machine, one sibling of a shared core, or cores of both: refused,
  // with the shared PUs and the way out in the message.
  for (const char* cpus : {"", "1", "1-2"}) {
    INFO(cpus);
    CHECK_THROWS_WITH(Runtime(part_of("core:2 pu:2", cpus)),
                      Catch::Contains("shares a core") && Catch::Contains("PUs 0,1") && Catch::Contains("Options::cpus"));
  }
  first.shutdown();
  // Its cores are free once its workers have stopped, before it is destroyed.
  Runtime second(part_of("core:2 pu:2", "1"));
  CHECK(second.topology().pus().size() == 1);
  CHECK(second.topology().cores()[0].os_pus == std::vector<unsigned>{0, 1});
  // Cores of one PU have no siblings to protect: runtimes may share them.
  Runtime solo1(options_for("core:2 pu:1")), solo2(options_for("core:2 pu:1"));
  CHECK(solo2.spawn([] { return 7; }).join() == 7);
}

TEST_CASE("runtimes split by Options::cpus run side by side", "[runtimes]") {
  Runtime left(part_of("core:2 pu:2", "0-1")), right(part_of("core:2 pu:2", "2,3"));
  CHECK(left.topology().pus().size() == 2);
  CHECK(right.topology().pus()[0].os_index == 2);
  CHECK(left.spawn([] { return 1; }).join() + right.spawn([] { return 2; }).join() == 3);
  CHECK_THROWS_WITH(Runtime(part_of("core:2 pu:2", "0-9")), Catch::Contains("does not have"));
  CHECK_THROWS_WITH(Runtime(part_of("core:2 pu:2", "zero")), Catch::Contains("is not a list"));
  CHECK_THROWS_AS(Runtime(part_of("core:2 pu:2", "3-")), TopologyError);
}

TEST_CASE("a fiber spawning into another runtime passes on its cookie", "[runtimes][spawn]") {
  Runtime one(part_of("core:2 pu:2", "0-1")), two(part_of("core:2 pu:2", "2-3"));
  const Cookie c = Cookie::create(), d = Cookie::create();
  auto h = one.spawn([&] {
    int inherited = 0;
    for (int i = 0; i < 200; ++i) inherited += two.spawn([&] { return this_fiber::cookie() == c; }).join();
    const bool named = two.spawn([] { return this_fiber::cookie(); }, SpawnOptions{.cookie = d}).join() == d;
    return std::make_pair(inherited, named);
  }, SpawnOptions{.cookie = c});
  const auto [inherited, named] = h.join();
  CHECK(inherited == 200);
  CHECK(named);
  // From a plain thread: untagged.
  CHECK(two.spawn([] { return this_fiber::cookie(); }).join() == Cookie{});
}
