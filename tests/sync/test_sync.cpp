// SPDX-License-Identifier: Apache-2.0
// Fiber synchronization primitives: Mutex, ConditionVariable, Event, Semaphore,
// WaitGroup, Latch; fibers and plain threads on both sides; no lost wake-ups
// under stress. Channels: test_channel.cpp.
#include <coresched/coresched.hpp>
#include <coresched/sync.hpp>

#include "sync_support.hpp"
#include "test_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace coresched;
using namespace std::chrono_literals;
using test_support::stress_scale;
using test_support::topo;
using namespace sync_support;

// ------------------------------------------------------------------ lost wake-ups

TEST_CASE("sync: Semaphore ping-pong between fibers on different cores loses no wake-up (1,000,000 waits)",
          "[sync][semaphore][stress]") {
  Runtime rt(topo("core:2 pu:2")); // PUs 0 and 3: different cores, different real CPUs
  const int rounds = scaled(500'000); // two wait/notify pairs per round
  Semaphore ping, pong;
  std::atomic<std::uint64_t> progress{0};
  Watchdog dog("semaphore ping-pong", progress);
  auto a = rt.spawn([&] {
    for (int i = 0; i < rounds; ++i) {
      ping.release();
      pong.acquire();
      progress.fetch_add(1, std::memory_order_relaxed);
    }
  }, SpawnOptions{.pin_to_pu = 0});
  auto b = rt.spawn([&] {
    for (int i = 0; i < rounds; ++i) {
      ping.acquire();
      pong.release();
    }
  }, SpawnOptions{.pin_to_pu = 3});
  a.join();
  b.join();
  CHECK(progress.load() == static_cast<std::uint64_t>(rounds));
  CHECK(ping.available() == 0);
  CHECK(pong.available() == 0);
}

TEST_CASE("sync: Event ping-pong between fibers on sibling PUs loses no wake-up", "[sync][event][stress]") {
  Runtime rt(topo("core:2 pu:2")); // PUs 0 and 1: siblings of one core, different real CPUs
  const int rounds = scaled(200'000);
  Event to_b, to_a;
  std::atomic<std::uint64_t> progress{0};
  Watchdog dog("event ping-pong", progress);
  auto a = rt.spawn([&] {
    for (int i = 0; i < rounds; ++i) {
      to_b.set();
      to_a.wait();
      to_a.reset(); // before the next to_b.set(), so B's next set cannot be lost
      progress.fetch_add(1, std::memory_order_relaxed);
    }
  }, SpawnOptions{.pin_to_pu = 0});
  auto b = rt.spawn([&] {
    for (int i = 0; i < rounds; ++i) {
      to_b.wait();
      to_b.reset();
      to_a.set();
    }
  }, SpawnOptions{.pin_to_pu = 1});
  a.join();
  b.join();
  CHECK(progress.load() == static_cast<std::uint64_t>(rounds));
}

TEST_CASE("sync: Semaphore ping-pong between a plain thread and a fiber loses no wake-up", "[sync][semaphore][stress]") {
  Runtime rt(topo("core:2 pu:2"));
  const int rounds = scaled(100'000);
  Semaphore to_fiber, to_thread;
  std::atomic<std::uint64_t> progress{0};
  Watchdog dog("thread/fiber ping-pong", progress);
  auto f = rt.spawn([&] {
    for (int i = 0; i < rounds; ++i) {
      to_fiber.acquire();
      to_thread.release();
    }
  });
  for (int i = 0; i < rounds; ++i) {
    to_fiber.release();
    to_thread.acquire();
    progress.fetch_add(1, std::memory_order_relaxed);
  }
  f.join();
  CHECK(progress.load() == static_cast<std::uint64_t>(rounds));
}

// ------------------------------------------------------------------ Mutex

TEST_CASE("sync: Mutex protects a counter incremented by many fibers on all workers and plain threads",
          "[sync][mutex][stress]") {
  Runtime rt(topo("core:2 pu:2"));
  constexpr int kFibers = 64, kThreads = 2;
  const int per = scaled(20'000);
  Mutex m;
  std::uint64_t counter = 0; // deliberately not atomic: the mutex must order every access
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::atomic<std::uint64_t> progress{0};
  Watchdog dog("mutex counter", progress);
  auto body = [&](int id) {
    for (int i = 0; i < per; ++i) {
      switch ((id + i) % 3) {
      case 0: {
        std::lock_guard g(m);
        if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
        ++counter;
        inside.fetch_sub(1);
        break;
      }
      case 1: {
        std::unique_lock lk(m);
        if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
        ++counter;
        inside.fetch_sub(1);
        break;
      }
      default:
        while (!m.try_lock()) {
          if (this_fiber::in_fiber()) this_fiber::yield();
          else std::this_thread::yield();
        }
        if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
        ++counter;
        inside.fetch_sub(1);
        m.unlock();
      }
      if (i % 64 == 0) progress.fetch_add(1, std::memory_order_relaxed);
      this_fiber::preempt_point();
    }
  };
  std::vector<JoinHandle<void>> hs;
  std::vector<std::atomic<int>> workers_seen(rt.topology().pus().size());
  const auto npus = static_cast<unsigned>(workers_seen.size());
  for (int id = 0; id < kFibers; ++id) {
    SpawnOptions so;
    if (id % 2 == 0) so.pin_to_pu = static_cast<unsigned>(id / 2) % npus; // every worker takes part
    hs.push_back(rt.spawn([&, id] {
      workers_seen[this_fiber::location().worker].fetch_add(1);
      body(id);
    }, so));
  }
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) ts.emplace_back([&, t] { body(kFibers + t); });
  for (auto& h : hs) h.join();
  for (auto& t : ts) t.join();
  CHECK(overlaps.load() == 0);
  CHECK(counter == static_cast<std::uint64_t>(kFibers + kThreads) * per);
  int workers_used = 0;
  for (auto& w : workers_seen) workers_used += w.load() > 0;
  CHECK(workers_used == static_cast<int>(workers_seen.size()));
  CHECK(m.try_lock());
  m.unlock();
}

TEST_CASE("sync: Mutex hands ownership to waiting fibers in FIFO order", "[sync][mutex]") {
  Runtime rt(topo("core:1 pu:1"));
  auto h = rt.spawn([] {
    Mutex m;
    std::vector<int> order;
    std::atomic<int> queued{0};
    m.lock();
    std::vector<JoinHandle<void>> hs;
    for (int id = 0; id < 5; ++id)
      hs.push_back(coresched::spawn([&, id] {
        queued.fetch_add(1); // one worker, cooperative: nothing runs between this and lock()
        m.lock();
        order.push_back(id);
        m.unlock();
      }));
    while (queued.load() < 5) this_fiber::yield();
    CHECK_FALSE(m.try_lock());
    m.unlock();
    for (auto& c : hs) c.join();
    return order;
  });
  CHECK(h.join() == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("sync: a Mutex held across a suspension blocks fibers and threads, not workers", "[sync][mutex]") {
  Runtime rt(topo("core:1 pu:1"));
  Mutex m;
  Event holding;
  std::atomic<bool> released{false};
  std::atomic<int> others_ran{0};
  auto holder = rt.spawn([&] {
    std::lock_guard g(m);
    holding.set();
    this_fiber::sleep_for(30ms); // the single worker must keep running other fibers meanwhile
    released.store(true);
  });
  holding.wait();
  auto waiter = rt.spawn([&] {
    std::lock_guard g(m);
    return released.load();
  });
  auto other = rt.spawn([&] { others_ran.fetch_add(1); });
  other.join(); // runs on the one worker while `waiter` is parked on the mutex
  CHECK(others_ran.load() == 1);
  bool released_before_thread_got_it = false;
  {
    std::lock_guard g(m); // a plain thread waits too
    released_before_thread_got_it = released.load();
  }
  CHECK(released_before_thread_got_it);
  holder.join();
  CHECK(waiter.join());
}

// ------------------------------------------------------------------ ConditionVariable

TEST_CASE("sync: ConditionVariable producer/consumer delivers every item once (fibers and threads)",
          "[sync][condvar][stress]") {
  Runtime rt(topo("core:2 pu:2"));
  constexpr int kProducers = 4, kConsumers = 4, kCapacity = 16;
  const int per = scaled(25'000);
  const int total = (kProducers + 1) * per; // plus one plain-thread producer
  Mutex m;
  ConditionVariable not_full, not_empty;
  std::deque<int> q;
  int producers_left = kProducers + 1;
  std::vector<std::atomic<int>> seen(static_cast<std::size_t>(total));
  std::atomic<std::uint64_t> progress{0};
  Watchdog dog("condvar producer/consumer", progress);
  auto produce = [&](int p) {
    for (int i = 0; i < per; ++i) {
      std::unique_lock lk(m);
      not_full.wait(lk, [&] { return q.size() < kCapacity; });
      q.push_back(p * per + i);
      lk.unlock();
      not_empty.notify_one();
    }
    std::lock_guard g(m);
    if (--producers_left == 0) not_empty.notify_all();
  };
  auto consume = [&] {
    for (;;) {
      std::unique_lock lk(m);
      not_empty.wait(lk, [&] { return !q.empty() || producers_left == 0; });
      if (q.empty()) return;
      const int v = q.front();
      q.pop_front();
      lk.unlock();
      not_full.notify_one();
      seen[static_cast<std::size_t>(v)].fetch_add(1);
      progress.fetch_add(1, std::memory_order_relaxed);
    }
  };
  std::vector<JoinHandle<void>> hs;
  for (int c = 0; c < kConsumers; ++c) hs.push_back(rt.spawn(consume));
  for (int p = 0; p < kProducers; ++p) hs.push_back(rt.spawn([&, p] { produce(p); }));
  std::thread consumer_thread(consume);
  std::thread producer_thread([&] { produce(kProducers); });
  for (auto& h : hs) h.join();
  producer_thread.join();
  consumer_thread.join();
  int once = 0;
  for (auto& s : seen) once += s.load() == 1;
  CHECK(once == total);
  CHECK(q.empty());
}

TEST_CASE("sync: ConditionVariable wakes exactly whom it is told to, never spuriously", "[sync][condvar]") {
  Runtime rt(topo("core:2 pu:2"));
  Mutex m;
  ConditionVariable cv;
  int waiting = 0;
  std::atomic<int> returned{0};
  auto wait_once = [&] {
    std::unique_lock lk(m);
    ++waiting;
    cv.wait(lk); // no predicate: returns only after a notify
    returned.fetch_add(1);
  };
  std::vector<JoinHandle<void>> hs;
  for (int i = 0; i < 4; ++i) hs.push_back(rt.spawn(wait_once));
  std::thread t(wait_once);
  // A waiter is queued before it releases m, so once we see 5 under m, all 5 wait.
  for (;;) {
    std::lock_guard g(m);
    if (waiting == 5) break;
  }
  std::this_thread::sleep_for(20ms);
  CHECK(returned.load() == 0);
  cv.notify_one();
  CHECK(settles_at(returned, 1));
  cv.notify_one();
  CHECK(settles_at(returned, 2));
  cv.notify_all();
  for (auto& h : hs) h.join();
  t.join();
  CHECK(returned.load() == 5);
}

// ------------------------------------------------------------------ Event

TEST_CASE("sync: Event is manual-reset: set releases all waiters until reset", "[sync][event]") {
  Runtime rt(topo("core:2 pu:2"));
  Event ev;
  CHECK_FALSE(ev.is_set());
  std::atomic<int> passed{0};
  std::vector<JoinHandle<void>> hs;
  for (int i = 0; i < 8; ++i) hs.push_back(rt.spawn([&] {
    ev.wait();
    passed.fetch_add(1);
  }));
  std::this_thread::sleep_for(20ms);
  CHECK(passed.load() == 0);
  ev.set();
  for (auto& h : hs) h.join();
  CHECK(passed.load() == 8);
  CHECK(ev.is_set());
  rt.spawn([&] { ev.wait(); }).join(); // set: returns at once
  ev.reset();
  CHECK_FALSE(ev.is_set());
  auto late = rt.spawn([&] {
    ev.wait();
    passed.fetch_add(1);
  });
  std::this_thread::sleep_for(20ms);
  CHECK(passed.load() == 8);
  ev.set();
  late.join();
  CHECK(passed.load() == 9);
  Event pre(true);
  CHECK(pre.is_set());
  pre.wait();
}

TEST_CASE("sync: a plain thread waits on an Event set by a fiber, and a fiber on one set by a plain thread",
          "[sync][event]") {
  Runtime rt(topo("core:2 pu:2"));
  SECTION("thread waits, fiber sets") {
    Event ev;
    std::atomic<int> data{0};
    auto f = rt.spawn([&] {
      this_fiber::sleep_for(10ms);
      data.store(42, std::memory_order_relaxed);
      ev.set();
    });
    ev.wait();
    CHECK(data.load(std::memory_order_relaxed) == 42);
    f.join();
  }
  SECTION("fiber waits, thread sets") {
    Event ev;
    int data = 0; // plain: the event must order it
    auto f = rt.spawn([&] {
      ev.wait();
      return data;
    });
    std::this_thread::sleep_for(10ms);
    data = 7;
    ev.set();
    CHECK(f.join() == 7);
  }
  check_isolation(rt);
}

// ------------------------------------------------------------------ Semaphore

TEST_CASE("sync: Semaphore limits concurrency to its count", "[sync][semaphore]") {
  Runtime rt(topo("core:2 pu:2"));
  Semaphore sem(3);
  std::atomic<int> inside{0}, max_inside{0};
  std::vector<JoinHandle<void>> hs;
  for (int i = 0; i < 32; ++i)
    hs.push_back(rt.spawn([&] {
      for (int k = 0; k < 20; ++k) {
        sem.acquire();
        const int now = inside.fetch_add(1) + 1;
        int mx = max_inside.load();
        while (now > mx && !max_inside.compare_exchange_weak(mx, now)) {
        }
        this_fiber::sleep_for(50us);
        inside.fetch_sub(1);
        sem.release();
      }
    }));
  for (auto& h : hs) h.join();
  CHECK(max_inside.load() <= 3);
  CHECK(max_inside.load() >= 2);
  CHECK(sem.available() == 3);
  CHECK(sem.try_acquire());
  CHECK(sem.available() == 2);
  sem.release(5);
  CHECK(sem.available() == 7);
  CHECK_THROWS_AS(sem.release(-1), UsageError);
  CHECK_THROWS_AS(Semaphore(-1), UsageError);
}

TEST_CASE("sync: Semaphore release(n) wakes n waiters", "[sync][semaphore]") {
  Runtime rt(topo("core:2 pu:2"));
  Semaphore sem(0);
  std::atomic<int> got{0};
  std::vector<JoinHandle<void>> hs;
  for (int i = 0; i < 6; ++i) hs.push_back(rt.spawn([&] {
    sem.acquire();
    got.fetch_add(1);
  }));
  std::this_thread::sleep_for(20ms);
  CHECK(got.load() == 0);
  sem.release(4);
  CHECK(settles_at(got, 4));
  CHECK(sem.available() == 0);
  sem.release(3);
  for (auto& h : hs) h.join();
  CHECK(got.load() == 6);
  CHECK(sem.available() == 1);
}


// ------------------------------------------------------------------ WaitGroup, Latch

TEST_CASE("sync: WaitGroup waits for every fiber, from a fiber and from a plain thread", "[sync][waitgroup]") {
  Runtime rt(topo("core:2 pu:2"));
  constexpr int kWorkers = 50;
  WaitGroup wg;
  CHECK(wg.count() == 0);
  wg.wait(); // zero: returns at once
  std::vector<std::atomic<int>> finished(kWorkers);
  wg.add(kWorkers);
  for (int i = 0; i < kWorkers; ++i)
    rt.spawn([&, i] {
      this_fiber::sleep_for(std::chrono::microseconds(100 * (i % 7)));
      finished[static_cast<std::size_t>(i)].store(1);
      wg.done();
    }, SpawnOptions{.detached = true});
  auto fiber_waiter = rt.spawn([&] {
    wg.wait();
    int n = 0;
    for (auto& f : finished) n += f.load();
    return n;
  });
  wg.wait();
  int n = 0;
  for (auto& f : finished) n += f.load();
  CHECK(n == kWorkers);
  CHECK(fiber_waiter.join() == kWorkers);
  CHECK(wg.count() == 0);
  CHECK_THROWS_AS(wg.done(), UsageError);
  CHECK(wg.count() == 0);
  // Reusable once back at zero.
  wg.add(2);
  auto d = rt.spawn([&] { wg.done(); wg.done(); });
  wg.wait();
  d.join();
}

TEST_CASE("sync: WaitGroup stress: repeated rounds of fibers never strand a waiter", "[sync][waitgroup][stress]") {
  Runtime rt(topo("core:2 pu:2"));
  const int rounds = scaled(2'000);
  std::atomic<std::uint64_t> progress{0};
  Watchdog dog("waitgroup rounds", progress);
  auto h = rt.spawn([&] {
    int short_rounds = 0;
    for (int r = 0; r < rounds; ++r) {
      WaitGroup wg;
      std::atomic<int> done{0};
      wg.add(4);
      for (int i = 0; i < 4; ++i)
        coresched::spawn([&] {
          done.fetch_add(1);
          wg.done();
        }, SpawnOptions{.detached = true});
      wg.wait();
      short_rounds += done.load() != 4;
      progress.fetch_add(1, std::memory_order_relaxed);
    }
    return short_rounds;
  });
  CHECK(h.join() == 0);
  CHECK(progress.load() == static_cast<std::uint64_t>(rounds));
}

TEST_CASE("sync: Latch releases fibers and threads only once the count reaches zero", "[sync][latch]") {
  Runtime rt(topo("core:2 pu:2"));
  constexpr int kFibers = 16;
  Latch latch(kFibers + 1); // plus the plain thread
  std::atomic<int> arrived{0}, early{0};
  std::vector<JoinHandle<void>> hs;
  for (int i = 0; i < kFibers; ++i)
    hs.push_back(rt.spawn([&, i] {
      this_fiber::sleep_for(std::chrono::microseconds(200 * (i % 5)));
      arrived.fetch_add(1);
      latch.arrive_and_wait();
      if (arrived.load() != kFibers + 1) early.fetch_add(1);
    }));
  std::this_thread::sleep_for(20ms);
  CHECK_FALSE(latch.try_wait());
  arrived.fetch_add(1);
  latch.arrive_and_wait();
  for (auto& h : hs) h.join();
  CHECK(early.load() == 0);
  CHECK(latch.try_wait());
  latch.wait();
  CHECK_THROWS_AS(latch.count_down(), UsageError);
  CHECK_THROWS_AS(Latch(-1), UsageError);
  Latch two(2);
  CHECK_THROWS_AS(two.count_down(3), UsageError);
  two.count_down(2);
  CHECK(two.try_wait());
}

// ------------------------------------------------------------------ the runtime around them

TEST_CASE("sync: a sleeping runtime wakes for a fiber spawned from a foreign thread", "[sync][wake]") {
  Runtime rt(topo("core:2 pu:2"));
  rt.spawn([] {}).join();
  std::this_thread::sleep_for(100ms); // every worker sleeps on its futex, the tick has stopped
  int got = 0;
  std::thread foreign([&] { got = rt.spawn([] { return 5; }).join(); });
  foreign.join();
  CHECK(got == 5);
}

TEST_CASE("sync: a sleeping runtime wakes for a parked fiber released by a foreign thread", "[sync][wake]") {
  Runtime rt(topo("core:2 pu:2"));
  Event ev;
  Semaphore sem;
  auto waiter = rt.spawn([&] {
    ev.wait();
    sem.acquire();
    return this_fiber::id() != 0;
  });
  std::this_thread::sleep_for(100ms); // the waiter parked; the runtime went idle
  std::thread foreign([&] {
    ev.set();
    std::this_thread::sleep_for(100ms);
    sem.release();
  });
  CHECK(waiter.join());
  foreign.join();
}

TEST_CASE("sync: fibers of different cookies synchronizing on one core keep isolation", "[sync][cookie]") {
  Runtime rt(topo("core:1 pu:2"));
  const Cookie a = Cookie::create(), b = Cookie::create();
  const int rounds = scaled(20'000);
  Semaphore to_b, to_a;
  Mutex m;
  std::uint64_t shared = 0;
  std::atomic<std::uint64_t> progress{0};
  Watchdog dog("cross-cookie ping-pong", progress);
  auto fa = rt.spawn([&] {
    for (int i = 0; i < rounds; ++i) {
      to_b.release();
      to_a.acquire();
      std::lock_guard g(m);
      ++shared;
      progress.fetch_add(1, std::memory_order_relaxed);
    }
  }, SpawnOptions{.cookie = a, .pin_to_pu = 0});
  auto fb = rt.spawn([&] {
    for (int i = 0; i < rounds; ++i) {
      to_b.acquire();
      {
        std::lock_guard g(m);
        ++shared;
      }
      to_a.release();
    }
  }, SpawnOptions{.cookie = b, .pin_to_pu = 1});
  fa.join();
  fb.join();
  CHECK(shared == 2ull * rounds);
  check_isolation(rt);
}
