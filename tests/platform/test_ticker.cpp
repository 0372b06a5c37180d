// SPDX-License-Identifier: Apache-2.0
// The slice ticker's period (runtime/platform/ticker.hpp): a quarter slice while
// something waits for a tick, a whole slice while nothing does.
#include "test_support.hpp"
#include "platform/ticker.hpp"

#include <coresched/coresched.hpp>
#include <coresched/io.hpp>
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace std::chrono_literals;
using coresched::detail::Ticker;

namespace {

/// Records the ticks' units; tells whether something waits.
struct Recorder {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<unsigned> units;
  bool waiting = false;
  Ticker::Seen tick(unsigned u) {
    std::lock_guard lk(mu);
    units.push_back(u);
    cv.notify_all();
    return {true, waiting};
  }
  /// Waits for the next tick after `n` ticks; returns its units.
  unsigned next_after(std::size_t n) {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return units.size() > n; });
    return units[n];
  }
  std::size_t count() {
    std::lock_guard lk(mu);
    return units.size();
  }
};

/// Over `window`, after a settling time: the ticker's wake-ups, the quarter
/// slices (2 ms at the tests' 8 ms slice) that passed, and core 0's changes of cookie.
struct Window {
  double ticks, quarters, switches;
};
Window measure(coresched::Runtime& rt, std::chrono::milliseconds window) {
  std::this_thread::sleep_for(100ms); // past the start's hold
  const auto before = rt.stats();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(window);
  const auto after = rt.stats();
  return {static_cast<double>(after.ticks - before.ticks),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0) / 2ms,
          static_cast<double>(after.cores[0].cookie_switches - before.cores[0].cookie_switches)};
}

/// Two CPU-bound fibers pinned to PUs 0 and 1 (each with a cookie of its
/// own if `own_cookies`), measured over `window`.
Window measure_busy_pair(const char* topology, bool own_cookies, std::chrono::milliseconds window) {
  coresched::Options o = test_support::topo(topology);
  o.slice = 8ms;
  coresched::Runtime rt(o);
  std::atomic<bool> stop{false};
  std::vector<coresched::JoinHandle<void>> busy;
  for (unsigned pu = 0; pu < 2; ++pu) {
    coresched::SpawnOptions so;
    so.pin_to_pu = pu;
    if (own_cookies) so.cookie = coresched::Cookie::create();
    busy.push_back(rt.spawn([&] { test_support::busy_until(stop); }, so));
  }
  const Window w = measure(rt, window);
  stop = true;
  for (auto& b : busy) b.join();
  return w;
}

/// Fibers `a` and `b` (each given the stop flag) on one PU with an 8 ms
/// slice, measured over 500 ms.
template <class A, class B> Window measure_two_on_one_pu(A a, B b) {
  coresched::Options o = test_support::topo("core:1 pu:1");
  o.slice = 8ms;
  coresched::Runtime rt(o);
  std::atomic<bool> stop{false};
  auto ha = rt.spawn([&] { a(stop); });
  auto hb = rt.spawn([&] { b(stop); });
  const Window w = measure(rt, 500ms);
  stop = true;
  ha.join();
  hb.join();
  return w;
}

/// Runs `d` without a preemption point.
void spin_for(std::chrono::microseconds d) {
  for (const auto end = std::chrono::steady_clock::now() + d; std::chrono::steady_clock::now() < end;) {
  }
}

} // namespace

TEST_CASE("the ticker turns coarse when nothing waits, and a poke makes it fine at once", "[ticker]") {
  Recorder r;
  Ticker t(4ms, [&](unsigned u) { return r.tick(u); });
  // Fine for the hold after start, then coarse: ticks of four quarter slices.
  std::size_t n = 0;
  while (t.fine()) {
    r.next_after(n++);
    REQUIRE(n < 1000);
  }
  n = r.count(); // (a test thread descheduled for a few ms would read fine ticks of the hold next)
  for (int i = 0; i < 3; ++i) CHECK(r.next_after(n++) >= Ticker::kCoarseUnits);
  // Poked just after a coarse tick, it ticks at the next quarter slice, not
  // a slice later. (Without the early wake-up this tick would come 16 ms on.)
  r.next_after(n++);
  t.poke();
  CHECK(t.fine());
  CHECK(r.next_after(n++) < Ticker::kCoarseUnits);
  // While something waits it stays fine.
  {
    std::lock_guard lk(r.mu);
    r.waiting = true;
  }
  t.poke();
  for (int i = 0; i < 2 * Ticker::kFineHold; ++i) r.next_after(n++);
  CHECK(t.fine());
  t.stop();
}

TEST_CASE("busy workers with nothing queued behind them let the ticker tick once a slice", "[ticker]") {
  // Two single-PU cores, each running one pinned CPU-bound fiber with nothing
  // behind it: the quarter-slice tick has nothing to do there, and on a VM each
  // timer wake-up costs tens of microseconds of CPU. Over 0.5 s with 8 ms
  // slices a fixed quarter-slice ticker wakes ~250 times; the adaptive one
  // ~62 (its hold of 8 quarter slices, then one a slice).
  const auto [ticks, quarters, switches] = measure_busy_pair("core:2 pu:1", false, 500ms);
  INFO("ticks " << ticks << " in " << quarters << " quarter slices");
  CHECK(ticks < 0.5 * quarters);
  CHECK(ticks > 0); // it still ticks: a stall would be seen
}

TEST_CASE("a fiber waiting behind a runner keeps the ticker at the quarter slice", "[ticker]") {
  // One PU, two CPU-bound fibers: each waits behind the other, so every tick
  // may have a slice end to flag.
  coresched::Options o = test_support::topo("core:1 pu:1");
  o.slice = 8ms;
  coresched::Runtime rt(o);
  std::atomic<bool> stop{false};
  auto a = rt.spawn([&] { test_support::busy_until(stop); });
  auto b = rt.spawn([&] { test_support::busy_until(stop); });
  // Every late wake-up of the ticker's thread pushes back the ticks after it,
  // and on a loaded host one window may lose many: the best of up to three
  // (at a coarse period, the mutation this guards against, all three fail).
  double ticks = 0, quarters = 1;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const auto w = measure(rt, 300ms);
    ticks = static_cast<double>(w.ticks);
    quarters = static_cast<double>(w.quarters);
    UNSCOPED_INFO("window " << attempt << ": ticks " << ticks << " in " << quarters << " quarter slices");
    if (ticks > 0.6 * quarters) break;
  }
  stop = true;
  a.join();
  b.join();
  CHECK(ticks > 0.6 * quarters);
}

TEST_CASE("fibers that switch often let the ticker tick once a slice though a run now and then outlasts a tick", "[ticker]") {
  // One PU, two fibers always queued behind each other: A yields in a loop;
  // B yields for 6 ms, then runs 5 ms without a preemption point, and again.
  // Two fine ticks (2 ms apart) that fall inside B's long run see fibers
  // queued and no switch; that needs the next tick a quarter slice on (a
  // slice end to time), but no hold of fine ticks. With the hold (two
  // slices, 16 ms), B's next long run is seen before it ends and the ticker
  // stays fine for good, ~1 tick a quarter slice: how an I/O server's ticker
  // stayed fine while the kernel descheduled its workers. Without it, the
  // runs that switch every few us let it tick once a slice, and no two
  // coarse ticks (8 ms apart) fall inside one 5 ms run.
  const auto w = measure_two_on_one_pu(
      [](const std::atomic<bool>& stop) {
        while (!stop.load(std::memory_order_relaxed)) coresched::this_fiber::yield();
      },
      [](const std::atomic<bool>& stop) {
        while (!stop.load(std::memory_order_relaxed)) {
          for (const auto end = std::chrono::steady_clock::now() + 6ms; std::chrono::steady_clock::now() < end;)
            coresched::this_fiber::yield();
          spin_for(5ms);
        }
      });
  INFO("ticks " << w.ticks << " in " << w.quarters << " quarter slices");
  CHECK(w.ticks < 0.5 * w.quarters);
  CHECK(w.ticks > 0); // a worker with fibers queued is still watched
}

TEST_CASE("fibers whose runs are a fraction of a quarter slice let the ticker tick once a slice", "[ticker]") {
  // One PU, two fibers queued behind each other, each running 1 ms and
  // yielding: two switches a quarter slice (2 ms). Their runs are short
  // beside the slice, so the ticker ticks once a slice. A rule that counted
  // switches against the window (fewer than 8 since the last tick) rather
  // than per quarter would find 2 in each fine window and 8 in each coarse
  // one: coarse would stay coarse, but once fine (its start) it would stay
  // fine for good, ~1 tick a quarter slice.
  const auto run = [](const std::atomic<bool>& stop) {
    while (!stop.load(std::memory_order_relaxed)) {
      spin_for(1ms);
      coresched::this_fiber::yield();
    }
  };
  const auto w = measure_two_on_one_pu(run, run);
  INFO("ticks " << w.ticks << " in " << w.quarters << " quarter slices");
  CHECK(w.ticks < 0.5 * w.quarters);
}

TEST_CASE("a forced-idle sibling ends the owner's turn on time while the ticker ticks once a slice", "[ticker][handover]") {
  // Two cookies, one busy fiber each, pinned to the two siblings of one core:
  // one always waits, forced idle. Its own timer asks the owner to stop when
  // the turn is due (a slice: the granularity each way), so the ticker has
  // nothing to do every quarter slice. With the sibling sleeping through the
  // turn's end instead (no timer), the ticker's once-a-slice fallback would
  // end turns late: 19-23 changes of cookie in 62.5 slices, against 60-61
  // with it, and 43-52 beside a CPU hog (ctest -j2 runs another test beside
  // it, so the bound leaves room for that). Under ASan alone it reads 55-61,
  // but a stall of the VM can take a window's turns. So it takes the best of
  // up to three windows; the mutation above fails all three.
  Window w{};
  for (int attempt = 0; attempt < 3; ++attempt) {
    w = measure_busy_pair("core:1 pu:2", true, 500ms);
    UNSCOPED_INFO("window " << attempt << ": ticks " << w.ticks << " in " << w.quarters << " quarter slices; "
                            << w.switches << " changes of cookie in " << w.quarters / 4 << " slices");
    if (w.ticks < 0.5 * w.quarters && w.switches > 0.55 * w.quarters / 4) break;
  }
  CHECK(w.ticks < 0.5 * w.quarters);
  CHECK(w.switches > 0.55 * w.quarters / 4);
}

TEST_CASE("a cookie arriving beside a core busy with another gets it within a few slices", "[ticker][fairness]") {
  // Cookie A runs a CPU-bound fiber on each sibling of one core, nothing
  // queued, nobody forced idle: the ticker ticks once a slice. A fiber of
  // cookie B then arrives, pinned to sibling 0. B is due half a slice later
  // (the granularity), and only a preemption request from the ticker ends A's
  // turn, so the arrival asks the ticker for its fine period (enqueue_locked).
  // In the model (tests/sim) that bounds the wait at 2 slices; here the
  // ticker's thread competes with the two busy workers for the two CPUs, and
  // 16 arrivals read a median of 0.7-1.4 slices and a worst of 1.8-4.1 (the
  // same without the fine-period request: this checks the promise, the
  // simulation checks the rule). With the ticker's slice-end request removed,
  // B would never start while A runs.
  coresched::Options o = test_support::topo("core:1 pu:2");
  o.slice = 8ms;
  coresched::Runtime rt(o);
  std::atomic<bool> stop{false};
  const coresched::Cookie a = coresched::Cookie::create(), b = coresched::Cookie::create();
  std::vector<coresched::JoinHandle<void>> busy;
  for (unsigned pu = 0; pu < 2; ++pu) {
    coresched::SpawnOptions so;
    so.pin_to_pu = pu;
    so.cookie = a;
    busy.push_back(rt.spawn([&] { test_support::busy_until(stop); }, so));
  }
  // 16 arrivals; B stamps its own start, so the polling thread's wake-up
  // does not count. The best of up to three rounds: one stall of the VM (or
  // of a sanitized build on a loaded host) can stretch one arrival past the
  // bound, while with the slice-end request removed every round fails.
  double median = 0, worst = 0;
  for (int round = 0; round < 3 && !stop; ++round) {
    std::vector<double> slices_waited;
    for (int i = 0; i < 16 && !stop; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(40 + 3 * i)); // past the ticker's hold: coarse again
      coresched::SpawnOptions so;
      so.pin_to_pu = 0;
      so.cookie = b;
      std::atomic<bool> started{false};
      std::chrono::steady_clock::time_point ran;
      const auto t0 = std::chrono::steady_clock::now();
      auto h = rt.spawn([&started, &ran] {
        ran = std::chrono::steady_clock::now();
        started = true;
      }, so);
      while (!started && std::chrono::steady_clock::now() - t0 < 50 * 8ms) std::this_thread::sleep_for(100us);
      if (!started) stop = true; // let B run, so that the test ends
      h.join();
      slices_waited.push_back(std::chrono::duration<double>(ran - t0) / 8ms);
    }
    std::sort(slices_waited.begin(), slices_waited.end());
    median = slices_waited[slices_waited.size() / 2];
    worst = slices_waited.back();
    UNSCOPED_INFO("round " << round << ": slices from arrival to start: median " << median << ", worst " << worst);
    if (median < 2.0 && worst < 8.0) break;
  }
  stop = true;
  for (auto& f : busy) f.join();
  CHECK(median < 2.0);
  CHECK(worst < 8.0);
}

TEST_CASE("I/O in flight beside a runner does not keep the ticker at the quarter slice", "[ticker][io][io_uring]") {
  // One PU: a CPU-bound fiber, and a fiber parked in a read that does not end
  // while the window lasts. The ring raises IORING_SQ_TASKRUN when the read's
  // completion waits, and the runner's next preemption point collects it, so
  // the ticker need not tick for it: once a slice, not every quarter (on this
  // VM each timer wake-up costs the busy CPUs tens of us; an I/O server is
  // always busy with I/O in flight). Kept at the quarter slice, this would
  // read ~1.0 of the quarters. A property of the io_uring backend: epoll
  // raises no flag, and the ticker is how a busy worker learns of events.
  coresched::Options o = test_support::topo("core:1 pu:1");
  o.slice = 8ms;
  o.io_backend = coresched::IoBackend::io_uring;
  coresched::Runtime rt(o);
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::atomic<bool> stop{false};
  auto busy = rt.spawn([&] { test_support::busy_until(stop); });
  auto reader = rt.spawn([&] {
    std::byte b[1];
    return coresched::io::read(fds[0], b).value;
  });
  const auto w = measure(rt, 500ms);
  INFO("ticks " << w.ticks << " in " << w.quarters << " quarter slices");
  const char one = 1;
  REQUIRE(::write(fds[1], &one, 1) == 1);
  CHECK(reader.join() == 1); // and the read still ends while the runner runs
  stop = true;
  busy.join();
  ::close(fds[0]);
  ::close(fds[1]);
  CHECK(w.ticks < 0.5 * w.quarters);
}

TEST_CASE("workers that switch between ticks with fibers queued let the ticker tick once a slice", "[ticker]") {
  // Two single-PU cores, four pinned fibers on each that burn ~10 us and
  // yield: fibers always wait in each queue, but every worker switches many
  // times between two ticks, so no runner has a slice end to flag and no
  // worker idles with a backlog to share. Queued fibers alone do not keep the
  // ticker at the quarter slice: at the default 1 ms slice this workload
  // draws 935 ticks a second, not 3,150.
  coresched::Options o = test_support::topo("core:2 pu:1");
  o.slice = 8ms;
  coresched::Runtime rt(o);
  std::atomic<bool> stop{false};
  std::vector<coresched::JoinHandle<void>> fibers;
  for (unsigned pu = 0; pu < 2; ++pu)
    for (int k = 0; k < 4; ++k)
      fibers.push_back(rt.spawn([&] {
        while (!stop.load(std::memory_order_relaxed)) {
          const auto until = std::chrono::steady_clock::now() + 10us;
          while (std::chrono::steady_clock::now() < until) {}
          coresched::this_fiber::yield();
        }
      }, coresched::SpawnOptions{.pin_to_pu = pu}));
  const auto w = measure(rt, 500ms);
  stop = true;
  for (auto& f : fibers) f.join();
  INFO("ticks " << w.ticks << " in " << w.quarters << " quarter slices");
  CHECK(w.ticks < 0.5 * w.quarters);
}

TEST_CASE("a fiber queued behind a long run that begins among short ones runs within two slices", "[ticker]") {
  // One PU, 8 ms slice. A yields in a loop. B yields for 20 ms (a switch
  // every few us: the ticker ticks once a slice), then runs 40 ms reaching a
  // preemption point every few us but never yielding, and again, five times.
  // The first tick after B's long run begins still sees the short runs'
  // switches; the next, a slice later at most, sees none for a whole slice
  // and asks B to stop. B is charged its cap, kMaxLead (the granularity,
  // fiber_vtime.hpp), which leaves it level with A, whom each yield kept
  // level with the queue's tail; ties go behind, so A runs: one to two slices
  // after the long run began, 12 ms at the median. (A tick landing in A's
  // last short turn would put A ahead and let B keep the PU a slice more:
  // rare, as those turns last microseconds.) A times that first wait of each
  // long run from user code. With the slice end flagged at a second coarse
  // tick instead, the median would be 20 ms; with no flag, 40 ms. The median
  // of the five must stay within two slices and the worst below three (a
  // late tick or a descheduled worker moves one wait, not the median); the
  // best of up to three windows, as a stall of the VM can take one. (Later
  // turns within one long run follow the vtime rule: B keeps the PU while it
  // leads A by less than the granularity.)
  coresched::Options o = test_support::topo("core:1 pu:1");
  o.slice = 8ms;
  coresched::Runtime rt(o);
  constexpr int kLongRuns = 5;
  double median_ms = 0, worst_ms = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::atomic<bool> stop{false};
    std::atomic<int> long_runs{0};
    std::atomic<std::chrono::steady_clock::rep> long_began{0};
    auto a = rt.spawn([&] {
      std::vector<double> waits_ms;
      int seen = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        coresched::this_fiber::yield();
        const int n = long_runs.load(std::memory_order_acquire);
        if (n == seen) continue;
        seen = n; // the first run since B's long run began
        const auto began = std::chrono::steady_clock::time_point(
            std::chrono::steady_clock::duration(long_began.load(std::memory_order_relaxed)));
        waits_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count());
      }
      return waits_ms;
    });
    auto b = rt.spawn([&] {
      for (int cycle = 0; cycle < kLongRuns; ++cycle) {
        for (const auto end = std::chrono::steady_clock::now() + 20ms; std::chrono::steady_clock::now() < end;)
          coresched::this_fiber::yield();
        const auto began = std::chrono::steady_clock::now();
        long_began.store(began.time_since_epoch().count(), std::memory_order_relaxed);
        long_runs.fetch_add(1, std::memory_order_release);
        while (std::chrono::steady_clock::now() < began + 40ms) coresched::this_fiber::preempt_point();
      }
    });
    b.join();
    stop = true;
    std::vector<double> waits = a.join();
    REQUIRE(waits.size() == kLongRuns);
    std::sort(waits.begin(), waits.end());
    median_ms = waits[kLongRuns / 2];
    worst_ms = waits.back();
    UNSCOPED_INFO("window " << attempt << ": first waits of the long runs, median " << median_ms << " ms, worst "
                            << worst_ms << " ms");
    if (median_ms <= 16.0 && worst_ms < 24.0) break;
  }
  CHECK(median_ms <= 16.0);
  CHECK(worst_ms < 24.0);
}
