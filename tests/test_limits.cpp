// SPDX-License-Identifier: Apache-2.0
// Edge values a caller may pass (stack sizes, counts, sleeps, I/O lengths,
// options and environment), stacks shared by inline joins, running out of
// stacks, and shutdown beside a fiber that keeps spawning. Every case was run
// against the code before its fix and failed there.
#include "stack_pool.hpp"
#include "test_support.hpp"

#include <coresched/coresched.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <fcntl.h>
#include <functional>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>

using namespace coresched;
using namespace std::chrono_literals;
using test_support::topo;

namespace {
// Holds `Bytes` of its own stack (touched page by page from the top) while
// `fn` runs below it, as a joiner deep in its own frames would.
template <std::size_t Bytes, class Fn> [[gnu::noinline]] int holding(Fn fn) {
  volatile char big[Bytes];
  for (std::size_t i = sizeof(big); i >= 1024; i -= 1024) big[i - 1] = 1;
  big[0] = 1;
  return big[0] + fn();
}

// A chain of fibers, each holding 12 KiB while it joins the next.
int chain(int depth) {
  if (depth == 0) return 0;
  return holding<12 * 1024>([depth] { return spawn([depth] { return chain(depth - 1); }).join(); });
}
} // namespace

// An inline join compared the child's ask with the joiner's whole stack, not
// with what the joiner's frames had left. A 64 KiB joiner holding 40 KiB ran a
// 64 KiB child needing 40 KiB inline below it and overflowed (every run, on
// one PU); a chain of joiners holding 12 KiB each overflowed at its fifth
// inline level. Each asks for the default and would fit on a stack of its own.
// Without the fix the process aborts (stack overflow).
TEST_CASE("a child joined inline below a busy joiner still gets the stack it asked for", "[limits][stack]") {
  Runtime rt(topo("core:1 pu:1"));
  const int pair = rt.spawn([] {
    return holding<40 * 1024>([] { return spawn([] { return holding<40 * 1024>([] { return 0; }); }).join(); });
  }).join();
  CHECK(pair == 2);
  CHECK(rt.spawn([] { return chain(12); }).join() == 12);
}

// SIZE_MAX rounded up to whole pages wrapped to 0, and the first fiber wrote
// its stack header into a guard page (SIGSEGV); 128 TiB could never be
// mapped, and its fiber waited for a stack for ever, with its joiner.
TEST_CASE("a stack size no fiber can have is refused at once", "[limits][stack]") {
  Runtime rt(topo("core:1 pu:1"));
  for (std::size_t bad : {SIZE_MAX, SIZE_MAX - 4095, std::size_t{1} << 47, (std::size_t{1} << 30) + 1})
    CHECK_THROWS_WITH(rt.spawn([] {}, SpawnOptions{.stack_size = bad}), Catch::Contains("largest stack"));
  CHECK(rt.spawn([] { return 1; }, SpawnOptions{.stack_size = std::size_t{16} << 20}).join() == 1);
  Options o = topo("core:1 pu:1");
  o.stack_size = SIZE_MAX;
  CHECK_THROWS_WITH(Runtime(o), Catch::Contains("largest stack"));
}

// now() + nanoseconds::max() overflowed into the past: the longest sleep
// returned at once. It now ends only with the runtime's shutdown.
TEST_CASE("the longest sleep does not return early", "[limits][sleep]") {
  Runtime rt(topo("core:1 pu:1"));
  std::atomic<bool> shutting{false};
  std::atomic<bool> woke_before_shutdown{false};
  auto sleeper = rt.spawn([&] {
    this_fiber::sleep_for(std::chrono::nanoseconds::max());
    woke_before_shutdown.store(!shutting.load());
  });
  std::this_thread::sleep_for(100ms);
  shutting.store(true);
  rt.shutdown();
  sleeper.join();
  CHECK_FALSE(woke_before_shutdown.load());
}

// Semaphore::release added past PTRDIFF_MAX (available() then read -2), and a
// WaitGroup's overflowing add was refused as "would become negative".
TEST_CASE("counts that would overflow are refused and left as they were", "[limits][sync]") {
  Semaphore sem(PTRDIFF_MAX - 1);
  sem.release(1);
  CHECK_THROWS_WITH(sem.release(1), Catch::Contains("overflow"));
  CHECK(sem.available() == PTRDIFF_MAX);
  CHECK(sem.try_acquire());
  CHECK(sem.available() == PTRDIFF_MAX - 1);

  WaitGroup wg;
  wg.add(INT64_MAX);
  CHECK_THROWS_WITH(wg.add(1), Catch::Contains("overflow"));
  CHECK(wg.count() == INT64_MAX);
  CHECK_THROWS_WITH(wg.add(INT64_MIN), Catch::Contains("negative"));
  wg.add(-INT64_MAX);
  CHECK(wg.count() == 0);
}

// Sizes at the limits of the system calls' types.
TEST_CASE("a transfer past 4 GiB is a short count, not its length cut to 32 bits", "[limits][io]") {
  // 4 GiB + 5 bytes of address space that /dev/null's write never reads.
  const std::size_t len = (std::size_t{4} << 30) + 5;
  void* p = mmap(nullptr, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  REQUIRE(p != MAP_FAILED);
  const int fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  Runtime rt(topo("core:1 pu:1"));
  const io::Result r = rt.spawn([&] { return io::write(fd, {static_cast<const std::byte*>(p), len}); }).join();
  ::close(fd);
  munmap(p, len);
  CHECK(r.ok());
  CHECK(r.value == 0x7ffff000); // as write(2) itself gives (MAX_RW_COUNT); it was 5
}

TEST_CASE("settings out of range are refused with a message", "[limits][options]") {
  auto refused = [](auto change) {
    Options o = topo("core:1 pu:1");
    change(o);
    CHECK_THROWS_AS(Runtime(o), UsageError);
  };
  refused([](Options& o) { o.slice = std::chrono::microseconds::max(); }); // overflowed: ticked every 90 us
  refused([](Options& o) { o.stall_threshold = std::chrono::milliseconds(18446744073710); }); // wrapped to 0.45 ms
  refused([](Options& o) { o.log_level = "bogus"; }); // taken as "off"
  refused([](Options& o) { o.dump_signal = 32; });    // glibc's own: sigaction failed, logged only
  CHECK_THROWS_AS(Runtime(topo("core:100000 pu:100000")), TopologyError); // was still in hwloc after 60 s
  Runtime rt(topo("core:1 pu:1"));
  CHECK_THROWS_AS(rt.dump(nullptr), UsageError); // SIGSEGV
}

TEST_CASE("environment values out of range are refused with a message", "[limits][options]") {
  struct Env {
    const char* name;
    Env(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
    ~Env() { ::unsetenv(name); }
  };
  {
    Env e("CORESCHED_TRACE_EVENTS", "-1"); // std::length_error: terminate in a program without a catch
    Options o = topo("core:1 pu:1");
    o.trace_path = "/dev/null";
    CHECK_THROWS_AS(Runtime(o), UsageError);
  }
  {
    Env e("CORESCHED_DUMP_SIGNAL", "4294967306"); // read as 10, SIGUSR1
    CHECK_THROWS_AS(Runtime(topo("core:1 pu:1")), UsageError);
  }
}

TEST_CASE("a Cancellation serves one operation at a time", "[limits][io]") {
  Runtime rt(topo("core:2 pu:1"));
  io::Cancellation c;
  std::atomic<bool> started{false};
  auto sleeper = rt.spawn([&] {
    started.store(true);
    return io::sleep_until(std::chrono::steady_clock::now() + 30s, &c);
  }, SpawnOptions{.pin_to_pu = 0});
  while (!started.load()) std::this_thread::sleep_for(1ms);
  // The second took the handle over, and cancel() reached only it: the first
  // ran to its end. Tried until the first is in flight (a slow build may
  // not have queued it yet); without the check no try is refused.
  bool refused = false;
  for (int i = 0; i < 200 && !refused; ++i) {
    try {
      rt.spawn([&] { return io::sleep_until(std::chrono::steady_clock::now() + 1ms, &c); },
               SpawnOptions{.pin_to_pu = 1}).join();
      std::this_thread::sleep_for(10ms);
    } catch (const UsageError&) {
      refused = true;
    }
  }
  CHECK(refused);
  c.cancel();
  CHECK(sleeper.join().error == std::errc::operation_canceled);
}

// Each fiber joins a child of the other cookie, so no child runs inline on its
// joiner's stack: when no stack can be mapped, every fiber that could free one
// waits for the child that has none. The child must fail (its join throws
// StackError), and the error unwinds the chain, instead of a hang.
TEST_CASE("a join chain that alternates cookies ends with StackError when no stack can be mapped", "[limits][stack]") {
  using coresched::detail::testing::fail_stack_allocations;
  Runtime rt(topo("core:1 pu:2"));
  const Cookie ab[2] = {Cookie::create(), Cookie::create()};
  constexpr int kRunsOutAt = 10;
  std::atomic<int> deepest{0};
  std::function<int(int)> link = [&](int depth) -> int {
    deepest.store(depth);
    if (depth == kRunsOutAt) fail_stack_allocations.store(1 << 30); // every mmap fails from here on
    if (depth == 2 * kRunsOutAt) return depth;
    // An odd stack size: never one from a pool, so each start maps one.
    return rt.spawn([&link, depth] { return link(depth + 1); },
                    SpawnOptions{.cookie = ab[(depth + 1) % 2], .stack_size = 72 * 1024})
        .join();
  };
  // Should the chain hang, let it finish after a while, so that the check fails.
  std::atomic<bool> done{false}, gave_up{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 600 && !done.load(); ++i) std::this_thread::sleep_for(50ms);
    if (!done.load()) {
      gave_up.store(true);
      fail_stack_allocations.store(0);
    }
  });
  std::string error;
  try {
    (void)rt.spawn([&] { return link(0); }).join();
  } catch (const StackError& e) {
    error = e.what();
  }
  done.store(true);
  watchdog.join();
  fail_stack_allocations.store(0);
  CHECK_FALSE(gave_up.load());
  CHECK(deepest.load() == kRunsOutAt);
  CHECK_THAT(error, Catch::Contains("never ran") && Catch::Contains("vm.max_map_count"));
  // The runtime goes on: stacks map again, and the reserve is there for the next time.
  CHECK(rt.spawn([] { return 5; }, SpawnOptions{.stack_size = 72 * 1024}).join() == 5);
}

// Sleeps end at once while a runtime shuts down: a fiber that spawns in a
// sleep-paced loop must not keep shutdown waiting for ever. Its spawns are
// refused once shutdown has begun.
TEST_CASE("a fiber spawning in a loop cannot hold shutdown", "[limits][shutdown]") {
  Runtime rt(topo("core:2 pu:1"));
  std::atomic<long> accepted{0}, refused_after{0};
  std::atomic<bool> started{false};
  rt.spawn([&] {
    started.store(true);
    for (;;) {
      try {
        spawn([] {}, SpawnOptions{.detached = true});
        accepted.fetch_add(1);
      } catch (const UsageError& e) {
        if (std::string(e.what()).find("shutdown") != std::string::npos) refused_after.fetch_add(1);
        return;
      }
      this_fiber::sleep_for(1ms);
    }
  }, SpawnOptions{.detached = true});
  while (!started.load()) std::this_thread::yield();
  // Should shutdown hang, its spawner would run for ever: a thread fails the case first.
  std::atomic<bool> shut{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 600 && !shut.load(); ++i) std::this_thread::sleep_for(50ms);
    if (!shut.load()) {
      std::fprintf(stderr, "shutdown did not end in 30 s while a fiber kept spawning\n");
      std::abort();
    }
  });
  std::this_thread::sleep_for(20ms);
  rt.shutdown();
  shut.store(true);
  watchdog.join();
  CHECK(accepted.load() > 0);
  CHECK(refused_after.load() == 1);
  CHECK_THROWS_WITH(rt.spawn([] {}), Catch::Contains("after shutdown"));
}

TEST_CASE("a Channel capacity that cannot be allocated is a UsageError", "[limits][channel]") {
  CHECK_THROWS_WITH(Channel<int>(SIZE_MAX), Catch::Contains("Channel capacity") && Catch::Contains("allocated"));
  CHECK_THROWS_AS(Channel<std::uint64_t>(std::size_t{1} << 60), UsageError);
  Channel<int> fine(4);
  CHECK(fine.try_send(1));
}
