// SPDX-License-Identifier: Apache-2.0
// tenants: two tenants share one runtime, isolated by core-scheduling cookies.
//
// Each tenant gets its own cookie (Cookie::create()) and every one of its request handlers is spawned with it, so a
// handler of one tenant never runs on an SMT sibling of a core where the other tenant's code runs at that instant.
//  - "analytics" is CPU-heavy: it keeps one long request (about 2 ms of computation) in flight per PU.
//  - "shop" serves short requests (about 20 us each) arriving every --interval-us (1 ms), and cares about latency.
// After --duration seconds the program prints, per tenant, requests served, latency, and from Runtime::stats()
// the cookie's CPU time and forced-idle time: the sibling time lost because the two tenants may not share a core.
// It exits 1 unless both tenants served requests and both cookies got CPU time.
//
// Fibers are cooperative: a shop request that arrives while analytics fibers hold every PU waits for one of them
// to reach a preemption point with its slice used up (Options::slice, 1 ms), so shop latencies are of the order
// of a slice, not of the 20 us of work. The core-wide fairness policy then gives the core to the shop cookie,
// which has used far less of it.
#include <coresched/coresched.hpp>
#include <coresched/sync.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
namespace this_fiber = coresched::this_fiber;

// Simulated request work: a fixed amount of integer mixing. The result goes to a sink so the compiler cannot drop
// the loop.
std::atomic<std::uint64_t> sink{0};

void compute(std::uint64_t iterations) {
  std::uint64_t x = iterations | 1;
  for (std::uint64_t i = 0; i < iterations; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    x ^= x >> 29;
    // Cooperative scheduling: without preemption points a long request would keep its PU (and keep the other
    // tenant's fibers off the whole core) until it finished. When nothing is due this is one flag read.
    if ((i & 0x3ff) == 0) this_fiber::preempt_point();
  }
  sink.fetch_add(x, std::memory_order_relaxed);
}

// Iterations of compute() per microsecond on this machine, measured on the main thread before the runtime starts
// (preempt_point() does nothing there), so a "2 ms request" is a fixed amount of work, not of wall time.
double calibrate() {
  const std::uint64_t n = 1 << 22;
  const auto t0 = Clock::now();
  compute(n);
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  return static_cast<double>(n) / std::max(us, 1.0);
}

struct Tenant {
  std::string name;
  coresched::Cookie cookie = coresched::Cookie::create();
  std::uint64_t iterations = 0;          // work per request
  coresched::WaitGroup in_flight;        // handlers not yet finished
  coresched::Mutex mu;                   // guards latencies_us
  std::vector<double> latencies_us;      // arrival to completion, one per request
};

// Runs one request on a fiber of the tenant's cookie and records its latency.
void spawn_handler(Tenant& t, Clock::time_point arrival, coresched::Semaphore* slot = nullptr) {
  t.in_flight.add();
  // The cookie is what isolates tenants. (A fiber spawned by a fiber inherits its cookie, so naming it here only
  // makes the tagging explicit; a front end shared by all tenants would have to name it.)
  coresched::spawn(
      [&t, arrival, slot] {
        compute(t.iterations);
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - arrival).count();
        {
          std::lock_guard lk(t.mu);
          t.latencies_us.push_back(us);
        }
        if (slot) slot->release();
        t.in_flight.done(); // last touch of t from this fiber
      },
      coresched::SpawnOptions{.cookie = t.cookie, .detached = true});
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  auto k = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

} // namespace

int main(int argc, char** argv) {
  double duration_s = 1.0;
  std::string policy = "core_vruntime";
  unsigned interval_us = 1000;

  CLI::App app{"tenants: a CPU-heavy tenant and a short-request tenant with different core-scheduling cookies; "
               "prints per-cookie CPU and forced-idle time. Exits 1 unless both tenants got CPU time."};
  app.add_option("--duration", duration_s, "Seconds to run the workload")->check(CLI::Range(0.01, 3600.0));
  app.add_option("--policy", policy, "Fairness between cookies on a core")
      ->check(CLI::IsMember({"core_vruntime", "forceidle_balance"}));
  app.add_option("--interval-us", interval_us, "Time between two shop requests, in microseconds")
      ->check(CLI::Range(10u, 1000000u));
  CLI11_PARSE(app, argc, argv);

  try {
    const double iters_per_us = calibrate();

    coresched::Options opts;
    opts.policy = policy == "core_vruntime" ? coresched::FairnessPolicy::core_vruntime
                                            : coresched::FairnessPolicy::forceidle_balance;
    coresched::Runtime rt(opts);
    std::printf("%s\npolicy %s, %.2f s\n\n", rt.topology().describe().c_str(), policy.c_str(), duration_s);

    Tenant analytics, shop;
    analytics.name = "analytics";
    analytics.iterations = static_cast<std::uint64_t>(2000 * iters_per_us);
    shop.name = "shop";
    shop.iterations = static_cast<std::uint64_t>(20 * iters_per_us);

    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration_s));
    const auto n_pus = static_cast<std::ptrdiff_t>(rt.topology().pus().size());

    // Each tenant's front end runs with the tenant's cookie too, like an accept loop serving one tenant's port.
    auto analytics_front = rt.spawn(
        [&] {
          // Closed loop: one request in flight per PU, a new one as soon as one finishes.
          coresched::Semaphore slots(n_pus);
          while (Clock::now() < deadline) {
            slots.acquire();
            spawn_handler(analytics, Clock::now(), &slots);
          }
          analytics.in_flight.wait(); // `slots` lives on this stack: wait for every handler before leaving
        },
        coresched::SpawnOptions{.cookie = analytics.cookie});

    auto shop_front = rt.spawn(
        [&] {
          // Open loop: requests arrive on a fixed schedule whether or not earlier ones are done.
          const auto interval = std::chrono::microseconds(interval_us);
          for (auto next = Clock::now(); next < deadline; next += interval) {
            this_fiber::sleep_until(next);
            spawn_handler(shop, next); // latency counts from the scheduled arrival
          }
          shop.in_flight.wait();
        },
        coresched::SpawnOptions{.cookie = shop.cookie});

    analytics_front.join();
    shop_front.join();
    const double elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();

    const coresched::Stats stats = rt.stats();
    std::uint64_t total_cpu = 0;
    for (const auto& c : stats.cookies) total_cpu += c.cpu_ns;

    auto ms = [](std::uint64_t ns) { return static_cast<double>(ns) / 1e6; };
    std::printf("%-10s %6s %9s %9s %9s %9s %9s %6s %12s %12s\n", "tenant", "cookie", "requests", "req/s",
                "avg us", "p99 us", "cpu ms", "cpu %", "fi suffered", "fi caused");
    bool ok = true;
    for (Tenant* t : {&analytics, &shop}) {
      const coresched::CookieStats cs = stats.cookie(t->cookie);
      auto& lat = t->latencies_us;
      double avg = 0;
      for (double v : lat) avg += v;
      if (!lat.empty()) avg /= static_cast<double>(lat.size());
      const double p99 = percentile(lat, 0.99);
      std::printf("%-10s %6llu %9zu %9.0f %9.0f %9.0f %9.1f %6.1f %9.1f ms %9.1f ms\n", t->name.c_str(),
                  static_cast<unsigned long long>(t->cookie.value()), lat.size(),
                  static_cast<double>(lat.size()) / elapsed_s, avg, p99, ms(cs.cpu_ns),
                  total_cpu ? 100.0 * static_cast<double>(cs.cpu_ns) / static_cast<double>(total_cpu) : 0.0,
                  ms(cs.forced_idle_suffered_ns), ms(cs.forced_idle_caused_ns));
      if (lat.empty() || cs.cpu_ns == 0) {
        std::fprintf(stderr, "FAIL: tenant %s served %zu requests with %llu ns of CPU\n", t->name.c_str(),
                     lat.size(), static_cast<unsigned long long>(cs.cpu_ns));
        ok = false;
      }
    }
    std::uint64_t switches = 0, forced_idle = 0;
    for (const auto& c : stats.cores) {
      switches += c.cookie_switches;
      forced_idle += c.forced_idle_ns;
    }
    std::printf("\ncores changed cookie %llu times; siblings were forced idle %.1f ms in all\n",
                static_cast<unsigned long long>(switches), ms(forced_idle));
    std::printf("(fi suffered: sibling time idled while this cookie waited for a core; fi caused: sibling time idled "
                "because this cookie held a core)\n");
    if (ok) std::printf("OK: both tenants got CPU time\n");
    return ok ? 0 : 1;
  } catch (const std::exception& e) { // e.g. a bad CORESCHED_TOPOLOGY
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
