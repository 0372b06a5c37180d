// SPDX-License-Identifier: Apache-2.0
// A fiber queued behind a runner that reaches no preemption point, while every
// other worker is busy with fibers that do: the ticker moves it to a worker
// that switches (Scheduler::rescue_queued, runtime/rescue.cpp). Measured from
// user code: when and where the queued fiber started.
#include "test_support.hpp"

#include <coresched/coresched.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>

using namespace coresched;
using namespace std::chrono_literals;
using test_support::busy_until;
using test_support::topo;
using Clock = std::chrono::steady_clock;

namespace {

struct Outcome {
  double waited_ms = 0;     // from C's wake-up to C's start
  unsigned ran_on = 0;      // C's worker
};

// C waits on a semaphore. A, pinned to worker 0, wakes it and then spins for
// `run` without a preemption point; B, pinned to worker 1, runs a CPU-bound
// loop with preemption points all along, so no worker is ever idle. C is
// queued on worker 0 behind A (woken by a running fiber of its cookie, it is
// placed on its waker's worker to run next: wake-affine placement).
Outcome queued_behind_stuck_runner(const char* topology, std::chrono::milliseconds run, bool pin_c) {
  Options o = topo(topology);
  o.stall_threshold = 0ms; // A's stall is the point of the test
  Runtime rt(o);
  std::atomic<bool> stop{false};
  std::atomic<bool> b_started{false}, c_waits{false};
  Semaphore go;
  Clock::time_point woken;
  std::atomic<Clock::rep> started{0};
  std::atomic<unsigned> ran_on{~0u};
  SpawnOptions so;
  if (pin_c) so.pin_to_pu = 0;
  auto c = rt.spawn([&] {
    c_waits.store(true);
    go.acquire();
    started.store(Clock::now().time_since_epoch().count());
    ran_on.store(this_fiber::location().worker);
  }, so);
  auto b = rt.spawn([&] {
    b_started.store(true);
    busy_until(stop);
  }, SpawnOptions{.pin_to_pu = 1});
  rt.spawn([&] {
    while (!b_started.load() || !c_waits.load()) this_fiber::yield();
    this_fiber::sleep_for(2ms); // C has parked by now
    woken = Clock::now();
    go.release();
    const auto until = Clock::now() + run;
    while (Clock::now() < until) {
    } // no preemption point
    stop.store(true);
  }, SpawnOptions{.pin_to_pu = 0}).join();
  c.join();
  b.join();
  const Clock::time_point t{Clock::duration{started.load()}};
  return {std::chrono::duration<double, std::milli>(t - woken).count(), ran_on.load()};
}

} // namespace

// Without the rescue, C waited for A's whole run: 300 ms of 300 (checked by
// taking the call out of Scheduler::tick). With it, about a slice and a half.
TEST_CASE("a fiber queued behind a runner without preemption points moves to a busy worker that switches",
          "[rescue]") {
  constexpr auto kRun = 300ms;
  const char* topology = GENERATE("core:2 pu:1", "core:1 pu:2");
  const Outcome r = queued_behind_stuck_runner(topology, kRun, false);
  INFO(topology << ": C waited " << r.waited_ms << " ms and ran on worker " << r.ran_on);
  CHECK(r.ran_on == 1);
  CHECK(r.waited_ms < 100.0);
}

TEST_CASE("a pinned fiber queued behind a runner without preemption points stays and waits", "[rescue]") {
  constexpr auto kRun = 100ms;
  const Outcome r = queued_behind_stuck_runner("core:2 pu:1", kRun, true);
  INFO("C waited " << r.waited_ms << " ms and ran on worker " << r.ran_on);
  CHECK(r.ran_on == 0);
  CHECK(r.waited_ms >= 100.0);
}
