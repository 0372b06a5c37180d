// SPDX-License-Identifier: Apache-2.0
// What every C++ peer program of the peer suite shares: the command line, the
// clock and the output protocol read by peers.py.
//
// A peer program runs ONE workload per invocation: a warm-up at a tenth of
// the size (stack pools, allocator arenas and page tables are then warm for
// every peer alike), then one measured trial. peers.py repeats invocations
// round-robin across peers, so slow drifts of this noisy machine hit every
// peer alike instead of favouring whoever ran first.
//
// Output: one JSON object per line on stdout, per measured figure:
//   {"peer": "...", "workload": "...", "metric": "...", "unit": "...", "value": x}
#pragma once

#include "../cli_finite.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

namespace peers {

using Clock = std::chrono::steady_clock;

/// The size of one trial, and the knobs a workload may read.
struct Params {
  long n = 100'000;     ///< operations (round trips, fibers, leaves, samples)
  double gap_us = 300;  ///< wake: the waker's pause before each wake
};

/// One measured figure of a trial.
struct Figure {
  std::string metric, unit;
  double value;
};

using Workload = std::function<std::vector<Figure>(const Params&)>;

inline double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

inline double ns_per_op(Clock::time_point t0, double ops) { return ns_since(t0) / ops; }

/// Busy-waits (the waker must stay running so the target's idle path is what we time).
inline void spin_for(std::chrono::nanoseconds d) {
  const auto until = Clock::now() + d;
  while (Clock::now() < until) {
  }
}

/// The process's resident memory now, in bytes (/proc/self/statm).
inline long rss_bytes() {
  long pages = 0, resident = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * sysconf(_SC_PAGESIZE);
}

/// p-th percentile (0..100) of `v` (nearest rank); sorts `v`.
inline double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

/// The skynet sum for `leaves` leaves numbered 0..leaves-1.
inline long skynet_expected(long leaves) { return leaves * (leaves - 1) / 2; }

inline void emit(const std::string& peer, const std::string& workload, const Figure& f) {
  std::printf("{\"peer\": \"%s\", \"workload\": \"%s\", \"metric\": \"%s\", \"unit\": \"%s\", \"value\": %.6g}\n",
              peer.c_str(), workload.c_str(), f.metric.c_str(), f.unit.c_str(), f.value);
  std::fflush(stdout);
}

/// Parses `<program> WORKLOAD [-n N] [--gap-us G] [--no-warmup]`, runs the
/// warm-up and the measured trial, prints the figures. Returns the exit code.
inline int run_main(int argc, char** argv, const std::string& peer, const std::map<std::string, Workload>& workloads) {
  CLI::App app{"peer-suite program for " + peer + ": runs one workload, prints JSON lines (see peers.py)"};
  std::string workload;
  Params p;
  bool no_warmup = false;
  std::vector<std::string> names;
  for (const auto& [name, fn] : workloads) names.push_back(name);
  app.add_option("workload", workload, "the workload")->required()->check(CLI::IsMember(names));
  app.add_option("-n", p.n, "size of the trial")->check(CLI::PositiveNumber);
  app.add_option("--gap-us", p.gap_us, "wake: microseconds the waker pauses before each wake")
      ->check(coresched::bench::finite_range(0, 1e6));
  app.add_flag("--no-warmup", no_warmup, "skip the warm-up at a tenth of the size");
  CLI11_PARSE(app, argc, argv);
  try {
    const Workload& run = workloads.at(workload);
    if (!no_warmup) {
      Params warm = p;
      warm.n = std::max(1L, p.n / 10);
      run(warm);
    }
    for (const auto& f : run(p)) emit(peer, workload, f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s %s: %s\n", peer.c_str(), workload.c_str(), e.what());
    return 1;
  }
  return 0;
}

} // namespace peers
