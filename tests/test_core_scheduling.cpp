// SPDX-License-Identifier: Apache-2.0
// Core scheduling through the public API: cookies, isolation, fairness.
#include "isolation_probe.hpp"

#include "core_coordinator.hpp" // the test-only hook that breaks isolation

#include <coresched/coresched.hpp>

#include "test_support.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

using namespace coresched;
using namespace std::chrono_literals;
using test_support::stress_scale;
using test_support::topo;
using Clock = std::chrono::steady_clock;

namespace {


void burn(std::chrono::microseconds d) {
  const auto until = Clock::now() + d;
  while (Clock::now() < until) {
  }
}

std::uint64_t total_switches(const Runtime& rt) {
  std::uint64_t n = 0;
  for (const auto& w : rt.stats().workers) n += w.switches;
  return n;
}
} // namespace

TEST_CASE("cookies: unique, untagged by default, inherited unless named", "[cookie]") {
  const Cookie a = Cookie::create(), b = Cookie::create();
  CHECK(a != b);
  CHECK_FALSE(a.untagged());
  CHECK(Cookie{}.untagged());
  Runtime rt(topo("core:1 pu:2"));
  auto h = rt.spawn([b] {
    auto inherit = coresched::spawn([] { return this_fiber::cookie(); });
    auto named = coresched::spawn([] { return this_fiber::cookie(); }, SpawnOptions{.cookie = b});
    return std::make_pair(inherit.join(), named.join());
  }, SpawnOptions{.cookie = a});
  auto [inherited, named] = h.join();
  CHECK(inherited == a);
  CHECK(named == b);
  CHECK(rt.spawn([] { return this_fiber::cookie(); }).join().untagged());
}

TEST_CASE("set_cookie changes the running fiber's cookie", "[cookie]") {
  Runtime rt(topo("core:1 pu:2"));
  const Cookie c = Cookie::create();
  auto h = rt.spawn([c] {
    this_fiber::set_cookie(c);
    this_fiber::yield();
    return this_fiber::cookie();
  });
  CHECK(h.join() == c);
}

namespace {
// Random yields, sleeps, cookie changes, spawns and joins, until `target`
// scheduling events; checked by the probe (and the runtime's own checker).
void isolation_stress(const char* spec) {
  Runtime rt(topo(spec));
  IsolationProbe probe(rt.topology());
  const std::vector<Cookie> cookies{Cookie{}, Cookie::create(), Cookie::create(), Cookie::create(), Cookie::create()};
  const auto target = static_cast<std::uint64_t>(1'000'000 * stress_scale());
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> children{0};
  std::vector<JoinHandle<void>> roots;
  for (unsigned i = 0; i < 24; ++i) {
    roots.push_back(rt.spawn([&, i] {
      std::minstd_rand rng(i + 1);
      probe.enter();
      while (!stop.load(std::memory_order_relaxed)) {
        const auto op = rng() % 100;
        probe.leave();
        if (op < 70) {
          this_fiber::yield();
        } else if (op < 80) {
          this_fiber::preempt_point();
        } else if (op < 85) {
          this_fiber::sleep_for(std::chrono::microseconds(rng() % 200));
        } else if (op < 93) {
          this_fiber::set_cookie(cookies[rng() % cookies.size()]);
        } else {
          SpawnOptions so;
          if (rng() % 2) so.cookie = cookies[rng() % cookies.size()];
          auto child = coresched::spawn([&] {
            for (int k = 0; k < 3; ++k) {
              probe.enter();
              probe.leave();
              this_fiber::yield();
            }
            children.fetch_add(1);
          }, so);
          child.join();
        }
        probe.enter();
      }
      probe.leave();
    }, SpawnOptions{.cookie = cookies[i % cookies.size()]}));
  }
  while (total_switches(rt) < target) std::this_thread::sleep_for(20ms);
  stop = true;
  for (auto& r : roots) r.join();
  const Stats st = rt.stats();
  INFO(st.to_table());
  CHECK(total_switches(rt) >= target);
  CHECK(children.load() > 0);
  CHECK(probe.violations.load() == 0);
  CHECK(st.isolation_violations == 0);
  std::uint64_t switches = 0;
  for (const auto& c : st.cores) switches += c.cookie_switches;
  CHECK(switches > 0);
}
} // namespace

TEST_CASE("isolation stress on core:2 pu:2", "[isolation]") { isolation_stress("core:2 pu:2"); }
TEST_CASE("isolation stress on core:4 pu:2", "[isolation]") { isolation_stress("core:4 pu:2"); }
TEST_CASE("isolation stress on SMT-4 core:2 pu:4", "[isolation]") { isolation_stress("core:2 pu:4"); }

TEST_CASE("the checkers catch a deliberate isolation violation", "[isolation]") {
  Runtime rt(topo("core:1 pu:2"));
  IsolationProbe probe(rt.topology());
  detail::testing::ignore_siblings = true; // the test-only hook: picks ignore siblings
  std::vector<JoinHandle<void>> hs;
  for (unsigned pu = 0; pu < 2; ++pu) {
    hs.push_back(rt.spawn([&] {
      const auto until = Clock::now() + 300ms;
      while (Clock::now() < until) {
        probe.enter();
        burn(50us);
        probe.leave();
        this_fiber::yield();
      }
    }, SpawnOptions{.cookie = Cookie::create(), .pin_to_pu = pu}));
  }
  for (auto& h : hs) h.join();
  detail::testing::ignore_siblings = false;
  CHECK(probe.violations.load() > 0);
#ifdef CORESCHED_ISOLATION_CHECK
  CHECK(rt.stats().isolation_violations > 0);
#endif
}

namespace {
// Runs CPU-bound fibers of two cookies on one two-PU core; returns cookie A's
// share of the core's time.
double share_of_a(FairnessPolicy policy, int fibers_a, int fibers_b) {
  Runtime rt(topo("core:1 pu:2", policy));
  const Cookie a = Cookie::create(), b = Cookie::create();
  const auto until = Clock::now() + 1500ms;
  std::vector<JoinHandle<void>> hs;
  auto body = [until] {
    while (Clock::now() < until) {
      burn(20us);
      this_fiber::preempt_point();
    }
  };
  for (int i = 0; i < fibers_a; ++i) hs.push_back(rt.spawn(body, SpawnOptions{.cookie = a}));
  for (int i = 0; i < fibers_b; ++i) hs.push_back(rt.spawn(body, SpawnOptions{.cookie = b}));
  for (auto& h : hs) h.join();
  const Stats st = rt.stats();
  const double ca = static_cast<double>(st.cookie(a).core_ns), cb = static_cast<double>(st.cookie(b).core_ns);
  INFO(st.to_table());
  REQUIRE(ca + cb > 0);
  CHECK(st.cookie(b).forced_idle_suffered_ns + st.cookie(a).forced_idle_suffered_ns > 0);
  return ca / (ca + cb);
}
} // namespace

TEST_CASE("fairness: two CPU-bound cookies each get half the core", "[fairness]") {
  for (auto policy : {FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance}) {
    const double share = share_of_a(policy, 2, 2);
    INFO(to_string(policy) << " share of A " << share);
    CHECK(share >= 0.45);
    CHECK(share <= 0.55);
  }
}

TEST_CASE("fairness: one fiber of A against 20 of B still gets 40%", "[fairness]") {
  for (auto policy : {FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance}) {
    const double share = share_of_a(policy, 1, 20);
    INFO(to_string(policy) << " share of A " << share);
    CHECK(share >= 0.40);
  }
}

TEST_CASE("kernel cookie option degrades gracefully", "[cookie]") {
  Options o = topo("core:1 pu:2");
  o.kernel_cookie = true;
  Runtime rt(o);
  CHECK(rt.spawn([] { return 7; }).join() == 7);
}

TEST_CASE("fairness holds across rounds of fresh cookies against a long-lived one", "[fairness]") {
  // Regression: a new cookie used to start at vruntime 0 against the untagged
  // cookie's whole history, so every round skewed the split further. Shares
  // are measured between two snapshots taken while both fibers run, so a late
  // start (a loaded CI machine) cannot skew them.
  for (auto policy : {FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance}) {
    Runtime rt(topo("core:1 pu:2", policy));
    for (int round = 0; round < 4; ++round) {
      const Cookie fresh = Cookie::create();
      std::atomic<int> started{0};
      std::atomic<bool> stop{false};
      auto body = [&] {
        started.fetch_add(1);
        while (!stop.load()) {
          burn(20us);
          this_fiber::preempt_point();
        }
      };
      auto a = rt.spawn(body, SpawnOptions{.cookie = fresh, .pin_to_pu = 0});
      auto b = rt.spawn(body, SpawnOptions{.cookie = Cookie{}, .pin_to_pu = 1});
      while (started.load() < 2) std::this_thread::sleep_for(1ms);
      const Stats before = rt.stats();
      std::this_thread::sleep_for(300ms);
      const Stats after = rt.stats();
      stop = true;
      a.join();
      b.join();
      const double fa = static_cast<double>(after.cookie(fresh).core_ns - before.cookie(fresh).core_ns);
      const double fb = static_cast<double>(after.cookie(Cookie{}).core_ns - before.cookie(Cookie{}).core_ns);
      INFO(to_string(policy) << " round " << round << " fresh " << fa << " untagged " << fb);
      REQUIRE(fa + fb > 0);
      CHECK(fa / (fa + fb) >= 0.40);
      CHECK(fa / (fa + fb) <= 0.60);
    }
  }
}
