// SPDX-License-Identifier: Apache-2.0
// Stack overflow reports and stall reports.
#include "test_support.hpp"
#include "platform/log.hpp"
#include "sched/worker.hpp" // Worker::blocks_worker

#include <coresched/coresched.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <fcntl.h>
#include <regex>
#include <spdlog/sinks/ostream_sink.h>
#include <sstream>
#include <string>
#include <utility>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace coresched;
using test_support::topo;

namespace {

volatile std::uint64_t recursion_limit = ~std::uint64_t{0}; // volatile: the compiler cannot prove the recursion ends

// Each frame keeps 512 bytes live, so 32 KiB run out after ~60 calls.
[[gnu::noinline]] std::uint64_t recurse(std::uint64_t depth) {
  volatile char frame[512];
  frame[0] = static_cast<char>(depth);
  frame[sizeof(frame) - 1] = 1;
  if (depth >= recursion_limit) return 0;
  return recurse(depth + 1) + static_cast<std::uint64_t>(frame[0]);
}

struct ChildResult {
  int status = 0;
  std::string stderr_text;
};

// Runs `body` in a forked child with its stderr captured. The child never
// returns into the test runner.
template <class F> ChildResult run_in_child(F body) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], STDERR_FILENO);
    const int null = open("/dev/null", O_WRONLY); // the runner's own crash report would land on stdout
    if (null >= 0) dup2(null, STDOUT_FILENO);
    std::signal(SIGABRT, SIG_DFL); // the test runner's own crash handler is not what is tested
    body();
    _exit(0);
  }
  close(fds[1]);
  ChildResult r;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) r.stderr_text.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  REQUIRE(waitpid(pid, &r.status, 0) == pid);
  return r;
}

} // namespace

TEST_CASE("a fiber that overflows its stack is named, then the process aborts", "[safety]") {
  const ChildResult r = run_in_child([] {
    Runtime rt(topo("core:1 pu:1"));
    const Cookie tenant = Cookie::create();
    rt.spawn([] { return recurse(0); }, SpawnOptions{.cookie = tenant, .stack_size = 32 * 1024}).join();
  });
  INFO("child stderr: " << r.stderr_text);
  REQUIRE(WIFSIGNALED(r.status));
  CHECK(WTERMSIG(r.status) == SIGABRT);
  CHECK(std::regex_search(r.stderr_text,
                          std::regex(R"(fiber [1-9][0-9]* \(cookie [1-9][0-9]*\) overflowed its 32 KiB stack)")));
}

TEST_CASE("a fault that is not a stack overflow is left to the default action", "[safety]") {
  const ChildResult r = run_in_child([] {
    Runtime rt(topo("core:1 pu:1"));
    rt.spawn([] {
        static volatile std::uintptr_t address = 16; // opaque to the compiler
        *reinterpret_cast<volatile int*>(address) = 1;
      }).join();
  });
  CHECK(r.stderr_text.find("overflowed") == std::string::npos);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The sanitizer's own SEGV handler was installed first; it reports and exits non-zero.
  CHECK((WIFSIGNALED(r.status) || (WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0)));
#else
  REQUIRE(WIFSIGNALED(r.status));
  CHECK(WTERMSIG(r.status) == SIGSEGV);
#endif
}

namespace {
// Spins for `d`, calling preempt_point() every ~100 us if `cooperative`.
void busy_for(std::chrono::milliseconds d, bool cooperative) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end)
    if (cooperative) this_fiber::preempt_point();
}

std::uint64_t total_stalls(const Stats& s) {
  std::uint64_t n = 0;
  for (const auto& w : s.workers) n += w.stalls;
  return n;
}
} // namespace

// Runs `body` in a fiber of a new cookie `name` on one worker with a 20 ms
// stall threshold; returns the stalls counted and what was logged meanwhile.
std::pair<std::uint64_t, std::string> stalls_of(const char* name, void (*body)()) {
  std::ostringstream logged;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(logged);
  detail::log().sinks().push_back(sink);
  const Cookie c = Cookie::create(name);
  std::uint64_t stalls = 0;
  {
    Options o = topo("core:1 pu:1");
    o.stall_threshold = std::chrono::milliseconds(20);
    Runtime rt(o);
    rt.spawn(body, SpawnOptions{.cookie = c}).join();
    stalls = total_stalls(rt.stats());
  }
  detail::log().sinks().pop_back(); // the runtime's threads are gone
  return {stalls, logged.str()};
}

TEST_CASE("a fiber that runs past the stall threshold without a preemption point is reported", "[safety]") {
  const auto [stalls, logged] = stalls_of("batch", [] { busy_for(std::chrono::milliseconds(150), false); });
  INFO(logged);
  CHECK(stalls == 1); // reported once per run, not once per tick
  CHECK(logged.find("without a preemption point") != std::string::npos);
  CHECK(logged.find("(batch)") != std::string::npos); // the tenant: the cookie's number and name
}

TEST_CASE("a fiber that blocks its worker in a system call is reported, though it uses no CPU", "[safety]") {
  // A blocking call made the plain way, not through coresched::io: the
  // worker's thread sleeps in the kernel for 150 ms.
  const auto [stalls, logged] = stalls_of("dns", [] { ::usleep(150'000); });
  INFO(logged);
  CHECK(stalls == 1);
  CHECK(logged.find("blocked worker") != std::string::npos);
  CHECK(logged.find("(dns)") != std::string::npos);
  CHECK(logged.find("blocking_call") != std::string::npos); // the way out
}

// A worker asleep in a call that waits for the process's memory-map lock
// (its own stack mapping, a sanitizer's shadow) or in a futex is held by
// another thread, not by the fiber that ran last: no stall is reported.
TEST_CASE("a worker waiting for a lock in the kernel is not reported as blocked by its fiber", "[safety]") {
  for (long nr : {SYS_futex, SYS_mmap, SYS_munmap, SYS_mprotect, SYS_madvise, SYS_process_madvise, SYS_mremap, SYS_brk}) {
    INFO("system call " << nr);
    CHECK_FALSE(detail::Worker::blocks_worker(nr));
  }
  for (long nr : {SYS_read, SYS_nanosleep, SYS_clock_nanosleep, SYS_recvfrom, SYS_connect, SYS_poll, SYS_epoll_wait}) {
    INFO("system call " << nr);
    CHECK(detail::Worker::blocks_worker(nr));
  }
  CHECK_FALSE(detail::Worker::blocks_worker(-1)); // blocked outside a system call
}

TEST_CASE("the same call through blocking_call is not reported: the worker goes on", "[safety][blocking]") {
  const auto [stalls, logged] = stalls_of("dns-offloaded", [] { blocking_call([] { ::usleep(150'000); }); });
  INFO(logged);
  CHECK(stalls == 0);
}

TEST_CASE("a fiber that reaches preemption points is not reported as a stall", "[safety]") {
  Options o = topo("core:1 pu:1");
  o.stall_threshold = std::chrono::milliseconds(200); // far above any VM hiccup
  Runtime rt(o);
  rt.spawn([] { busy_for(std::chrono::milliseconds(400), true); }).join();
  CHECK(total_stalls(rt.stats()) == 0);

  Options off = topo("core:1 pu:1");
  off.stall_threshold = std::chrono::milliseconds(0);
  Runtime quiet(off);
  quiet.spawn([] { busy_for(std::chrono::milliseconds(60), false); }).join();
  CHECK(total_stalls(quiet.stats()) == 0);

  Options bad = topo("core:1 pu:1");
  bad.stall_threshold = std::chrono::milliseconds(-1);
  CHECK_THROWS_AS(Runtime(bad), UsageError);
}

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>

#include "fiber/stack_pool.hpp"

// A fiber's entry frame never returns, so its redzone marks outlive it. If a
// freed stack kept them, the next mapping at that address (an io_uring ring,
// say) would read as a stack-buffer-underflow.
TEST_CASE("a freed fiber stack leaves no ASan redzones behind", "[safety][asan]") {
  const detail::Stack s = detail::allocate_stack(64 * 1024);
  char* frame = static_cast<char*>(s.top()) - 4096;
  __asan_poison_memory_region(frame, 256); // what an abandoned frame leaves
  REQUIRE(__asan_region_is_poisoned(s.base, s.size) != nullptr);
  detail::free_stack(s);
  CHECK(__asan_region_is_poisoned(s.base, s.size) == nullptr);
}
#endif
