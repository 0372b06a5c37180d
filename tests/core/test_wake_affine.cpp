// SPDX-License-Identifier: Apache-2.0
// Wake-affine placement: a fiber woken by a running fiber
// of its cookie waits on the waker's worker, and neither a waker that blocks
// nor one that runs on is made to pay for it. Measured from user code: where
// each fiber ran and when.
#include "core/affine_grace.hpp"
#include "test_support.hpp"

#include <coresched/coresched.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <tuple>
#include <utility>

using namespace coresched;
using test_support::topo;
using Clock = std::chrono::steady_clock;

namespace {

void spin_for(std::chrono::microseconds d, bool preempt_points) {
  const auto until = Clock::now() + d;
  while (Clock::now() < until)
    if (preempt_points) this_fiber::preempt_point();
}

double ms_since(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(t - t0).count();
}

} // namespace

namespace {

// A wakes B and blocks, 200 times, on two single-PU cores: how many times B
// ran on the worker its waker had just run on. With `run_on_us`, A first runs
// on for that long (with preemption points) before it blocks.
int wakes_on_wakers_worker(Options o, int rounds, int run_on_us = 0) {
  Runtime rt(o);
  Semaphore to_b, to_a;
  std::atomic<unsigned> waker_worker{~0u};
  std::atomic<int> same{0};
  auto b = rt.spawn([&] {
    for (int i = 0; i < rounds; ++i) {
      to_b.acquire();
      if (this_fiber::location().worker == waker_worker.load()) same.fetch_add(1);
      to_a.release();
    }
  });
  rt.spawn([&] {
    for (int i = 0; i < rounds; ++i) {
      spin_for(std::chrono::microseconds(50), false); // B is parked by now
      waker_worker.store(this_fiber::location().worker);
      to_b.release();
      if (run_on_us > 0) spin_for(std::chrono::microseconds(run_on_us), true);
      to_a.acquire();
    }
  }).join();
  b.join();
  return same.load();
}

} // namespace

TEST_CASE("a fiber woken by a fiber of its cookie that then blocks runs on the waker's worker", "[affine]") {
  // Without wake-affine placement B goes back to its own idle worker, or to
  // whichever is idle: about half of 200 match.
  constexpr int kRounds = 200;
  const int same = wakes_on_wakers_worker(topo("core:2 pu:1"), kRounds);
  INFO("B ran on its waker's worker " << same << " of " << kRounds << " times");
  CHECK(same >= kRounds * 9 / 10);
}

TEST_CASE("Options::wake_affine = false and CORESCHED_WAKE_AFFINE=0 turn wake-affine placement off", "[affine]") {
  constexpr int kRounds = 200;
  Options o = topo("core:2 pu:1");
  o.wake_affine = false;
  // A runs on for 1 ms after each wake-up, so its worker is busy while B is
  // placed and woken: B then runs where it was placed. (When A blocks at
  // once, its worker, going idle, often steals B from the other one, whose
  // vCPU is still waking up, with the option off too.) B runs on A's worker
  // 0-32 of 200 times with the option honoured, 115-191 with the check in
  // affine_worker removed (B waits on A's worker and runs
  // there when A reaches a preemption point, unless a thief takes it first).
  // Up to three tries: a vCPU slow to wake lets A's worker go idle and steal
  // B now and then; the missing check reads high in every try.
  int same = kRounds, tries = 0;
  while (tries < 3 && same >= kRounds / 2) {
    same = wakes_on_wakers_worker(o, kRounds, 1000);
    ++tries;
  }
  INFO("B ran on its waker's worker " << same << " of " << kRounds << " times (try " << tries << " of up to 3)");
  CHECK(same < kRounds / 2);
  ::setenv("CORESCHED_WAKE_AFFINE", "0", 1);
  CHECK_FALSE(Runtime(topo("core:2 pu:1")).options().wake_affine);
  ::setenv("CORESCHED_WAKE_AFFINE", "1", 1);
  CHECK(Runtime(topo("core:2 pu:1")).options().wake_affine);
  ::setenv("CORESCHED_WAKE_AFFINE", "yes", 1);
  CHECK_THROWS_AS(Runtime(topo("core:2 pu:1")), UsageError);
  ::unsetenv("CORESCHED_WAKE_AFFINE");
}

TEST_CASE("a waker that runs on without a preemption point does not keep the fiber it woke waiting", "[affine]") {
  // B waits on A's worker while A spins 60 ms with no preemption point and the
  // other worker sleeps. The slice tick's backlog rule wakes that worker to
  // steal B: without that rule it would start 60 ms late.
  // Up to three tries (one sample each; a stall of the host can take one):
  // without the rule B starts 60 ms late in every one.
  auto one_try = [] {
    Runtime rt(topo("core:2 pu:1"));
    Semaphore to_b;
    std::atomic<bool> b_parked{false};
    Clock::time_point released, started;
    auto b = rt.spawn([&] {
      b_parked.store(true);
      to_b.acquire();
      started = Clock::now();
    });
    rt.spawn([&] {
      while (!b_parked.load()) this_fiber::yield();
      spin_for(std::chrono::microseconds(2000), false); // B has parked
      released = Clock::now();
      to_b.release();
      spin_for(std::chrono::microseconds(60'000), false);
    }).join();
    b.join();
    return ms_since(released, started);
  };
  double late = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    late = one_try();
    UNSCOPED_INFO("try " << attempt << ": B started " << late << " ms after its wake-up");
    if (late < 30.0) break;
  }
  CHECK(late < 30.0);
}

TEST_CASE("a waker that runs on with preemption points shares the work with an idle worker at once", "[affine]") {
  // A wakes B onto its own worker and runs on (preempt_point, as cooperative
  // code does) for 40 ms; B then spins 40 ms too. They must run side by side
  // on the two workers within 10 ms, not only after the backlog rule of a
  // slice tick (a quarter slice: 25 ms here) finds them queued.
  // One try is one sample inside a 40 ms window: a try during which the
  // workers' threads waited 5 ms or more for a CPU (the host ran something
  // else) is run again, up to twice. A quiet miss is not retried: without
  // the rule B lands at a tick of random phase, under 10 ms in ~40 % of tries.
  auto one_try = [] {
    Options o = topo("core:2 pu:1");
    o.slice = std::chrono::microseconds(100'000);
    Runtime rt(o);
    const std::uint64_t waited_before = test_support::workers_runqueue_wait_ns();
    Semaphore to_b;
    std::atomic<bool> b_parked{false}, a_running{false};
    std::atomic<unsigned> a_worker{~0u};
    Clock::time_point released;
    std::atomic<double> apart_after_ms{-1};
    auto b = rt.spawn([&] {
      b_parked.store(true);
      to_b.acquire();
      const auto until = Clock::now() + std::chrono::milliseconds(40);
      while (Clock::now() < until) {
        if (apart_after_ms.load() < 0 && a_running.load() && a_worker.load() != this_fiber::location().worker)
          apart_after_ms.store(ms_since(released, Clock::now()));
        this_fiber::preempt_point();
      }
    });
    rt.spawn([&] {
      while (!b_parked.load()) this_fiber::yield();
      spin_for(std::chrono::microseconds(2000), false);
      released = Clock::now();
      a_worker.store(this_fiber::location().worker);
      a_running.store(true);
      to_b.release();
      const auto until = Clock::now() + std::chrono::milliseconds(40);
      while (Clock::now() < until) {
        a_worker.store(this_fiber::location().worker);
        this_fiber::preempt_point();
      }
      a_running.store(false);
    }).join();
    b.join();
    const double waited_ms = static_cast<double>(test_support::workers_runqueue_wait_ns() - waited_before) / 1e6;
    return std::pair<double, double>{apart_after_ms.load(), waited_ms};
  };
  double apart = -1, waited_ms = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::tie(apart, waited_ms) = one_try();
    UNSCOPED_INFO("try " << attempt << ": A and B first ran on different workers " << apart
                         << " ms after the wake-up (-1: never); the workers waited " << waited_ms << " ms for a CPU");
    if ((apart >= 0 && apart < 10.0) || waited_ms < 5) break;
  }
  CHECK(apart >= 0);
  CHECK(apart < 10.0);
}

TEST_CASE("a thief leaves a core's one wake-affine fiber alone for the grace, then takes it", "[affine]") {
  using coresched::detail::AffineGrace;
  AffineGrace g(2);
  g.new_attempt();
  CHECK(g.allows(0, 0, 1)); // no wake-affine placement there yet
  CHECK(g.allows(0, 3, 2)); // a backlog: always
  CHECK_FALSE(g.refused());
  CHECK_FALSE(g.allows(0, 3, 1)); // a placement it has not seen: wait
  CHECK(g.refused());             // (a thief about to sleep spins on instead)
  CHECK(g.allows(1, 0, 1));       // other cores are unaffected
  std::this_thread::sleep_for(std::chrono::nanoseconds(2 * AffineGrace::kGraceNs));
  g.new_attempt();
  CHECK(g.allows(0, 3, 1)); // waited long enough
  CHECK_FALSE(g.refused());
  CHECK_FALSE(g.allows(0, 4, 1)); // a newer placement: wait again
}
