// SPDX-License-Identifier: Apache-2.0
// coresched-wake-bench: cross-worker wake latency (stamp -> woken fiber runs),
// to a worker that is still spinning and to one asleep in its io_uring,
// beside a plain futex ping-pong and a spinning hand-off between two pinned
// threads, all measured in one run.
#include <coresched/coresched.hpp>
#include <coresched/sync.hpp>

#include "../cli_finite.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;
using namespace coresched;

struct Pcts {
  double p50, p99;
};
Pcts pcts(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[v.size() * 99 / 100]};
}
void spin_for(std::chrono::nanoseconds d) {
  const auto until = Clock::now() + d;
  while (Clock::now() < until) {
  }
}
double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

// Fiber A (PU 0) stamps and releases B (PU 1) after `delay`; B records the latency.
std::vector<double> fiber_wake(Runtime& rt, std::chrono::nanoseconds delay, int samples) {
  Semaphore to_b, to_a;
  Clock::time_point stamp;
  std::vector<double> lat;
  lat.reserve(static_cast<std::size_t>(samples));
  auto b = rt.spawn([&] {
    for (int i = 0; i < samples; ++i) {
      to_b.acquire();
      lat.push_back(us_since(stamp));
      to_a.release();
    }
  }, SpawnOptions{.pin_to_pu = 1});
  auto a = rt.spawn([&] {
    for (int i = 0; i < samples; ++i) {
      spin_for(delay); // B's worker spins, then sleeps, meanwhile
      stamp = Clock::now();
      to_b.release();
      to_a.acquire();
    }
  }, SpawnOptions{.pin_to_pu = 0});
  a.join();
  b.join();
  return lat;
}

void pin(unsigned cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}
long futex(std::atomic<std::uint32_t>& w, int op, std::uint32_t v) {
  return syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&w), op, v, nullptr, nullptr, 0);
}

// Two pinned threads; the waiter blocks in futex (or spins) on a word.
std::vector<double> thread_wake(bool spin, std::chrono::nanoseconds delay, int samples, unsigned cpu0, unsigned cpu1) {
  std::atomic<std::uint32_t> word{0}, back{0};
  Clock::time_point stamp;
  std::vector<double> lat;
  std::thread waiter([&] {
    pin(cpu1);
    for (int i = 1; i <= samples; ++i) {
      while (word.load(std::memory_order_acquire) != static_cast<std::uint32_t>(i))
        if (!spin) futex(word, FUTEX_WAIT_PRIVATE, static_cast<std::uint32_t>(i - 1));
      lat.push_back(us_since(stamp));
      back.store(static_cast<std::uint32_t>(i), std::memory_order_release);
    }
  });
  pin(cpu0);
  for (int i = 1; i <= samples; ++i) {
    spin_for(delay);
    stamp = Clock::now();
    word.store(static_cast<std::uint32_t>(i), std::memory_order_release);
    if (!spin) futex(word, FUTEX_WAKE_PRIVATE, 1);
    while (back.load(std::memory_order_acquire) != static_cast<std::uint32_t>(i)) {
    }
  }
  waiter.join();
  return lat;
}
} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched-wake-bench: cross-worker wake latency to a spinning and a sleeping worker vs futex"};
  int samples = 2000;
  std::string topology = "core:2 pu:1";
  double sleep_delay_us = 300, spin_delay_us = 1;
  app.add_option("-s,--samples", samples, "wake-ups per measurement")->check(CLI::PositiveNumber);
  app.add_option("--topology", topology, "runtime topology (needs two PUs)");
  app.add_option("--sleep-delay-us", sleep_delay_us, "delay before a wake so the target is asleep")
      ->check(coresched::bench::finite_range(0, 1e6));
  app.add_option("--spin-delay-us", spin_delay_us, "delay before a wake while the target still spins")
      ->check(coresched::bench::finite_range(0, 1e6));
  CLI11_PARSE(app, argc, argv);
  try {
    Options o;
    o.topology = topology;
    Runtime rt(o);
    if (rt.topology().pus().size() < 2) throw std::runtime_error("needs two PUs");
    std::printf("%s\n", rt.topology().describe().c_str());
    const unsigned cpu0 = rt.topology().pus()[0].cpu, cpu1 = rt.topology().pus()[1].cpu;
    using us = std::chrono::duration<double, std::micro>;
    const auto sleep_d = std::chrono::duration_cast<std::chrono::nanoseconds>(us(sleep_delay_us));
    const auto spin_d = std::chrono::duration_cast<std::chrono::nanoseconds>(us(spin_delay_us));
    std::fprintf(stderr, "[wake-bench] measuring...\n");
    const auto fs = pcts(fiber_wake(rt, spin_d, samples));
    const auto fz = pcts(fiber_wake(rt, sleep_d, samples));
    rt.shutdown(); // the threads below get the CPUs to themselves
    const auto ts = pcts(thread_wake(true, spin_d, samples, cpu0, cpu1));
    const auto tz = pcts(thread_wake(false, sleep_d, samples, cpu0, cpu1));
    std::printf("\nwake latency, stamp to woken code running (%d samples, us)\n", samples);
    std::printf("%-44s %8s %8s\n", "", "p50", "p99");
    std::printf("%-44s %8.2f %8.2f\n", "coresched: to a spinning worker", fs.p50, fs.p99);
    std::printf("%-44s %8.2f %8.2f\n", "coresched: to a sleeping worker (io_uring)", fz.p50, fz.p99);
    std::printf("%-44s %8.2f %8.2f\n", "threads: spinning hand-off", ts.p50, ts.p99);
    std::printf("%-44s %8.2f %8.2f\n", "threads: futex ping-pong (sleeping waiter)", tz.p50, tz.p99);
    std::printf("\nspinning p50 %.2f us (target <= 1 us); sleeping/futex p50 ratio %.2f (target <= 1.2)\n", fs.p50,
                fz.p50 / tz.p50);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-wake-bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
