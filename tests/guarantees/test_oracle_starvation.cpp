// SPDX-License-Identifier: Apache-2.0
// Starvation probes: ways an owner cookie might keep a waiting cookie off a
// core without ever reaching preempt_point(), or a fiber might wait behind
// fibers of its own cookie for ever.
//
// The class of bug they look for: a worker that switches between fibers (so
// the slice tick, Scheduler::tick, sees its switch count move and never asks
// it to stop) without the core's cookie choice being reconsidered
// (CoreCoordinator::pick_locked / choose_cookie). An inline join is one if it
// counts as a switch (test_oracle_handover.cpp's "[starvation]" case). Here the
// owner cookie A keeps every sibling of core 0 busy by the other ways a worker
// switches: fibers ping-ponging through a Semaphore or a Channel (wake-affine
// hand-offs, or cross-sibling ones), a contended Mutex's hand-offs, fibers
// yielding to each other, fibers that sleep on timers between bursts, joins
// of children that block, and detached relays whose successor adopts the
// finished fiber's stack (Worker::fiber_loop). None of A's fibers calls
// preempt_point(). A cookie B, always runnable, must still own core 0 for a
// fair part of the time (Stats::cookie(b).core_ns: about half; checked as
// more than a fifth), and the oracle must see no overlap.
//
// Other cores, where there are any, are kept busy by pinned fillers of A (an
// idle worker there would steal what waits on core 0), and B is pinned to
// core 0 there so that its share is core 0's.
#include "handover_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace coresched;
using namespace guarantees;
using namespace guarantees::handover;
using namespace std::chrono_literals;

namespace {

/// The measuring window of one scenario: not scaled below 300 ms, as B's
/// first run may come tens of ms after its spawn on a loaded, sanitized host
/// (up to 32 ms under TSan on a quiet one), which a 100 ms window could
/// not tell from starvation.
std::chrono::milliseconds window() { return std::chrono::milliseconds(std::max(300, scaled(300))); }

/// A runtime on `spec`, core 0 under study, fillers of A on the other cores.
/// Owner patterns register what releases their blocked fibers at the end.
class Rig {
public:
  explicit Rig(Options o) : h(std::move(o)) {
    pus = pus_of_core(h.rt.topology(), 0);
    multi_core = h.rt.topology().cores().size() > 1;
    for (const auto& core : h.rt.topology().cores())
      if (core.index != 0)
        for (unsigned pu : core.pus) fibers.push_back(spawn_burner(h, stop, a, pu, "filler on another core"));
  }
  ~Rig() { finish(); }
  Rig(const Rig&) = delete;
  Rig& operator=(const Rig&) = delete;

  /// Where owner fibers of A go: pinned to each PU of core 0, or anywhere.
  SpawnOptions owner_opts(unsigned pu, bool pinned) const {
    return SpawnOptions{.cookie = a, .pin_to_pu = pinned ? std::optional<unsigned>(pu) : std::nullopt};
  }
  /// B's placement: core 0's last PU where other cores could take it.
  std::optional<unsigned> waiting_pin() const {
    return multi_core ? std::optional<unsigned>(pus.back()) : std::nullopt;
  }

  /// An always-runnable fiber of `c` (bursts and preemption points); its gaps on `gap`.
  void spawn_waiting(Cookie c, GapMeter& gap, std::optional<unsigned> pin) {
    fibers.push_back(spawn_burner(h, stop, c, pin, "waiting cookie", &gap));
  }
  /// Two fibers of A per PU of core 0 that burn and yield to each other.
  void spawn_yielders(std::atomic<int>& started, bool pinned) {
    for (unsigned pu : pus)
      for (int i = 0; i < 2; ++i)
        fibers.push_back(h.rt.spawn([this, &started] {
          Scope s(h.oracle, a, "yielder");
          started.fetch_add(1);
          while (!stop.load(std::memory_order_relaxed)) {
            s.burn(15us);
            s.yield();
          }
        }, owner_opts(pu, pinned)));
  }

  /// Ends every fiber: stop, release the blocked, join, wait for the relays.
  void finish() {
    if (finished_) return;
    finished_ = true;
    stop.store(true);
    for (auto& u : unblock) u();
    for (auto& f : fibers) f.join();
    fibers.clear();
    (void)wait_for([&] { return detached_live.load() == 0; });
  }

  Harness h;
  const Cookie a = Cookie::create();
  std::vector<unsigned> pus;
  bool multi_core = false;
  std::atomic<bool> stop{false};
  std::atomic<int> detached_live{0};
  std::deque<Semaphore> semaphores;
  std::deque<Channel<int>> channels;
  std::deque<Mutex> mutexes;
  std::vector<std::function<void()>> unblock; // run on the test thread after `stop`
  std::vector<JoinHandle<void>> fibers;

private:
  bool finished_ = false;
};

/// Waits until every one of `n` owner fibers has run once, then lets A hold
/// core 0 alone for a few slices (its fibers come and go, its books age).
void settle(Rig& r, std::atomic<int>& started, int n) {
  REQUIRE(wait_for([&] { return started.load() >= n; }));
  std::this_thread::sleep_for(3 * std::chrono::duration_cast<std::chrono::microseconds>(r.h.rt.options().slice));
}

// --------------------------------------------------------------- owner patterns

/// Two fibers per PU of core 0 pass a token back and forth through a pair of
/// Semaphores (or unbuffered Channels): each wakes the other and blocks.
/// Unpinned, the woken one is placed wake-affine (runnext) on its waker's worker.
void ping_pong(Rig& r, bool channel, bool pinned, std::atomic<int>& started) {
  for (unsigned pu : r.pus) {
    if (channel) {
      Channel<int>* there = &r.channels.emplace_back(0);
      Channel<int>* back = &r.channels.emplace_back(0);
      r.unblock.push_back([there, back] { there->close(); back->close(); });
      r.fibers.push_back(r.h.rt.spawn([&r, there, back, &started] {
        Scope s(r.h.oracle, r.a, "channel ping");
        started.fetch_add(1);
        for (int n = 0; !r.stop.load(std::memory_order_relaxed); ++n) {
          s.burn(10us);
          if (!s.around([&] { return there->send(n); })) break;
          if (!s.around([&] { return back->recv(); })) break;
        }
      }, r.owner_opts(pu, pinned)));
      r.fibers.push_back(r.h.rt.spawn([&r, there, back, &started] {
        Scope s(r.h.oracle, r.a, "channel pong");
        started.fetch_add(1);
        for (;;) {
          const auto v = s.around([&] { return there->recv(); });
          if (!v) break;
          s.burn(10us);
          if (!s.around([&] { return back->send(*v); })) break;
        }
      }, r.owner_opts(pu, pinned)));
    } else {
      Semaphore* ping = &r.semaphores.emplace_back(0);
      Semaphore* pong = &r.semaphores.emplace_back(0);
      r.unblock.push_back([ping, pong] { ping->release(1000); pong->release(1000); });
      r.fibers.push_back(r.h.rt.spawn([&r, ping, pong, &started] {
        Scope s(r.h.oracle, r.a, "semaphore ping");
        started.fetch_add(1);
        while (!r.stop.load(std::memory_order_relaxed)) {
          s.burn(10us);
          pong->release();
          s.around([&] { ping->acquire(); });
        }
      }, r.owner_opts(pu, pinned)));
      r.fibers.push_back(r.h.rt.spawn([&r, ping, pong, &started] {
        Scope s(r.h.oracle, r.a, "semaphore pong");
        started.fetch_add(1);
        while (!r.stop.load(std::memory_order_relaxed)) {
          s.around([&] { pong->acquire(); });
          s.burn(10us);
          ping->release();
        }
      }, r.owner_opts(pu, pinned)));
    }
  }
}

/// Up to three windows (measure_until, handover_support.hpp) until `ok`
/// holds for `c`'s {owned ms, wall ms} in one.
template <class Ok> std::pair<double, double> measure_until(Rig& r, Cookie c, Ok ok, int& windows) {
  const Window w = handover::measure_until(r.h.rt, {c}, window(), [&](const Window& m) {
    return ok(std::pair<double, double>{m.owned_ms[0], m.wall_ms});
  }, windows);
  return {w.owned_ms[0], w.wall_ms};
}

/// Runs one owner scenario and checks B's share of core 0.
void check_waiting_share(Rig& r, std::atomic<int>& started, int owners, const std::string& what) {
  settle(r, started, owners);
  GapMeter gap_b;
  const Cookie b = Cookie::create();
  r.spawn_waiting(b, gap_b, r.waiting_pin());
  int windows = 0;
  const auto [b_ms, wall_ms] =
      measure_until(r, b, [](const std::pair<double, double>& m) { return m.first > 0.2 * m.second; }, windows);
  const double a_ms_total = core_ms(r.h.rt, r.a);
  r.finish();
  INFO(what << ": B owned core 0 for " << b_ms << " ms of " << wall_ms << " ms (" << gap_b.turns.load()
            << " turns, longest gap " << gap_b.max_us.load() << " us, window " << windows << " of up to 3); A owned"
            << " cores for " << a_ms_total << " ms in all");
  CHECK(b_ms > 0.2 * wall_ms);
  CHECK_ISOLATED(r.h);
}

Options base_options(const std::string& spec, FairnessPolicy policy = FairnessPolicy::core_vruntime) {
  Options o = options_for(spec);
  o.slice = 2ms; // a worker descheduled for a whole slice is rarer on this host
  o.policy = policy;
  return o;
}

} // namespace

// ---------------------------------------------------------------------------
// A's fibers never reach a preemption point: they only wake each other and
// block, on every sibling of core 0. Every block is a pick (Worker::park),
// which must weigh B against A each time.
TEST_CASE("a cookie waiting behind owner fibers that ping-pong through semaphores or channels gets the core",
          "[oracle][starvation]") {
  const std::string spec = GUARANTEE_TOPOLOGIES; // "core:1 pu:4": the two-cookie case below
  const bool channel = GENERATE(false, true);
  const bool pinned = GENERATE(false, true);
  const std::string what = spec + (channel ? ", channels" : ", semaphores") + (pinned ? ", pinned pairs" : ", unpinned pairs (wake-affine)");
  INFO(what);
  std::atomic<int> started{0}; // before the rig, which joins the fibers that count it
  Rig r(base_options(spec, channel ? FairnessPolicy::forceidle_balance : FairnessPolicy::core_vruntime));
  ping_pong(r, channel, pinned, started);
  check_waiting_share(r, started, static_cast<int>(2 * r.pus.size()), what);
}

// A contended Mutex hands the lock to the oldest waiter: every unlock wakes a
// fiber, every lock parks. Three fibers of A per PU share one mutex across the
// core (hand-offs cross siblings).
TEST_CASE("a cookie waiting behind owner fibers handing a mutex around gets the core", "[oracle][starvation]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  const auto policy = GENERATE(FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance);
  const std::string what = spec + ", " + to_string(policy);
  INFO(what);
  std::atomic<int> started{0};
  Rig r(base_options(spec, policy));
  auto& m = r.mutexes.emplace_back();
  for (unsigned pu : r.pus)
    for (int i = 0; i < 3; ++i)
      r.fibers.push_back(r.h.rt.spawn([&r, &m, &started] {
        Scope s(r.h.oracle, r.a, "mutex contender");
        started.fetch_add(1);
        while (!r.stop.load(std::memory_order_relaxed)) {
          s.around([&] { m.lock(); });
          s.burn(15us);
          m.unlock();
          s.burn(2us);
        }
      }, r.owner_opts(pu, i == 0)));
  check_waiting_share(r, started, static_cast<int>(3 * r.pus.size()), what);
}

// Two fibers of A per PU that only yield to each other: each yield is a
// reschedule through the core's pick (reschedule_shared), never a preemption
// point of the slice.
TEST_CASE("a cookie waiting behind owner fibers that yield to each other gets the core", "[oracle][starvation]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  const bool pinned = GENERATE(false, true);
  const std::string what = spec + (pinned ? ", pinned" : ", unpinned");
  INFO(what);
  std::atomic<int> started{0};
  Rig r(base_options(spec));
  r.spawn_yielders(started, pinned);
  check_waiting_share(r, started, static_cast<int>(2 * r.pus.size()), what);
}

// Fibers of A that burn and sleep on a timer (io::sleep_until through the
// worker's ring), three per PU, so A always has one runnable: completions
// are reaped on busy workers (poll_io at the next pick) and wake A's fibers
// while B waits.
TEST_CASE("a cookie waiting behind owner fibers that sleep on timers between bursts gets the core",
          "[oracle][starvation]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  const auto policy = GENERATE(FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance);
  const std::string what = spec + ", " + to_string(policy);
  INFO(what);
  std::atomic<int> started{0};
  Rig r(base_options(spec, policy));
  for (unsigned pu : r.pus)
    for (int i = 0; i < 3; ++i)
      r.fibers.push_back(r.h.rt.spawn([&r, &started, i] {
        Scope s(r.h.oracle, r.a, "timer sleeper");
        started.fetch_add(1);
        while (!r.stop.load(std::memory_order_relaxed)) {
          s.burn(std::chrono::microseconds(30 + 10 * i));
          s.sleep_for(std::chrono::microseconds(20 + 15 * i));
        }
      }, r.owner_opts(pu, i == 0)));
  check_waiting_share(r, started, static_cast<int>(3 * r.pus.size()), what);
}

// A's fibers spawn a child and join it; the child blocks (a short timer
// sleep, or a yield), so the inline join cannot finish without a switch: the
// child parks or reschedules on the joiner's stack, and the joiner resumes
// beneath it wherever the child finishes.
TEST_CASE("a cookie waiting behind owner fibers whose joined children block gets the core",
          "[oracle][starvation]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  const bool child_sleeps = GENERATE(false, true);
  const std::string what = spec + (child_sleeps ? ", children sleep" : ", children yield");
  INFO(what);
  std::atomic<int> started{0};
  Rig r(base_options(spec));
  for (unsigned pu : r.pus)
    r.fibers.push_back(r.h.rt.spawn([&r, &started, child_sleeps] {
      Scope s(r.h.oracle, r.a, "joiner");
      started.fetch_add(1);
      while (!r.stop.load(std::memory_order_relaxed)) {
        s.burn(15us);
        auto child = s.around([&] {
          return coresched::spawn([&r, child_sleeps] {
            Scope cs(r.h.oracle, r.a, "blocking child");
            cs.burn(5us);
            if (child_sleeps) cs.sleep_for(10us);
            else cs.yield();
            cs.burn(5us);
          });
        });
        s.join(child);
      }
    }, r.owner_opts(pu, true)));
  check_waiting_share(r, started, static_cast<int>(r.pus.size()), what);
}

// Detached relays: each fiber of A burns, spawns its successor and ends; the
// successor has never run, so it is adopted onto the finished fiber's stack
// (Worker::fiber_loop) right after the pick. Two chains per PU.
namespace {
struct Relay {
  Rig* r;
  void operator()() const {
    {
      Scope s(r->h.oracle, r->a, "relay");
      s.burn(25us);
    }
    if (r->stop.load(std::memory_order_relaxed)) {
      r->detached_live.fetch_sub(1);
      return;
    }
    coresched::spawn(Relay{r}, SpawnOptions{.detached = true}); // the chain's count moves with it
  }
};
} // namespace

TEST_CASE("a cookie waiting behind owner relays whose successors adopt their stacks gets the core",
          "[oracle][starvation]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  const auto policy = GENERATE(FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance);
  const std::string what = spec + ", " + to_string(policy);
  INFO(what);
  std::atomic<int> started{0};
  Rig r(base_options(spec, policy));
  for (unsigned pu : r.pus)
    for (int i = 0; i < 2; ++i) {
      r.detached_live.fetch_add(1);
      r.fibers.push_back(r.h.rt.spawn([&r, &started] {
        started.fetch_add(1);
        coresched::spawn(Relay{&r}, SpawnOptions{.detached = true});
      }, r.owner_opts(pu, true)));
    }
  check_waiting_share(r, started, static_cast<int>(2 * r.pus.size()), what);
}

// Two waiting cookies, B and C, behind A's ping-pong pairs: each should own
// core 0 about a third of the time (checked as more than a tenth).
TEST_CASE("two cookies waiting behind owner ping-pong pairs each get the core", "[oracle][starvation]") {
  const std::string spec = GENERATE(as<std::string>{}, "core:1 pu:2", "core:2 pu:2", "core:1 pu:4");
  const auto policy = GENERATE(FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance);
  const std::string what = spec + ", " + to_string(policy);
  INFO(what);
  GapMeter gap_b, gap_c; // before the rig, which joins the fibers that note them
  std::atomic<int> started{0};
  Rig r(base_options(spec, policy));
  ping_pong(r, false, false, started);
  settle(r, started, static_cast<int>(2 * r.pus.size()));
  const Cookie b = Cookie::create(), c = Cookie::create();
  r.spawn_waiting(b, gap_b, r.waiting_pin());
  r.spawn_waiting(c, gap_c, r.waiting_pin());
  // From their first runs on (either may start tens of ms late on a loaded,
  // sanitized host), in up to three windows.
  REQUIRE(wait_for([&] { return gap_b.turns.load() > 0 && gap_c.turns.load() > 0; }, 10s));
  int windows = 0;
  const Window w = handover::measure_until(r.h.rt, {b, c}, window(), [](const Window& m) {
    return m.owned_ms[0] > 0.1 * m.wall_ms && m.owned_ms[1] > 0.1 * m.wall_ms;
  }, windows);
  const double b_ms = w.owned_ms[0], c_ms = w.owned_ms[1], wall_ms = w.wall_ms;
  r.finish();
  INFO("B owned core 0 for " << b_ms << " ms, C for " << c_ms << " ms, of " << wall_ms << " ms (window " << windows
                             << " of up to 3); longest gaps " << gap_b.max_us.load() << " / " << gap_c.max_us.load()
                             << " us");
  CHECK(b_ms > 0.1 * wall_ms);
  CHECK(c_ms > 0.1 * wall_ms);
  CHECK_ISOLATED(r.h);
}

// Within one cookie: an always-runnable fiber X of A shares its PU with a
// pair of A's fibers ping-ponging wake-affine on it (woken fibers are placed
// up to the sleeper credit behind the PU's floor, and may preempt). X must
// still run: about a third of its PU (checked as more than a twentieth of
// the wall time), and never wait for hundreds of slices.
TEST_CASE("a fiber beside a wake-affine ping-pong pair of its own cookie is not starved", "[oracle][starvation]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  const bool pinned = GENERATE(false, true);
  INFO(spec << (pinned ? ", pair pinned with X" : ", pair unpinned"));
  GapMeter gap_x; // before the rig, which joins X
  std::atomic<long> x_burned_us{0};
  std::atomic<int> started{0};
  Rig r(base_options(spec));
  // A pair on every PU of core 0 (so no sibling idles to steal X), and X
  // pinned to core 0's first PU.
  ping_pong(r, false, pinned, started);
  settle(r, started, static_cast<int>(2 * r.pus.size()));
  r.fibers.push_back(r.h.rt.spawn([&r, &gap_x, &x_burned_us] {
    Scope s(r.h.oracle, r.a, "always-runnable X");
    Clock::time_point last{};
    while (!r.stop.load(std::memory_order_relaxed)) {
      gap_x.note(last);
      s.burn(20us);
      x_burned_us.fetch_add(20);
      s.preempt_point();
    }
  }, SpawnOptions{.cookie = r.a, .pin_to_pu = r.pus.front()}));
  REQUIRE(wait_for([&] { return gap_x.turns.load() > 0; }, 10s));
  const long x0 = x_burned_us.load();
  gap_x.max_us.store(0);
  const auto w0 = Clock::now();
  std::this_thread::sleep_for(window());
  const double x_ms = static_cast<double>(x_burned_us.load() - x0) / 1000.0;
  const double wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - w0).count();
  const long max_gap_us = gap_x.max_us.load();
  r.finish();
  INFO("X burned " << x_ms << " ms of " << wall_ms << " ms; longest gap " << max_gap_us << " us");
  // X's burn counts its worker's CPU time, which the host's other threads
  // share (four workers on two CPUs in "core:2 pu:2"): 8-30 %, never 0.
  CHECK(x_ms > 0.02 * wall_ms);
  CHECK_ISOLATED(r.h);
}

// Several cores, all busy with A's ping-pong pairs (unpinned), and B unpinned:
// B may be placed, stolen or rescued to any core, and each core that receives
// it places it at its own floor. Wherever it goes it must own some core a
// fair part of the time (Stats::cookie(b).core_ns sums over the cores).
TEST_CASE("an unpinned waiting cookie on cores all busy with owner ping-pong pairs gets a core",
          "[oracle][starvation]") {
  // (SMT cores only: single-PU cores keep no ownership books.)
  const std::string spec = "core:2 pu:2";
  const auto policy = GENERATE(FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance);
  const std::string what = spec + ", " + to_string(policy);
  INFO(what);
  std::atomic<int> started{0};
  Options o = base_options(spec, policy);
  Harness h(o);
  const Cookie a = Cookie::create(), b = Cookie::create();
  std::atomic<bool> stop{false};
  std::deque<Semaphore> sems;
  std::vector<JoinHandle<void>> fibers;
  GapMeter gap_b;
  const auto npu = static_cast<unsigned>(h.rt.topology().pus().size());
  for (unsigned i = 0; i < npu; ++i) {
    Semaphore* ping = &sems.emplace_back(0);
    Semaphore* pong = &sems.emplace_back(0);
    fibers.push_back(h.rt.spawn([&, ping, pong] {
      Scope s(h.oracle, a, "semaphore ping");
      started.fetch_add(1);
      while (!stop.load(std::memory_order_relaxed)) {
        s.burn(10us);
        pong->release();
        s.around([&] { ping->acquire(); });
      }
    }, SpawnOptions{.cookie = a}));
    fibers.push_back(h.rt.spawn([&, ping, pong] {
      Scope s(h.oracle, a, "semaphore pong");
      started.fetch_add(1);
      while (!stop.load(std::memory_order_relaxed)) {
        s.around([&] { pong->acquire(); });
        s.burn(10us);
        ping->release();
      }
    }, SpawnOptions{.cookie = a}));
  }
  auto finish = [&] {
    stop.store(true);
    for (auto& s : sems) s.release(1000);
    for (auto& f : fibers) f.join();
    fibers.clear();
  };
  if (!wait_for([&] { return started.load() == static_cast<int>(2 * npu); })) {
    finish();
    FAIL("A's fibers did not all start");
  }
  std::this_thread::sleep_for(3 * o.slice);
  fibers.push_back(spawn_burner(h, stop, b, std::nullopt, "waiting cookie", &gap_b));
  if (!wait_for([&] { return gap_b.turns.load() > 0; }, 10s)) {
    finish();
    FAIL("B never ran");
  }
  int windows = 0;
  const Window w = handover::measure_until(h.rt, {b}, window(), [](const Window& m) {
    return m.owned_ms[0] > 0.2 * m.wall_ms;
  }, windows);
  const double b_ms = w.owned_ms[0], wall_ms = w.wall_ms;
  finish();
  INFO("B owned cores for " << b_ms << " ms of " << wall_ms << " ms (" << gap_b.turns.load() << " turns, longest gap "
                            << gap_b.max_us.load() << " us, window " << windows << " of up to 3)");
  CHECK(b_ms > 0.2 * wall_ms);
  CHECK_ISOLATED(h);
}

// A cookie whose one fiber sleeps briefly between bursts (runnable about half
// the time when alone) beside A's always-runnable yielders on every sibling:
// a request tenant beside a compute tenant. It asks for half the core and
// should get most of that. Placed level with the owner at each wake-up (no
// sleeper credit), B would wait out the hysteresis (half a slice) at every
// burst and own 8-17 % of core 0; with the sleeper credit and wake-up
// preemption between cookies (CoreCoordinator::place, preempt_owner_for) it
// owns 34-47 %. Beside owner fibers that never yield but
// reach a preemption point every 20 us (burners), B's timer completion is
// collected at the burner's next preemption point (IORING_SQ_TASKRUN), and a
// wake-up inside the owner's least turn hands over when that ends
// (choose_cookie's kept_until, pick_locked): B owns 35-40 % there too.
// The check: B's work beside A over its work alone on core 0 in as long
// (timer latencies and the host's share of CPU included): yielders 0.97-1.0
// (core:1 pu:2) and 0.54-0.75 (core:2 pu:2), burners 0.99-1.0 and
// 0.40-0.50; without the credit it would read 0.15-0.20 and 0.07-0.09.
// Beside burners on core:1 pu:2 it would read 0.09 with wake-ups in a young
// turn left to the tick, and 0.22-0.28 without the owner's request to pick
// again: both under the bound.
TEST_CASE("a cookie that sleeps between bursts beside busy owner fibers gets most of what it asks",
          "[oracle][starvation]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  const auto policy = GENERATE(FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance);
  const bool burners = GENERATE(false, true);
  const std::string what = spec + ", " + to_string(policy) + (burners ? ", owner burners" : ", owner yielders");
  INFO(what);
  std::atomic<int> started{0};
  GapMeter gap_b;
  std::atomic<long> b_burned_us{0};
  Rig r(base_options(spec, policy));
  const Cookie b = Cookie::create();
  r.fibers.push_back(r.h.rt.spawn([&r, b, &gap_b, &b_burned_us] {
    Scope s(r.h.oracle, b, "sleepy cookie");
    Clock::time_point last{};
    while (!r.stop.load(std::memory_order_relaxed)) {
      gap_b.note(last);
      s.burn(100us);
      b_burned_us.fetch_add(100);
      s.sleep_for(100us);
    }
  }, SpawnOptions{.cookie = b, .pin_to_pu = r.waiting_pin()}));
  // What B does alone on core 0 is its demand here, timer latencies included
  // (in the emulated SMT guest a cycle of B takes ~4x as long as on the host).
  REQUIRE(wait_for([&] { return b_burned_us.load() > 0; }));
  const long alone0 = b_burned_us.load();
  std::this_thread::sleep_for(window());
  const double alone_ms = static_cast<double>(b_burned_us.load() - alone0) / 1000.0;
  if (burners) {
    for (unsigned pu : r.pus) r.fibers.push_back(spawn_burner(r.h, r.stop, r.a, pu, "owner burner"));
    settle(r, started, 0);
  } else {
    r.spawn_yielders(started, true);
    settle(r, started, static_cast<int>(2 * r.pus.size()));
  }
  // Four workers share two CPUs on core:2 pu:2, and beside burners B's work
  // there reads 0.40-0.50 of alone: too close to call, so that case is
  // checked against starvation only.
  const bool check_share = share_checks() && !(burners && r.multi_core);
  const double bound = burners ? 0.6 : 0.35;
  long burned0 = b_burned_us.load();
  double burned_ms = 0;
  int windows = 0;
  const auto [b_ms, wall_ms] = measure_until(r, b, [&](const std::pair<double, double>&) {
    burned_ms = static_cast<double>(b_burned_us.load() - burned0) / 1000.0;
    burned0 = b_burned_us.load();
    return !check_share || burned_ms > bound * alone_ms;
  }, windows);
  r.finish();
  INFO("alone, B burned " << alone_ms << " ms of " << window().count() << " ms; beside A it owned core 0 for " << b_ms
                          << " ms of " << wall_ms << " ms, burned " << burned_ms << " ms in " << gap_b.turns.load()
                          << " bursts (longest gap " << gap_b.max_us.load() << " us; window " << windows
                          << " of up to 3)");
  // Not starved. In the 2-core SMT guest (tests/vm), B's burners case owns
  // only a few %, the host's CPUs its vCPUs' to give.
  CHECK(b_ms > (burners ? 0.005 : 0.02) * wall_ms);
  REQUIRE(alone_ms > 0);
  if (check_share) CHECK(burned_ms > bound * alone_ms);
  CHECK_ISOLATED(r.h);
}
