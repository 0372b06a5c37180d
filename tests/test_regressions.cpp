// SPDX-License-Identifier: Apache-2.0
// Regression tests for defects of the isolation and fiber guarantees, each
// written as an application would meet it; each fails without its fix.
#include "isolation_probe.hpp"
#include "stack_pool.hpp"
#include "test_support.hpp"

#include <coresched/coresched.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <exception>
#include <fcntl.h>
#include <stdexcept>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace coresched;
using test_support::topo;

namespace {

// Keeps the PU busy for about `iters` loop turns, so that an interval stamped
// by the probe is long enough for an overlapping sibling to see it.
void spin(int iters) {
  for (int i = 0; i < iters; ++i) asm volatile("" ::: "memory");
}

int scaled(int n) { return std::max(1, static_cast<int>(n * test_support::stress_scale())); }

// Fibers of `c` that stamp the probe while they spin, until `stop`.
void busy_tenant(Runtime& rt, IsolationProbe& probe, Cookie c, std::atomic<bool>& stop, int n,
                 std::vector<JoinHandle<void>>& out) {
  for (int i = 0; i < n; ++i)
    out.push_back(rt.spawn(
        [&] {
          while (!stop.load(std::memory_order_relaxed)) {
            probe.enter();
            spin(200);
            probe.leave();
            this_fiber::yield();
          }
        },
        SpawnOptions{.cookie = c}));
}

// Runs `body` in a forked child; false if it did not exit 0 within `limit`.
template <class F> bool finishes_in_child(F body, std::chrono::seconds limit) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::signal(SIGABRT, SIG_DFL);
    body();
    _exit(0);
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

} // namespace

TEST_CASE("a child joined inline that changes its cookie leaves its joiner under the joiner's cookie",
          "[regression][isolation]") {
  for (const char* spec : {"core:1 pu:2", "core:2 pu:2"}) {
    Runtime rt(topo(spec));
    IsolationProbe probe(rt.topology());
    const Cookie a = Cookie::create(), b = Cookie::create();
    std::atomic<bool> stop{false};
    std::vector<JoinHandle<void>> hs;
    busy_tenant(rt, probe, b, stop, 2 * static_cast<int>(rt.topology().cores().size()), hs);
    std::atomic<long> intervals{0};
    for (int p = 0; p < 2; ++p)
      hs.push_back(rt.spawn(
          [&] {
            for (int i = 0; i < scaled(20000); ++i) {
              // Joined before it started: it runs inline on this PU, and switches itself to b.
              spawn([&] { this_fiber::set_cookie(b); }).join();
              probe.enter(); // this fiber is still a
              spin(200);
              probe.leave();
              intervals.fetch_add(1, std::memory_order_relaxed);
            }
          },
          SpawnOptions{.cookie = a}));
    hs[hs.size() - 1].join();
    hs[hs.size() - 2].join();
    stop = true;
    hs.clear();
    INFO(spec << ": " << intervals.load() << " intervals");
    CHECK(probe.violations.load() == 0);
  }
}

namespace {
// A capture whose destructor is user code of the fiber's cookie: it stamps the
// probe while it runs, as a destructor zeroising a tenant's key would touch it.
struct StampOnDestroy {
  IsolationProbe* probe = nullptr;
  std::atomic<long>* outside = nullptr;
  StampOnDestroy(IsolationProbe* p, std::atomic<long>* o) : probe(p), outside(o) {}
  StampOnDestroy(StampOnDestroy&& o) noexcept : probe(std::exchange(o.probe, nullptr)), outside(o.outside) {}
  StampOnDestroy(const StampOnDestroy&) = delete;
  ~StampOnDestroy() {
    if (!probe) return; // moved from
    if (!this_fiber::in_fiber()) { // the runtime destroyed it between fibers
      outside->fetch_add(1);
      return;
    }
    probe->enter(); // under the cookie the runtime says this fiber has now
    spin(200);
    probe->leave();
  }
};
} // namespace

TEST_CASE("a finished fiber's captures and uncollected result are destroyed under its own cookie",
          "[regression][isolation]") {
  Runtime rt(topo("core:1 pu:2"));
  IsolationProbe probe(rt.topology());
  const Cookie a = Cookie::create(), b = Cookie::create();
  std::atomic<long> outside{0};
  std::atomic<int> done{0};
  const int n = scaled(20000);
  // Two tenants of detached fibers: captures with destructors, and results
  // (a detached fiber's result is the runtime's to destroy) with them too.
  auto spawner = [&](Cookie c) {
    return rt.spawn(
        [&, c] {
          for (int i = 0; i < n; ++i) {
            spawn(
                [cap = StampOnDestroy(&probe, &outside), &done] {
                  spin(100);
                  done.fetch_add(1, std::memory_order_relaxed);
                  return StampOnDestroy(cap.probe, cap.outside);
                },
                SpawnOptions{.cookie = c, .detached = true});
            if (i % 16 == 0) this_fiber::yield();
          }
        },
        SpawnOptions{.cookie = c});
  };
  auto ha = spawner(a), hb = spawner(b);
  ha.join();
  hb.join();
  rt.shutdown();
  CHECK(done.load() == 2 * n);
  CHECK(outside.load() == 0);
  CHECK(probe.violations.load() == 0);
}

TEST_CASE("exception state follows the fiber across suspensions", "[regression][exceptions]") {
  for (const char* spec : {"core:1 pu:1", "core:2 pu:1", "core:1 pu:2"}) {
    Runtime rt(topo(spec));
    std::atomic<int> wrong{0}, right{0};
    std::vector<JoinHandle<void>> hs;
    for (int i = 0; i < 400; ++i)
      hs.push_back(rt.spawn([&, i] {
        try {
          throw std::runtime_error(std::to_string(i));
        } catch (const std::exception&) {
          // Suspend inside the handler: other fibers throw and catch meanwhile.
          if (i % 2) this_fiber::yield();
          else this_fiber::sleep_for(std::chrono::microseconds(100));
          try {
            std::rethrow_exception(std::current_exception());
          } catch (const std::runtime_error& again) {
            (again.what() == std::to_string(i) ? right : wrong).fetch_add(1);
          }
          try {
            throw; // rethrows this fiber's own exception
          } catch (const std::runtime_error& again) {
            (again.what() == std::to_string(i) ? right : wrong).fetch_add(1);
          }
        }
        if (std::current_exception()) wrong.fetch_add(1); // the handler has ended
      }));
    hs.clear();
    INFO(spec);
    CHECK(wrong.load() == 0);
    CHECK(right.load() == 800);
  }
}

TEST_CASE("std::uncaught_exceptions() follows a fiber that suspends during unwinding", "[regression][exceptions]") {
  Runtime rt(topo("core:1 pu:1"));
  std::atomic<int> wrong{0};
  struct SuspendingGuard {
    std::atomic<int>* wrong;
    ~SuspendingGuard() {
      this_fiber::yield(); // another fiber runs, outside any unwinding
      if (std::uncaught_exceptions() != 1) wrong->fetch_add(1);
    }
  };
  std::vector<JoinHandle<void>> hs;
  for (int i = 0; i < 100; ++i) {
    hs.push_back(rt.spawn([&] {
      try {
        SuspendingGuard g{&wrong};
        throw 1;
      } catch (int) {
      }
    }));
    hs.push_back(rt.spawn([&] {
      this_fiber::yield();
      if (std::uncaught_exceptions() != 0) wrong.fetch_add(1);
    }));
  }
  hs.clear();
  CHECK(wrong.load() == 0);
}

namespace {
// Touches 200 KiB of stack page by page from the top, as a deep call chain
// would, so that running short of stack meets the guard page.
[[gnu::noinline]] int use_200k() {
  volatile char big[200 * 1024];
  for (std::size_t i = sizeof(big); i >= 1024; i -= 1024) big[i - 1] = 1;
  big[0] = 2;
  return big[0] + big[sizeof(big) - 1];
}
} // namespace

TEST_CASE("a child joined at once gets the stack size it asked for", "[regression][stack]") {
  Runtime rt(topo("core:1 pu:1"));
  auto h = rt.spawn([] {
    // Before the child starts: the join could run it inline on this 64 KiB stack.
    return spawn([] { return use_200k(); }, SpawnOptions{.stack_size = 512 * 1024}).join();
  });
  CHECK(h.join() == 3);
}

TEST_CASE("an unpinned child joined inline keeps its pinned joiner on its PU", "[regression][pin]") {
  Runtime rt(topo("core:2 pu:1"));
  std::atomic<bool> stop{false};
  // Keep PU 1 busy, so a wake-up of the child prefers the idle PU 0.
  auto hog = rt.spawn(
      [&] {
        while (!stop.load()) this_fiber::yield();
      },
      SpawnOptions{.pin_to_pu = 1});
  auto h = rt.spawn(
      [] {
        int moved = 0;
        for (int i = 0; i < 50; ++i) {
          spawn([] { this_fiber::sleep_for(std::chrono::microseconds(200)); }).join();
          moved += this_fiber::location().worker != 1;
        }
        return moved;
      },
      SpawnOptions{.pin_to_pu = 1});
  CHECK(h.join() == 0);
  stop = true;
}

TEST_CASE("a core with more than 8 PUs loses no wake-up and shuts down", "[regression][wakeup]") {
  // 16 PUs on one core: a wake-up list of 8 dropped the rest, and the
  // runtime never finished shutting down.
  CHECK(finishes_in_child(
      [] {
        Runtime rt(topo("core:1 pu:16"));
        std::atomic<int> ran{0};
        for (int round = 0; round < 5; ++round) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20)); // all 16 workers go to sleep
          std::vector<JoinHandle<void>> hs;
          for (int i = 0; i < 16; ++i) hs.push_back(rt.spawn([&] { ran.fetch_add(1); }, SpawnOptions{.pin_to_pu = unsigned(i)}));
        }
        rt.shutdown();
        if (ran.load() != 80) _exit(2);
      },
      std::chrono::seconds(60)));
}

TEST_CASE("a core with more PUs than the runtime supports is refused with a message", "[regression][wakeup]") {
  CHECK_THROWS_WITH(Runtime(topo("core:1 pu:65")), Catch::Contains("at most 64 per core"));
}

TEST_CASE("a spawn from a thread racing shutdown either is refused or runs", "[regression][shutdown]") {
  // The callable's move constructor runs inside spawn, between the runtime's
  // stopping check and the moment the fiber is counted; a slow one holds the
  // spawn there while shutdown runs.
  struct SlowMove {
    std::atomic<int>* moves;
    std::atomic<bool>* inside;
    std::atomic<int>* ran;
    SlowMove(std::atomic<int>* m, std::atomic<bool>* in, std::atomic<int>* r) : moves(m), inside(in), ran(r) {}
    SlowMove(SlowMove&& o) noexcept : moves(o.moves), inside(o.inside), ran(o.ran) {
      if (moves->fetch_add(1) == 1) { // the move into the fiber's record
        inside->store(true);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    void operator()() const { ran->fetch_add(1); }
  };
  for (int round = 0; round < 3; ++round) {
    Runtime rt(topo("core:1 pu:2"));
    std::atomic<int> moves{0}, ran{0}, accepted{0};
    std::atomic<bool> inside{false};
    std::thread spawner([&] {
      try {
        rt.spawn(SlowMove(&moves, &inside, &ran), SpawnOptions{.detached = true});
        accepted.fetch_add(1);
      } catch (const UsageError&) {
      }
    });
    while (!inside.load()) std::this_thread::yield();
    rt.shutdown(); // must wait for the spawn in progress, or it must be refused
    spawner.join();
    CHECK(ran.load() == accepted.load());
  }
}

TEST_CASE("a fiber that finds no memory for its stack waits and runs later", "[regression][stack]") {
  Runtime rt(topo("core:1 pu:2"));
  IsolationProbe probe(rt.topology());
  const Cookie cookies[2] = {Cookie::create(), Cookie::create()};
  // Stacks come from the pool first: ask for an odd size, so each start maps one.
  coresched::detail::testing::fail_stack_allocations.store(60);
  std::atomic<int> ran{0};
  std::vector<JoinHandle<void>> hs;
  for (int i = 0; i < 200; ++i)
    hs.push_back(rt.spawn(
        [&] {
          probe.enter();
          spin(100);
          probe.leave();
          this_fiber::sleep_for(std::chrono::milliseconds(1)); // hold the stack while others start
          ran.fetch_add(1);
        },
        SpawnOptions{.cookie = cookies[i % 2], .stack_size = 72 * 1024}));
  hs.clear();
  coresched::detail::testing::fail_stack_allocations.store(0);
  CHECK(ran.load() == 200);
  CHECK(probe.violations.load() == 0);
}

TEST_CASE("the reserved cookie value is refused with a message", "[regression][cookie]") {
  Runtime rt(topo("core:1 pu:2"));
  const Cookie reserved = Cookie::from_value(~std::uint64_t{0});
  CHECK_THROWS_WITH(rt.spawn([] {}, SpawnOptions{.cookie = reserved}), Catch::Contains("reserved"));
  auto h = rt.spawn([&] {
    try {
      this_fiber::set_cookie(reserved);
    } catch (const UsageError&) {
      return true;
    }
    return false;
  });
  CHECK(h.join());
}

TEST_CASE("joining a fiber that changes its cookie on another core", "[regression][tsan]") {
  // A join looks for the child in its own core's queue while the child runs
  // on the other core and changes its cookie there: the lookup must read no
  // field of the child (TSan reported a data race while RunQueue::contains
  // read its cookie). Asserts the values; the race itself shows under TSan.
  Runtime rt(topo("core:2 pu:1"));
  auto h = rt.spawn(
      [] {
        long sum = 0;
        for (int i = 0; i < scaled(2000); ++i) {
          auto child = spawn(
              [i] {
                for (int k = 0; k < 8; ++k) this_fiber::set_cookie(Cookie::create());
                return i;
              },
              SpawnOptions{.pin_to_pu = 1});
          sum += child.join(); // often while it runs, on PU 1
        }
        return sum;
      },
      SpawnOptions{.pin_to_pu = 0});
  const long n = scaled(2000);
  CHECK(h.join() == n * (n - 1) / 2);
}

namespace {
// errno is a thread-local, and its address is a const function of the thread:
// the compiler may compute it once and reuse it after a suspension, when the
// fiber may run on another thread (as with any thread_local). Code that
// reads errno after a suspension reads it through a call like these.
[[gnu::noinline]] int get_errno() { return errno; }
[[gnu::noinline]] void set_errno(int v) { errno = v; }
} // namespace

TEST_CASE("errno follows the fiber across suspensions", "[regression][errno]") {
  for (const char* spec : {"core:1 pu:1", "core:2 pu:1"}) {
    Runtime rt(topo(spec));
    std::atomic<int> wrong{0};
    std::vector<JoinHandle<void>> hs;
    for (int i = 0; i < 200; ++i)
      hs.push_back(rt.spawn([&, i] {
        for (int k = 0; k < 20; ++k) {
          set_errno(1000 + i);
          if (k % 2) this_fiber::yield();
          else this_fiber::sleep_for(std::chrono::microseconds(50)); // the worker's own syscalls run meanwhile
          if (get_errno() != 1000 + i) wrong.fetch_add(1);
        }
      }));
    hs.clear();
    INFO(spec);
    CHECK(wrong.load() == 0);
  }
}

TEST_CASE("a result whose handle goes after the fiber finished is destroyed by the handle's owner",
          "[regression][isolation]") {
  // Once a fiber is done, its result belongs to whoever holds the handle; a
  // detach then destroys it in that fiber. It used to go with the record's
  // last reference, which the finished fiber's worker often dropped while
  // already running another fiber.
  struct Ids {
    std::atomic<std::uint64_t> owner{0}, child{0};
    std::atomic<int> wrong{0}, destroyed{0};
  };
  struct Tracker {
    Ids* ids = nullptr;
    explicit Tracker(Ids* i) : ids(i) {}
    Tracker(Tracker&& o) noexcept : ids(std::exchange(o.ids, nullptr)) {}
    ~Tracker() {
      if (!ids) return;
      const std::uint64_t me = this_fiber::id();
      if (me != ids->owner.load() && me != ids->child.load()) ids->wrong.fetch_add(1);
      ids->destroyed.fetch_add(1);
    }
  };
  Runtime rt(topo("core:2 pu:1"));
  const int n = scaled(3000);
  auto h = rt.spawn([&] {
    int wrong = 0;
    for (int i = 0; i < n; ++i) {
      Ids ids;
      ids.owner = this_fiber::id();
      std::atomic<bool> returning{false};
      auto child = spawn(
          [&] {
            returning.store(true);
            return Tracker(&ids);
          },
          SpawnOptions{.pin_to_pu = 1}); // beside this fiber, which is pinned to PU 0
      ids.child = child.id();
      while (!returning.load()) this_fiber::yield(); // it runs on the other worker
      spin((i % 64) * 8);                            // sweep the detach across the child's last steps
      child.detach();
      while (ids.destroyed.load() == 0) this_fiber::yield();
      wrong += ids.wrong.load();
    }
    return wrong;
  }, SpawnOptions{.pin_to_pu = 0});
  CHECK(h.join() == 0);
}

TEST_CASE("io::close releases the fd number for a pipe made on another core", "[regression][tsan][io]") {
  // ThreadSanitizer learns of a close only through its close(2) interceptor.
  // A close done by the ring left the fd "open" in TSan's books, and a pipe
  // that reused the number in a fiber on another worker was reported as a data
  // race with the first pipe's creation (CI's TSan suite, fuzzer "core:2
  // pu:2"). The two fibers below share nothing TSan could order them by: a
  // relaxed flag tells the second that the first has closed. In the other
  // builds it checks that io::close really frees the numbers.
  Runtime rt(topo("core:2 pu:1"));
  std::atomic<int> closed{-1};
  auto a = rt.spawn([&] { // no Catch macros in the fibers: Catch is not thread-safe
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return false;
    const bool ok = io::close(fds[1]).ok() && io::close(fds[0]).ok();
    closed.store(fds[0], std::memory_order_relaxed);
    return ok;
  }, SpawnOptions{.pin_to_pu = 0});
  // New pipes take the lowest free numbers: the ones just closed, or lower
  // ones that other code freed meanwhile (in the ASan build, fds 7 and 8
  // came free between the two fibers in 2 runs of 30, worker start-up's own
  // files). So b makes pipes, keeping them open, until one reuses the number.
  struct Seen { int closed, pipes; bool reused; };
  auto b = rt.spawn([&] {
    while (closed.load(std::memory_order_relaxed) < 0) this_fiber::yield();
    const int before = closed.load(std::memory_order_relaxed);
    std::vector<int> made;
    bool reused = false;
    for (int i = 0; i < 16 && !reused; ++i) {
      int fds[2];
      if (::pipe2(fds, O_CLOEXEC) != 0) break;
      made.insert(made.end(), {fds[0], fds[1]});
      reused = fds[0] == before || fds[1] == before;
    }
    for (int fd : made) ::close(fd);
    return Seen{before, static_cast<int>(made.size() / 2), reused};
  }, SpawnOptions{.pin_to_pu = 1});
  CHECK(a.join());
  const Seen seen = b.join();
  INFO("fd " << seen.closed << " closed through the ring; pipes made until it came back: " << seen.pipes);
  CHECK(seen.reused);
}

TEST_CASE("I/O begun after the worker cancelled its in-flight I/O for shutdown ends too",
          "[regression][shutdown][io]") {
  // A worker cancels its in-flight I/O once, when it first sees the runtime
  // stopping. A fiber that reached its read or timer only after that pass
  // (one slow to get there: the 2x2 SMT guest hung here 2 times in 3, every
  // worker asleep in its ring and shutdown waiting for that fiber) waited for
  // ever. One worker, so that the order is certain: `early` has a read in
  // flight; `late` holds the worker until shutdown has begun, yields (the
  // worker's scheduling point cancels `early`'s read), then begins its own.
  const bool ok = finishes_in_child([] {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) _exit(2);
    std::atomic<bool> stopping{false};
    std::atomic<int> cancelled{0};
    {
      Runtime rt(topo("core:1 pu:1"));
      rt.spawn([&] {
        std::byte buf[8];
        if (io::read(fds[0], buf).error == std::errc::operation_canceled) cancelled.fetch_add(1);
      }, SpawnOptions{.detached = true});
      rt.spawn([&] {
        while (!stopping.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1)); // holds the worker
        this_fiber::yield();
        std::byte buf[8];
        if (io::read(fds[0], buf).error == std::errc::operation_canceled) cancelled.fetch_add(1);
        const auto far = std::chrono::steady_clock::now() + std::chrono::hours(1);
        if (io::sleep_until(far).error == std::errc::operation_canceled) cancelled.fetch_add(1);
      }, SpawnOptions{.detached = true});
      std::this_thread::sleep_for(std::chrono::milliseconds(50)); // both fibers started
      std::thread flag([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50)); // shutdown has set `stopping` by now
        stopping.store(true);
      });
      rt.shutdown();
      flag.join();
    }
    _exit(cancelled.load() == 3 ? 0 : 3);
  }, std::chrono::seconds(20));
  CHECK(ok);
}

TEST_CASE("shutdown ends the timers of a runtime made after another in the same process",
          "[regression][shutdown][io]") {
  // Shutdown used to cancel a worker's I/O with one IORING_ASYNC_CANCEL_ANY.
  // Linux 6.1 does not initialise a timer request's cancel sequence, and a
  // request recycled from the previous runtime's (cancelled) one may carry
  // the sequence of this ring's first ANY cancellation, which then skips it:
  // fibers in a 1 h sleep outlived shutdown in the SMT guest (kernel 6.1), 2 of
  // 3 tries of the guarantee test that shuts down while fibers wait. Kernels
  // that initialise the sequence (the development machine's 6.18) pass either
  // way; the vm tests run this one on 6.1.
  const bool ok = finishes_in_child([] {
    for (int round = 0; round < 6; ++round) {
      std::atomic<int> cancelled{0};
      {
        Runtime rt(topo("core:2 pu:2"));
        for (int f = 0; f < 16; ++f)
          rt.spawn([&] {
            const auto far = std::chrono::steady_clock::now() + std::chrono::hours(1);
            if (io::sleep_until(far).error == std::errc::operation_canceled) cancelled.fetch_add(1);
          }, SpawnOptions{.detached = true});
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        rt.shutdown();
      }
      if (cancelled.load() != 16) _exit(3);
    }
    _exit(0);
  }, std::chrono::seconds(60));
  CHECK(ok);
}
