// SPDX-License-Identifier: Apache-2.0
// The ticker's rescue (runtime/sched/rescue.cpp) moves queued fibers to other
// workers and between the sibling queues of one core, from a thread that is
// not a worker. Whatever it moves must still run only under its own cookie and
// only beside its own cookie. Checked by the oracle while the rescue is made to
// happen: runners of every cookie that reach no preemption point for three
// slices, fibers woken by semaphores that queue behind them, and every worker
// kept busy by rivals (with a worker idle, the rescue stands aside).
#include "harness.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

using namespace coresched;
using namespace guarantees;
using namespace std::chrono_literals;

TEST_CASE("fibers the rescue moves keep cookies apart", "[oracle][rescue]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const Cookie a = Cookie::create(), b = Cookie::create();
  const std::vector<Cookie> cookies{Cookie{}, a, b};
  h.start_rivals({Cookie{}, a, b});
  std::atomic<bool> stop{false};
  std::atomic<long> woken_ran{0};
  std::vector<JoinHandle<void>> fibers;
  constexpr int kSleepersPerCookie = 3;
  std::vector<std::unique_ptr<Semaphore>> sems;
  for (std::size_t i = 0; i < cookies.size() * kSleepersPerCookie; ++i) sems.push_back(std::make_unique<Semaphore>(0));
  for (std::size_t ci = 0; ci < cookies.size(); ++ci) {
    const Cookie c = cookies[ci];
    // A runner that keeps its PU for three slices at a time.
    fibers.push_back(h.rt.spawn([&, c] {
      Scope s(h.oracle, c, "stuck runner");
      while (!stop.load()) {
        s.burn(3ms);
        s.yield();
      }
    }, SpawnOptions{.cookie = c}));
    // Fibers that wait on their semaphore, run a little, and wait again.
    for (int k = 0; k < kSleepersPerCookie; ++k) {
      Semaphore& sem = *sems[ci * kSleepersPerCookie + static_cast<std::size_t>(k)];
      fibers.push_back(h.rt.spawn([&, c] {
        Scope s(h.oracle, c, "woken");
        for (;;) {
          s.around([&] { sem.acquire(); });
          if (stop.load()) break;
          s.burn(30us);
          woken_ran.fetch_add(1);
        }
      }, SpawnOptions{.cookie = c}));
    }
    // Their waker, of the same cookie: wakes each of them now and then.
    fibers.push_back(h.rt.spawn([&, c, ci] {
      Scope s(h.oracle, c, "waker");
      while (!stop.load()) {
        for (int k = 0; k < kSleepersPerCookie; ++k) sems[ci * kSleepersPerCookie + static_cast<std::size_t>(k)]->release();
        s.burn(50us);
        s.sleep_for(300us);
      }
      for (int k = 0; k < kSleepersPerCookie; ++k) sems[ci * kSleepersPerCookie + static_cast<std::size_t>(k)]->release();
    }, SpawnOptions{.cookie = c}));
  }
  // The rescue is timing-bound: a sanitized build on a loaded host may move
  // few fibers in 300 ms, or none. So the run lasts its time and
  // then goes on, up to 20 times as long, until the rescue has moved one.
  auto rescued_so_far = [&] {
    std::uint64_t n = 0;
    for (const auto& w : h.rt.stats().workers) n += w.rescued;
    return n;
  };
  const auto run_for = std::chrono::milliseconds(std::max(200, scaled(1500)));
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(run_for);
  while (rescued_so_far() == 0 && std::chrono::steady_clock::now() - start < 20 * run_for)
    std::this_thread::sleep_for(10ms);
  stop.store(true);
  for (auto& f : fibers) f.join();
  h.stop_rivals();
  const std::uint64_t rescued = rescued_so_far();
  INFO("rescued " << rescued << ", woken fibers ran " << woken_ran.load() << " times");
  CHECK(rescued > 0);
  CHECK(woken_ran.load() > 0);
  CHECK_ISOLATED(h);
}
