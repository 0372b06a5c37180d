// SPDX-License-Identifier: Apache-2.0
// A fiber queued behind a runner that reaches no preemption point, while every
// other worker is busy with fibers that do: the ticker moves it to a worker
// that switches (Scheduler::rescue_queued, runtime/sched/rescue.cpp). Measured from
// user code: when and where the queued fiber started.
#include "test_support.hpp"

#include <coresched/coresched.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

using namespace coresched;
using namespace std::chrono_literals;
using test_support::busy_until;
using test_support::topo;
using Clock = std::chrono::steady_clock;

namespace {

// A runner's stall is the point of these tests: not reported.
Options without_stall_reports(const char* topology) {
  Options o = topo(topology);
  o.stall_threshold = 0ms;
  return o;
}

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
  Runtime rt(without_stall_reports(topology));
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

// Core 1 of `core:2 pu:2` busy with fibers of `cookie` that reach
// preemption points all along, until stop(): the rescue's target.
struct BusyCore1 {
  BusyCore1(Runtime& rt, Cookie cookie) {
    for (unsigned pu : {2u, 3u})
      fibers.push_back(rt.spawn([this] {
        started.fetch_add(1);
        busy_until(stopping);
      }, SpawnOptions{.cookie = cookie, .pin_to_pu = pu}));
  }
  // A failed REQUIRE must not leave the busy fibers running: the handles'
  // destructors would wait for them for ever.
  ~BusyCore1() { stop(); }
  bool running() const { return started.load() == 2; }
  void stop() { stopping.store(true); }
  void join() {
    for (auto& h : fibers) h.join();
  }
  std::atomic<bool> stopping{false};
  std::atomic<int> started{0};
  std::vector<JoinHandle<void>> fibers;
};

double ms_since(Clock::time_point from, const std::atomic<Clock::rep>& to) {
  const Clock::time_point t{Clock::duration{to.load()}};
  return std::chrono::duration<double, std::milli>(t - from).count();
}

} // namespace

// Without the rescue, C would wait for A's whole run (300 ms). With it,
// about a slice and a half.
TEST_CASE("a fiber queued behind a runner without preemption points moves to a busy worker that switches",
          "[rescue]") {
  constexpr auto kRun = 300ms;
  const char* topology = GENERATE("core:2 pu:1", "core:1 pu:2");
  const Outcome r = queued_behind_stuck_runner(topology, kRun, false);
  INFO(topology << ": C waited " << r.waited_ms << " ms and ran on worker " << r.ran_on);
  CHECK(r.ran_on == 1);
  CHECK(r.waited_ms < 100.0);
}

namespace {

// A fiber pinned to `busy_pu` (of `busy_cookie`) runs with preemption points
// all along; a runner pinned to `runner_pu` (of `runner_cookie`) waits until
// it runs and `settle` more, spawns C, and spins for `run` without a
// preemption point. When, after its spawn, and where C started.
Outcome spawned_behind_stuck_runner(const Options& o, unsigned busy_pu, Cookie busy_cookie, unsigned runner_pu,
                                    Cookie runner_cookie, std::chrono::milliseconds settle) {
  constexpr auto kRun = 300ms;
  Runtime rt(o);
  std::atomic<bool> stop{false}, busy_started{false};
  std::atomic<Clock::rep> started{0};
  std::atomic<unsigned> ran_on{~0u};
  auto busy = rt.spawn([&] {
    busy_started.store(true);
    busy_until(stop);
  }, SpawnOptions{.cookie = busy_cookie, .pin_to_pu = busy_pu});
  Clock::time_point spawned;
  std::optional<JoinHandle<void>> c;
  rt.spawn([&] {
    while (!busy_started.load()) this_fiber::yield();
    this_fiber::sleep_for(settle);
    spawned = Clock::now();
    c = spawn([&] {
      started.store(Clock::now().time_since_epoch().count());
      ran_on.store(this_fiber::location().worker);
    });
    const auto until = Clock::now() + kRun;
    while (Clock::now() < until) {
    } // no preemption point
  }, SpawnOptions{.cookie = runner_cookie, .pin_to_pu = runner_pu}).join();
  c->join();
  stop.store(true);
  busy.join();
  return {ms_since(spawned, started), ran_on.load()};
}

} // namespace

// A spawns C and then runs without a preemption point; B keeps worker 1
// busy, so no worker is idle. C waits on worker 0's spawn ring, which the
// rescue drains. A spawn kept on the worker's private queue, which only that
// worker can reach, would wait A's whole run.
TEST_CASE("a fiber spawned by a runner that then reaches no preemption point moves to a busy worker that switches",
          "[rescue]") {
  const Outcome r = spawned_behind_stuck_runner(without_stall_reports("core:2 pu:1"), 1, Cookie{}, 0, Cookie{}, 0ms);
  INFO("C started " << r.waited_ms << " ms after its spawn, on worker " << r.ran_on);
  CHECK(r.ran_on == 1);
  CHECK(r.waited_ms < 100.0);
}

// A mixed topology (core 0: PUs 0 and 1; cores 1 and 2: one PU each). PU 0
// runs cookie X with preemption points; on PU 2 a fiber of cookie Y spawns C
// and spins without a preemption point; PUs 1 and 3 idle. The tick's backlog
// rule must wake PU 3, which can take C, not PU 1, which may run only X beside
// PU 0. Woken instead, PU 1 would count the backlog as shared, and C would
// wait all 300 ms.
TEST_CASE("a runner's spawn is taken by an idle worker that can run its cookie, not by an SMT sibling that cannot",
          "[rescue]") {
  Options o = without_stall_reports("");
  o.topology = CORESCHED_TEST_DATA "/1pkg-smt2-core-2-single-cores.xml";
  const Outcome r = spawned_behind_stuck_runner(o, 0, Cookie::create(), 2, Cookie::create(), 5ms); // PUs 1, 3 asleep
  INFO("C started " << r.waited_ms << " ms after its spawn, on worker " << r.ran_on);
  CHECK(r.ran_on == 3);
  CHECK(r.waited_ms < 100.0);
}

TEST_CASE("a pinned fiber queued behind a runner without preemption points stays and waits", "[rescue]") {
  constexpr auto kRun = 100ms;
  const Outcome r = queued_behind_stuck_runner("core:2 pu:1", kRun, true);
  INFO("C waited " << r.waited_ms << " ms and ran on worker " << r.ran_on);
  CHECK(r.ran_on == 0);
  CHECK(r.waited_ms >= 100.0);
}

// The case a global "is anyone idle" check gets wrong. On core 0, A's runner
// spins without a preemption point on PU 0, and PU 1 is idle; core 1 runs B
// fibers with preemption points on both PUs. C, of cookie B, is woken by the
// runner: no idle PU can run B (core 0 runs A), so it waits on the waker's
// worker, behind the runner. PU 1 counts as idle but cannot take it (not while
// A runs beside it), and no worker of another core is idle to steal it.
// Gated on Scheduler::idle_hint(), the rescue would stand aside and C wait
// the whole 300 ms.
TEST_CASE("a fiber queued behind a stuck runner beside an idle sibling that cannot run it moves to another core",
          "[rescue]") {
  constexpr auto kRun = 300ms;
  Runtime rt(without_stall_reports("core:2 pu:2"));
  const Cookie a = Cookie::create(), b = Cookie::create();
  std::atomic<bool> c_waits{false};
  Semaphore go;
  Clock::time_point woken;
  std::atomic<Clock::rep> started{0};
  std::atomic<unsigned> ran_on{~0u};
  BusyCore1 busy(rt, b);
  auto c = rt.spawn([&] {
    c_waits.store(true);
    go.acquire();
    started.store(Clock::now().time_since_epoch().count());
    ran_on.store(this_fiber::location().worker);
  }, SpawnOptions{.cookie = b});
  rt.spawn([&] {
    while (!busy.running() || !c_waits.load()) this_fiber::yield();
    this_fiber::sleep_for(2ms); // C has parked by now
    woken = Clock::now();
    go.release();
    const auto until = Clock::now() + kRun;
    while (Clock::now() < until) {
    } // no preemption point
    busy.stop();
  }, SpawnOptions{.cookie = a, .pin_to_pu = 0}).join();
  c.join();
  busy.join();
  const double waited_ms = ms_since(woken, started);
  INFO("C waited " << waited_ms << " ms and ran on worker " << ran_on.load());
  CHECK(ran_on.load() >= 2);
  CHECK(waited_ms < 100.0);
}

// A fiber of cookie B queued on the sibling beside the stuck runner: on core
// 0, A's runner spins without a preemption point on PU 0 and PU 1 is forced
// idle (it may run only A while the runner holds the core); core 1 runs B
// fibers with preemption points on both PUs. C, of cookie B, last ran on PU 1
// and is woken from a plain thread, so it is queued there, waiting for core
// 0's change of cookie at the runner's next switch. The rescue takes it off
// the forced-idle sibling's queue to core 1. Looking only at the runner's
// own queue, it would leave C waiting the whole 300 ms.
TEST_CASE("a fiber of another cookie queued on a forced-idle sibling of a stuck runner moves to another core",
          "[rescue]") {
  constexpr auto kRun = 300ms;
  Runtime rt(without_stall_reports("core:2 pu:2"));
  const Cookie a = Cookie::create(), b = Cookie::create();
  BusyCore1 busy(rt, b);
  // C parks on PU 1. PU 0 shares core 0's queue, so while it idles it may
  // take C first: a fiber of B pinned there spins without a preemption point
  // until C has parked (with PU 0 idle, under ASan C parks elsewhere, most
  // likely taken by PU 0). Where C parks is still up to the runtime (a thief on
  // core 1 may take it), so the set-up is tried until it parks on PU 1.
  Semaphore go;
  std::atomic<unsigned> parked_on{~0u}, ran_on{~0u};
  std::atomic<Clock::rep> started{0};
  std::optional<JoinHandle<void>> c;
  for (int attempt = 0; attempt < 50 && parked_on.load() != 1; ++attempt) {
    if (c) {
      go.release();
      c->join();
    }
    parked_on = ~0u;
    std::atomic<bool> blocking{false}, unblock{false};
    auto blocker = rt.spawn([&] {
      blocking.store(true);
      while (!unblock.load()) {
      } // no preemption point: PU 0 cannot take C
    }, SpawnOptions{.cookie = b, .pin_to_pu = 0});
    while (!blocking.load()) std::this_thread::sleep_for(100us);
    rt.spawn([&] {
      c = spawn([&] {
        parked_on.store(this_fiber::location().worker);
        go.acquire();
        started.store(Clock::now().time_since_epoch().count());
        ran_on.store(this_fiber::location().worker);
      }, SpawnOptions{.cookie = b}); // queued on core 0, run on PU 1 once this fiber ends
    }, SpawnOptions{.cookie = b, .pin_to_pu = 1}).join();
    for (int i = 0; i < 1000 && parked_on.load() == ~0u; ++i) std::this_thread::sleep_for(1ms);
    unblock.store(true);
    blocker.join();
  }
  if (parked_on.load() != 1) { // end C (and, by ~BusyCore1, the busy fibers) rather than hang in their joins
    go.release();
    if (c) c->join();
    FAIL("C never parked on PU 1 in 50 tries (last: worker " << parked_on.load() << ")");
  }
  std::atomic<bool> spinning{false};
  auto runner = rt.spawn([&] {
    spinning.store(true);
    const auto until = Clock::now() + kRun;
    while (Clock::now() < until) {
    } // no preemption point
    busy.stop();
  }, SpawnOptions{.cookie = a, .pin_to_pu = 0});
  while (!spinning.load() || !busy.running()) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(2ms);
  const Clock::time_point woken = Clock::now();
  go.release(); // from this thread: no wake-affine placement, C goes back to PU 1
  runner.join();
  c->join();
  busy.join();
  const double waited_ms = ms_since(woken, started);
  INFO("C waited " << waited_ms << " ms and ran on worker " << ran_on.load());
  CHECK(ran_on.load() >= 2);
  CHECK(waited_ms < 100.0);
}
