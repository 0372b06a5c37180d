// SPDX-License-Identifier: Apache-2.0
// Per-cookie accounting against an independent clock: what Runtime::stats()
// says a cookie ran is what its fibers measured in user code, at any instant,
// also for a cookie that keeps its PU and never changes hands.
#include "test_support.hpp"

#include <coresched/coresched.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

using namespace coresched;
using test_support::topo;
using Clock = std::chrono::steady_clock;

namespace {

std::uint64_t ns_since(Clock::time_point t) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
}

std::uint64_t cpu_of(const Stats& st, Cookie c) {
  for (const auto& cs : st.cookies)
    if (cs.cookie == c) return cs.cpu_ns;
  return 0;
}

} // namespace

TEST_CASE("stats count the run in progress of a cookie that keeps its core", "[stats][accounting]") {
  // One busy fiber per cookie, each alone on a core of its own: neither ever
  // gives its PU up, so nothing closes a segment while they run. PUs 0 and 3
  // are on different real CPUs (synthetic PUs go round-robin over them): two
  // workers sharing one CPU would also lose it to each other inside
  // preempt_point's system calls, which the runtime rightly counts as running.
  Runtime rt(topo("core:2 pu:2"));
  const Cookie cookies[2] = {Cookie::create(), Cookie::create()};
  std::atomic<std::uint64_t> measured[2] = {0, 0};
  std::atomic<bool> stop{false};
  std::vector<JoinHandle<void>> hs;
  for (unsigned i = 0; i < 2; ++i)
    hs.push_back(rt.spawn([&, i] {
      // Wall time between preemption points, as the user's code sees it:
      // stretches of 20 us of work, each added when it ends.
      while (!stop.load(std::memory_order_relaxed)) {
        const auto since = Clock::now();
        while (ns_since(since) < 20'000) {
        }
        measured[i].fetch_add(ns_since(since), std::memory_order_relaxed);
        this_fiber::preempt_point();
      }
    }, SpawnOptions{.cookie = cookies[i], .pin_to_pu = 3 * i}));
  // Up to three windows: one in which the host kept a worker off its CPU for
  // long between a stamp and the snapshot reads apart without a fault.
  bool close = false;
  for (int window = 0; window < 3 && !close; ++window) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const std::uint64_t before[2] = {measured[0].load(), measured[1].load()};
    const Stats st = rt.stats();
    const std::uint64_t after[2] = {measured[0].load(), measured[1].load()};
    close = true;
    for (int i = 0; i < 2; ++i) {
      const double got = static_cast<double>(cpu_of(st, cookies[i]));
      const double lo = static_cast<double>(before[i]), hi = static_cast<double>(after[i]);
      INFO("window " << window << " cookie " << i << ": stats " << got / 1e6 << " ms, measured " << lo / 1e6 << ".."
                     << hi / 1e6 << " ms");
      CHECK(got > 0);
      close = close && got >= 0.95 * lo && got <= 1.05 * hi + 1e6;
    }
  }
  stop.store(true);
  for (auto& h : hs) h.join();
  CHECK(close);
}

TEST_CASE("stats count a forced idle in progress", "[stats][accounting]") {
  // Cookie a's fiber runs 400 ms without a preemption point on one sibling;
  // cookie b's fiber waits on the core, so the other sibling stays forced idle
  // throughout, a span that ends only when a stops.
  Options o = topo("core:1 pu:2");
  o.stall_threshold = std::chrono::milliseconds(0);
  Runtime rt(o);
  const Cookie a = Cookie::create(), b = Cookie::create();
  std::atomic<bool> a_runs{false}, b_ran{false};
  auto ha = rt.spawn([&] {
    a_runs.store(true);
    const auto until = Clock::now() + std::chrono::milliseconds(400);
    while (Clock::now() < until) {
    }
  }, SpawnOptions{.cookie = a, .pin_to_pu = 0});
  while (!a_runs.load()) std::this_thread::yield();
  auto hb = rt.spawn([&] { b_ran.store(true); }, SpawnOptions{.cookie = b, .pin_to_pu = 1});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const Stats st = rt.stats();
  const bool still_waiting = !b_ran.load();
  ha.join();
  hb.join();
  REQUIRE(still_waiting); // else a stopped early: nothing to check
  std::uint64_t suffered = 0, caused = 0;
  for (const auto& cs : st.cookies) {
    if (cs.cookie == b) suffered = cs.forced_idle_suffered_ns;
    if (cs.cookie == a) caused = cs.forced_idle_caused_ns;
  }
  INFO("b suffered " << suffered / 1000000 << " ms, a caused " << caused / 1000000 << " ms, 200 ms after b arrived");
  CHECK(suffered > 100'000'000);
  CHECK(caused == suffered);
}
