// SPDX-License-Identifier: Apache-2.0
// Runtime::dump: what it reports of fibers parked in each kind of
// wait, of a worker that never yields, and of the cores.
#include "test_support.hpp"

#include <coresched/coresched.hpp>

#include <catch2/catch.hpp>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <poll.h>
#include <string>
#include <thread>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

using namespace coresched;
using test_support::topo;

namespace {

std::string dump_of(const Runtime& rt) {
  char* buf = nullptr;
  std::size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  REQUIRE(f);
  rt.dump(f);
  std::fclose(f);
  std::string s(buf, len);
  std::free(buf);
  return s;
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// Waits (bounded) until `n` fibers of the dump are parked.
template <class F> std::string dump_when(const Runtime& rt, F ready) {
  std::string d;
  for (int i = 0; i < 2000; ++i) {
    d = dump_of(rt);
    if (ready(d)) return d;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return d;
}

[[gnu::noinline]] void wait_in_a_named_function(Event& e) {
  e.wait();
  asm volatile("" ::: "memory"); // not a tail call: this frame stays on the stack
}

// Waits with the link to its caller's frame (saved rbp, return address)
// marked unreadable to ASan while it is parked, as a walk through code without
// frame pointers can land on any word of a stack, redzones included. The dump
// must read it anyway, unchecked, and not abort the program.
[[gnu::noinline, gnu::no_icf]] void wait_with_a_poisoned_frame_link(Event& e) {
#if defined(__SANITIZE_ADDRESS__)
  auto* link = static_cast<char*>(__builtin_frame_address(0));
  ASAN_POISON_MEMORY_REGION(link, 16);
#endif
  e.wait();
#if defined(__SANITIZE_ADDRESS__)
  ASAN_UNPOISON_MEMORY_REGION(link, 16);
#endif
  asm volatile("" ::: "memory");
}

// Calls fn() with rbp holding `value`, as code built without frame pointers
// may use rbp as a general register while it calls into the runtime.
extern "C" void dump_test_call_with_rbp(void (*fn)(), long value);
asm(".text\n"
    ".globl dump_test_call_with_rbp\n"
    ".type dump_test_call_with_rbp, @function\n"
    "dump_test_call_with_rbp:\n"
    "  pushq %rbp\n"
    "  movq %rsi, %rbp\n"
    "  callq *%rdi\n"
    "  popq %rbp\n"
    "  retq\n"
    ".size dump_test_call_with_rbp, .-dump_test_call_with_rbp\n");

Event* rbp_test_event = nullptr;
[[gnu::noinline]] void wait_for_rbp_test_event() { rbp_test_event->wait(); }

} // namespace

// A frame pointer of -8 or -16 makes "fp + 16 > hi" wrap and pass, and a
// walk that trusted it would read address 0 or -8: a SIGSEGV in the dump.
TEST_CASE("the fiber dump ends its walk at a frame pointer near the top of the address space", "[dump]") {
  Runtime rt(topo("core:1 pu:2"));
  for (const long rbp : {-8L, -16L, 0x1000L}) {
    Event release;
    rbp_test_event = &release;
    auto waiter = rt.spawn([rbp] { dump_test_call_with_rbp(&wait_for_rbp_test_event, rbp); });
    const std::string d = dump_when(rt, [&](const std::string& s) {
      return has(s, "fiber " + std::to_string(waiter.id()) + " cookie 0 (untagged) parked");
    });
    INFO("rbp " << rbp << "\n" << d);
    CHECK(has(d, "started fibers listed"));
    release.set();
    waiter.join();
  }
}

// Fiber records are recycled (and may go back to malloc) while a dump reads
// them: under ASan plain reads of them abort the program.
TEST_CASE("fiber dumps taken while fibers come and go read no record unchecked", "[dump]") {
  Runtime rt(topo("core:2 pu:2"));
  std::atomic<bool> stop{false};
  std::vector<JoinHandle<void>> churn;
  for (int k = 0; k < 4; ++k)
    churn.push_back(rt.spawn([&] {
      while (!stop.load()) {
        auto a = spawn([] { this_fiber::yield(); });
        auto b = spawn([] {});
        b.join(); // (often inline)
        a.join();
      }
    }, SpawnOptions{.cookie = Cookie::from_value(static_cast<std::uint64_t>(1 + k % 2))}));
  std::FILE* null = std::fopen("/dev/null", "w");
  REQUIRE(null);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  int dumps = 0;
  while (std::chrono::steady_clock::now() < until) {
    rt.dump(null);
    ++dumps;
  }
  std::fclose(null);
  stop = true;
  for (auto& h : churn) h.join();
  INFO(dumps << " dumps");
  CHECK(dumps > 0);
}

// libdw's line tables take more than a fiber's default 64 KiB of stack: a
// dump run on the fiber itself would mostly overflow it.
TEST_CASE("a fiber dump taken from a fiber with the default stack", "[dump]") {
  Runtime rt(topo("core:1 pu:2"));
  Event release;
  auto waiter = rt.spawn([&] { wait_in_a_named_function(release); });
  const std::string d = rt.spawn([&] {
                            std::string text;
                            for (int i = 0; i < 2000 && !has(text, "wait_in_a_named_function"); ++i) {
                              text = dump_of(*Runtime::current());
                              this_fiber::sleep_for(std::chrono::milliseconds(1));
                            }
                            return text;
                          }).join();
  INFO(d);
  CHECK(has(d, "wait_in_a_named_function"));
  release.set();
  waiter.join();
}

TEST_CASE("the fiber dump walks a frame that ASan marks as a redzone without aborting", "[dump]") {
  Runtime rt(topo("core:1 pu:2"));
  Event release;
  auto waiter = rt.spawn([&] { wait_with_a_poisoned_frame_link(release); });
  // Until the fiber shows parked with its frame: a dump may catch it still
  // running into its wait, or parked with only the switch on its stack.
  const std::string parked = "fiber " + std::to_string(waiter.id()) + " cookie 0 (untagged) parked";
  const std::string d = dump_when(rt, [&](const std::string& s) {
    return has(s, parked) && has(s, "wait_with_a_poisoned_frame_link");
  });
  INFO(d);
  CHECK(has(d, parked));
  CHECK(has(d, "wait_with_a_poisoned_frame_link"));
  release.set();
  waiter.join();
}

TEST_CASE("the fiber dump names what each parked fiber waits for, with its frames", "[dump]") {
  Runtime rt(topo("core:1 pu:2"));
  Event release;
  Mutex m;
  Semaphore sem(0);
  WaitGroup wg;
  wg.add(1);
  Channel<int> ch(0);
  int fds[2];
  REQUIRE(::pipe(fds) == 0);

  const Cookie waits = Cookie::create("waits \"here\"");
  auto event_waiter = rt.spawn([&] { wait_in_a_named_function(release); }, SpawnOptions{.cookie = waits});
  auto joiner = rt.spawn([&] { event_waiter.join(); });
  auto mutex_holder = rt.spawn([&] {
    m.lock();
    release.wait();
    m.unlock();
  });
  auto mutex_waiter = rt.spawn([&] {
    while (m.try_lock()) { // until the holder has it
      m.unlock();
      this_fiber::yield();
    }
    m.lock();
    m.unlock();
  });
  auto sem_waiter = rt.spawn([&] { sem.acquire(); });
  auto wg_waiter = rt.spawn([&] { wg.wait(); });
  auto ch_waiter = rt.spawn([&] { return ch.recv(); });
  auto reader = rt.spawn([&] {
    std::byte b[1];
    return io::read(fds[0], b).value;
  });
  auto sleeper = rt.spawn([&] { this_fiber::sleep_for(std::chrono::seconds(30)); });

  const std::string want_join = "join of fiber " + std::to_string(event_waiter.id());
  const std::string want_read = "io read on fd " + std::to_string(fds[0]);
  const std::string d = dump_when(rt, [&](const std::string& s) {
    return has(s, want_join) && has(s, "Event at 0x") && has(s, "Mutex at 0x") && has(s, "Semaphore at 0x") &&
           has(s, "WaitGroup at 0x") && has(s, "Channel recv at 0x") && has(s, want_read) && has(s, "sleep, ");
  });
  INFO(d);
  CHECK(has(d, want_join));
  CHECK(has(d, "Event at 0x"));
  CHECK(has(d, "Mutex at 0x"));
  CHECK(has(d, "Semaphore at 0x"));
  CHECK(has(d, "WaitGroup at 0x"));
  CHECK(has(d, "Channel recv at 0x"));
  CHECK(has(d, want_read));
  CHECK(has(d, "sleep, "));
  CHECK(has(d, "fiber " + std::to_string(event_waiter.id()) + " cookie " + std::to_string(waits.value()) +
                   " (waits \"here\") parked")); // the cookie's label: number and name
  // Frames from the saved context, named: the runtime's wait and the test's own
  // function (this file is built with frame pointers, as the README advises).
  CHECK(has(d, "coresched::detail::WaitQueue::wait"));
  CHECK(has(d, "wait_in_a_named_function(coresched::Event&) at test_dump.cpp:"));
  CHECK(has(d, "core 0 (workers 0,1)"));
  CHECK(has(d, "started fibers listed"));

  release.set();
  sem.release();
  wg.done();
  ch.send(1);
  REQUIRE(::write(fds[1], "x", 1) == 1);
  rt.shutdown(); // ends the sleep early
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_CASE("the fiber dump returns while a fiber holds its worker", "[dump]") {
  Runtime rt(topo("core:1 pu:2"));
  std::atomic<bool> stop{false}, spinning{false};
  const Cookie spin = Cookie::create("spin"), other_cookie = Cookie::create();
  auto spinner = rt.spawn([&] {
    spinning = true;
    while (!stop.load()) {} // no preemption point
  }, SpawnOptions{.cookie = spin});
  auto other = rt.spawn([&] { this_fiber::sleep_for(std::chrono::milliseconds(1)); },
                        SpawnOptions{.cookie = other_cookie});
  while (!spinning) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::string d = dump_of(rt);
  INFO(d);
  CHECK(has(d, "runs fiber " + std::to_string(spinner.id()) + " (cookie " + spin.label() + ")"));
  CHECK(has(d, "fiber " + std::to_string(spinner.id()) + " cookie " + spin.label() + " running"));
  CHECK(has(d, "owner cookie " + spin.label() + " for "));
  stop = true;
}

TEST_CASE("the fiber dump lists fibers that never ran and a child run inline", "[dump]") {
  // A slice that never ends: a join asked to stop by the tick does not run
  // its child inline, and with the spinner holding PU 1 the tick comes once
  // the parent has run a millisecond (under TSan, a spawn and the dump's
  // turns on the core lock take that).
  Options o = topo("core:1 pu:2");
  o.slice = std::chrono::hours(1);
  Runtime rt(o);
  Event go;
  std::atomic<std::uint64_t> child_id{0}, parent_id{0};
  // A fiber pinned behind a spinner never runs while the dump is taken. The
  // spinner holds PU 1 before the parent spawns its child: an idle PU 1 could
  // take the child first, and it would not run inline (now and then under
  // TSan).
  std::atomic<bool> stop{false}, spinning{false};
  auto spinner = rt.spawn([&] {
    spinning = true;
    while (!stop.load()) {}
  }, SpawnOptions{.pin_to_pu = 1});
  while (!spinning.load()) std::this_thread::yield();
  auto queued = rt.spawn([] {}, SpawnOptions{.pin_to_pu = 1});
  auto parent = rt.spawn([&] {
    parent_id = this_fiber::id();
    auto child = spawn([&] {
      child_id = this_fiber::id();
      go.wait();
    });
    child.join(); // runs inline: same cookie, not started
  }, SpawnOptions{.pin_to_pu = 0});
  const std::string d = dump_when(rt, [&](const std::string& s) {
    // (and its queues read: an idle worker spinning on the core lock, slow
    // under TSan, can keep the dump from taking it for its 1 ms)
    // The child sets its id before it parks: wait for the park too (a dump
    // taken between the two lists it running, now and then under TSan).
    return child_id.load() && has(s, "fiber " + std::to_string(child_id.load()) + " cookie 0 (untagged) parked") &&
           has(s, "below it on the same stack: fiber " + std::to_string(parent_id.load())) &&
           !has(s, "queues not read");
  });
  INFO(d);
  CHECK(has(d, "fiber " + std::to_string(child_id.load()) + " cookie 0 (untagged) parked"));
  CHECK(has(d, "below it on the same stack: fiber " + std::to_string(parent_id.load())));
  CHECK(has(d, "fiber " + std::to_string(queued.id()) + " cookie 0 (untagged), pinned to PU 1, never ran"));
  stop = true;
  go.set();
}

TEST_CASE("the dump signal writes a fiber dump to stderr", "[dump]") {
  // In a child process: the dump goes to its stderr, which the parent reads.
  // No fixed sleeps: the child signals once its fiber has parked, and lets
  // the fiber go (and exits) only when the parent has read the dump's last
  // line, however slow the sanitized child or its first symbolizer load.
  int out[2], go[2];
  REQUIRE(::pipe(out) == 0);
  REQUIRE(::pipe(go) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out[1], 2);
    ::close(go[1]);
    Options o = topo("core:1 pu:2");
    o.dump_signal = SIGUSR2;
    Runtime rt(o);
    Event e;
    auto h = rt.spawn([&] { wait_in_a_named_function(e); });
    (void)dump_when(rt, [&](const std::string& d) { return has(d, "fiber " + std::to_string(h.id()) + " cookie 0 (untagged) parked"); });
    ::kill(::getpid(), SIGUSR2);
    pollfd p{go[0], POLLIN, 0};
    (void)::poll(&p, 1, 30'000); // the parent has read the whole dump (or gave up)
    e.set();
    h.join();
    std::_Exit(0);
  }
  ::close(out[1]);
  ::close(go[0]);
  std::string text;
  char buf[4096];
  bool released = false;
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) {
    text.append(buf, static_cast<std::size_t>(n));
    if (!released && (has(text, " started fibers listed ===") || has(text, "started fibers not listed]"))) {
      released = true;
      (void)!::write(go[1], "x", 1);
    }
  }
  ::close(out[0]);
  ::close(go[1]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  INFO(text);
  CHECK(WIFEXITED(status));
  CHECK(has(text, "=== coresched fiber dump"));
  CHECK(has(text, "waiting"));
  CHECK(has(text, "Event at 0x"));
}

TEST_CASE("a dump signal that cannot be caught is refused with a message", "[dump]") {
  Options o = topo("core:1 pu:1");
  o.dump_signal = SIGKILL;
  CHECK_THROWS_AS(Runtime(o), UsageError);
  // A fault signal's handler must stay the fault's (SIGSEGV reports a
  // fiber's stack overflow).
  for (const int fault : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) {
    o.dump_signal = fault;
    CHECK_THROWS_WITH(Runtime(o), Catch::Contains("fault signal"));
  }
  o.dump_signal = 0;
  ::setenv("CORESCHED_DUMP_SIGNAL", "SIGNOPE", 1);
  CHECK_THROWS_WITH(Runtime(o), Catch::Contains("CORESCHED_DUMP_SIGNAL=SIGNOPE"));
  ::setenv("CORESCHED_DUMP_SIGNAL", "USR2", 1);
  CHECK_NOTHROW(Runtime(o));
  ::unsetenv("CORESCHED_DUMP_SIGNAL");
}

namespace {

struct WatchedRun {
  double seconds = 0;       // from the first spawn to the end of shutdown()
  std::uint64_t stalls = 0; // WorkerStats::stalls, all workers, before shutdown
  int dumps = 0;
};

// A runtime's life, watched (or not) by a plain thread that writes a dump to
// /dev/null every 0.5 ms: busy fibers that reach a preemption point every few
// us until a flag, and 256 sleeping fibers, each started on a stack of its
// own (a worker maps stacks for them as they first run); once all sleep, the
// flag and shutdown (which ends the sleeps).
WatchedRun run_watched(bool dumping) {
  Runtime rt(topo("core:2 pu:2"));
  std::atomic<bool> stop{false}, done{false};
  std::atomic<int> asleep{0}, dumps{0};
  std::thread dumper;
  if (dumping) {
    dumper = std::thread([&] {
      std::FILE* null = std::fopen("/dev/null", "w");
      if (!null) return;
      while (!done.load()) {
        rt.dump(null);
        ++dumps;
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
      std::fclose(null);
    });
    while (dumps.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  constexpr int kSleepers = 256;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<JoinHandle<void>> fibers;
  for (int k = 0; k < 4; ++k)
    fibers.push_back(rt.spawn([&] { test_support::busy_until(stop); },
                              SpawnOptions{.cookie = Cookie::from_value(static_cast<std::uint64_t>(1 + k % 2))}));
  for (int k = 0; k < kSleepers; ++k)
    fibers.push_back(rt.spawn([&] {
      asleep.fetch_add(1);
      this_fiber::sleep_for(std::chrono::hours(1));
    }, SpawnOptions{.cookie = Cookie::from_value(static_cast<std::uint64_t>(1 + k % 2))}));
  while (asleep.load() < kSleepers) std::this_thread::sleep_for(std::chrono::microseconds(200));
  WatchedRun r;
  for (const auto& w : rt.stats().workers) r.stalls += w.stalls;
  stop = true;
  rt.shutdown();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done = true;
  if (dumper.joinable()) dumper.join();
  r.dumps = dumps.load();
  return r;
}

} // namespace

// A worker mapping a stack for a fiber's first run waits for the lock of the
// list of stacks: were a dump to hold it while it symbolizes and writes
// every fiber's frames, with a thread dumping every 0.5 ms each such worker
// would wait for a whole dump (the run below would take seconds, against
// tens of ms without dumps), and another worker, spinning until the context
// of the fiber switched out there was saved, would report that fiber as stalled. A busy
// machine only slows a run (by seconds, on a shared 2-CPU one), so each
// kind's fastest of five runs is compared (alternated, on the same machine).
// Stalls are counted while the fibers run.
TEST_CASE("fiber dumps every 0.5 ms neither stretch a runtime's run and shutdown nor report stalls", "[dump]") {
  std::string runs;
  double quiet = 1e9, dumped = 1e9;
  std::uint64_t stalls = 0;
  int dumps = 0;
  for (int round = 0; round < 5; ++round) {
    const WatchedRun q = run_watched(false);
    const WatchedRun d = run_watched(true);
    quiet = std::min(quiet, q.seconds);
    dumped = std::min(dumped, d.seconds);
    stalls += d.stalls;
    dumps += d.dumps;
    runs += "without dumps " + std::to_string(q.seconds) + " s (" + std::to_string(q.stalls) + " stalls), with " +
            std::to_string(d.dumps) + " dumps " + std::to_string(d.seconds) + " s (" + std::to_string(d.stalls) +
            " stalls)\n";
  }
  INFO(runs);
  CHECK(dumps > 0);
  CHECK(dumped <= 3 * quiet);
  CHECK(stalls == 0);
}
