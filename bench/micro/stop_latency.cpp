// SPDX-License-Identifier: Apache-2.0
// coresched-stop-latency-bench: how soon a fiber runs after the event that
// ends its wait, beside a busy fiber of another cookie on its sibling PU.
//
// Two PUs of one core (`core:1 pu:2`, synthetic siblings unless --topology
// says otherwise). PU 1 runs a fiber of cookie B that burns and reaches a
// preemption point every few microseconds. PU 0 runs, round after round, a
// fiber of cookie A that waits and stamps the time it runs again. What ends
// the wait, each in its own rounds of the same run:
//   stop-event   std::stop_source::request_stop() from the main thread; the
//                fiber waits in Event::wait(stop_token)
//   stop-sleep   the same, the fiber in this_fiber::sleep_for(1 h, token)
//   set-event    Event::set() from the main thread (the baseline: a plain
//                wake-up of the same fiber)
//   timed-1ms    nothing: Event::wait_for(1 ms) times out; the figure is
//                its lateness past the 1 ms
//   sleep-1ms    the same for this_fiber::sleep_for(1 ms) (the worker's
//                reactor timer, where the timed wait uses the runtime's
//                deadline thread)
// Latency: from the request (or the deadline) to the fiber running. The
// fiber's cookie must take the core from B each time, so this includes the
// hand-over (B is asked to stop at its next preemption point).
#include "json_rounds.hpp"

#include <coresched/coresched.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;
using namespace coresched;

enum class Kind { stop_event, stop_sleep, set_event, timed, sleep };
const char* name(Kind k) {
  switch (k) {
  case Kind::stop_event: return "stop-event";
  case Kind::stop_sleep: return "stop-sleep";
  case Kind::set_event: return "set-event";
  case Kind::timed: return "timed-1ms";
  case Kind::sleep: return "sleep-1ms";
  }
  return "?";
}

// Latencies in microseconds for `n` wake-ups of kind `k`.
std::vector<double> measure(Runtime& rt, Cookie a, Kind k, int n) {
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    std::stop_source src;
    Event ev;
    std::atomic<bool> waiting{false};
    std::atomic<Clock::rep> woke{0};
    Clock::time_point due{};
    auto f = rt.spawn([&] {
      waiting = true;
      if (k == Kind::stop_event) (void)ev.wait(src.get_token());
      else if (k == Kind::stop_sleep) (void)this_fiber::sleep_for(std::chrono::hours(1), src.get_token());
      else if (k == Kind::set_event) ev.wait();
      else if (k == Kind::timed) {
        due = Clock::now() + std::chrono::milliseconds(1);
        (void)ev.wait_until(due);
      } else {
        due = Clock::now() + std::chrono::milliseconds(1);
        this_fiber::sleep_until(due);
      }
      woke = Clock::now().time_since_epoch().count();
    }, SpawnOptions{.cookie = a, .pin_to_pu = 0});
    while (!waiting.load()) std::this_thread::yield();
    if (k != Kind::timed && k != Kind::sleep) {
      std::this_thread::sleep_for(std::chrono::microseconds(300)); // parked by now
      due = Clock::now();
      if (k == Kind::set_event) ev.set();
      else src.request_stop();
    }
    f.join();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::time_point(Clock::duration(woke.load())) - due).count());
  }
  return us;
}

double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched-stop-latency-bench: from request_stop() (or set(), or a deadline) to the waiting fiber "
               "running, beside a busy fiber of another cookie on the sibling PU"};
  std::string topology = "core:1 pu:2", json;
  int n = 400, rounds = 3;
  app.add_option("--topology", topology, "hwloc synthetic topology (PUs 0 and 1 must be siblings)");
  app.add_option("-n,--wakeups", n, "wake-ups per kind and round (default 400)")->check(CLI::Range(10, 100000));
  app.add_option("--rounds", rounds, "rounds (default 3); the kinds alternate within each")->check(CLI::Range(1, 100));
  app.add_option("--json", json, "also write the rounds as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  JsonRounds out(json, "coresched-stop-latency-bench");
  if (!out.ok()) return 1;
  out.parameters(R"("topology": "%s", "wakeups": %d)", topology.c_str(), n);
  try {
    Options o;
    o.topology = topology;
    Runtime rt(o);
    const Cookie a = Cookie::create("waiter"), b = Cookie::create("busy");
    std::atomic<bool> stop{false};
    auto busy = rt.spawn([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        std::uint64_t x = 1;
        for (int i = 0; i < 500; ++i) x = x * 6364136223846793005ull + 1;
        asm volatile("" : : "r"(x));
        this_fiber::preempt_point();
      }
    }, SpawnOptions{.cookie = b, .pin_to_pu = 1});
    std::printf("# io backend: %s\n", to_string(rt.io_backend()));
    std::printf("%-11s %5s %9s %9s %9s\n", "kind", "round", "p50 us", "p99 us", "max us");
    for (int r = 1; r <= rounds; ++r) {
      for (Kind k : {Kind::stop_event, Kind::stop_sleep, Kind::set_event, Kind::timed, Kind::sleep}) {
        std::fprintf(stderr, "[stop-latency] round %d/%d %s ...\n", r, rounds, name(k));
        const auto v = measure(rt, a, k, n);
        const double p50 = pct(v, 0.5), p99 = pct(v, 0.99), mx = pct(v, 1.0);
        std::printf("%-11s %5d %9.1f %9.1f %9.1f\n", name(k), r, p50, p99, mx);
        out.round(R"("kind": "%s", "round": %d, "p50_us": %.2f, "p99_us": %.2f, "max_us": %.2f)", name(k), r, p50, p99,
                  mx);
      }
    }
    stop = true;
    busy.join();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-stop-latency-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
