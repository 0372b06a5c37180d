// SPDX-License-Identifier: Apache-2.0
// coresched-io-beside-bench: a CPU-bound runner and two fibers that pass a
// byte back and forth through two pipes, all on one PU, against the same on
// kernel threads pinned to one CPU, in one run. Reports the runner's work
// beside the ping-pong over its work alone, and the round trips a second:
// how the scheduler splits a CPU between a runner and I/O that wakes often.
//
// Fibers: a one-worker runtime (`core:1 pu:1`), io::write / io::read, the
// runner reaching a preemption point every few hundred nanoseconds. Threads:
// write(2) / read(2), the runner without preemption points (the kernel
// preempts it).
#include "json_rounds.hpp"

#include <coresched/coresched.hpp>
#include <coresched/io.hpp>

#include "../cli_finite.hpp"

#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <pthread.h>
#include <sched.h>
#include <string>
#include <thread>
#include <unistd.h>

namespace {
using Clock = std::chrono::steady_clock;
using namespace coresched;

struct Split {
  double work_alone = 0, work_beside = 0, round_trips = 0; // per second
};

inline void work_step(std::atomic<long>& work) {
  std::uint64_t x = 1;
  for (int i = 0; i < 200; ++i) x = x * 6364136223846793005ull + 1;
  asm volatile("" : : "r"(x));
  work.fetch_add(1, std::memory_order_relaxed);
}

/// Runs `measure` over `seconds` twice: the runner alone, then beside the
/// ping-pong `start_pingpong()` starts.
template <class StartPingPong> Split windows(std::atomic<long>& work, std::atomic<long>& trips, double seconds,
                                             StartPingPong start_pingpong) {
  const auto window = std::chrono::duration<double>(seconds);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  long w0 = work.load();
  std::this_thread::sleep_for(window);
  Split s;
  s.work_alone = static_cast<double>(work.load() - w0) / seconds;
  start_pingpong();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  w0 = work.load();
  const long t0 = trips.load();
  std::this_thread::sleep_for(window);
  s.work_beside = static_cast<double>(work.load() - w0) / seconds;
  s.round_trips = static_cast<double>(trips.load() - t0) / seconds;
  return s;
}

Split fibers(double seconds) {
  Options o;
  o.topology = "core:1 pu:1";
  Runtime rt(o);
  int ab[2], ba[2];
  if (::pipe(ab) != 0 || ::pipe(ba) != 0) throw std::runtime_error("pipe failed");
  std::atomic<bool> stop{false};
  std::atomic<long> work{0}, trips{0};
  auto runner = rt.spawn([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      work_step(work);
      this_fiber::preempt_point();
    }
  });
  JoinHandle<void> ping, pong;
  const Split s = windows(work, trips, seconds, [&] {
    ping = rt.spawn([&] {
      std::byte b[1]{};
      while (!stop.load() && io::write(ab[1], b) && io::read(ba[0], b).value == 1) trips.fetch_add(1);
    });
    pong = rt.spawn([&] {
      std::byte b[1]{};
      while (io::read(ab[0], b).value == 1 && io::write(ba[1], b)) {}
    });
  });
  stop = true;
  ::close(ab[1]);
  ::close(ba[1]);
  ping.join();
  pong.join();
  runner.join();
  ::close(ab[0]);
  ::close(ba[0]);
  return s;
}

void pin_to_cpu0() {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

Split threads(double seconds) {
  int ab[2], ba[2];
  if (::pipe(ab) != 0 || ::pipe(ba) != 0) throw std::runtime_error("pipe failed");
  std::atomic<bool> stop{false};
  std::atomic<long> work{0}, trips{0};
  std::thread runner([&] {
    pin_to_cpu0();
    while (!stop.load(std::memory_order_relaxed)) work_step(work);
  });
  std::thread ping, pong;
  const Split s = windows(work, trips, seconds, [&] {
    ping = std::thread([&] {
      pin_to_cpu0();
      char c = 1;
      while (!stop.load() && ::write(ab[1], &c, 1) == 1 && ::read(ba[0], &c, 1) == 1) trips.fetch_add(1);
    });
    pong = std::thread([&] {
      pin_to_cpu0();
      char c;
      while (::read(ab[0], &c, 1) == 1 && ::write(ba[1], &c, 1) == 1) {}
    });
  });
  stop = true;
  ::close(ab[1]);
  ::close(ba[1]);
  ping.join();
  pong.join();
  runner.join();
  ::close(ab[0]);
  ::close(ba[0]);
  return s;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched-io-beside-bench: a CPU-bound runner beside an I/O ping-pong on one PU, fibers against "
               "kernel threads"};
  double seconds = 1.0;
  unsigned rounds = 2;
  std::string json_path;
  app.add_option("--seconds", seconds, "each measured window (alone, then beside)")->check(coresched::bench::finite_range(0.05, 60.0));
  app.add_option("--rounds", rounds, "rounds, fibers and threads alternated")->check(CLI::Range(1u, 100u));
  app.add_option("--json", json_path, "also write every round's figures as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  JsonRounds json(json_path, "coresched-io-beside-bench");
  if (!json.ok()) return 1;
  std::printf("# a runner and a pipe ping-pong on one CPU; %g s windows\n", seconds);
  std::printf("%-8s %5s %16s %16s %12s %14s\n", "way", "round", "work alone /s", "work beside /s", "of alone",
              "round trips/s");
  json.parameters("\"seconds\": %g", seconds);
  try {
    for (unsigned r = 0; r < rounds; ++r)
      for (const char* way : {"fibers", "threads"}) {
        const Split s = std::string(way) == "fibers" ? fibers(seconds) : threads(seconds);
        const double ratio = s.work_alone > 0 ? s.work_beside / s.work_alone : 0;
        std::printf("%-8s %5u %16.0f %16.0f %12.3f %14.0f\n", way, r + 1, s.work_alone, s.work_beside, ratio,
                    s.round_trips);
        std::fflush(stdout);
        json.round("\"way\": \"%s\", \"round\": %u, \"work_alone_per_s\": %.0f, \"work_beside_per_s\": %.0f, "
                   "\"work_ratio\": %.4f, \"round_trips_per_s\": %.0f",
                   way, r + 1, s.work_alone, s.work_beside, ratio, s.round_trips);
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-io-beside-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
