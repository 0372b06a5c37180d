// SPDX-License-Identifier: Apache-2.0
// coresched-core-bench: the cost of core scheduling itself.
//  * pick: one requeue+pick on a two-PU core, all untagged vs two cookies.
//  * handover: wake-to-run latency of a fiber whose sibling PU runs a busy
//    fiber of the same cookie vs another cookie (the difference is the cookie
//    hand-over: request, sibling stops at its preemption point, new cookie runs).
//  * gap: two busy cookies pinned to the two PUs of a core, so the core changes
//    cookie every slice while the one it leaves still has work; the runtime's
//    hand-over gap (CoreStats: change of cookie -> first fiber of the new one).
#include "core/core_coordinator.hpp"

#include <coresched/coresched.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <thread>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;
using namespace coresched;
using namespace coresched::detail;

double pick_ns(bool two_cookies, long n) {
  CoreCoordinator core(0, {0, 1}, CoreConfig{});
  std::vector<Fiber> f(4);
  WakeList w;
  for (std::size_t i = 0; i < f.size(); ++i) f[i].cookie = two_cookies ? i % 2 + 1 : 0;
  core.lock().lock();
  (void)core.enqueue_locked(1, &f[3], w);
  (void)core.pick_locked(1, w); // sibling 1 runs a fiber, as on a busy core
  for (std::size_t i = 0; i < 3; ++i) core.requeue_locked(0, &f[i]);
  Fiber* running = core.pick_locked(0, w).fiber;
  core.lock().unlock();
  const auto t0 = Clock::now();
  for (long i = 0; i < n; ++i) {
    core.lock().lock();
    if (running) core.requeue_locked(0, running);
    running = core.pick_locked(0, w).fiber;
    core.lock().unlock();
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(n);
}

struct Percentiles {
  double p50, p99, max;
};

Percentiles percentiles(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))]; };
  return {at(0.5), at(0.99), v.back()};
}

// A busy fiber on PU 0 (preemption point every ~2 us) and a sleeper on PU 1
// that records how late it runs after its deadline.
Percentiles handover_us(const std::string& topology, bool other_cookie, int samples) {
  Options o;
  o.topology = topology;
  Runtime rt(o);
  const auto& pus = rt.topology().cores()[0].pus;
  if (pus.size() < 2) throw std::runtime_error("handover needs a core with two PUs; use a synthetic topology");
  const Cookie busy_cookie = Cookie::create();
  const Cookie sleeper_cookie = other_cookie ? Cookie::create() : busy_cookie;
  std::atomic<bool> stop{false};
  auto busy = rt.spawn([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const auto until = Clock::now() + std::chrono::microseconds(2);
      while (Clock::now() < until) {
      }
      this_fiber::preempt_point();
    }
  }, SpawnOptions{.cookie = busy_cookie, .pin_to_pu = pus[0]});
  auto sleeper = rt.spawn([&] {
    std::vector<double> lat;
    for (int i = 0; i < samples; ++i) {
      const auto deadline = Clock::now() + std::chrono::microseconds(2000 + (i * 137) % 1000);
      this_fiber::sleep_until(deadline);
      lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - deadline).count());
    }
    stop = true;
    return lat;
  }, SpawnOptions{.cookie = sleeper_cookie, .pin_to_pu = pus[1]});
  auto lat = sleeper.join();
  busy.join();
  return percentiles(lat);
}
// Two busy cookies, one pinned to each PU of core 0, for `ms`: the core's
// hand-over count and gap percentiles, and the CPU time the process used per
// second of wall time (the forced-idle sibling's spin shows there).
struct Gaps {
  CoreStats core;
  double cpu_per_wall;
};

Gaps handover_gaps(const std::string& topology, int ms) {
  Options o;
  o.topology = topology;
  Runtime rt(o);
  const auto& pus = rt.topology().cores()[0].pus;
  if (pus.size() < 2) throw std::runtime_error("gap needs a core with two PUs; use a synthetic topology");
  std::atomic<bool> stop{false};
  std::vector<JoinHandle<void>> fibers;
  for (unsigned i = 0; i < 2; ++i)
    fibers.push_back(rt.spawn([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        const auto until = Clock::now() + std::chrono::microseconds(2);
        while (Clock::now() < until) {
        }
        this_fiber::preempt_point();
      }
    }, SpawnOptions{.cookie = Cookie::create(), .pin_to_pu = pus[i]}));
  const auto cpu0 = std::clock();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  stop = true;
  for (auto& f : fibers) f.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC;
  return {rt.stats().cores[0], cpu / wall};
}
} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched-core-bench: cost of the core-wide pick and of a cookie hand-over"};
  long n = 2'000'000;
  int samples = 500;
  std::string topology = "core:1 pu:2";
  app.add_option("-n,--iterations", n, "picks to time")->check(CLI::PositiveNumber);
  app.add_option("-s,--samples", samples, "wake-ups per hand-over measurement")->check(CLI::PositiveNumber);
  app.add_option("--topology", topology, "topology for the hand-over runs (needs a 2-PU core)");
  int gap_ms = 2000;
  app.add_option("--gap-ms", gap_ms, "length of the hand-over gap run, ms")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    std::printf("pick (requeue + core-wide pick on a 2-PU core, lock included)\n");
    const double untagged = pick_ns(false, n), tagged = pick_ns(true, n);
    std::printf("  all untagged: %8.1f ns\n  two cookies:  %8.1f ns  (ratio %.2f)\n\n", untagged, tagged,
                tagged / untagged);
    std::fprintf(stderr, "[core-bench] hand-over, same cookie...\n");
    const auto same = handover_us(topology, false, samples);
    std::fprintf(stderr, "[core-bench] hand-over, other cookie...\n");
    const auto other = handover_us(topology, true, samples);
    std::printf("wake-to-run latency of a sleeper whose sibling PU is busy (%d samples, us; topology \"%s\")\n",
                samples, topology.c_str());
    std::printf("  %-28s %8s %8s %8s\n", "sibling runs", "p50", "p99", "max");
    std::printf("  %-28s %8.1f %8.1f %8.1f\n", "same cookie (no hand-over)", same.p50, same.p99, same.max);
    std::printf("  %-28s %8.1f %8.1f %8.1f\n", "other cookie (hand-over)", other.p50, other.p99, other.max);
    std::printf("  hand-over cost p50: %.1f us\n\n", other.p50 - same.p50);
    std::fprintf(stderr, "[core-bench] hand-over gap, two busy cookies...\n");
    const Gaps g = handover_gaps(topology, gap_ms);
    std::printf("hand-over gap: two busy cookies pinned to the two PUs, %d ms (change of cookie -> the new one runs)\n",
                gap_ms);
    std::printf("  hand-overs %llu; gap p50 %.1f us, p99 %.1f us, max %.1f us; forced idle %.1f %% of 2 PUs; "
                "process CPU %.2f per wall second\n",
                static_cast<unsigned long long>(g.core.handovers), static_cast<double>(g.core.handover_gap_p50_ns) / 1e3,
                static_cast<double>(g.core.handover_gap_p99_ns) / 1e3, static_cast<double>(g.core.handover_gap_max_ns) / 1e3,
                static_cast<double>(g.core.forced_idle_ns) / (gap_ms * 1e6 * 2) * 100, g.cpu_per_wall);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-core-bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
