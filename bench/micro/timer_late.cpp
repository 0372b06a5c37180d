// SPDX-License-Identifier: Apache-2.0
// coresched-timer-late-bench: how late a fiber's sleep ends when its worker is
// busy with another fiber. A sleeper sleeps to a due time again and again,
// and notes how long after the due time it runs again; beside it, CPU-bound
// fibers reach a preemption point every few microseconds and never switch.
//
// Two layouts:
// - `same`: one PU (`core:1 pu:1`), the runner and the sleeper of one cookie.
//   The completion waits in the ring of the worker running the runner.
// - `tagged`: one core of two PUs (`core:1 pu:2`), a runner of cookie A on
//   each, the sleeper of cookie B: its wake-up must also take the core from A.
//
// What ends the wait is the runner's next preemption point, which reads the
// ring's IORING_SQ_TASKRUN flag (this_fiber::preempt_point), not the slice
// ticker's next tick (a quarter slice).
#include "json_rounds.hpp"

#include <coresched/coresched.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;
using namespace coresched;

struct Figures {
  double avg_us = 0, p50_us = 0, p99_us = 0, max_us = 0;
};

Figures measure(const std::string& layout, unsigned slice_us, unsigned sleep_us, unsigned sleeps) {
  Options o;
  o.topology = layout == "same" ? "core:1 pu:1" : "core:1 pu:2";
  o.slice = std::chrono::microseconds(slice_us);
  Runtime rt(o);
  const Cookie a = Cookie::create();
  const Cookie b = layout == "same" ? a : Cookie::create();
  std::atomic<bool> stop{false};
  std::vector<JoinHandle<void>> runners;
  for (unsigned pu = 0; pu < rt.topology().pus().size(); ++pu)
    runners.push_back(rt.spawn([&stop] {
      while (!stop.load(std::memory_order_relaxed)) {
        std::uint64_t x = 1;
        for (int i = 0; i < 500; ++i) x = x * 6364136223846793005ull + 1;
        asm volatile("" : : "r"(x));
        this_fiber::preempt_point();
      }
    }, SpawnOptions{.cookie = a, .pin_to_pu = pu}));
  auto sleeper = rt.spawn([&] {
    std::vector<double> late;
    late.reserve(sleeps);
    for (unsigned i = 0; i < sleeps; ++i) {
      const auto due = Clock::now() + std::chrono::microseconds(sleep_us);
      this_fiber::sleep_until(due);
      late.push_back(std::chrono::duration<double, std::micro>(Clock::now() - due).count());
    }
    stop = true;
    return late;
  }, SpawnOptions{.cookie = b, .pin_to_pu = 0});
  std::vector<double> late = sleeper.join();
  for (auto& r : runners) r.join();
  std::sort(late.begin(), late.end());
  Figures f;
  for (double v : late) f.avg_us += v / static_cast<double>(late.size());
  f.p50_us = late[late.size() / 2];
  f.p99_us = late[std::min(late.size() - 1, late.size() * 99 / 100)];
  f.max_us = late.back();
  return f;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched-timer-late-bench: how late a fiber's sleep ends beside fibers that never switch"};
  unsigned slice_us = 1000, sleep_us = 1000, sleeps = 200, rounds = 3;
  std::vector<std::string> layouts{"same", "tagged"};
  std::string json_path;
  app.add_option("--slice-us", slice_us, "the runtime's slice (Options::slice), microseconds")
      ->check(CLI::Range(100u, 1000000u));
  app.add_option("--sleep-us", sleep_us, "each sleep, microseconds")->check(CLI::Range(1u, 1000000u));
  app.add_option("--sleeps", sleeps, "sleeps per round")->check(CLI::Range(1u, 1000000u));
  app.add_option("--rounds", rounds, "rounds per layout (alternated)")->check(CLI::Range(1u, 1000u));
  app.add_option("--layout", layouts, "same (one PU, one cookie) and/or tagged (two siblings, two cookies)")
      ->check(CLI::IsMember({"same", "tagged"}));
  app.add_option("--json", json_path, "also write every round's figures as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  JsonRounds json(json_path, "coresched-timer-late-bench");
  if (!json.ok()) return 1;
  std::printf("# sleeps of %u us beside fibers that never switch, slice %u us; lateness past the due time\n", sleep_us,
              slice_us);
  std::printf("%-7s %5s %10s %10s %10s %10s\n", "layout", "round", "avg us", "p50 us", "p99 us", "max us");
  json.parameters("\"slice_us\": %u, \"sleep_us\": %u, \"sleeps\": %u", slice_us, sleep_us, sleeps);
  try {
    for (unsigned r = 0; r < rounds; ++r)
      for (const auto& layout : layouts) {
        const Figures f = measure(layout, slice_us, sleep_us, sleeps);
        std::printf("%-7s %5u %10.1f %10.1f %10.1f %10.1f\n", layout.c_str(), r + 1, f.avg_us, f.p50_us, f.p99_us,
                    f.max_us);
        std::fflush(stdout);
        json.round("\"layout\": \"%s\", \"round\": %u, \"avg_us\": %.2f, \"p50_us\": %.2f, \"p99_us\": %.2f, "
                   "\"max_us\": %.2f",
                   layout.c_str(), r + 1, f.avg_us, f.p50_us, f.p99_us, f.max_us);
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-timer-late-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
