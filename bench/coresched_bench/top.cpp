// SPDX-License-Identifier: Apache-2.0
// `coresched-bench top`: the live view (live_view.hpp) over a workload of
// several tenants, so a person can watch cores change hands: `--cookies`
// compute tenants whose fibers spin with preemption points, and optionally a
// request tenant whose fibers sleep and wake. An application shows the same
// view of its own runtime with a LiveView (bench/coresched_bench/live_view.hpp).
#include "cli_options.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "live_view.hpp"

#include <coresched/coresched.hpp>
#include <fmt/format.h>

#include <atomic>
#include <vector>

namespace coresched::bench::top {
namespace {

struct Settings {
  unsigned cookies = 2;
  unsigned fibers = 0; ///< per compute tenant; 0: one per PU
  unsigned request_fibers = 0;
  double time_s = 10;
  unsigned interval_ms = 1000;
  bool json = false;
  std::optional<FairnessPolicy> policy;
  std::optional<unsigned> slice_us;
  std::string topology;
};

void add_options(CLI::App& sub, Settings& s) {
  sub.add_option("--cookies", s.cookies, "Compute tenants, each under its own cookie")
      ->capture_default_str()->check(CLI::Range(1u, 64u));
  sub.add_option("--fibers", s.fibers, "Fibers per compute tenant (default: one per PU)")->check(CLI::Range(1u, 100000u));
  sub.add_option("--request-fibers", s.request_fibers,
                 "Fibers of one more tenant that sleep 1 ms and compute ~50 us per request (default: none)")
      ->check(CLI::Range(0u, 100000u));
  sub.add_option("--time", s.time_s, "Seconds to run")->capture_default_str()->check(positive_seconds());
  sub.add_option("--interval", s.interval_ms, "Milliseconds between frames")
      ->capture_default_str()->check(CLI::Range(10u, 3'600'000u));
  sub.add_flag("--json", s.json, "One JSON object per frame on stdout instead of the table");
  add_policy_option(sub, s.policy);
  add_slice_option(sub, s.slice_us);
  add_topology_option(sub, s.topology, true);
}

// Spins for about `ns`, reaching a preemption point every few microseconds.
void compute(std::chrono::nanoseconds ns) {
  const auto end = std::chrono::steady_clock::now() + ns;
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 2000; ++i) asm volatile("" ::: "memory");
    this_fiber::preempt_point();
  }
}

int run(const Settings& s) {
  Runtime rt(runtime_options(smt_topology("top", s.topology), s.policy, std::nullopt, s.slice_us));
  const unsigned pus = static_cast<unsigned>(rt.topology().pus().size());
  const unsigned per = s.fibers ? s.fibers : pus;
  if (!s.json)
    print_header("top", rt,
                 {{"compute tenants", std::to_string(s.cookies)},
                  {"fibers per tenant", std::to_string(per)},
                  {"request fibers", std::to_string(s.request_fibers)},
                  {"interval ms", std::to_string(s.interval_ms)}});
  std::atomic<bool> stop{false};
  std::vector<JoinHandle<void>> hs;
  for (unsigned c = 0; c < s.cookies; ++c) {
    const Cookie cookie = Cookie::create(fmt::format("tenant-{}", c + 1));
    for (unsigned i = 0; i < per; ++i)
      hs.push_back(rt.spawn([&] { while (!stop.load(std::memory_order_relaxed)) compute(std::chrono::microseconds(200)); },
                            SpawnOptions{.cookie = cookie}));
  }
  if (s.request_fibers) {
    const Cookie cookie = Cookie::create("requests");
    for (unsigned i = 0; i < s.request_fibers; ++i)
      hs.push_back(rt.spawn([&] {
        while (!stop.load(std::memory_order_relaxed)) {
          this_fiber::sleep_for(std::chrono::milliseconds(1));
          compute(std::chrono::microseconds(50));
        }
      }, SpawnOptions{.cookie = cookie}));
  }
  const auto length = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(s.time_s));
  const auto start = std::chrono::steady_clock::now();
  {
    // A frame per interval and a last one at --time; an interrupt ends the view early, with a frame up to it.
    LiveView view(rt, stdout, std::chrono::milliseconds(s.interval_ms), s.json, length);
    while (!view.wait_done(std::chrono::milliseconds(50)))
      if (interrupted()) view.finish();
  }
  // With --json, stdout holds only frames: the note goes to stderr.
  print_interrupted({seconds(std::chrono::steady_clock::now() - start), s.time_s, "s"}, s.json ? stderr : stdout);
  stop = true;
  hs.clear();
  return 0;
}

} // namespace
} // namespace coresched::bench::top

namespace coresched::bench {
Command register_top(CLI::App& parent) {
  return make_command<top::Settings>(
      parent, "top",
      "A live view of a running workload, once per interval and at the end of --time (a table, or JSON lines): per "
      "core its owner cookie, forced-idle share, queued fibers per cookie and hand-overs per second; per cookie "
      "(number and name: tenant-1, tenant-2, ..., requests) its weight, cpu % (the PU time its fibers ran / (elapsed "
      "x PUs)) and core % (the time it held an SMT core / (elapsed x SMT cores)). Two busy tenants each alone on a "
      "core read 50/50 in both; where they share a core, core % splits its time and cpu % is lower by gaps and forced "
      "idle",
      top::add_options, top::run);
}
} // namespace coresched::bench
