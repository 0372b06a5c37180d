// SPDX-License-Identifier: Apache-2.0
// coresched-timer-cost-bench: what a periodic timer wake-up costs CPU-bound
// threads on this machine. One pinned busy thread per CPU counts arithmetic
// rounds while a separate thread sleeps and wakes every PERIOD (as the slice
// ticker does), against the same threads with no timer, the variants
// alternated round by round in one run. The CPU one wake-up costs is the
// rounds lost, in CPU time, over the wake-ups made.
#include "../cli_finite.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <pthread.h>
#include <sched.h>
#include <string>
#include <thread>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;

void pin(unsigned cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

struct Result {
  double rounds_per_s = 0; // summed over the busy threads
  double wakeups_per_s = 0;
};

/// `period_us` 0: no timer thread.
Result measure(unsigned cpus, unsigned period_us, double seconds) {
  std::atomic<bool> stop{false};
  std::vector<unsigned long> rounds(cpus);
  std::vector<std::thread> busy;
  for (unsigned c = 0; c < cpus; ++c)
    busy.emplace_back([&, c] {
      pin(c);
      unsigned long n = 0;
      std::uint64_t x = 1;
      while (!stop.load(std::memory_order_relaxed)) {
        for (int k = 0; k < 1000; ++k) x = x * 6364136223846793005ull + 1;
        asm volatile("" : : "r"(x));
        ++n;
      }
      rounds[c] = n;
    });
  unsigned long wakeups = 0;
  std::thread timer;
  if (period_us > 0)
    timer = std::thread([&] {
      const timespec ts{0, static_cast<long>(period_us) * 1000};
      while (!stop.load(std::memory_order_relaxed)) {
        nanosleep(&ts, nullptr);
        ++wakeups;
      }
    });
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : busy) t.join();
  if (timer.joinable()) timer.join();
  const double el = std::chrono::duration<double>(Clock::now() - t0).count();
  Result r;
  for (auto n : rounds) r.rounds_per_s += static_cast<double>(n) / el;
  r.wakeups_per_s = static_cast<double>(wakeups) / el;
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched-timer-cost-bench: CPU-bound threads, one per CPU, with and without a thread that wakes "
               "every PERIOD (the slice ticker's pattern), alternated round by round"};
  unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  std::vector<unsigned> periods{250, 1000};
  double seconds = 2;
  int rounds = 3;
  std::string json_path;
  app.add_option("--cpus", cpus, "busy threads, pinned to CPUs 0..N-1")->capture_default_str()->check(CLI::Range(1u, 4096u));
  app.add_option("--period-us", periods, "timer periods to measure (repeatable)")->capture_default_str()
      ->check(CLI::Range(10u, 1000000u));
  app.add_option("--time", seconds, "seconds per measurement")->capture_default_str()->check(coresched::bench::finite_range(0.1, 3600.0));
  app.add_option("--rounds", rounds, "rounds; each measures every variant once")->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--json", json_path, "also write the medians as JSON to this file");
  CLI11_PARSE(app, argc, argv);

  std::vector<unsigned> variants{0};
  variants.insert(variants.end(), periods.begin(), periods.end());
  std::vector<std::vector<Result>> res(variants.size());
  for (int r = 0; r < rounds; ++r)
    for (std::size_t v = 0; v < variants.size(); ++v) {
      std::fprintf(stderr, "[timer-cost] round %d/%d, %s ...\n", r + 1, rounds,
                   variants[v] ? ("timer every " + std::to_string(variants[v]) + " us").c_str() : "no timer");
      res[v].push_back(measure(cpus, variants[v], seconds));
    }
  auto med = [&](std::size_t v, double Result::*f) {
    std::vector<double> x;
    for (const auto& r : res[v]) x.push_back(r.*f);
    return median(x);
  };
  const double base = med(0, &Result::rounds_per_s);
  std::printf("%u busy threads, %d rounds of %.1f s, medians\n", cpus, rounds, seconds);
  std::printf("%-22s %16s %10s %14s %22s\n", "variant", "rounds/s", "of none", "wake-ups/s", "CPU per wake-up (us)");
  std::FILE* j = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "w");
  if (!json_path.empty() && !j) {
    std::fprintf(stderr, "coresched-timer-cost-bench: cannot write %s\n", json_path.c_str());
    return 1;
  }
  if (j) std::fprintf(j, "{\"cpus\": %u, \"rounds\": %d, \"seconds\": %g, \"variants\": [", cpus, rounds, seconds);
  for (std::size_t v = 0; v < variants.size(); ++v) {
    const double rps = med(v, &Result::rounds_per_s), wps = med(v, &Result::wakeups_per_s);
    // Rounds lost, as a share of the CPUs, per wake-up.
    const double cost_us = wps > 0 ? (1.0 - rps / base) * cpus / wps * 1e6 : 0;
    const std::string name = variants[v] ? "timer every " + std::to_string(variants[v]) + " us" : "no timer";
    if (wps > 0) std::printf("%-22s %16.0f %10.3f %14.0f %22.1f\n", name.c_str(), rps, rps / base, wps, cost_us);
    else std::printf("%-22s %16.0f %10.3f %14.0f %22s\n", name.c_str(), rps, rps / base, wps, "-");
    if (j)
      std::fprintf(j, "%s{\"period_us\": %u, \"rounds_per_s\": %.0f, \"of_none\": %.4f, \"wakeups_per_s\": %.0f, "
                      "\"cpu_us_per_wakeup\": %.2f}",
                   v ? ", " : "", variants[v], rps, rps / base, wps, cost_us);
  }
  if (j) {
    std::fprintf(j, "]}\n");
    std::fclose(j);
  }
  return 0;
}
