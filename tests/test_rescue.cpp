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
#include <vector>

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

// The case a global "is anyone idle" check got wrong. On core 0, A's runner
// spins without a preemption point on PU 0, and PU 1 is idle; core 1 runs B
// fibers with preemption points on both PUs. C, of cookie B, is woken by the
// runner: no idle PU can run B (core 0 runs A), so it waits on the waker's
// worker, behind the runner. PU 1 counts as idle but cannot take it (not while
// A runs beside it), and no worker of another core is idle to steal it.
// Gated on Scheduler::idle_hint(), the rescue stood aside and C waited the
// whole 300 ms (seen: 300 ms of 300, three runs).
TEST_CASE("a fiber queued behind a stuck runner beside an idle sibling that cannot run it moves to another core",
          "[rescue]") {
  constexpr auto kRun = 300ms;
  Options o = topo("core:2 pu:2");
  o.stall_threshold = 0ms;
  Runtime rt(o);
  const Cookie a = Cookie::create(), b = Cookie::create();
  std::atomic<bool> stop{false};
  std::atomic<int> busy_started{0};
  std::atomic<bool> c_waits{false};
  Semaphore go;
  Clock::time_point woken;
  std::atomic<Clock::rep> started{0};
  std::atomic<unsigned> ran_on{~0u};
  std::vector<JoinHandle<void>> busy;
  for (unsigned pu : {2u, 3u})
    busy.push_back(rt.spawn([&] {
      busy_started.fetch_add(1);
      busy_until(stop);
    }, SpawnOptions{.cookie = b, .pin_to_pu = pu}));
  auto c = rt.spawn([&] {
    c_waits.store(true);
    go.acquire();
    started.store(Clock::now().time_since_epoch().count());
    ran_on.store(this_fiber::location().worker);
  }, SpawnOptions{.cookie = b});
  rt.spawn([&] {
    while (busy_started.load() < 2 || !c_waits.load()) this_fiber::yield();
    this_fiber::sleep_for(2ms); // C has parked by now
    woken = Clock::now();
    go.release();
    const auto until = Clock::now() + kRun;
    while (Clock::now() < until) {
    } // no preemption point
    stop.store(true);
  }, SpawnOptions{.cookie = a, .pin_to_pu = 0}).join();
  c.join();
  for (auto& h : busy) h.join();
  const Clock::time_point t{Clock::duration{started.load()}};
  const double waited_ms = std::chrono::duration<double, std::milli>(t - woken).count();
  INFO("C waited " << waited_ms << " ms and ran on worker " << ran_on.load());
  CHECK(ran_on.load() >= 2);
  CHECK(waited_ms < 100.0);
}
