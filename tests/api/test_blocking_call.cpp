// SPDX-License-Identifier: Apache-2.0
// blocking_call: results and exceptions come back to the fiber, a plain
// thread (and a nested call) runs the call in place, the worker runs its
// other fibers and timers meanwhile, many calls run at once, shutdown waits
// for them, and the call's cookie keeps the core: no fiber of another cookie
// runs on a sibling while it lasts.
#include <coresched/coresched.hpp>

#include "platform/call_threads.hpp"

#include "test_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace coresched;
using namespace std::chrono_literals;
using test_support::topo;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

void spin_for(std::chrono::nanoseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
  }
}

double ms_of(std::chrono::nanoseconds d) { return static_cast<double>(d.count()) / 1e6; }

} // namespace

TEST_CASE("blocking_call returns the call's value, rethrows its exception, and runs it on another thread",
          "[blocking]") {
  Runtime rt(topo("core:2 pu:2"));
  rt.spawn([] {
      const auto fiber_thread = std::this_thread::get_id();
      std::thread::id call_thread;
      CHECK(blocking_call([&] {
              call_thread = std::this_thread::get_id();
              return 42;
            }) == 42);
      CHECK(call_thread != fiber_thread);
      auto p = blocking_call([] { return std::make_unique<int>(7); }); // move-only results
      CHECK(*p == 7);
      int side = 0;
      blocking_call([&] { side = 1; });
      CHECK(side == 1);
      CHECK_THROWS_WITH(blocking_call([]() -> int { throw std::runtime_error("lookup failed"); }), "lookup failed");
      // A nested call runs in place, on the helper thread.
      std::thread::id outer, inner;
      blocking_call([&] {
        outer = std::this_thread::get_id();
        blocking_call([&] { inner = std::this_thread::get_id(); });
      });
      CHECK(outer == inner);
    }).join();
}

TEST_CASE("blocking_call from a plain thread runs the call in place", "[blocking]") {
  std::thread::id where;
  CHECK(blocking_call([&] {
          where = std::this_thread::get_id();
          return 5;
        }) == 5);
  CHECK(where == std::this_thread::get_id());
  CHECK_THROWS_AS(blocking_call([] { throw std::logic_error("x"); }), std::logic_error);
}

// One worker: a fiber in a 300 ms blocking call, another fiber on the same
// worker sleeping 1 ms at a time. Run in the fiber itself, the call would
// make the first of those sleeps end 300 ms late and leave no room for others. The
// sleeps' median lateness is held to 2 ms; their tail is the host's (on the
// development VM a plain 1 ms sleep's p99 reaches 1-3 ms), so the worst one is
// held only to what tells a blocked worker from a free one.
TEST_CASE("a 1 ms sleep on the worker of a 300 ms blocking call ends on time", "[blocking]") {
  Runtime rt(topo("package:1 core:1 pu:1"));
  bool ok = false;
  for (int attempt = 0; attempt < 3 && !ok; ++attempt) {
    std::atomic<bool> in_call{true};
    std::vector<std::chrono::nanoseconds> late;
    auto sleeper = rt.spawn([&] {
      do {
        const auto t0 = std::chrono::steady_clock::now();
        this_fiber::sleep_for(1ms);
        late.push_back(std::chrono::steady_clock::now() - t0 - 1ms);
      } while (in_call.load());
    });
    auto call = rt.spawn([&] {
      blocking_call([] { std::this_thread::sleep_for(300ms); });
      in_call = false;
    });
    call.join();
    sleeper.join();
    std::sort(late.begin(), late.end());
    const auto median = late[late.size() / 2], worst = late.back();
    INFO("attempt " << attempt << ": " << late.size() << " sleeps, lateness median " << ms_of(median) << " ms, worst "
                    << ms_of(worst) << " ms");
    CHECK(worst < 100ms); // without the hand-over: 300 ms
    ok = late.size() >= 100 && median <= 2ms;
    if (kSanitized) ok = late.size() >= 10; // the sanitizers' slowed code makes no timing promise
  }
  CHECK(ok);
}

// One core of two PUs. Cookie b's two fibers count as they run; cookie a's
// fiber makes a CPU-bound blocking call of 100 ms, reading b's count at its
// start and end, while another fiber of a counts too. By the promise b's count
// cannot move during the call (its code would run beside the call's), and
// a's other fiber may run beside it.
TEST_CASE("a blocking call keeps its core for its cookie", "[blocking][isolation]") {
  Runtime rt(topo("core:1 pu:2"));
  const Cookie a = Cookie::create("a"), b = Cookie::create("b");
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> b_count{0}, a_count{0};
  auto counter = [&](std::atomic<std::uint64_t>& n) {
    return [&] {
      while (!stop.load(std::memory_order_relaxed)) {
        n.fetch_add(1, std::memory_order_relaxed);
        this_fiber::preempt_point();
      }
    };
  };
  std::vector<JoinHandle<void>> hs;
  hs.push_back(rt.spawn(counter(b_count), SpawnOptions{.cookie = b}));
  hs.push_back(rt.spawn(counter(b_count), SpawnOptions{.cookie = b}));
  hs.push_back(rt.spawn(counter(a_count), SpawnOptions{.cookie = a}));
  while (b_count.load() < 1000) std::this_thread::sleep_for(1ms);
  const int rounds = kSanitized ? 3 : 10;
  for (int i = 0; i < rounds; ++i) {
    std::uint64_t b_start = 0, b_end = 0, a_start = 0, a_end = 0;
    rt.spawn(
          [&] {
            blocking_call([&] {
              b_start = b_count.load();
              a_start = a_count.load();
              spin_for(100ms);
              b_end = b_count.load();
              a_end = a_count.load();
            });
          },
          SpawnOptions{.cookie = a})
        .join();
    INFO("round " << i << ": b counted " << b_end - b_start << ", a " << a_end - a_start << " during the call");
    CHECK(b_end == b_start);
    CHECK(a_end > a_start);
    // And b runs again once the call has ended.
    const std::uint64_t after = b_count.load();
    while (b_count.load() == after) std::this_thread::sleep_for(100us);
  }
  stop = true;
  for (auto& h : hs) h.join();
}

TEST_CASE("blocking calls run at once, each on a thread of its own", "[blocking]") {
  Runtime rt(topo("core:2 pu:2"));
  const int n = 64;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<JoinHandle<void>> hs;
  for (int i = 0; i < n; ++i) hs.push_back(rt.spawn([] { blocking_call([] { std::this_thread::sleep_for(50ms); }); }));
  for (auto& h : hs) h.join();
  const auto took = std::chrono::steady_clock::now() - t0;
  INFO(ms_of(took) << " ms for " << n << " calls of 50 ms");
  CHECK(took < n * 50ms / 4); // one after another: 3.2 s (under TSan, starting 64 threads takes 0.4-0.5 s)
}

TEST_CASE("shutdown waits for a blocking call in flight", "[blocking][shutdown]") {
  std::atomic<int> finished{0};
  {
    Runtime rt(topo("core:1 pu:2"));
    std::atomic<bool> started{false};
    rt.spawn(
        [&] {
          blocking_call([&] {
            started = true;
            std::this_thread::sleep_for(100ms);
          });
          ++finished;
        },
        SpawnOptions{.detached = true});
    while (!started.load()) std::this_thread::sleep_for(1ms);
  }
  CHECK(finished.load() == 1);
}

// errno as read afresh: optimized code keeps errno's address across a call
// (glibc's __errno_location is const), and a fiber that resumed on the core's
// other worker would read that thread's errno through it (docs/limitations.md).
[[gnu::noinline]] int errno_now() noexcept {
  asm volatile("");
  return errno;
}

TEST_CASE("the fiber sees errno as the call left it, and a reference result is the object itself", "[blocking]") {
  Runtime rt(topo("core:1 pu:2"));
  rt.spawn([] {
      for (int i = 0; i < 50; ++i) { // resumed on either worker
        errno = 0;
        CHECK(blocking_call([] { return ::close(-1); }) == -1);
        CHECK(errno_now() == EBADF);
      }
      int x = 1;
      int& r = blocking_call([&]() -> int& { return x; });
      CHECK(&r == &x);
    }).join();
}

// The call runs on a plain thread: a fiber it spawns without a cookie is the
// call's tenant's. Untagged, it could not run beside the call's hold, and the
// call that joined it would wait for ever.
TEST_CASE("a blocking call that spawns and joins a fiber: the child has the call's cookie", "[blocking]") {
  Runtime rt(topo("core:1 pu:2"));
  const Cookie a = Cookie::create("a");
  rt.spawn(
        [&] {
          const std::uint64_t child =
              blocking_call([&] { return rt.spawn([] { return this_fiber::cookie().value(); }).join(); });
          CHECK(child == a.value());
        },
        SpawnOptions{.cookie = a})
      .join();
}

TEST_CASE("a blocking call that cannot get a thread throws, runs nothing and frees its core", "[blocking]") {
  Runtime rt(topo("core:1 pu:2"));
  const Cookie a = Cookie::create("a"), b = Cookie::create("b");
  std::atomic<int> ran{0};
  detail::testing::call_thread_start_fails = true;
  rt.spawn([&] { CHECK_THROWS_AS(blocking_call([&] { ++ran; }), std::system_error); }, SpawnOptions{.cookie = a})
      .join();
  detail::testing::call_thread_start_fails = false;
  // Cookie b can have the core, and the failed call never runs later.
  rt.spawn([] {}, SpawnOptions{.cookie = b}).join();
  rt.spawn([&] { blocking_call([] {}); }, SpawnOptions{.cookie = a}).join();
  CHECK(ran.load() == 0);
}

// A fiber of another cookie that arrives while a call holds a core goes to a
// core that is free, not to the held one, whose PUs look idle.
TEST_CASE("a fiber arriving during another cookie's blocking call runs on a free core", "[blocking]") {
  Runtime rt(topo("core:2 pu:2"));
  const Cookie a = Cookie::create("a"), b = Cookie::create("b");
  // Six rounds must all be on time (with the held core taken for idle, about
  // two in ten would be, by luck); a second attempt forgives one slow machine.
  bool ok = false;
  for (int attempt = 0; attempt < 2 && !ok; ++attempt) {
    ok = true;
    for (int round = 0; round < 6 && ok; ++round) {
      std::atomic<bool> in_call{false};
      std::atomic<std::int64_t> call_end{0}, b_start{0};
      auto now = [] { return std::chrono::steady_clock::now().time_since_epoch().count(); };
      auto caller = rt.spawn(
          [&] {
            blocking_call([&] {
              in_call = true;
              std::this_thread::sleep_for(300ms);
              call_end = now();
            });
          },
          SpawnOptions{.cookie = a});
      while (!in_call.load()) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(5ms);
      rt.spawn([&] { b_start = now(); }, SpawnOptions{.cookie = b}).join();
      caller.join();
      ok = b_start.load() < call_end.load();
    }
  }
  CHECK(ok);
}

// Eight fibers of cookie a make short blocking calls back to back, so that
// one is nearly always in flight; cookie b's busy fiber must still get its
// turns on the one core. With the core's hold taken whatever the turn, b
// would mostly get nothing.
TEST_CASE("back-to-back blocking calls of one cookie leave the core's turns to another", "[blocking][fairness]") {
  Runtime rt(topo("core:1 pu:2"));
  const Cookie a = Cookie::create("a"), b = Cookie::create("b");
  auto b_rate = [&](bool with_calls) {
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> n{0};
    std::vector<JoinHandle<void>> hs;
    if (with_calls)
      for (int i = 0; i < 8; ++i)
        hs.push_back(rt.spawn(
            [&, i] {
              while (!stop.load())
                blocking_call([i] { std::this_thread::sleep_for(std::chrono::microseconds(500 + 200 * i)); });
            },
            SpawnOptions{.cookie = a}));
    hs.push_back(rt.spawn(
        [&] {
          while (!stop.load(std::memory_order_relaxed)) {
            n.fetch_add(1, std::memory_order_relaxed);
            this_fiber::preempt_point();
          }
        },
        SpawnOptions{.cookie = b}));
    std::this_thread::sleep_for(kSanitized ? 1s : 500ms);
    stop = true;
    for (auto& h : hs) h.join();
    return static_cast<double>(n.load());
  };
  bool ok = false;
  for (int attempt = 0; attempt < 3 && !ok; ++attempt) {
    const double alone = b_rate(false), beside = b_rate(true);
    INFO("attempt " << attempt << ": b beside the calls did " << beside / alone << " of its work alone");
    // Its fair share of the core is half; the calls' holds and hand-overs cost some of it.
    ok = beside >= 0.2 * alone;
  }
  CHECK(ok);
}
