// SPDX-License-Identifier: Apache-2.0
// coresched-arrival-bench: how long a fiber of a cookie that is not running
// waits, from spawn() (or from the wake-up) to its first instruction, on one
// core of two PUs (`core:1 pu:2`) that a busy owner cookie holds: two fibers
// of the owner, one pinned to each PU, loop through this_fiber::preempt_point()
// and never block. Every 2-5 slices (--gap-min/--gap-max) one arrival:
//
// - `--cookie fresh`: each arrival under a new Cookie::create(), a cookie the
//   core has never seen; `returning`: one second cookie for every arrival, a
//   cookie that has been on the core before;
// - `--from thread`: spawned by a plain thread; `fiber`: spawned by one of the
//   owner's own fibers (between two preemption points); `wake`: a parked fiber
//   of the returning cookie is woken by a plain thread (Event::set), measured
//   from the set to its first instruction after the wait;
// - `--pin none`: the arrival may run on either PU; `0` or `1`: pinned there.
//
// Each case is run under both fairness policies and each slice asked for. The
// waits are printed in slices (p50, p99, max, and the share over 2 slices).
// The next arrival comes only after the last one has started, so each one
// finds the owner alone. `call max` is the longest the spawn() (or set())
// call itself took: the spawning thread descheduled by the kernel, not a
// wait the runtime can shorten.
#include "../cli_finite.hpp"
#include "json_rounds.hpp"

#include <coresched/coresched.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;
using namespace coresched;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

struct Case {
  std::string cookie, from, pin, policy;
  unsigned slice_us = 1000;
};

struct Figures {
  double p50 = 0, p99 = 0, max = 0, over2 = 0; // slices; over2: share of arrivals
  double call_max = 0; // slices: the longest spawn() or Event::set() call itself
  unsigned n = 0;
};

// One arrival's two stamps (ns); 0: not yet.
struct Stamp {
  std::atomic<std::int64_t> asked{0};
  std::atomic<std::int64_t> returned{0}; // spawn() or Event::set() returned
  std::atomic<std::int64_t> started{0};
};

Figures measure(const Case& c, unsigned arrivals, double gap_min, double gap_max, std::uint32_t seed) {
  Options o;
  o.topology = "core:1 pu:2";
  o.slice = std::chrono::microseconds(c.slice_us);
  o.policy = c.policy == "forceidle_balance" ? FairnessPolicy::forceidle_balance : FairnessPolicy::core_vruntime;
  Runtime rt(o);
  const Cookie owner = Cookie::create();
  const Cookie back = Cookie::create(); // the returning cookie
  const double slice_ns = c.slice_us * 1000.0;
  std::optional<unsigned> pin;
  if (c.pin != "none") pin = static_cast<unsigned>(std::stoul(c.pin));

  // One warm-up arrival of the returning cookie first, so that it has been
  // on the core; it is not counted.
  std::vector<std::unique_ptr<Stamp>> stamps;
  for (unsigned i = 0; i <= arrivals; ++i) stamps.push_back(std::make_unique<Stamp>());
  std::atomic<bool> stop{false};
  std::atomic<int> spawn_index{-1}; // --from fiber: the arrival the owner's fiber is to spawn now
  auto arrive = [&](unsigned i) {
    const Cookie k = c.cookie == "fresh" && i > 0 ? Cookie::create() : back;
    Stamp* s = stamps[i].get();
    s->asked.store(now_ns(), std::memory_order_relaxed);
    rt.spawn([s] { s->started.store(now_ns(), std::memory_order_relaxed); },
             SpawnOptions{.cookie = k, .pin_to_pu = pin, .detached = true});
    s->returned.store(now_ns(), std::memory_order_relaxed);
  };
  std::vector<JoinHandle<void>> owners;
  for (unsigned pu = 0; pu < 2; ++pu)
    owners.push_back(rt.spawn([&, pu] {
      while (!stop.load(std::memory_order_relaxed)) {
        std::uint64_t x = 1;
        for (int i = 0; i < 200; ++i) x = x * 6364136223846793005ull + 1;
        asm volatile("" : : "r"(x));
        if (pu == 0 && spawn_index.load(std::memory_order_relaxed) >= 0)
          arrive(static_cast<unsigned>(spawn_index.exchange(-1, std::memory_order_relaxed)));
        this_fiber::preempt_point();
      }
    }, SpawnOptions{.cookie = owner, .pin_to_pu = pu}));
  // However this ends (an arrival that never starts throws), the owners stop
  // before their handles join them.
  struct StopOwners {
    std::atomic<bool>& stop;
    ~StopOwners() { stop = true; }
  } stop_owners{stop};

  // --from wake: one fiber of the returning cookie, parked between arrivals.
  Event go;
  std::atomic<int> woken_for{-1};
  JoinHandle<void> sleeper;
  struct WakeLast { // the sleeper returns before its handle joins it
    std::atomic<int>& woken_for;
    Event& go;
    bool on;
    ~WakeLast() {
      if (!on) return;
      woken_for.store(-1, std::memory_order_relaxed);
      go.set();
    }
  } wake_last{woken_for, go, c.from == "wake"};
  if (c.from == "wake")
    sleeper = rt.spawn([&] {
      for (;;) {
        go.wait();
        const int i = woken_for.load(std::memory_order_relaxed);
        if (i < 0) return;
        stamps[static_cast<unsigned>(i)]->started.store(now_ns(), std::memory_order_relaxed);
        go.reset();
      }
    }, SpawnOptions{.cookie = back, .pin_to_pu = pin});

  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> gap(gap_min, gap_max);
  std::this_thread::sleep_for(std::chrono::nanoseconds(static_cast<std::int64_t>(2 * slice_ns)));
  for (unsigned i = 0; i <= arrivals; ++i) {
    if (c.from == "wake") {
      woken_for.store(static_cast<int>(i), std::memory_order_relaxed);
      stamps[i]->asked.store(now_ns(), std::memory_order_relaxed);
      go.set();
      stamps[i]->returned.store(now_ns(), std::memory_order_relaxed);
    } else if (c.from == "fiber") {
      spawn_index.store(static_cast<int>(i), std::memory_order_relaxed);
    } else {
      arrive(i);
    }
    const auto next = Clock::now() + std::chrono::nanoseconds(static_cast<std::int64_t>(gap(rng) * slice_ns));
    const auto give_up = Clock::now() + std::chrono::seconds(10);
    while (stamps[i]->started.load(std::memory_order_relaxed) == 0) {
      if (Clock::now() > give_up) {
        std::fprintf(stderr, "coresched-arrival-bench: arrival %u has not started in 10 s\n", i);
        rt.dump(stderr);
        throw std::runtime_error("arrival " + std::to_string(i) + " has not started in 10 s");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    std::this_thread::sleep_until(next);
    // The wake case: the fiber parks again before the next set.
    if (c.from == "wake")
      while (go.is_set()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  if (c.from == "wake") {
    woken_for.store(-1, std::memory_order_relaxed);
    go.set();
    sleeper.join();
  }
  stop = true;
  for (auto& h : owners) h.join();

  std::vector<double> waits;
  double call_max = 0;
  for (unsigned i = 1; i <= arrivals; ++i) {
    waits.push_back(static_cast<double>(stamps[i]->started.load() - stamps[i]->asked.load()) / slice_ns);
    call_max = std::max(call_max, static_cast<double>(stamps[i]->returned.load() - stamps[i]->asked.load()) / slice_ns);
  }
  std::sort(waits.begin(), waits.end());
  Figures f;
  f.n = static_cast<unsigned>(waits.size());
  f.call_max = call_max;
  f.p50 = waits[waits.size() / 2];
  f.p99 = waits[std::min(waits.size() - 1, waits.size() * 99 / 100)];
  f.max = waits.back();
  f.over2 = static_cast<double>(std::count_if(waits.begin(), waits.end(), [](double w) { return w > 2.0; })) /
            static_cast<double>(waits.size());
  return f;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched-arrival-bench: the wait of a cookie that is not running, from spawn() or wake-up to its "
               "first instruction, beside a busy owner cookie on core:1 pu:2, in slices"};
  std::vector<unsigned> slices{250, 1000, 4000};
  std::vector<std::string> policies{"core_vruntime", "forceidle_balance"};
  std::vector<std::string> cookies{"fresh", "returning"};
  std::vector<std::string> froms{"thread", "fiber"};
  std::vector<std::string> pins{"none", "1"};
  unsigned arrivals = 200, rounds = 1, seed = 1;
  double gap_min = 2, gap_max = 5;
  std::string json_path;
  app.add_option("--slice-us", slices, "slices (Options::slice), microseconds")
      ->check(CLI::Range(100u, 100000u))
      ->capture_default_str();
  app.add_option("--policy", policies, "fairness policies")
      ->check(CLI::IsMember({"core_vruntime", "forceidle_balance"}))
      ->capture_default_str();
  app.add_option("--cookie", cookies, "fresh (a new cookie per arrival) and/or returning (one that ran before)")
      ->check(CLI::IsMember({"fresh", "returning"}))
      ->capture_default_str();
  app.add_option("--from", froms,
                 "thread (a plain thread spawns), fiber (an owner fiber spawns), wake (a thread wakes a parked fiber "
                 "of the returning cookie; not with fresh)")
      ->check(CLI::IsMember({"thread", "fiber", "wake"}))
      ->capture_default_str();
  app.add_option("--pin", pins, "none, or the PU (0 or 1) the arriving fiber is pinned to")
      ->check(CLI::IsMember({"none", "0", "1"}))
      ->capture_default_str();
  app.add_option("--arrivals", arrivals, "arrivals per case and round")->check(CLI::Range(1u, 100000u))->capture_default_str();
  app.add_option("--gap-min", gap_min, "least gap between arrivals, slices")
      ->check(coresched::bench::finite_range(0.1, 1000))
      ->capture_default_str();
  app.add_option("--gap-max", gap_max, "largest gap between arrivals, slices")
      ->check(coresched::bench::finite_range(0.1, 1000))
      ->capture_default_str();
  app.add_option("--rounds", rounds, "rounds of every case")->check(CLI::Range(1u, 1000u))->capture_default_str();
  app.add_option("--seed", seed, "seed of the gaps")->capture_default_str();
  app.add_option("--json", json_path, "also write every case's figures as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  if (gap_max < gap_min) {
    std::fprintf(stderr, "coresched-arrival-bench: --gap-max must not be below --gap-min\n");
    return 1;
  }
  JsonRounds json(json_path, "coresched-arrival-bench");
  if (!json.ok()) return 1;
  std::vector<Case> cases;
  for (unsigned r = 0; r < rounds; ++r)
    for (const auto& policy : policies)
      for (unsigned s : slices)
        for (const auto& cookie : cookies)
          for (const auto& from : froms)
            for (const auto& pin : pins)
              if (!(from == "wake" && cookie == "fresh")) cases.push_back({cookie, from, pin, policy, s});
  std::printf("# core:1 pu:2, two busy owner fibers; %u arrivals per case, %.1f-%.1f slices apart; wait from spawn "
              "(or wake-up) to the first instruction, in slices\n",
              arrivals, gap_min, gap_max);
  std::printf("%-17s %6s %-9s %-6s %-4s %5s %7s %7s %7s %7s %9s\n", "policy", "slice", "cookie", "from", "pin", "round",
              "p50", "p99", "max", ">2 %", "call max");
  json.parameters("\"arrivals\": %u, \"gap_min_slices\": %.2f, \"gap_max_slices\": %.2f, \"seed\": %u", arrivals,
                  gap_min, gap_max, seed);
  try {
    const auto began = Clock::now();
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      const unsigned round = static_cast<unsigned>(k / (cases.size() / rounds)) + 1;
      const Figures f = measure(c, arrivals, gap_min, gap_max, seed + static_cast<unsigned>(k));
      std::printf("%-17s %6u %-9s %-6s %-4s %5u %7.2f %7.2f %7.2f %7.1f %9.2f\n", c.policy.c_str(), c.slice_us,
                  c.cookie.c_str(), c.from.c_str(), c.pin.c_str(), round, f.p50, f.p99, f.max, 100 * f.over2,
                  f.call_max);
      std::fflush(stdout);
      json.round("\"policy\": \"%s\", \"slice_us\": %u, \"cookie\": \"%s\", \"from\": \"%s\", \"pin\": \"%s\", "
                 "\"round\": %u, \"n\": %u, \"p50_slices\": %.3f, \"p99_slices\": %.3f, \"max_slices\": %.3f, "
                 "\"over_2_slices\": %.4f, \"call_max_slices\": %.3f",
                 c.policy.c_str(), c.slice_us, c.cookie.c_str(), c.from.c_str(), c.pin.c_str(), round, f.n, f.p50,
                 f.p99, f.max, f.over2, f.call_max);
      // Progress on stderr, so that stdout stays a table.
      const double spent = std::chrono::duration<double>(Clock::now() - began).count();
      std::fprintf(stderr, "[%zu/%zu cases, %.0f s, ~%.0f s left]\n", k + 1, cases.size(), spent,
                   spent / static_cast<double>(k + 1) * static_cast<double>(cases.size() - k - 1));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-arrival-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
