// SPDX-License-Identifier: Apache-2.0
// fiber-bench: our yield, spawn+join and preempt_point against Boost.Fiber
// doing the same, measured in one run so the ratios are meaningful on a noisy
// machine. Each figure is the best (minimum) of --repeat trials.
#include <coresched/coresched.hpp>

#include <CLI/CLI.hpp>
#include <boost/fiber/all.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;

double ns_since(Clock::time_point t0, double ops) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / ops;
}

double best_of(int repeat, const std::function<double()>& trial) {
  double best = 1e300;
  for (int i = 0; i < repeat; ++i) best = std::min(best, trial());
  return best;
}

// ---- coresched (one worker, so fiber-to-fiber on one PU) ----
double ours_yield(coresched::Runtime& rt, long n) {
  auto body = [n] {
    for (long i = 0; i < n; ++i) coresched::this_fiber::yield();
  };
  return rt.spawn([&] {
    const auto t0 = Clock::now();
    auto other = coresched::spawn(body);
    body();
    other.join();
    return ns_since(t0, 2.0 * static_cast<double>(n));
  }).join();
}

double ours_spawn_join(coresched::Runtime& rt, long n) {
  return rt.spawn([n] {
    const auto t0 = Clock::now();
    for (long i = 0; i < n; ++i) coresched::spawn([] {}).join();
    return ns_since(t0, static_cast<double>(n));
  }).join();
}

double ours_preempt_point(coresched::Runtime& rt, long n) {
  return rt.spawn([n] {
    const auto t0 = Clock::now();
    for (long i = 0; i < n; ++i) coresched::this_fiber::preempt_point();
    return ns_since(t0, static_cast<double>(n));
  }).join();
}

// ---- Boost.Fiber (default round_robin scheduler on this thread) ----
double boost_yield(long n) {
  auto body = [n] {
    for (long i = 0; i < n; ++i) boost::this_fiber::yield();
  };
  const auto t0 = Clock::now();
  boost::fibers::fiber a(body), b(body);
  a.join();
  b.join();
  return ns_since(t0, 2.0 * static_cast<double>(n));
}

double boost_spawn_join(long n) {
  double r = 0;
  boost::fibers::fiber([&] {
    const auto t0 = Clock::now();
    for (long i = 0; i < n; ++i) boost::fibers::fiber([] {}).join();
    r = ns_since(t0, static_cast<double>(n));
  }).join();
  return r;
}

struct Row {
  std::string name;
  double ours, peer, target_ns, target_ratio;
};
} // namespace

int main(int argc, char** argv) {
  CLI::App app{"fiber-bench: coresched yield / spawn+join / preempt_point vs Boost.Fiber (ns per operation)"};
  long n = 2'000'000;
  int repeat = 5;
  std::string json;
  std::string topology = "core:1 pu:1";
  app.add_option("-n,--iterations", n, "operations per trial")->check(CLI::PositiveNumber);
  app.add_option("-r,--repeat", repeat, "trials; the best is reported")->check(CLI::PositiveNumber);
  app.add_option("--topology", topology, "topology for coresched (one PU: fiber to fiber on one worker)");
  app.add_option("--json", json, "write the figures as JSON to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    coresched::Options opts;
    opts.topology = topology;
    coresched::Runtime rt(opts);
    std::printf("%s\n", rt.topology().describe().c_str());
    std::printf("iterations %ld, best of %d trials\n\n", n, repeat);
    std::vector<Row> rows;
    std::fprintf(stderr, "[fiber-bench] yield...\n");
    rows.push_back({"yield", best_of(repeat, [&] { return ours_yield(rt, n); }),
                    best_of(repeat, [&] { return boost_yield(n); }), 20, 0.35});
    std::fprintf(stderr, "[fiber-bench] spawn+join...\n");
    rows.push_back({"spawn+join", best_of(repeat, [&] { return ours_spawn_join(rt, n / 4); }),
                    best_of(repeat, [&] { return boost_spawn_join(n / 4); }), 120, 0.5});
    std::fprintf(stderr, "[fiber-bench] preempt_point...\n");
    rows.push_back({"preempt_point (nothing due)", best_of(repeat, [&] { return ours_preempt_point(rt, n * 10); }),
                    0, 3, 0});

    std::printf("%-28s %12s %14s %8s %10s %8s\n", "operation", "coresched ns", "Boost.Fiber ns", "ratio",
                "target ns", "target");
    for (const auto& r : rows) {
      if (r.peer > 0)
        std::printf("%-28s %12.1f %14.1f %8.3f %10.0f %8s\n", r.name.c_str(), r.ours, r.peer, r.ours / r.peer,
                    r.target_ns, ("<=" + std::to_string(r.target_ratio).substr(0, 4)).c_str());
      else
        std::printf("%-28s %12.2f %14s %8s %10.0f %8s\n", r.name.c_str(), r.ours, "-", "-", r.target_ns, "-");
    }
    if (!json.empty()) {
      std::ofstream out(json);
      if (!out) throw std::runtime_error("cannot write " + json);
      out << "{\n  \"topology\": \"" << rt.topology().spec() << "\",\n  \"iterations\": " << n
          << ",\n  \"repeat\": " << repeat << ",\n  \"unit\": \"ns/op\",\n  \"rows\": [\n";
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& r = rows[i];
        out << "    {\"operation\": \"" << r.name << "\", \"coresched_ns\": " << r.ours
            << ", \"boost_fiber_ns\": " << r.peer << ", \"ratio\": " << (r.peer > 0 ? r.ours / r.peer : 0)
            << ", \"target_ns\": " << r.target_ns << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
      }
      out << "  ]\n}\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fiber-bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
