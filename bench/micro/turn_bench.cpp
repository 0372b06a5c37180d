// SPDX-License-Identifier: Apache-2.0
// coresched-turn-bench: how long equal CPU-bound fibers of one cookie keep a
// PU before the next one runs, beside the same number of kernel threads on one
// CPU, in one run. The oracle is in the workers' own code: each notes when the
// one running changes, so a "turn" is what actually ran, whatever the
// scheduler believes. It also reports each run's fairness (the least and the
// most work one of the N did, over the mean).
//
// Fibers: a one-worker runtime (`core:1 pu:1`, mapped onto CPU 0), N fibers
// doing a few microseconds of arithmetic between preemption points. Threads:
// N threads pinned to CPU 0 doing the same arithmetic without them.
#include <coresched/coresched.hpp>

#include "../cli_finite.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <exception>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <pthread.h>
#include <sched.h>
#include <string>
#include <thread>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;

/// What the N running things share: who ran last, since when, the turns seen.
/// Only the one running writes it (one CPU, so one at a time); a change of
/// hands is noticed by the newcomer at its next unit of work.
struct Oracle {
  std::atomic<int> last{-1};
  Clock::time_point since{};
  std::vector<double> turns_us;
  std::vector<unsigned long> units;

  explicit Oracle(unsigned n) : units(n) { turns_us.reserve(1 << 16); }

  /// One unit of work (~5 us here) by runner `i`; `stop` ends the loop.
  void run(unsigned i, const std::atomic<bool>& stop, void (*point)()) {
    std::uint64_t x = 1;
    unsigned long n = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      for (int k = 0; k < 2000; ++k) x = x * 6364136223846793005ull + 1;
      asm volatile("" : : "r"(x));
      ++n;
      if (last.load(std::memory_order_relaxed) != static_cast<int>(i)) {
        const auto now = Clock::now();
        if (last.load(std::memory_order_relaxed) >= 0)
          turns_us.push_back(std::chrono::duration<double, std::micro>(now - since).count());
        since = now;
        last.store(static_cast<int>(i), std::memory_order_relaxed);
      }
      point();
    }
    units[i] = n;
  }
};

struct Result {
  std::vector<double> turns_us; // sorted
  double least = 0, most = 0;   // work of the least and the most served, over the mean
  double pct(double p) const {
    if (turns_us.empty()) return 0;
    return turns_us[std::min(turns_us.size() - 1, static_cast<std::size_t>(p * static_cast<double>(turns_us.size())))];
  }
};

Result finish(Oracle& o) {
  Result r;
  r.turns_us = std::move(o.turns_us);
  if (!r.turns_us.empty()) r.turns_us.erase(r.turns_us.begin()); // the first turn began with the measurement
  std::sort(r.turns_us.begin(), r.turns_us.end());
  double sum = 0;
  for (auto u : o.units) sum += static_cast<double>(u);
  const double mean = sum / static_cast<double>(o.units.size());
  const auto [lo, hi] = std::minmax_element(o.units.begin(), o.units.end());
  r.least = mean > 0 ? static_cast<double>(*lo) / mean : 0;
  r.most = mean > 0 ? static_cast<double>(*hi) / mean : 0;
  return r;
}

Result fibers(unsigned n, double seconds, unsigned slice_us) {
  coresched::Options opt;
  opt.topology = "core:1 pu:1";
  if (slice_us) opt.slice = std::chrono::microseconds(slice_us);
  coresched::Runtime rt(opt);
  Oracle o(n);
  std::atomic<bool> stop{false};
  std::vector<coresched::JoinHandle<void>> hs;
  for (unsigned i = 0; i < n; ++i)
    hs.push_back(rt.spawn([&, i] { o.run(i, stop, [] { coresched::this_fiber::preempt_point(); }); }));
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& h : hs) h.join();
  return finish(o);
}

Result threads(unsigned n, double seconds) {
  Oracle o(n);
  std::atomic<bool> stop{false};
  std::vector<std::thread> ts;
  for (unsigned i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(0, &set);
      pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
      o.run(i, stop, [] {});
    });
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : ts) t.join();
  return finish(o);
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched-turn-bench: how long each of N equal CPU-bound fibers of one cookie keeps a one-worker "
               "runtime's PU before the next runs, beside N kernel threads pinned to one CPU, in one run"};
  std::vector<unsigned> counts{2, 4};
  double seconds = 2;
  int rounds = 2;
  unsigned slice_us = 0;
  std::string json_path;
  app.add_option("--fibers", counts, "how many fibers (and threads) share the PU (repeatable)")->capture_default_str()
      ->check(CLI::Range(2u, 1000u));
  app.add_option("--time", seconds, "seconds per measurement")->capture_default_str()->check(coresched::bench::finite_range(0.2, 3600.0));
  app.add_option("--rounds", rounds, "rounds; each measures fibers then threads for every count")->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--slice-us", slice_us, "the runtime's slice in microseconds (default: Options::slice, 1000)")
      ->check(CLI::Range(100u, 1000000u));
  app.add_option("--json", json_path, "also write every round's figures as JSON to this file");
  CLI11_PARSE(app, argc, argv);

  std::FILE* j = nullptr;
  if (!json_path.empty() && !(j = std::fopen(json_path.c_str(), "w"))) {
    std::fprintf(stderr, "coresched-turn-bench: cannot write %s\n", json_path.c_str());
    return 1;
  }
  if (j) std::fprintf(j, "{\"seconds\": %g, \"slice_us\": %u, \"runs\": [", seconds, slice_us ? slice_us : 1000);
  std::printf("%-8s %6s %5s %8s %8s %8s %8s %10s\n", "who", "count", "round", "turns", "p10 us", "p50 us", "p90 us",
              "work min/max");
  bool first = true;
  for (int r = 0; r < rounds; ++r)
    for (unsigned n : counts)
      for (const bool fib : {true, false}) {
        std::fprintf(stderr, "[turns] round %d/%d, %u %s ...\n", r + 1, rounds, n, fib ? "fibers" : "threads");
        Result res;
        try { // a bad CORESCHED_* setting is a message, not a terminate
          res = fib ? fibers(n, seconds, slice_us) : threads(n, seconds);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "coresched-turn-bench: %s\n", e.what());
          if (j) std::fclose(j);
          return 1;
        }
        std::printf("%-8s %6u %5d %8zu %8.0f %8.0f %8.0f %5.2f/%.2f\n", fib ? "fibers" : "threads", n, r + 1,
                    res.turns_us.size(), res.pct(0.1), res.pct(0.5), res.pct(0.9), res.least, res.most);
        if (j)
          std::fprintf(j, "%s{\"who\": \"%s\", \"count\": %u, \"round\": %d, \"turns\": %zu, \"p10_us\": %.1f, "
                          "\"p50_us\": %.1f, \"p90_us\": %.1f, \"least_work_over_mean\": %.4f, "
                          "\"most_work_over_mean\": %.4f}",
                       first ? "" : ", ", fib ? "fibers" : "threads", n, r + 1, res.turns_us.size(), res.pct(0.1),
                       res.pct(0.5), res.pct(0.9), res.least, res.most);
        first = false;
      }
  if (j) {
    std::fprintf(j, "]}\n");
    std::fclose(j);
  }
  return 0;
}
