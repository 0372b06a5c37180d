// SPDX-License-Identifier: Apache-2.0
// Core scheduling through the public API: cookies, isolation, fairness.
#include "guarantees/oracle.hpp"

#include "core/core_coordinator.hpp" // the test-only hook that breaks isolation

#include <coresched/coresched.hpp>

#include "test_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <ctime>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace coresched;
using namespace std::chrono_literals;
using guarantees::Oracle;
using guarantees::Scope;
using test_support::scaled;
using test_support::stress_scale;
using test_support::topo;
using test_support::workers_runqueue_wait_ns;
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

TEST_CASE("joining a fiber that changes its cookie on another core", "[cookie][tsan]") {
  // A join looks for the child in its own core's queue while the child runs
  // on the other core and changes its cookie there: the lookup must read no
  // field of the child (RunQueue::contains reading its cookie is a data race
  // TSan reports). Asserts the values; the race itself shows under TSan.
  Runtime rt(topo("core:2 pu:1"));
  auto h = rt.spawn(
      [] {
        long sum = 0;
        for (int i = 0; i < scaled(2000); ++i) {
          auto child = spawn(
              [i] {
                for (int k = 0; k < 8; ++k) this_fiber::set_cookie(Cookie::create());
                return i;
              },
              SpawnOptions{.pin_to_pu = 1});
          sum += child.join(); // often while it runs, on PU 1
        }
        return sum;
      },
      SpawnOptions{.pin_to_pu = 0});
  const long n = scaled(2000);
  CHECK(h.join() == n * (n - 1) / 2);
}

namespace {
// Random yields, sleeps, cookie changes, spawns and joins, until `target`
// scheduling events; checked by the oracle (and the runtime's own checker).
void isolation_stress(const char* spec) {
  Runtime rt(topo(spec));
  Oracle oracle(rt.topology());
  const std::vector<Cookie> cookies{Cookie{}, Cookie::create(), Cookie::create(), Cookie::create(), Cookie::create()};
  const auto target = static_cast<std::uint64_t>(1'000'000 * stress_scale());
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> children{0};
  std::vector<JoinHandle<void>> roots;
  for (unsigned i = 0; i < 24; ++i) {
    roots.push_back(rt.spawn([&, i] {
      std::minstd_rand rng(i + 1);
      Scope s(oracle, cookies[i % cookies.size()]);
      while (!stop.load(std::memory_order_relaxed)) {
        const auto op = rng() % 100;
        if (op < 70) {
          s.yield();
        } else if (op < 80) {
          s.preempt_point();
        } else if (op < 85) {
          s.sleep_for(std::chrono::microseconds(rng() % 200));
        } else if (op < 93) {
          s.set_cookie(cookies[rng() % cookies.size()]);
        } else {
          SpawnOptions so;
          if (rng() % 2) so.cookie = cookies[rng() % cookies.size()];
          const Cookie expect = so.cookie.value_or(s.cookie()); // named, or inherited
          s.around([&] {
            auto child = coresched::spawn([&] {
              for (int k = 0; k < 3; ++k) {
                { Scope cs(oracle, expect); }
                this_fiber::yield();
              }
              children.fetch_add(1);
            }, so);
            child.join();
          });
        }
      }
    }, SpawnOptions{.cookie = cookies[i % cookies.size()]}));
  }
  while (total_switches(rt) < target) std::this_thread::sleep_for(20ms);
  stop = true;
  for (auto& r : roots) r.join();
  const Stats st = rt.stats();
  INFO(st.to_table());
  CHECK(total_switches(rt) >= target);
  CHECK(children.load() > 0);
  CHECK(oracle.violations.load() == 0);
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
  Oracle oracle(rt.topology());
  detail::testing::ignore_siblings = true; // the test-only hook: picks ignore siblings
  std::vector<JoinHandle<void>> hs;
  for (unsigned pu = 0; pu < 2; ++pu) {
    const Cookie c = Cookie::create();
    hs.push_back(rt.spawn([&oracle, c] {
      const auto until = Clock::now() + 300ms;
      while (Clock::now() < until) {
        {
          Scope s(oracle, c);
          burn(50us);
        }
        this_fiber::yield();
      }
    }, SpawnOptions{.cookie = c, .pin_to_pu = pu}));
  }
  for (auto& h : hs) h.join();
  detail::testing::ignore_siblings = false;
  CHECK(oracle.violations.load() > 0);
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
  // A new cookie must not start at vruntime 0 against the untagged cookie's
  // whole history, or every round skews the split further. Shares
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
      // A window in which the workers' threads waited 10 ms or more for a
      // CPU (the host ran something else) is measured again, up to twice: a
      // turn stretched at either edge is paid back only after the window.
      double fa = 0, fb = 0, waited_ms = 0;
      for (int attempt = 0; attempt < 3; ++attempt) {
        const std::uint64_t waited_before = workers_runqueue_wait_ns();
        const Stats before = rt.stats();
        std::this_thread::sleep_for(300ms);
        const Stats after = rt.stats();
        waited_ms = static_cast<double>(workers_runqueue_wait_ns() - waited_before) / 1e6;
        fa = static_cast<double>(after.cookie(fresh).core_ns - before.cookie(fresh).core_ns);
        fb = static_cast<double>(after.cookie(Cookie{}).core_ns - before.cookie(Cookie{}).core_ns);
        if (waited_ms < 10) break;
      }
      stop = true;
      a.join();
      b.join();
      INFO(to_string(policy) << " round " << round << " fresh " << fa << " untagged " << fb << " (workers waited "
                             << waited_ms << " ms for a CPU)");
      REQUIRE(fa + fb > 0);
      CHECK(fa / (fa + fb) >= 0.40);
      CHECK(fa / (fa + fb) <= 0.60);
    }
  }
}

TEST_CASE("fairness: a cookie arriving after another ran alone for 2 s gets 40% of every 100 ms", "[fairness]") {
  // Cookie A, two busy fibers, runs alone on a two-PU core for T; then cookie
  // B arrives, and A must not lose the core for the next T. While one cookie
  // runs alone no pick reads the clock, so A's core vruntime and the core's
  // floor are T old, and B placed at that stale floor would be T behind A:
  // the books are brought up to date when a cookie arrives. tests/sim/
  // checks the same in simulated time.
  //
  // Measured: the work (20 us chunks) each cookie's fibers do in each
  // 100 ms window of the 1.5 s after B arrives, all within the 2 s that A
  // would starve otherwise (0 % of every window). Work, not Stats::core_ns:
  // when the VM is paused, the cookie holding the core is charged core time
  // for the pause but does no work (seconds in one window). And stats are not
  // read before B arrives: reading them checkpoints the core, which
  // refreshes A's vruntime and would hide the starvation.
  //
  // Noise, measured rather than guessed. This 2-vCPU VM is shared with
  // builds and other test runs, and a window in which the kernel or the host
  // ran something else instead of a worker says nothing about the scheduler:
  // a window is quiet if the worker threads' run-queue wait (time runnable
  // while the kernel ran another thread) stayed under 10 ms and they did at
  // least 70 % of the work two PUs can do in it (the host may pause the
  // whole VM, which no run-queue counter sees). In quiet windows the split
  // is 48-51 %, and each cookie must get 40 % of every one. Under load (load
  // average 15-18: 30-2500 ms of wait per window) a window's split ranges
  // from 0 to 100 %; such windows, and the one after each, are reported, not
  // judged. The whole 1.5 s is always judged, loosely: each cookie 25 % of
  // the work (39-61 % under that load; a starved A gets 0 %).
  for (auto policy : {FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance}) {
    Runtime rt(topo("core:1 pu:2", policy));
    const Cookie cookie[2] = {Cookie::create(), Cookie::create()};
    std::atomic<std::uint64_t> work[2] = {0, 0};
    std::atomic<bool> stop{false};
    auto body = [&stop](std::atomic<std::uint64_t>& done) {
      return [&stop, &done] {
        while (!stop.load(std::memory_order_relaxed)) {
          burn(20us);
          done.fetch_add(1, std::memory_order_relaxed);
          this_fiber::preempt_point();
        }
      };
    };
    std::vector<JoinHandle<void>> hs;
    for (int i = 0; i < 2; ++i) hs.push_back(rt.spawn(body(work[0]), SpawnOptions{.cookie = cookie[0]}));
    std::this_thread::sleep_for(2s); // A alone
    for (int i = 0; i < 2; ++i) hs.push_back(rt.spawn(body(work[1]), SpawnOptions{.cookie = cookie[1]}));
    constexpr int kWindows = 15;
    struct Sample {
      double work[2], waited_ns;
      Clock::time_point at;
    };
    auto sample_now = [&] {
      return Sample{{static_cast<double>(work[0].load()), static_cast<double>(work[1].load())},
                    static_cast<double>(workers_runqueue_wait_ns()), Clock::now()};
    };
    std::vector<Sample> sample{sample_now()};
    for (int w = 1; w <= kWindows; ++w) {
      std::this_thread::sleep_until(sample[0].at + w * 100ms);
      sample.push_back(sample_now());
    }
    stop = true;
    for (auto& h : hs) h.join();
    double total[2] = {0, 0};
    int noisy = 0;
    bool quiet_before = true; // the 2 s before B arrived are not judged; A ran alone there
    std::string log;
    for (int w = 1; w <= kWindows; ++w) {
      const double a = sample[w].work[0] - sample[w - 1].work[0], b = sample[w].work[1] - sample[w - 1].work[1];
      const double waited_ms = (sample[w].waited_ns - sample[w - 1].waited_ns) / 1e6;
      const double capacity = 2 * std::chrono::duration<double>(sample[w].at - sample[w - 1].at) / 20us;
      const bool quiet = waited_ms < 10 && a + b >= 0.7 * capacity;
      // A window right after a noisy one is not judged either. Time a worker
      // lost while its cookie owned the core was still charged to that
      // cookie, and the scheduler rightly pays it back in the next window, so
      // that window's split is skewed by the noise before it. (Under TSan
      // such a window can read 38 % just inside the quiet limits.)
      const bool judged = quiet && quiet_before;
      quiet_before = quiet;
      const double share = a + b > 0 ? a / (a + b) : 0.0;
      total[0] += a;
      total[1] += b;
      noisy += !quiet;
      log += std::to_string(static_cast<int>(100 * share)) + (judged ? "% " : quiet ? "% (after noise) " : "% (noisy) ");
      if (!judged) continue;
      INFO(to_string(policy) << " window " << w << ": A did " << a << " chunks, B " << b << " (of " << capacity
                             << "); the workers waited " << waited_ms << " ms for a CPU");
      CHECK(std::min(share, 1 - share) >= 0.40);
    }
    REQUIRE(total[0] + total[1] > 0);
    const double overall = total[0] / (total[0] + total[1]);
    INFO(to_string(policy) << ": A's share of the work per 100 ms window after B arrived: " << log);
    CHECK(std::min(overall, 1 - overall) >= 0.25);
    if (noisy)
      WARN(to_string(policy) << ": " << noisy << " of " << kWindows << " windows lost CPU to other load; A's share "
                             << overall << " in all, per window: " << log);
  }
}

TEST_CASE("hand-overs between busy cookies are counted with their gaps", "[handover]") {
  // Two cookies, each with one busy fiber pinned to its own sibling: the core
  // changes cookie every slice while the cookie it leaves still has work.
  Runtime rt(topo("core:1 pu:2"));
  const Cookie a = Cookie::create(), b = Cookie::create();
  std::atomic<bool> stop{false};
  std::vector<JoinHandle<void>> fibers;
  for (unsigned i = 0; i < 2; ++i)
    fibers.push_back(rt.spawn([&] {
      while (!stop.load(std::memory_order_relaxed)) this_fiber::preempt_point();
    }, SpawnOptions{.cookie = i ? a : b, .pin_to_pu = i}));
  // 300 ms, and on up to 20 times as long until 20 hand-overs were seen (a
  // sanitized build on a loaded host may make few in 300 ms).
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  while (rt.stats().cores[0].handovers < 20 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(6))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  stop = true;
  for (auto& f : fibers) f.join();
  const CoreStats c = rt.stats().cores[0];
  INFO("hand-overs " << c.handovers << ", cookie switches " << c.cookie_switches << ", gap p50 "
                     << c.handover_gap_p50_ns << " p99 " << c.handover_gap_p99_ns << " max " << c.handover_gap_max_ns);
  CHECK(c.handovers >= 20); // 300 ms of 1 ms slices make ~150-300; at most one per cookie switch
  CHECK(c.handovers <= c.cookie_switches);
  CHECK(c.handover_gap_p50_ns <= c.handover_gap_p99_ns);
  CHECK(c.handover_gap_p99_ns <= c.handover_gap_max_ns);
  CHECK(c.handover_gap_max_ns > 0); // a sibling that takes over needs some time to notice
  CHECK(c.handover_gap_max_ns < 300'000'000);
}

TEST_CASE("a core with one cookie has no hand-overs", "[handover]") {
  Runtime rt(topo("core:1 pu:2"));
  std::vector<JoinHandle<void>> fibers;
  for (int i = 0; i < 4; ++i)
    fibers.push_back(rt.spawn([] {
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
      while (std::chrono::steady_clock::now() < until) this_fiber::preempt_point();
    }));
  for (auto& f : fibers) f.join();
  CHECK(rt.stats().cores[0].handovers == 0);
}

TEST_CASE("a forced-idle PU does not spin through an owner's long turn", "[handover]") {
  // Cookie A runs 300 ms without a preemption point after short turns; B
  // waits on the other sibling. Its turn is due long before A stops: the
  // forced-idle PU may spin a quarter slice past the due time, not for the
  // whole turn, and an overdue turn must not look due just now at every look
  // (or the PU spins throughout): the process uses about one CPU, not two.
  // Both ways: by default it spins at most one wake-up latency once per
  // turn's end, with handover_spin up to a quarter slice past it.
  const bool spin = GENERATE(false, true);
  INFO("handover_spin " << spin);
  Options o = topo("core:1 pu:2");
  o.handover_spin = spin;
  Runtime rt(o);
  const Cookie a = Cookie::create(), b = Cookie::create();
  std::atomic<int> phase{0};
  auto fa = rt.spawn([&] {
    const auto teach = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    while (std::chrono::steady_clock::now() < teach) this_fiber::preempt_point(); // short turns, hand-overs
    phase = 1;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (std::chrono::steady_clock::now() < until) {
    } // no preemption point: B's PU stays forced idle
    phase = 2;
  }, SpawnOptions{.cookie = a, .pin_to_pu = 0});
  auto fb = rt.spawn([&] {
    while (phase.load(std::memory_order_relaxed) < 2) this_fiber::preempt_point();
  }, SpawnOptions{.cookie = b, .pin_to_pu = 1});
  while (phase.load() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20)); // A has taken the core for its long turn
  timespec c0{}, c1{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
  const auto w0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  const double cpu = static_cast<double>(c1.tv_sec - c0.tv_sec) + static_cast<double>(c1.tv_nsec - c0.tv_nsec) / 1e9;
  fa.join();
  fb.join();
  INFO("process CPU " << cpu << " s over " << wall << " s wall");
  CHECK(cpu / wall < 1.5);
}
