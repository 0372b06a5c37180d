// SPDX-License-Identifier: Apache-2.0
// Oracle scenarios around the core's hand-over, across lifecycle stages: the
// ticker stopping and restarting as a hand-over is due, set_cookie storms over
// more cookies than a core keeps books for, and shutdown while a sibling is
// forced idle (see test_oracle_handover.cpp for the rest, and
// handover_support.hpp: CORESCHED_HANDOVER_SEED=<n> reruns one seed).
#include "handover_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
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
// The ticker stops after 64 idle quarter slices and restarts at the next busy
// worker. Rounds of: the runtime idles for about that long (drawn around the
// threshold), then A and B arrive together on one core (A on every sibling but
// the last, B pinned to the last, a sleeper of A on the last too), so that the
// first hand-over is due just as the ticker restarts. Each round's fibers have
// a fixed amount of work, so a starved one never finishes.
TEST_CASE("random programs: the ticker stops and restarts as a hand-over is due", "[oracle][handover]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  const std::uint64_t seed = GENERATE_COPY(from_range(seeds(301 + topology_salt(spec))));
  std::mt19937_64 rng(seed);
  std::string opts_text;
  Options o = drawn_options(spec, rng, opts_text);
  o.slice = std::chrono::microseconds(200 + rng() % 400); // short: idle stops the ticker within a few ms
  INFO(spec << ", seed " << seed << ", " << opts_text << " (slice set to " << o.slice.count() << " us)");
  Harness h(o);
  const auto pus = pus_of_core(h.rt.topology(), 0);
  const Cookie a = Cookie::create(), b = Cookie::create();
  const long quarter_us = o.slice.count() / 4;
  const int rounds = scaled(12);
  std::atomic<int> finished{0}, wrong{0};
  long worst_b_start_us = 0;
  for (int r = 0; r < rounds; ++r) {
    // Idle for 40-100 quarter slices: the ticker stops at 64 (sometimes not yet).
    std::this_thread::sleep_for(std::chrono::microseconds(quarter_us * static_cast<long>(40 + rng() % 60)));
    std::vector<JoinHandle<void>> fibers;
    std::atomic<long> b_start_us{-1};
    const auto t0 = Clock::now();
    const int work_a = 5 + static_cast<int>(rng() % 40), work_b = 5 + static_cast<int>(rng() % 20);
    for (std::size_t i = 0; i + 1 < pus.size(); ++i)
      fibers.push_back(h.rt.spawn([&, work_a] {
        Scope s(h.oracle, a, "owner after a restart");
        for (int k = 0; k < work_a; ++k) {
          s.burn(std::chrono::microseconds(quarter_us));
          s.preempt_point();
        }
        finished.fetch_add(1);
      }, SpawnOptions{.cookie = a, .pin_to_pu = pus[i]}));
    fibers.push_back(h.rt.spawn([&, work_a, sl = 20 + rng() % 200] {
      Scope s(h.oracle, a, "owner sleeper after a restart");
      for (int k = 0; k < work_a / 4 + 1; ++k) {
        s.sleep_for(std::chrono::microseconds(sl));
        s.burn(std::chrono::microseconds(quarter_us));
      }
      finished.fetch_add(1);
    }, SpawnOptions{.cookie = a, .pin_to_pu = pus.back()}));
    fibers.push_back(h.rt.spawn([&, work_b] {
      b_start_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
      Scope s(h.oracle, b, "waiting cookie after a restart");
      for (int k = 0; k < work_b; ++k) {
        s.burn(std::chrono::microseconds(quarter_us));
        if (this_fiber::cookie() != b) wrong.fetch_add(1);
        s.preempt_point();
      }
      finished.fetch_add(1);
    }, SpawnOptions{.cookie = b, .pin_to_pu = pus.back()}));
    const int expect = static_cast<int>(pus.size()) + 1;
    const bool done = wait_for([&] { return finished.load() >= (r + 1) * expect; }, 20s);
    CHECK(done);
    for (auto& f : fibers) f.join();
    worst_b_start_us = std::max(worst_b_start_us, b_start_us.load());
    if (!done) break;
  }
  INFO("worst start of B after a restart " << worst_b_start_us << " us; ticks " << h.rt.stats().ticks);
  CHECK(wrong.load() == 0);
  CHECK(worst_b_start_us < 1000 * static_cast<long>(o.slice.count()));
  CHECK_ISOLATED(h);
}

// ---------------------------------------------------------------------------
// set_cookie storms while siblings are forced idle: A and B runners keep core
// 0 changing hands; storm fibers (pinned to random PUs or not) switch among 40
// cookies (more than the 32 a core keeps books for, so entries are forgotten
// and placed again), with waits, yields and inline joins between switches.
TEST_CASE("random programs: set_cookie storms over 40 cookies during forced idle", "[oracle][handover][cookie]") {
  const std::string spec = GENERATE(as<std::string>{}, "core:1 pu:2", "core:2 pu:2", "core:1 pu:4");
  const std::uint64_t seed = GENERATE_COPY(from_range(seeds(501 + topology_salt(spec))));
  std::mt19937_64 rng(seed);
  std::string opts_text;
  Harness h(drawn_options(spec, rng, opts_text));
  INFO(spec << ", seed " << seed << ", " << opts_text);
  const unsigned npu = static_cast<unsigned>(h.rt.topology().pus().size());
  std::vector<Cookie> pool;
  for (int i = 0; i < 40; ++i) pool.push_back(Cookie::create());
  pool.push_back(Cookie{});
  const Cookie a = pool[0], b = pool[1];
  h.start_rivals({a, b}, 1);
  const int rounds = scaled(150);
  std::atomic<int> wrong_cookie{0}, done{0}, wrong_exception{0};
  std::vector<JoinHandle<void>> fibers;
  const int n_storms = 4;
  for (int f = 0; f < n_storms; ++f) {
    const std::optional<unsigned> pin =
        rng() % 2 ? std::optional<unsigned>(static_cast<unsigned>(rng() % npu)) : std::nullopt;
    const Cookie first = pool[rng() % pool.size()];
    fibers.push_back(h.rt.spawn([&, first, f, rseed = rng()] {
      std::mt19937_64 r(rseed);
      Scope s(h.oracle, first, "set_cookie storm");
      for (int i = 0; i < rounds; ++i) {
        const Cookie to = pool[r() % pool.size()];
        s.set_cookie(to);
        if (this_fiber::cookie() != to) wrong_cookie.fetch_add(1);
        s.burn(std::chrono::microseconds(2 + r() % 20));
        switch (r() % 6) {
        case 0: s.yield(); break;
        case 1: s.preempt_point(); break;
        case 2: s.sleep_for(std::chrono::microseconds(r() % 80)); break;
        case 3: {
          auto child = s.around([&] {
            return coresched::spawn([&, to] {
              Scope cs(h.oracle, to, "inline child in a storm");
              cs.burn(3us);
            });
          });
          s.join(child);
          break;
        }
        case 4: { // an exception held across a cookie change and a wait
          const std::uint64_t tag = static_cast<std::uint64_t>(f) << 32 | static_cast<unsigned>(i);
          try {
            throw Tagged{tag};
          } catch (const Tagged&) {
            s.set_cookie(pool[r() % pool.size()]);
            s.yield();
            if (!current_is(tag)) wrong_exception.fetch_add(1);
          }
          if (std::current_exception()) wrong_exception.fetch_add(1);
          break;
        }
        default: break;
        }
        if (this_fiber::cookie() != s.cookie()) wrong_cookie.fetch_add(1);
      }
      done.fetch_add(1);
    }, SpawnOptions{.cookie = first, .pin_to_pu = pin}));
  }
  // Every storm fiber finishes while the rivals still compete.
  const bool finished = wait_for([&] { return done.load() == n_storms; }, 30s);
  h.stop_rivals();
  for (auto& fb : fibers) fb.join();
  CHECK(finished);
  CHECK(wrong_cookie.load() == 0);
  CHECK(wrong_exception.load() == 0);
  CHECK_ISOLATED(h);
}

// ---------------------------------------------------------------------------
// Shutdown while a sibling is forced idle: a fresh runtime per round, A and B
// competing for core 0, sleepers of A pinned to the sibling that waits (some
// inside a catch block, some unwinding) sleeping for an hour, which shutdown
// cuts short. The runners are told to stop and shutdown() follows at once
// (a random few microseconds later), while the hand-over may be in flight.
TEST_CASE("random programs: shutdown while a sibling is forced idle", "[oracle][handover][shutdown]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  const std::uint64_t seed = GENERATE_COPY(from_range(seeds(701 + topology_salt(spec))));
  std::mt19937_64 rng(seed);
  INFO(spec << ", seed " << seed);
  const int rounds = scaled(8);
  for (int r = 0; r < rounds; ++r) {
    std::string opts_text;
    auto h = std::make_unique<Harness>(drawn_options(spec, rng, opts_text));
    INFO("round " << r << ": " << opts_text);
    const auto pus = pus_of_core(h->rt.topology(), 0);
    const Cookie a = Cookie::create(), b = Cookie::create();
    std::atomic<bool> stop{false};
    std::atomic<int> ended{0}, wrong{0}, cut_short{0}, started{0};
    int spawned = 0;
    std::vector<JoinHandle<void>> fibers;
    // A runner of `c` pinned to `pu`, until `stop`: A on every sibling but the last, B there.
    auto runner = [&, hp = h.get()](Cookie c, unsigned pu, const char* what) {
      ++spawned;
      fibers.push_back(hp->rt.spawn([&, hp, c, what] {
        Scope s(hp->oracle, c, what);
        started.fetch_add(1);
        while (!stop.load(std::memory_order_relaxed)) {
          s.burn(25us);
          s.preempt_point();
        }
        ended.fetch_add(1);
      }, SpawnOptions{.cookie = c, .pin_to_pu = pu}));
    };
    for (std::size_t i = 0; i + 1 < pus.size(); ++i) runner(a, pus[i], "owner runner");
    runner(b, pus.back(), "waiting runner");
    const int n_sleepers = 3;
    for (int k = 0; k < n_sleepers; ++k, ++spawned) {
      const bool detached = rng() % 2;
      auto body = [&, k, hp = h.get()] {
        Scope s(hp->oracle, a, "sleeper cut short by shutdown");
        started.fetch_add(1);
        s.sleep_for(std::chrono::microseconds(50 * k)); // a few wake onto the forced-idle sibling first
        s.burn(10us);
        const std::uint64_t tag = 1000u + static_cast<unsigned>(k);
        const auto t0 = Clock::now();
        if (k == 0) {
          try {
            throw Tagged{tag};
          } catch (const Tagged&) {
            s.sleep_for(1h);
            if (!current_is(tag)) wrong.fetch_add(1);
          }
        } else if (k == 1) {
          struct Unwinding {
            Scope& s;
            std::atomic<int>& bad;
            ~Unwinding() {
              const auto res = s.around([] { return io::sleep_until(Clock::now() + 1h); });
              if (res.error != std::errc::operation_canceled) bad.fetch_add(1);
              if (std::uncaught_exceptions() != 1) bad.fetch_add(1);
            }
          };
          try {
            Unwinding u{s, wrong};
            throw Tagged{tag};
          } catch (const Tagged& e) {
            if (e.tag != tag) wrong.fetch_add(1);
          }
        } else {
          const auto res = s.around([] { return io::sleep_until(Clock::now() + 1h); });
          if (res.error != std::errc::operation_canceled) wrong.fetch_add(1);
        }
        if (Clock::now() - t0 < 1h) cut_short.fetch_add(1);
        if (std::current_exception() || std::uncaught_exceptions() != 0) wrong.fetch_add(1);
        s.burn(10us);
        ended.fetch_add(1);
      };
      if (detached) h->rt.spawn(body, SpawnOptions{.cookie = a, .pin_to_pu = pus.back(), .detached = true});
      else fibers.push_back(h->rt.spawn(body, SpawnOptions{.cookie = a, .pin_to_pu = pus.back()}));
    }
    // Until a sibling has been forced idle (run until seen, capped).
    const bool forced = wait_for([&] {
      const auto st = h->rt.stats();
      return started.load() == spawned && st.cores[0].forced_idle_ns > 0;
    }, 20s);
    CHECK(forced);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    stop.store(true);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 50));
    std::thread joiner([&] { for (auto& f : fibers) f.join(); });
    h->rt.shutdown(); // waits for every fiber, the hour-long sleepers included
    joiner.join();
    CHECK(ended.load() == spawned);
    CHECK(cut_short.load() == n_sleepers);
    CHECK(wrong.load() == 0);
    CHECK_ISOLATED(*h);
    if (ended.load() != spawned) break;
  }
}
