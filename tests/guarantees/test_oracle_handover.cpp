// SPDX-License-Identifier: Apache-2.0
// Oracle scenarios around the core's hand-over (forced_idle.cpp,
// worker_idle.cpp, ticker.cpp, rescue.cpp): a sibling forced idle behind the
// owner cookie that goes on running the owner's own fibers (woken onto it,
// pinned to it) while other cookies wait; its timer for the owner's turn end;
// Options::handover_spin; the ticker stopping and restarting as a hand-over is
// due; set_cookie storms over more cookies than a core keeps books for;
// shutdown while a sibling is forced idle; exceptions held across waits on
// those paths. Most scenarios are random programs drawn from a seed (printed
// on failure; CORESCHED_HANDOVER_SEED=<n> reruns one seed), which also draws
// the options: fairness policy, handover_spin, slice and wake_affine.
//
// Besides isolation (the oracle), the scenarios check that no cookie starves:
// "eventually" checks run until the event is seen, with a generous cap, and
// the few time bounds are hundreds of slices, far above any wait a fair
// scheduler gives on a loaded, sanitized 2-CPU host.
#include "handover_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace coresched;
using namespace guarantees;
using namespace guarantees::handover;
using namespace std::chrono_literals;

// ---------------------------------------------------------------------------
// A random program around the forced-idle sibling that runs the owner's own
// fibers: runners of the owner cookie A and of B keep a core contended (one of
// its siblings forced idle much of the time); sleepers of A, one pinned to
// every PU and some unpinned, wait by every means (sleep_for, io::sleep_until,
// Semaphore, Event, Channel), each woken by a fiber of another cookie or by a
// plain thread, and so wake onto forced-idle siblings; some wait inside a catch
// block or while unwinding; some change cookie after waking, or join a child
// inline. Meanwhile a plain thread spawns short fibers of a third cookie C
// (pinned or not) and releases sleepers itself.
TEST_CASE("random programs: owner fibers wake onto forced-idle siblings while a third cookie arrives",
          "[oracle][handover]") {
  const std::string spec = GENERATE(as<std::string>{}, "core:1 pu:2", "core:2 pu:2", "core:1 pu:4");
  const std::uint64_t seed = GENERATE_COPY(from_range(seeds(101 + topology_salt(spec))));
  std::mt19937_64 rng(seed);
  std::string opts_text;
  Options opts = drawn_options(spec, rng, opts_text);
  INFO(spec << ", seed " << seed << ", " << opts_text);
  Harness h(opts);
  const unsigned npu = static_cast<unsigned>(h.rt.topology().pus().size());
  const Cookie a = Cookie::create(), b = Cookie::create(), c = Cookie::create();
  const std::vector<Cookie> pool{a, b, c, Cookie{}, Cookie::create()};
  std::atomic<bool> stop{false};
  std::atomic<int> wrong_exception{0}, wrong_uncaught{0}, wrong_cookie{0};
  GapMeter gap_a, gap_b;

  // Runners: always runnable, so their gaps are time spent waiting.
  std::vector<JoinHandle<void>> fibers;
  auto runner = [&](Cookie ck, GapMeter& gm, std::uint64_t rseed, std::optional<unsigned> pin) {
    fibers.push_back(h.rt.spawn([&, ck, rseed] {
      std::mt19937_64 r(rseed);
      Scope s(h.oracle, ck, "runner");
      Clock::time_point last{};
      while (!stop.load(std::memory_order_relaxed)) {
        gm.note(last);
        s.burn(std::chrono::microseconds(10 + r() % 70));
        if (r() % 8 == 0) s.yield();
        else s.preempt_point();
      }
    }, SpawnOptions{.cookie = ck, .pin_to_pu = pin}));
  };
  const unsigned n_a = 1 + static_cast<unsigned>(rng() % npu), n_b = 1 + static_cast<unsigned>(rng() % 2);
  for (unsigned i = 0; i < n_a; ++i)
    runner(a, gap_a, rng(), rng() % 2 ? std::optional<unsigned>(static_cast<unsigned>(rng() % npu)) : std::nullopt);
  for (unsigned i = 0; i < n_b; ++i)
    runner(b, gap_b, rng(), rng() % 3 == 0 ? std::optional<unsigned>(static_cast<unsigned>(rng() % npu)) : std::nullopt);

  // Sleepers of A: one pinned to each PU, plus two unpinned.
  struct Waits {
    Semaphore sem{0};
    Event ev;
    Channel<int> ch{4};
  };
  const unsigned n_sleepers = npu + 2;
  std::vector<std::unique_ptr<Waits>> waits;
  for (unsigned i = 0; i < n_sleepers; ++i) waits.push_back(std::make_unique<Waits>());
  std::atomic<long> sleeper_rounds{0};
  std::vector<std::atomic<long>> rounds_of(n_sleepers);
  std::atomic<unsigned> sleepers_done{0};
  struct SwitchInDtor {
    Scope& s;
    std::atomic<int>& bad;
    int kind;
    ~SwitchInDtor() {
      const int before = std::uncaught_exceptions();
      if (kind == 0) s.sleep_for(30us);
      else s.around([&] { (void)io::sleep_until(Clock::now() + 30us); });
      if (std::uncaught_exceptions() != before || before != 1) bad.fetch_add(1);
    }
  };
  for (unsigned i = 0; i < n_sleepers; ++i) {
    const std::optional<unsigned> pin = i < npu ? std::optional<unsigned>(i) : std::nullopt;
    fibers.push_back(h.rt.spawn([&, i, rseed = rng()] {
      std::mt19937_64 r(rseed);
      Waits& w = *waits[i];
      Scope s(h.oracle, a, "sleeper of the owner");
      auto wait_once = [&](int kind) {
        switch (kind) {
        case 0: s.sleep_for(std::chrono::microseconds(20 + r() % 300)); break;
        case 1: {
          const auto res = s.around([&] { return io::sleep_until(Clock::now() + std::chrono::microseconds(20 + r() % 300)); });
          (void)res;
          break;
        }
        case 2: s.around([&] { w.sem.acquire(); }); break;
        case 3:
          s.around([&] { w.ev.wait(); });
          w.ev.reset();
          break;
        default: (void)s.around([&] { return w.ch.recv(); }); break;
        }
      };
      for (long n = 0; !stop.load(std::memory_order_relaxed); ++n) {
        const int kind = static_cast<int>(r() % 5);
        const std::uint64_t tag = static_cast<std::uint64_t>(i) << 32 | static_cast<std::uint64_t>(n);
        switch (r() % 4) {
        case 0: // inside a catch block: the exception must survive the wait
          try {
            throw Tagged{tag};
          } catch (const Tagged& e) {
            wait_once(kind);
            if (e.tag != tag || !current_is(tag)) wrong_exception.fetch_add(1);
            try {
              throw;
            } catch (const Tagged& again) {
              if (again.tag != tag || !current_is(tag)) wrong_exception.fetch_add(1);
            }
            if (!current_is(tag)) wrong_exception.fetch_add(1);
          }
          if (std::current_exception()) wrong_exception.fetch_add(1);
          break;
        case 1: // while unwinding: uncaught_exceptions() must survive the wait
          try {
            SwitchInDtor d{s, wrong_uncaught, static_cast<int>(r() % 2)};
            throw Tagged{tag};
          } catch (const Tagged& e) {
            if (e.tag != tag) wrong_exception.fetch_add(1);
          }
          if (std::uncaught_exceptions() != 0 || std::current_exception()) wrong_exception.fetch_add(1);
          break;
        default: wait_once(kind); break;
        }
        s.burn(std::chrono::microseconds(5 + r() % 50));
        switch (r() % 6) {
        case 0: { // a cookie change right after the wake-up, and back
          const Cookie to = pool[r() % pool.size()];
          s.set_cookie(to);
          if (this_fiber::cookie() != to) wrong_cookie.fetch_add(1);
          s.burn(std::chrono::microseconds(5 + r() % 30));
          s.set_cookie(a);
          if (this_fiber::cookie() != a) wrong_cookie.fetch_add(1);
          break;
        }
        case 1: { // a child joined at once (inline), of the same cookie
          auto child = s.around([&] {
            return coresched::spawn([&] {
              Scope cs(h.oracle, a, "inline child of a sleeper");
              cs.burn(5us);
            });
          });
          s.join(child);
          break;
        }
        default: break;
        }
        sleeper_rounds.fetch_add(1, std::memory_order_relaxed);
        rounds_of[i].fetch_add(1, std::memory_order_relaxed);
      }
      sleepers_done.fetch_add(1);
    }, SpawnOptions{.cookie = a, .pin_to_pu = pin}));
  }
  auto wake_all = [&](std::mt19937_64& r, bool all) {
    for (auto& w : waits) {
      if (!all && r() % 2) continue;
      w->sem.release();
      w->ev.set();
      (void)w->ch.try_send(1);
    }
  };
  // Wakers of B and C: sleepers of A woken by other cookies' fibers.
  for (const Cookie wc : {b, c})
    fibers.push_back(h.rt.spawn([&, wc, rseed = rng()] {
      std::mt19937_64 r(rseed);
      Scope s(h.oracle, wc, "waker");
      while (!stop.load(std::memory_order_relaxed)) {
        wake_all(r, false);
        s.burn(std::chrono::microseconds(5 + r() % 30));
        s.sleep_for(std::chrono::microseconds(50 + r() % 300));
      }
    }, SpawnOptions{.cookie = wc}));

  // The plain thread: arrivals of C, and wake-ups of its own.
  std::vector<JoinHandle<void>> arrivals;
  std::atomic<int> arrived_ran{0};
  std::atomic<long> arrival_wait_max_us{0};
  const auto run_for = std::chrono::milliseconds(std::max(80, scaled(250)));
  const auto until = Clock::now() + run_for;
  while (Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::microseconds(100 + rng() % 400));
    wake_all(rng, false);
    if (rng() % 2) {
      const auto t0 = Clock::now();
      const std::optional<unsigned> pin =
          rng() % 2 ? std::optional<unsigned>(static_cast<unsigned>(rng() % npu)) : std::nullopt;
      arrivals.push_back(h.rt.spawn([&, t0, burns = 1 + rng() % 3] {
        const auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
        long prev = arrival_wait_max_us.load();
        while (us > prev && !arrival_wait_max_us.compare_exchange_weak(prev, us)) {
        }
        Scope s(h.oracle, c, "arrival of a third cookie");
        for (unsigned k = 0; k < burns; ++k) {
          s.burn(20us);
          s.preempt_point();
        }
        arrived_ran.fetch_add(1);
      }, SpawnOptions{.cookie = c, .pin_to_pu = pin}));
    }
  }
  // Every arrival runs while the runners still compete (a starved cookie never would).
  const int n_arrivals = static_cast<int>(arrivals.size());
  const bool arrivals_ran = wait_for([&] { return arrived_ran.load() == n_arrivals; }, 20s);
  const double a_ms = core_ms(h.rt, a), b_ms = core_ms(h.rt, b);
  stop.store(true);
  // Sleepers blocked on a semaphore, event or channel need one last wake-up.
  const bool sleepers_ended = wait_for([&] {
    for (auto& w : waits) {
      w->sem.release();
      w->ev.set();
      (void)w->ch.try_send(1);
    }
    return sleepers_done.load() == n_sleepers;
  }, 20s);
  if (!sleepers_ended) {
    // A sleeper that never ends would keep the joins below waiting until the
    // suite's timeout: show where every fiber waits, and end the run now.
    h.rt.dump(stderr);
    std::fprintf(stderr, "FAILED: %d of %d sleepers ended within 20 s of the stop\n", sleepers_done.load(), n_sleepers);
    std::abort();
  }
  for (auto& f : fibers) f.join();
  for (auto& f : arrivals) f.join();
  INFO("sleeper rounds " << sleeper_rounds.load() << ", arrivals " << n_arrivals << ", slowest arrival start "
                         << arrival_wait_max_us.load() << " us; longest runner gaps A " << gap_a.max_us.load()
                         << " us, B " << gap_b.max_us.load() << " us; core time A " << a_ms << " ms, B " << b_ms
                         << " ms");
  CHECK(arrivals_ran);
  CHECK(wrong_exception.load() == 0);
  CHECK(wrong_uncaught.load() == 0);
  CHECK(wrong_cookie.load() == 0);
  for (unsigned i = 0; i < n_sleepers; ++i) CHECK(rounds_of[i].load() > 0);
  CHECK(gap_a.turns.load() > 0);
  CHECK(gap_b.turns.load() > 0);
  // Both cookies held a core: neither was shut out (each had a runner runnable throughout).
  CHECK(b_ms > 0.05 * a_ms);
  CHECK(a_ms > 0.05 * b_ms);
  // No always-runnable runner waited a thousand slices.
  const long bound_us = 1000 * static_cast<long>(opts.slice.count());
  CHECK(gap_a.max_us.load() < bound_us);
  CHECK(gap_b.max_us.load() < bound_us);
  CHECK_ISOLATED(h);
}

// ---------------------------------------------------------------------------
// A forced-idle sibling that goes on with the owner's own fiber, made to
// happen every time: on core 0, one runner of A on each sibling but the last;
// the last sibling has a sleeper of A pinned to it, which wakes every few
// hundred microseconds, so that sibling, forced idle behind A while B waits,
// goes on with A's own fiber and then does not time A's turn. B must still
// get core 0 in turns, under both fairness policies, with
// and without handover_spin.
TEST_CASE("a forced-idle sibling that runs the owner's woken fiber does not starve the waiting cookie",
          "[oracle][handover]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  const bool spin = GENERATE(false, true);
  const auto policy = GENERATE(FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance);
  INFO(spec << ", handover_spin " << spin << ", policy " << to_string(policy));
  Options o = options_for(spec);
  o.handover_spin = spin;
  o.policy = policy;
  Harness h(o);
  const auto pus = pus_of_core(h.rt.topology(), 0);
  const Cookie a = Cookie::create(), b = Cookie::create();
  std::atomic<bool> stop{false};
  GapMeter gap_b;
  std::atomic<long> sleeper_rounds{0};
  std::vector<JoinHandle<void>> fibers;
  for (std::size_t i = 0; i + 1 < pus.size(); ++i)
    fibers.push_back(h.rt.spawn([&] {
      Scope s(h.oracle, a, "owner runner");
      while (!stop.load(std::memory_order_relaxed)) {
        s.burn(30us);
        s.preempt_point();
      }
    }, SpawnOptions{.cookie = a, .pin_to_pu = pus[i]}));
  fibers.push_back(h.rt.spawn([&] {
    Scope s(h.oracle, a, "owner sleeper on the forced-idle sibling");
    for (unsigned n = 0; !stop.load(std::memory_order_relaxed); ++n) {
      s.sleep_for(std::chrono::microseconds(100 + n % 5 * 50));
      s.burn(std::chrono::microseconds(20 + n % 3 * 40));
      sleeper_rounds.fetch_add(1, std::memory_order_relaxed);
    }
  }, SpawnOptions{.cookie = a, .pin_to_pu = pus.back()}));
  // B may run on any sibling of core 0 (pinned to the first: it cannot leave for core 1).
  fibers.push_back(spawn_burner(h, stop, b, pus.front(), "waiting cookie", &gap_b));
  const auto run_for = std::chrono::milliseconds(std::max(60, scaled(150)));
  std::this_thread::sleep_for(run_for);
  // B must have had turns (run until seen, generously capped).
  const bool b_ran = wait_for([&] { return gap_b.turns.load() > 20; }, 20s);
  const double a_ms = core_ms(h.rt, a), b_ms = core_ms(h.rt, b);
  stop.store(true);
  for (auto& f : fibers) f.join();
  INFO("B turns " << gap_b.turns.load() << ", longest B gap " << gap_b.max_us.load() << " us, sleeper rounds "
                  << sleeper_rounds.load() << "; core time A " << a_ms << " ms, B " << b_ms << " ms");
  CHECK(b_ran);
  CHECK(sleeper_rounds.load() > 0);
  CHECK(b_ms > 0.05 * a_ms);
  CHECK(gap_b.max_us.load() < 1000 * static_cast<long>(o.slice.count()));
  CHECK_ISOLATED(h);
}

// ---------------------------------------------------------------------------
// The slice tick asks a runner to stop once its worker has not *switched*
// for a slice. An inline run is no switch for it (no pick reconsiders the
// core's cookie), and a join asked to stop parks instead of running the child
// inline (Worker::run_inline). Otherwise fibers of the owner cookie that join
// children inline between preemption points, on every sibling of a core,
// would never be asked to stop while another cookie waits: no sibling is
// forced idle to time the turn (every one runs the owner), and the ticker
// sees switches. The waiting cookie would get the core only when the host
// happens to deschedule a worker for a whole slice.
// Two ways in: B arrives while every sibling runs A; or the sibling forced
// idle behind A (B waits there) goes on with A's own fiber (the case above).
// Checked as B's share of core 0 while B is always runnable: the two cookies
// should own it about half each. (Other cores are kept busy, or their idle
// workers steal A's children before the inline join, which then parks, and a
// pick hands over.)
TEST_CASE("a cookie waiting behind owner fibers that join inline on every sibling gets the core",
          "[oracle][handover][starvation]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  const bool via_forced_idle = GENERATE(false, true);
  // With preemption points between the joins, or with none: a join is one
  // (README), so A must stop at its next join once B is due.
  const bool points = GENERATE(true, false);
  INFO(spec << (via_forced_idle ? ", the last sibling was forced idle behind A" : ", B arrives late")
            << (points ? ", preemption points between the joins" : ", no preemption point but the joins"));
  Options o = options_for(spec);
  o.slice = 4ms; // a worker descheduled for a whole slice (which ends the wait) is rarer
  Harness h(o);
  const auto pus = pus_of_core(h.rt.topology(), 0);
  const Cookie a = Cookie::create(), b = Cookie::create();
  std::atomic<bool> stop{false};
  std::atomic<unsigned> a_running{0};
  std::atomic<long> b_first_us{-1};
  GapMeter gap_b;
  std::vector<JoinHandle<void>> fibers;
  auto spawn_owner = [&](unsigned pu) {
    fibers.push_back(h.rt.spawn([&] {
      Scope s(h.oracle, a, "owner joining inline");
      a_running.fetch_add(1);
      while (!stop.load(std::memory_order_relaxed)) {
        s.burn(20us);
        auto child = s.around([&] {
          return coresched::spawn([&] {
            Scope cs(h.oracle, a, "inline child");
            cs.burn(2us);
          });
        });
        s.join(child);
        if (points) s.preempt_point();
      }
    }, SpawnOptions{.cookie = a, .pin_to_pu = pu}));
  };
  // Other cores are kept busy (an idle worker there would steal A's children
  // before their inline join, which then parks and so picks).
  for (const auto& core : h.rt.topology().cores())
    if (core.index != 0)
      for (unsigned pu : core.pus) fibers.push_back(spawn_burner(h, stop, a, pu, "filler on another core"));
  const std::size_t first_batch = via_forced_idle ? pus.size() - 1 : pus.size();
  for (std::size_t i = 0; i < first_batch; ++i) spawn_owner(pus[i]);
  if (!wait_for([&] { return a_running.load() == first_batch; })) {
    stop.store(true); // (a REQUIRE here would leave the fibers spinning and the joins below waiting for ever)
    for (auto& f : fibers) f.join();
    FAIL("A's owners did not all start");
  }
  std::this_thread::sleep_for(2 * o.slice); // A alone for a while: its children come and go
  // Pinned to core 0 where there are other cores (an idle one would take it).
  const std::optional<unsigned> b_pin =
      h.rt.topology().cores().size() == 1 ? std::nullopt : std::optional<unsigned>(pus.back());
  const auto t0 = Clock::now();
  fibers.push_back(h.rt.spawn([&] {
    b_first_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
    Scope s(h.oracle, b, "waiting cookie");
    Clock::time_point last{};
    while (!stop.load(std::memory_order_relaxed)) {
      gap_b.note(last);
      s.burn(20us);
      s.preempt_point();
    }
  }, SpawnOptions{.cookie = b, .pin_to_pu = b_pin}));
  if (via_forced_idle) spawn_owner(pus.back()); // wakes onto the sibling that waits for B
  // B's first run may come 100 ms or more after its spawn on a loaded,
  // sanitized host, which a window could not tell from starvation: the
  // windows start once it has run, and are not scaled down. B never running
  // fails here (after 10 s).
  const bool b_ran = wait_for([&] { return b_first_us.load() >= 0; }, 10s);
  int windows = 0;
  const Window w = b_ran ? measure_until(h.rt, {b}, 300ms, [](const Window& m) {
    return m.owned_ms[0] > 0.2 * m.wall_ms;
  }, windows) : Window{{0.0}, 1.0};
  const double b_ms = w.owned_ms[0], wall_ms = w.wall_ms;
  stop.store(true);
  for (auto& f : fibers) f.join();
  INFO("B owned core 0 for " << b_ms << " ms of " << wall_ms << " ms (window " << windows << " of up to 3); B first ran"
                               << " after " << b_first_us.load() << " us, longest B gap " << gap_b.max_us.load() << " us");
  CHECK(b_ran);
  CHECK(b_ms > 0.2 * wall_ms);
  CHECK_ISOLATED(h);
}


// A fiber that calls set_cookie back and forth between two cookies every
// 100 us, beside A's burners on the other siblings of core 0. With the
// sleeper credit given on set_cookie too, each call would put the new cookie
// ahead of A (and forceidle_balance's change of owner reset A's wait), and A
// would own core 0 for 0-1 % of 1.5 s under forceidle_balance. A set_cookie
// earns none: A owns 0.50-0.65 of core 0; with the credit given on
// set_cookie (the lead bounded by history) it would own 0.33, under both
// policies.
TEST_CASE("a fiber switching cookies with set_cookie does not keep a busy cookie off the core",
          "[oracle][handover]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  const auto policy = GENERATE(FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance);
  INFO(spec << ", policy " << to_string(policy));
  Options o = options_for(spec);
  o.policy = policy;
  Harness h(o);
  const auto pus = pus_of_core(h.rt.topology(), 0);
  const Cookie a = Cookie::create(), y = Cookie::create(), z = Cookie::create();
  std::atomic<bool> stop{false};
  std::vector<JoinHandle<void>> fibers;
  for (std::size_t i = 0; i + 1 < pus.size(); ++i) fibers.push_back(spawn_burner(h, stop, a, pus[i], "busy owner"));
  fibers.push_back(h.rt.spawn([&] {
    Scope s(h.oracle, y, "set_cookie toggler");
    for (unsigned n = 0; !stop.load(std::memory_order_relaxed); ++n) {
      for (int k = 0; k < 10; ++k) {
        s.burn(10us);
        s.preempt_point();
      }
      s.set_cookie(n % 2 ? y : z);
    }
  }, SpawnOptions{.cookie = y, .pin_to_pu = pus.back()}));
  std::this_thread::sleep_for(3 * o.slice);
  // Up to three windows: a credit on set_cookie reads ~0.33 in every one, a
  // host that kept the workers off their CPUs only in some.
  int windows = 0;
  const Window w = measure_until(h.rt, {a}, std::chrono::milliseconds(std::max(300, scaled(300))), [](const Window& m) {
    return m.owned_ms[0] > 0.4 * m.wall_ms;
  }, windows);
  const double a_ms = w.owned_ms[0], wall_ms = w.wall_ms;
  stop.store(true);
  for (auto& f : fibers) f.join();
  INFO("A owned core 0 for " << a_ms << " ms of " << wall_ms << " ms (window " << windows << " of up to 3)");
  CHECK(a_ms > 0.4 * wall_ms);
  CHECK_ISOLATED(h);
}
