// SPDX-License-Identifier: Apache-2.0
// coresched-handover-bench: what cookies that wake often cost a busy one.
//
// One core of two PUs (`core:1 pu:2`, or --topology). Cookie A runs one
// CPU-bound fiber pinned to each PU, with a preemption point every few
// hundred ns. Beside it, N other cookies each run one fiber that sleeps S µs
// (uniform in a range), then burns B µs of wall time, again and again. Every
// wake-up of one of them can take the core from A: two hand-overs (there and
// back), each a forced-idle sibling's wake-up, tens of µs on a VM.
//
// Reported per round: A's work per second over its work per second alone
// (the same runtime, the sleepers not started), the share of the core A
// owned, the sleepers' CPU time and the time PUs spent forced idle (shares of
// the PUs' time), changes of cookie a second, and how late the sleepers'
// wake-ups ran (p50, p99). --same-cookie is the control: the sleepers run
// under A's cookie, so nothing is handed over and no PU is forced idle, and
// A's share is what their wake-ups themselves cost it on this machine.
// Three sleepers waking every 20-40 µs are the case to watch: once a
// wake-up is seen at once, they can take A's share from 0.81 to 0.33-0.40.
#include "json_rounds.hpp"

#include <coresched/coresched.hpp>

#include "../cli_finite.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <ctime>
#include <pthread.h>
#include <sched.h>
#include <string>
#include <sys/prctl.h>
#include <thread>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;
using namespace coresched;

struct Params {
  std::string topology = "core:1 pu:2";
  unsigned slice_us = 1000;
  unsigned sleepers = 3;
  unsigned sleep_min_us = 20, sleep_max_us = 40;
  unsigned burst_min_us = 1, burst_max_us = 3;
  double seconds = 1.0;
  bool same_cookie = false; // the control: the sleepers run under A's cookie (no hand-over at all)
  bool threads = false;     // the same on kernel threads, as the control (this kernel has no core scheduling)
};

struct Figures {
  double share = 0;          // A's work beside the sleepers over its work alone
  double sleepers_cpu = 0;   // the sleepers' CPU time over the core's (PUs x wall)
  double a_owned = 0;        // the share of the core's time A owned it
  double forced_idle = 0;    // the share of the PUs' time spent forced idle
  double changes_per_s = 0;  // changes of the core's cookie a second
  double late_p50_us = 0, late_p99_us = 0;
};

std::uint64_t spin_units(const std::atomic<bool>& stop) {
  std::uint64_t units = 0;
  std::uint64_t x = 1;
  while (!stop.load(std::memory_order_relaxed)) {
    for (int i = 0; i < 200; ++i) x = x * 6364136223846793005ull + 1;
    asm volatile("" : : "r"(x));
    ++units;
    this_fiber::preempt_point();
  }
  return units;
}

// What one measurement saw (deltas of Runtime::stats over it).
struct Run {
  std::uint64_t units = 0;          // A's work
  std::uint64_t sleepers_cpu_ns = 0;
  std::uint64_t a_core_ns = 0;      // time A owned the core
  std::uint64_t forced_idle_ns = 0; // sibling time forced idle
  std::uint64_t changes = 0;        // changes of the core's cookie
  double wall_s = 0;
  std::vector<double> late;         // the sleepers' wake-ups past their due time, µs
};

std::uint64_t cookie_field(const Stats& s, const Cookie& c, std::uint64_t CookieStats::*field) {
  for (const auto& cs : s.cookies)
    if (cs.cookie == c) return cs.*field;
  return 0;
}

template <class F> std::uint64_t core_sum(const Stats& s, F f) {
  std::uint64_t n = 0;
  for (const auto& c : s.cores) n += f(c);
  return n;
}

// A busy on every PU for `seconds`, with `sleepers` other cookies beside it (0: alone).
Run run_a(Runtime& rt, const Cookie& a, const Params& p, unsigned sleepers) {
  std::atomic<bool> stop{false};
  const Stats before = rt.stats();
  const auto t0 = Clock::now();
  std::vector<JoinHandle<std::uint64_t>> owners;
  for (unsigned pu = 0; pu < rt.topology().pus().size(); ++pu)
    owners.push_back(rt.spawn([&stop] { return spin_units(stop); }, SpawnOptions{.cookie = a, .pin_to_pu = pu}));
  std::vector<Cookie> cookies;
  std::vector<JoinHandle<std::vector<double>>> others;
  for (unsigned i = 0; i < sleepers; ++i) {
    cookies.push_back(p.same_cookie ? a : Cookie::create());
    others.push_back(rt.spawn([&stop, &p, i] {
      std::mt19937_64 rng(1234 + i);
      std::uniform_int_distribution<unsigned> sleep(p.sleep_min_us, p.sleep_max_us);
      std::uniform_int_distribution<unsigned> burst(p.burst_min_us, p.burst_max_us);
      std::vector<double> l;
      while (!stop.load(std::memory_order_relaxed)) {
        const auto due = Clock::now() + std::chrono::microseconds(sleep(rng));
        this_fiber::sleep_until(due);
        const auto woke = Clock::now();
        l.push_back(std::chrono::duration<double, std::micro>(woke - due).count());
        const auto end = woke + std::chrono::microseconds(burst(rng));
        while (Clock::now() < end) this_fiber::preempt_point();
      }
      return l;
    }, SpawnOptions{.cookie = cookies.back()}));
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(p.seconds));
  stop = true;
  Run r;
  for (auto& o : owners) r.units += o.join();
  for (auto& o : others) {
    auto l = o.join();
    r.late.insert(r.late.end(), l.begin(), l.end());
  }
  r.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const Stats after = rt.stats();
  for (const auto& c : cookies)
    if (c != a) // under the control, not told apart from A's
      r.sleepers_cpu_ns += cookie_field(after, c, &CookieStats::cpu_ns) - cookie_field(before, c, &CookieStats::cpu_ns);
  r.a_core_ns = cookie_field(after, a, &CookieStats::core_ns) - cookie_field(before, a, &CookieStats::core_ns);
  auto fi = [](const CoreStats& c) { return c.forced_idle_ns; };
  auto ch = [](const CoreStats& c) { return c.cookie_switches; };
  r.forced_idle_ns = core_sum(after, fi) - core_sum(before, fi);
  r.changes = core_sum(after, ch) - core_sum(before, ch);
  return r;
}

Figures measure(const Params& p) {
  Options o;
  o.topology = p.topology;
  o.slice = std::chrono::microseconds(p.slice_us);
  Runtime rt(o);
  const Cookie a = Cookie::create();
  const Run alone = run_a(rt, a, p, 0);
  Run beside = run_a(rt, a, p, p.sleepers);
  const double pus = static_cast<double>(rt.topology().pus().size());
  const double cores = static_cast<double>(rt.topology().cores().size());
  Figures f;
  // Work per second, so that the two spans' lengths (joins included) do not matter.
  f.share = alone.units ? (static_cast<double>(beside.units) / beside.wall_s) /
                              (static_cast<double>(alone.units) / alone.wall_s)
                        : 0;
  f.sleepers_cpu = static_cast<double>(beside.sleepers_cpu_ns) / 1e9 / (beside.wall_s * pus);
  f.a_owned = static_cast<double>(beside.a_core_ns) / 1e9 / (beside.wall_s * cores);
  f.forced_idle = static_cast<double>(beside.forced_idle_ns) / 1e9 / (beside.wall_s * pus);
  f.changes_per_s = static_cast<double>(beside.changes) / beside.wall_s;
  auto& late = beside.late;
  std::sort(late.begin(), late.end());
  if (!late.empty()) {
    f.late_p50_us = late[late.size() / 2];
    f.late_p99_us = late[std::min(late.size() - 1, late.size() * 99 / 100)];
  }
  return f;
}

// The same on kernel threads: A's two threads pinned to CPUs 0 and 1 (the CPUs
// the runtime's two PUs run on here), the sleepers unpinned, each sleeping to
// an absolute due time with a timer slack of 1 ns (the default 50 µs would
// make them later than the fibers' io_uring timers, which have none). With no
// core scheduling in this kernel it compares with --same-cookie.
Figures measure_threads(const Params& p) {
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  auto run = [&](unsigned sleepers, std::vector<double>& late, std::uint64_t& sleepers_cpu_ns) {
    std::atomic<bool> stop{false};
    std::vector<std::uint64_t> units(2, 0);
    std::vector<std::thread> ts;
    const auto t0 = Clock::now();
    for (unsigned k = 0; k < 2; ++k)
      ts.emplace_back([&, k] {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(k % cpus, &set);
        pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
        units[k] = spin_units(stop);
      });
    std::vector<std::vector<double>> lates(sleepers);
    std::vector<std::uint64_t> cpu(sleepers, 0);
    for (unsigned i = 0; i < sleepers; ++i)
      ts.emplace_back([&, i] {
        prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
        std::mt19937_64 rng(1234 + i);
        std::uniform_int_distribution<unsigned> sleep(p.sleep_min_us, p.sleep_max_us);
        std::uniform_int_distribution<unsigned> burst(p.burst_min_us, p.burst_max_us);
        while (!stop.load(std::memory_order_relaxed)) {
          const auto due = Clock::now() + std::chrono::microseconds(sleep(rng));
          std::this_thread::sleep_until(due);
          const auto woke = Clock::now();
          lates[i].push_back(std::chrono::duration<double, std::micro>(woke - due).count());
          const auto end = woke + std::chrono::microseconds(burst(rng));
          while (Clock::now() < end) {}
        }
        timespec ts_cpu{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts_cpu);
        cpu[i] = static_cast<std::uint64_t>(ts_cpu.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts_cpu.tv_nsec);
      });
    std::this_thread::sleep_for(std::chrono::duration<double>(p.seconds));
    stop = true;
    for (auto& t : ts) t.join();
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    for (auto& l : lates) late.insert(late.end(), l.begin(), l.end());
    for (auto c : cpu) sleepers_cpu_ns += c;
    return static_cast<double>(units[0] + units[1]) / wall;
  };
  std::vector<double> none, late;
  std::uint64_t none_cpu = 0, sleepers_cpu = 0;
  const double alone = run(0, none, none_cpu);
  const auto t1 = Clock::now();
  const double beside = run(p.sleepers, late, sleepers_cpu);
  const double wall = std::chrono::duration<double>(Clock::now() - t1).count();
  Figures f;
  f.share = alone > 0 ? beside / alone : 0;
  f.sleepers_cpu = static_cast<double>(sleepers_cpu) / 1e9 / (wall * 2);
  f.a_owned = 1;
  std::sort(late.begin(), late.end());
  if (!late.empty()) {
    f.late_p50_us = late[late.size() / 2];
    f.late_p99_us = late[std::min(late.size() - 1, late.size() * 99 / 100)];
  }
  return f;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched-handover-bench: a busy cookie beside cookies that wake often (A's share of its work alone)"};
  Params p;
  unsigned rounds = 3;
  std::string json_path;
  app.add_option("--topology", p.topology, "runtime topology (Options::topology)");
  app.add_option("--slice-us", p.slice_us, "the runtime's slice, microseconds")->check(CLI::Range(100u, 1000000u));
  app.add_option("--sleepers", p.sleepers, "cookies that sleep and burn beside A")->check(CLI::Range(1u, 64u));
  app.add_option("--sleep-min-us", p.sleep_min_us, "shortest sleep")->check(CLI::Range(1u, 1000000u));
  app.add_option("--sleep-max-us", p.sleep_max_us, "longest sleep")->check(CLI::Range(1u, 1000000u));
  app.add_option("--burst-min-us", p.burst_min_us, "shortest burst")->check(CLI::Range(1u, 1000000u));
  app.add_option("--burst-max-us", p.burst_max_us, "longest burst")->check(CLI::Range(1u, 1000000u));
  app.add_option("--time", p.seconds, "seconds per measurement (alone, then beside)")->check(coresched::bench::finite_range(0.05, 600.0));
  app.add_option("--rounds", rounds, "rounds")->check(CLI::Range(1u, 1000u));
  app.add_flag("--same-cookie", p.same_cookie,
               "the control: the sleepers run under A's cookie, so nothing is handed over (what their timers and "
               "switches cost alone)");
  app.add_flag("--threads", p.threads,
               "the same on kernel threads (A's two pinned to CPUs 0 and 1), to compare with --same-cookie: this "
               "kernel has no core scheduling");
  app.add_option("--json", json_path, "also write every round's figures as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  if (p.sleep_min_us > p.sleep_max_us || p.burst_min_us > p.burst_max_us) {
    std::fprintf(stderr, "coresched-handover-bench: a range's minimum is above its maximum\n");
    return 2;
  }
  JsonRounds json(json_path, "coresched-handover-bench");
  if (!json.ok()) return 1;
  if (p.threads)
    std::printf("# kernel threads: A busy on CPUs 0 and 1; %u threads sleep %u-%u us, burn %u-%u us\n", p.sleepers,
                p.sleep_min_us, p.sleep_max_us, p.burst_min_us, p.burst_max_us);
  else
    std::printf("# %s, slice %u us: A busy on every PU; %u %s sleep %u-%u us, burn %u-%u us\n", p.topology.c_str(),
                p.slice_us, p.sleepers, p.same_cookie ? "fibers of A's cookie" : "cookies", p.sleep_min_us,
                p.sleep_max_us, p.burst_min_us, p.burst_max_us);
  std::printf("%5s %8s %8s %12s %11s %10s %10s %10s\n", "round", "A share", "A owned", "sleepers cpu", "forced idle",
              "changes/s", "late p50", "late p99");
  json.parameters("\"topology\": \"%s\", \"slice_us\": %u, \"sleepers\": %u, \"sleep_us\": [%u, %u], "
                  "\"burst_us\": [%u, %u], \"same_cookie\": %s, \"threads\": %s",
                  p.topology.c_str(), p.slice_us, p.sleepers, p.sleep_min_us, p.sleep_max_us, p.burst_min_us,
                  p.burst_max_us, p.same_cookie ? "true" : "false", p.threads ? "true" : "false");
  try {
    for (unsigned r = 0; r < rounds; ++r) {
      const Figures f = p.threads ? measure_threads(p) : measure(p);
      std::printf("%5u %8.3f %8.3f %12.3f %11.3f %10.0f %8.1fus %8.1fus\n", r + 1, f.share, f.a_owned, f.sleepers_cpu,
                  f.forced_idle, f.changes_per_s, f.late_p50_us, f.late_p99_us);
      std::fflush(stdout);
      json.round("\"round\": %u, \"a_share\": %.4f, \"a_owned\": %.4f, \"sleepers_cpu\": %.4f, "
                 "\"forced_idle\": %.4f, \"changes_per_s\": %.0f, \"late_p50_us\": %.2f, \"late_p99_us\": %.2f",
                 r + 1, f.share, f.a_owned, f.sleepers_cpu, f.forced_idle, f.changes_per_s, f.late_p50_us,
                 f.late_p99_us);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-handover-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
