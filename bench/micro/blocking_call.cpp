// SPDX-License-Identifier: Apache-2.0
// coresched-blocking-call-bench: what a blocking call costs, and what it
// spares the other fibers of its worker.
//
// cost (`core:1 pu:2`, one fiber making calls of an empty function, ns per call):
//   blocking_call   coresched::blocking_call: a helper thread kept from the
//                   last call, the core held for the caller's cookie
//   thread          marl's blocking_call hand-off: a new std::thread per call,
//                   the fiber waits on an Event, then joins the thread
//   inline          the function called in the fiber (the floor)
// lateness (one worker, `core:1 pu:1`): a fiber sleeping 1 ms at a time
// while another fiber of the same worker spends 300 ms
//   blocking_call   in blocking_call(sleep 300 ms)
//   in-fiber        in std::this_thread::sleep_for(300 ms): the worker blocks
//   sleep           in this_fiber::sleep_for(300 ms) (nothing blocks: the floor)
// Lateness: how long past its 1 ms each of the sleeper's sleeps ended.
#include "json_rounds.hpp"

#include <coresched/coresched.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;
using namespace coresched;
using namespace std::chrono_literals;

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

void nothing() noexcept { asm volatile(""); }

// ns per call, one sample per call.
std::vector<double> cost(Runtime& rt, const std::string& kind, int n) {
  std::vector<double> ns;
  ns.reserve(static_cast<std::size_t>(n));
  rt.spawn([&] {
      for (int i = 0; i < n; ++i) {
        const auto t0 = Clock::now();
        if (kind == "blocking_call") {
          blocking_call(nothing);
        } else if (kind == "thread") {
          Event done;
          std::thread t([&] {
            nothing();
            done.set();
          });
          done.wait();
          t.join();
        } else {
          nothing();
        }
        ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
      }
    }, SpawnOptions{.cookie = Cookie::create("caller")}).join();
  return ns;
}

// The sleeper's lateness (us) past each 1 ms sleep while the other fiber spends 300 ms.
std::vector<double> lateness(Runtime& rt, const std::string& kind) {
  std::atomic<bool> busy{true};
  std::vector<double> us;
  // The sleeper first, so that its first sleep is under way when the other starts.
  auto sleeper = rt.spawn([&] {
    do { // at least once: beside a worker blocked in-fiber, the one sleep the block delays
      const auto t0 = Clock::now();
      this_fiber::sleep_for(1ms);
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0 - 1ms).count());
    } while (busy.load());
  });
  auto other = rt.spawn([&] {
    if (kind == "blocking_call") blocking_call([] { std::this_thread::sleep_for(300ms); });
    else if (kind == "in-fiber") std::this_thread::sleep_for(300ms);
    else this_fiber::sleep_for(300ms);
    busy = false;
  });
  other.join();
  sleeper.join();
  return us;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched-blocking-call-bench: the cost of one blocking_call beside a thread per call (marl's "
               "hand-off), and the lateness of 1 ms sleeps on the worker of a 300 ms blocking call"};
  std::string json;
  int n = 20000, rounds = 3;
  app.add_option("-n,--calls", n, "calls per kind and round for the cost (default 20000)")->check(CLI::Range(10, 10000000));
  app.add_option("--rounds", rounds, "rounds (default 3); the kinds alternate within each")->check(CLI::Range(1, 100));
  app.add_option("--json", json, "also write the rounds as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  JsonRounds out(json, "coresched-blocking-call-bench");
  if (!out.ok()) return 1;
  out.parameters(R"("calls": %d)", n);
  try {
    Options two, one;
    two.topology = "core:1 pu:2";
    one.topology = "package:1 core:1 pu:1";
    {
    Runtime rt2(two);
    std::printf("# io backend: %s\n", to_string(rt2.io_backend()));
    std::printf("%-8s %-13s %5s %10s %10s %10s %6s\n", "figure", "kind", "round", "p50", "p99", "max", "n");
    for (int r = 1; r <= rounds; ++r) {
      for (const char* k : {"blocking_call", "thread", "inline"}) {
        std::fprintf(stderr, "[blocking-call] round %d/%d cost %s ...\n", r, rounds, k);
        const auto v = cost(rt2, k, n);
        std::printf("%-8s %-13s %5d %7.0f ns %7.0f ns %7.0f ns %6zu\n", "cost", k, r, pct(v, 0.5), pct(v, 0.99),
                    pct(v, 1.0), v.size());
        out.round(R"("figure": "cost", "kind": "%s", "round": %d, "p50_ns": %.0f, "p99_ns": %.0f, "max_ns": %.0f)", k, r,
                  pct(v, 0.5), pct(v, 0.99), pct(v, 1.0));
      }
    }
    }
    Runtime rt1(one);
    for (int r = 1; r <= rounds; ++r) {
      for (const char* k : {"blocking_call", "in-fiber", "sleep"}) {
        std::fprintf(stderr, "[blocking-call] round %d/%d lateness %s ...\n", r, rounds, k);
        const auto v = lateness(rt1, k);
        std::printf("%-8s %-13s %5d %7.0f us %7.0f us %7.0f us %6zu\n", "lateness", k, r, pct(v, 0.5), pct(v, 0.99),
                    pct(v, 1.0), v.size());
        out.round(R"("figure": "lateness", "kind": "%s", "round": %d, "sleeps": %zu, "p50_us": %.1f, "p99_us": %.1f, )"
                  R"("max_us": %.1f)", k, r, v.size(), pct(v, 0.5), pct(v, 0.99), pct(v, 1.0));
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-blocking-call-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
