// SPDX-License-Identifier: Apache-2.0
// Timed and stoppable waits on every primitive: never early, a timeout or a
// stop leaves the queue consistent (a racing release goes to the next waiter,
// nothing is lost), shutdown ends them, bad durations saturate. For fibers
// and plain threads.
#include <coresched/coresched.hpp>
#include <coresched/sync.hpp>

#include "sync_support.hpp"
#include "test_support.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <fcntl.h>
#include <unistd.h>
#include <chrono>
#include <functional>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

using namespace coresched;
using namespace std::chrono_literals;
using test_support::topo;
using namespace sync_support;
using Clock = std::chrono::steady_clock;

namespace {

// Every primitive's timed wait on something that never becomes ready, as
// one call that returns whether it got what it waited for.
struct TimedCase {
  const char* name;
  std::function<bool(std::chrono::nanoseconds)> wait_for;
  std::function<bool(Clock::time_point)> wait_until;
};

struct NeverReady {
  Mutex m;
  ConditionVariable cv;
  Event ev;
  Semaphore sem{0};
  WaitGroup wg;
  Latch latch{1};
  Channel<int> buffered{1};
  Channel<int> unbuffered{0};
  NeverReady() {
    m.lock(); // held by nobody who will unlock it
    wg.add(1);
    REQUIRE(buffered.try_send(1)); // full
  }
  ~NeverReady() { m.unlock(); }

  std::vector<TimedCase> cases() {
    return {
        {"Mutex", [this](auto d) { return m.try_lock_for(d); }, [this](auto t) { return m.try_lock_until(t); }},
        {"ConditionVariable",
         [this](auto d) {
           Mutex cm;
           std::unique_lock lk(cm);
           return cv.wait_for(lk, d) == std::cv_status::no_timeout;
         },
         [this](auto t) {
           Mutex cm;
           std::unique_lock lk(cm);
           return cv.wait_until(lk, t) == std::cv_status::no_timeout;
         }},
        {"Event", [this](auto d) { return ev.wait_for(d); }, [this](auto t) { return ev.wait_until(t); }},
        {"Semaphore", [this](auto d) { return sem.try_acquire_for(d); },
         [this](auto t) { return sem.try_acquire_until(t); }},
        {"WaitGroup", [this](auto d) { return wg.wait_for(d); }, [this](auto t) { return wg.wait_until(t); }},
        {"Latch", [this](auto d) { return latch.wait_for(d); }, [this](auto t) { return latch.wait_until(t); }},
        {"Channel send (full)", [this](auto d) { return buffered.send_for(2, d); },
         [this](auto t) { return buffered.send_until(2, t); }},
        {"Channel recv (empty)", [this](auto d) { return unbuffered.recv_for(d).has_value(); },
         [this](auto t) { return unbuffered.recv_until(t).has_value(); }},
        {"Channel send (no receiver)", [this](auto d) { return unbuffered.send_for(3, d); },
         [this](auto t) { return unbuffered.send_until(3, t); }},
    };
  }
};

// Runs `fn` in a fiber of `rt` (pinned to PU `pu`) or on a plain thread.
void run_in(Runtime& rt, bool fiber, const std::function<void()>& fn) {
  if (fiber) rt.spawn(fn, SpawnOptions{.pin_to_pu = 0}).join();
  else std::thread(fn).join();
}

} // namespace

TEST_CASE("timed waits: every primitive times out, never early, from fibers and threads", "[sync][timed]") {
  Runtime rt(topo("core:2 pu:2"));
  NeverReady nr;
  for (const bool fiber : {true, false}) {
    for (auto& c : nr.cases()) {
      INFO(c.name << (fiber ? " in a fiber" : " on a thread"));
      bool got = true;
      std::chrono::nanoseconds took{};
      run_in(rt, fiber, [&] {
        const auto t0 = Clock::now();
        got = c.wait_for(3ms);
        took = Clock::now() - t0;
      });
      CHECK_FALSE(got);
      CHECK(took >= 3ms);
      run_in(rt, fiber, [&] {
        const auto deadline = Clock::now() + 2ms;
        got = c.wait_until(deadline);
        took = Clock::now() - deadline;
      });
      CHECK_FALSE(got);
      CHECK(took >= 0ns);
      // A time in the past and a negative duration: at once, timed out.
      run_in(rt, fiber, [&] {
        got = c.wait_until(Clock::now() - 1h) || c.wait_for(-5s) || c.wait_for(0ns);
      });
      CHECK_FALSE(got);
    }
  }
  CHECK(nr.ev.is_set() == false);
  CHECK(nr.sem.available() == 0);
  CHECK(nr.buffered.size() == 1);
  CHECK(nr.unbuffered.size() == 0);
}

TEST_CASE("timed waits: what is ready is taken, even with a deadline in the past", "[sync][timed]") {
  Runtime rt(topo("core:1 pu:2"));
  run_in(rt, true, [] {
    Mutex m;
    CHECK(m.try_lock_until(Clock::now() - 1s));
    m.unlock();
    Event ev(true);
    CHECK(ev.wait_for(-1ms));
    Semaphore sem(1);
    CHECK(sem.try_acquire_until(Clock::time_point::min()));
    Latch l(0);
    CHECK(l.wait_for(0s));
    Channel<int> ch(2);
    CHECK(ch.send_for(7, 0s));
    auto v = ch.recv_until(Clock::now() - 1s);
    REQUIRE(v);
    CHECK(*v == 7);
  });
}

TEST_CASE("timed waits: a release before the deadline ends the wait at once, for every primitive", "[sync][timed]") {
  Runtime rt(topo("core:2 pu:2"));
  for (const bool fiber : {true, false}) {
    INFO((fiber ? "fiber" : "thread") << " waits");
    Mutex m;
    ConditionVariable cv;
    bool flag = false;
    Event ev;
    Semaphore sem;
    WaitGroup wg;
    wg.add(1);
    Latch latch(1);
    Channel<int> ch(0);
    std::atomic<int> ok{0};
    std::atomic<bool> prompt{false};
    m.lock();
    // No Catch2 assertion in here: the waiter runs beside the main thread's.
    auto waiter = [&] {
      const auto t0 = Clock::now();
      ok += m.try_lock_for(10s);
      m.unlock();
      {
        std::unique_lock lk(m);
        ok += cv.wait_for(lk, 10s, [&] { return flag; });
      }
      ok += ev.wait_for(10s);
      ok += sem.try_acquire_for(10s);
      ok += wg.wait_for(10s);
      ok += latch.wait_until(Clock::now() + 10s);
      auto v = ch.recv_for(10s);
      ok += v && *v == 42;
      prompt = Clock::now() - t0 < 5s;
    };
    std::thread plain;
    JoinHandle<void> f;
    if (fiber) f = rt.spawn(waiter, SpawnOptions{.pin_to_pu = 0});
    else plain = std::thread(waiter);
    std::this_thread::sleep_for(2ms);
    m.unlock();
    std::this_thread::sleep_for(2ms);
    {
      std::lock_guard lk(m);
      flag = true;
    }
    cv.notify_all();
    ev.set();
    sem.release();
    wg.done();
    latch.count_down();
    const bool sent = ch.send_for(42, 10s);
    if (fiber) f.join();
    else plain.join();
    CHECK(sent);
    CHECK(ok.load() == 7);
    CHECK(prompt.load());
  }
}

TEST_CASE("timed waits: racing timeouts and releases lose nothing (Semaphore, Mutex, Channel)",
          "[sync][timed][stress]") {
  Runtime rt(topo("core:2 pu:2"));
  const int rounds = scaled(4000);
  std::atomic<std::uint64_t> progress{0};
  Watchdog dog("timed races", progress);

  SECTION("Semaphore: every unit released is acquired by a waiter or still available") {
    Semaphore sem;
    std::atomic<long> acquired{0};
    std::vector<JoinHandle<void>> hs;
    for (int i = 0; i < 6; ++i)
      hs.push_back(rt.spawn([&, i] {
        for (int r = 0; r < rounds; ++r) {
          if (sem.try_acquire_for(std::chrono::microseconds(5 + (r * 7 + i) % 40))) ++acquired;
          progress.fetch_add(1, std::memory_order_relaxed);
        }
      }));
    std::thread releaser([&] {
      for (int r = 0; r < rounds; ++r) {
        sem.release();
        if (r % 8 == 0) std::this_thread::sleep_for(20us);
      }
    });
    releaser.join();
    for (auto& h : hs) h.join();
    CHECK(acquired.load() + sem.available() == rounds);
  }

  SECTION("Mutex: a lock taken by a timed lock is exclusive, and a timed-out waiter holds nothing") {
    Mutex m;
    long inside = 0, total = 0, timeouts = 0;
    std::atomic<bool> overlap{false};
    std::vector<JoinHandle<void>> hs;
    for (int i = 0; i < 6; ++i)
      hs.push_back(rt.spawn([&, i] {
        for (int r = 0; r < rounds; ++r) {
          if (m.try_lock_for(std::chrono::microseconds(2 + (r + i) % 20))) {
            if (++inside != 1) overlap = true;
            ++total;
            if ((r + i) % 5 == 0) this_fiber::yield();
            --inside;
            m.unlock();
          } else {
            std::lock_guard lk(m);
            ++timeouts;
          }
          progress.fetch_add(1, std::memory_order_relaxed);
        }
      }));
    for (auto& h : hs) h.join();
    CHECK_FALSE(overlap.load());
    CHECK(total + timeouts == 6L * rounds);
    CHECK(m.try_lock()); // nothing left held or queued
    m.unlock();
  }

  SECTION("Channel: every value sent is received once") {
    for (const std::size_t cap : {std::size_t{0}, std::size_t{2}}) {
      Channel<int> ch(cap);
      std::atomic<long> sent_sum{0}, recv_sum{0}, sent{0}, received{0};
      std::vector<JoinHandle<void>> hs;
      for (int i = 0; i < 3; ++i) {
        hs.push_back(rt.spawn([&, i] {
          for (int r = 0; r < rounds; ++r) {
            const int v = i * rounds + r + 1;
            if (ch.send_for(v, std::chrono::microseconds(3 + r % 30))) {
              sent_sum += v;
              ++sent;
            }
            progress.fetch_add(1, std::memory_order_relaxed);
          }
        }));
        hs.push_back(rt.spawn([&, i] {
          for (int r = 0; r < rounds; ++r) {
            if (auto v = ch.recv_for(std::chrono::microseconds(3 + (r + i) % 30))) {
              recv_sum += *v;
              ++received;
            }
            progress.fetch_add(1, std::memory_order_relaxed);
          }
        }));
      }
      for (auto& h : hs) h.join();
      while (auto v = ch.try_recv()) {
        recv_sum += *v;
        ++received;
      }
      CHECK(sent.load() == received.load());
      CHECK(sent_sum.load() == recv_sum.load());
    }
  }
  check_isolation(rt);
}

TEST_CASE("timed waits: a timed-out waiter passes a later release to the next waiter", "[sync][timed]") {
  Runtime rt(topo("core:2 pu:2"));
  Semaphore sem;
  std::atomic<int> second_got{0};
  auto first = rt.spawn([&] { CHECK_FALSE(sem.try_acquire_for(2ms)); }, SpawnOptions{.pin_to_pu = 0});
  auto second = rt.spawn([&] { second_got = sem.try_acquire_for(10s); }, SpawnOptions{.pin_to_pu = 3});
  first.join();
  sem.release();
  second.join();
  CHECK(second_got.load() == 1);
  CHECK(sem.available() == 0);
}

TEST_CASE("stop tokens: request_stop ends every kind of wait, from a thread and from a fiber", "[sync][stop]") {
  Runtime rt(topo("core:2 pu:2"));
  for (const bool stop_from_fiber : {false, true}) {
    for (const bool wait_in_fiber : {true, false}) {
      INFO("wait in " << (wait_in_fiber ? "fiber" : "thread") << ", stop from "
                      << (stop_from_fiber ? "fiber" : "thread"));
      NeverReady nr;
      Mutex cm;
      std::stop_source src;
      std::atomic<int> ended{0}, got{0};
      std::vector<std::function<bool(std::stop_token)>> waits = {
          [&](std::stop_token st) {
            std::unique_lock lk(cm);
            return nr.cv.wait(lk, st, [] { return false; });
          },
          [&](std::stop_token st) { return nr.ev.wait(st); },
          [&](std::stop_token st) { return nr.sem.acquire(st); },
          [&](std::stop_token st) { return nr.wg.wait(st); },
          [&](std::stop_token st) { return nr.latch.wait_for(1h, st); },
          [&](std::stop_token st) { return nr.buffered.send(5, st); },
          [&](std::stop_token st) { return nr.unbuffered.recv(st).has_value(); },
      };
      std::vector<std::thread> threads;
      std::vector<JoinHandle<void>> fibers;
      for (auto& w : waits) {
        auto body = [&, w] {
          got += w(src.get_token());
          ++ended;
        };
        if (wait_in_fiber) fibers.push_back(rt.spawn(body));
        else threads.emplace_back(body);
      }
      std::this_thread::sleep_for(5ms);
      CHECK(ended.load() == 0);
      if (stop_from_fiber) rt.spawn([&] { src.request_stop(); }).join();
      else src.request_stop();
      for (auto& f : fibers) f.join();
      for (auto& t : threads) t.join();
      CHECK(ended.load() == static_cast<int>(waits.size()));
      CHECK(got.load() == 0);
      // Already stopped: returns at once, and a ready primitive still wins.
      run_in(rt, wait_in_fiber, [&] {
        CHECK_FALSE(nr.ev.wait(src.get_token()));
        Event set(true);
        CHECK(set.wait(src.get_token()));
      });
    }
  }
}

TEST_CASE("stop tokens: request_stop ends sleeps and I/O, with operation_canceled", "[sync][stop][io]") {
  Runtime rt(topo("core:2 pu:2"));
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  std::stop_source src;
  std::atomic<int> slept_full{-1}, thread_slept_full{-1};
  io::Result read_result{1, {}};
  const auto t0 = Clock::now();
  auto sleeper = rt.spawn([&] { slept_full = this_fiber::sleep_for(1h, src.get_token()); });
  auto reader = rt.spawn([&] {
    std::byte b[8];
    read_result = io::read(fds[0], b, -1, {.stop = src.get_token()});
  });
  std::thread plain([&] { thread_slept_full = this_fiber::sleep_for(1h, src.get_token()); });
  std::this_thread::sleep_for(5ms);
  src.request_stop();
  sleeper.join();
  reader.join();
  plain.join();
  CHECK(Clock::now() - t0 < 30s);
  CHECK(slept_full.load() == 0);
  CHECK(thread_slept_full.load() == 0);
  CHECK(read_result.error == std::errc::operation_canceled);
  // Stopped already: nothing starts. A token with no source changes nothing.
  rt.spawn([&] {
    std::byte b[8];
    CHECK(io::read(fds[0], b, -1, {.stop = src.get_token()}).error == std::errc::operation_canceled);
    CHECK_FALSE(this_fiber::sleep_for(1h, src.get_token()));
    CHECK(this_fiber::sleep_for(1ms, std::stop_token{}));
    const auto t = Clock::now();
    CHECK(this_fiber::sleep_for(2ms, std::stop_source{}.get_token()));
    CHECK(Clock::now() - t >= 2ms);
  }).join();
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_CASE("stop tokens: a token whose source is gone never stops a wait", "[sync][stop]") {
  Runtime rt(topo("core:1 pu:2"));
  std::stop_token orphan;
  {
    std::stop_source src;
    orphan = src.get_token();
  }
  Event ev;
  auto f = rt.spawn([&] { CHECK(ev.wait(orphan)); });
  std::this_thread::sleep_for(2ms);
  ev.set();
  f.join();
}

TEST_CASE("timed waits: shutdown ends a fiber's timed wait, timed out", "[sync][timed]") {
  Event never;
  std::atomic<int> result{-1};
  const auto t0 = Clock::now();
  {
    Runtime rt(topo("core:1 pu:2"));
    rt.spawn([&] { result = never.wait_for(1h); }).detach();
    std::this_thread::sleep_for(5ms);
  } // ~Runtime waits for the fiber: its wait must end
  CHECK(result.load() == 0);
  CHECK(Clock::now() - t0 < 30s);
}

TEST_CASE("timed waits: saturating durations (hours::max, a double) wait as long as needed", "[sync][timed]") {
  Runtime rt(topo("core:1 pu:2"));
  Event ev;
  std::atomic<int> ok{0};
  auto a = rt.spawn([&] { ok += ev.wait_for(std::chrono::hours::max()); });
  auto b = rt.spawn([&] { ok += ev.wait_until(Clock::time_point::max()); });
  auto c = rt.spawn([&] { ok += ev.wait_for(std::chrono::duration<double>(1e300)); });
  auto d = rt.spawn([&] { ok += ev.wait_until(std::chrono::system_clock::now() + 1h); });
  // Past INT64_MAX ns from now: unsaturated, these would reach the timer
  // thread as a negative time and stop it for good.
  auto e = rt.spawn([&] { ok += ev.wait_for(std::chrono::nanoseconds::max()); });
  auto f = rt.spawn([&] { ok += ev.wait_for(std::chrono::years(400)); });
  auto g = rt.spawn([&] { ok += ev.wait_for(Clock::duration::max()); });
  // Another clock's extreme time points: the difference to its now can
  // overflow, and max() must not time out at once.
  using seconds_tp = std::chrono::time_point<std::chrono::system_clock, std::chrono::seconds>;
  auto h = rt.spawn([&] { ok += ev.wait_until(seconds_tp::max()); });
  auto i = rt.spawn([&] { ok += ev.wait_until(std::chrono::system_clock::time_point::max()); });
  std::this_thread::sleep_for(3ms);
  CHECK(ok.load() == 0);
  std::atomic<int> past{-1};
  rt.spawn([&] { past = ev.wait_until(std::chrono::system_clock::time_point::min()); }).join(); // at once
  CHECK(past.load() == 0);
  ev.set();
  for (auto* x : {&a, &b, &c, &d, &e, &f, &g, &h, &i}) x->join();
  CHECK(ok.load() == 9);
}

TEST_CASE("timed waits: many fibers' deadlines fire in time and in order", "[sync][timed]") {
  Runtime rt(topo("core:2 pu:2"));
  Event never;
  std::vector<JoinHandle<void>> hs;
  std::atomic<int> early{0}, done{0};
  for (int i = 0; i < 200; ++i)
    hs.push_back(rt.spawn([&, i] {
      const auto d = std::chrono::microseconds(100 + (i * 37) % 3000);
      const auto t0 = Clock::now();
      if (never.wait_for(d)) return;
      if (Clock::now() - t0 < d) ++early;
      ++done;
    }));
  for (auto& h : hs) h.join();
  CHECK(early.load() == 0);
  CHECK(done.load() == 200);
}
