// SPDX-License-Identifier: Apache-2.0
// Fiber stacks: a fiber gets the size it asked for, also when run inline below
// its joiner; a size no fiber can have is refused; a fiber that finds no memory
// for its stack waits for one, and a join chain that can map none ends in StackError;
// stacks are carved from slabs (a mapping per slab, not two per fiber) and keep
// their guard pages when their memory is given back.
#include "guarantees/oracle.hpp"
#include "fiber/stack_pool.hpp"
#include "test_support.hpp"

#include <coresched/coresched.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

using namespace coresched;
using namespace std::chrono_literals;
using guarantees::Oracle;
using guarantees::Scope;
using test_support::spin;
using test_support::topo;

namespace {
// Touches 200 KiB of stack page by page from the top, as a deep call chain
// would, so that running short of stack meets the guard page.
[[gnu::noinline]] int use_200k() {
  volatile char big[200 * 1024];
  for (std::size_t i = sizeof(big); i >= 1024; i -= 1024) big[i - 1] = 1;
  big[0] = 2;
  return big[0] + big[sizeof(big) - 1];
}

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

TEST_CASE("a child joined at once gets the stack size it asked for", "[stack]") {
  Runtime rt(topo("core:1 pu:1"));
  auto h = rt.spawn([] {
    // Before the child starts: the join could run it inline on this 64 KiB stack.
    return spawn([] { return use_200k(); }, SpawnOptions{.stack_size = 512 * 1024}).join();
  });
  CHECK(h.join() == 3);
}

// An inline join compares the child's ask with what the joiner's frames have
// left, not with the joiner's whole stack. Otherwise a 64 KiB joiner holding
// 40 KiB would run a 64 KiB child needing 40 KiB inline below it and
// overflow, and a chain of joiners holding 12 KiB each would overflow at its
// fifth inline level; the process aborts (stack overflow). Each asks for the
// default and would fit on a stack of its own.
TEST_CASE("a child joined inline below a busy joiner still gets the stack it asked for", "[stack]") {
  Runtime rt(topo("core:1 pu:1"));
  const int pair = rt.spawn([] {
    return holding<40 * 1024>([] { return spawn([] { return holding<40 * 1024>([] { return 0; }); }).join(); });
  }).join();
  CHECK(pair == 2);
  CHECK(rt.spawn([] { return chain(12); }).join() == 12);
}

// SIZE_MAX rounded up to whole pages wraps to 0, and the first fiber would
// write its stack header into a guard page (SIGSEGV); 128 TiB can never be
// mapped, and its fiber would wait for a stack for ever, with its joiner.
TEST_CASE("a stack size no fiber can have is refused at once", "[stack]") {
  Runtime rt(topo("core:1 pu:1"));
  for (std::size_t bad : {SIZE_MAX, SIZE_MAX - 4095, std::size_t{1} << 47, (std::size_t{1} << 30) + 1})
    CHECK_THROWS_WITH(rt.spawn([] {}, SpawnOptions{.stack_size = bad}), Catch::Contains("largest stack"));
  CHECK(rt.spawn([] { return 1; }, SpawnOptions{.stack_size = std::size_t{16} << 20}).join() == 1);
  Options o = topo("core:1 pu:1");
  o.stack_size = SIZE_MAX;
  CHECK_THROWS_WITH(Runtime(o), Catch::Contains("largest stack"));
}

TEST_CASE("a fiber that finds no memory for its stack waits and runs later", "[stack]") {
  Runtime rt(topo("core:1 pu:2"));
  Oracle oracle(rt.topology());
  const Cookie cookies[2] = {Cookie::create(), Cookie::create()};
  // Stacks come from the pool first: ask for an odd size, so each start maps one.
  coresched::detail::testing::fail_stack_allocations.store(60);
  std::atomic<int> ran{0};
  std::vector<JoinHandle<void>> hs;
  for (int i = 0; i < 200; ++i)
    hs.push_back(rt.spawn(
        [&, c = cookies[i % 2]] {
          {
            Scope s(oracle, c);
            spin(100);
          }
          this_fiber::sleep_for(std::chrono::milliseconds(1)); // hold the stack while others start
          ran.fetch_add(1);
        },
        SpawnOptions{.cookie = cookies[i % 2], .stack_size = 72 * 1024}));
  hs.clear();
  coresched::detail::testing::fail_stack_allocations.store(0);
  CHECK(ran.load() == 200);
  CHECK(oracle.violations.load() == 0);
}

// Each fiber joins a child of the other cookie, so no child runs inline on its
// joiner's stack: when no stack can be mapped, every fiber that could free one
// waits for the child that has none. The child must fail (its join throws
// StackError), and the error unwinds the chain, instead of a hang.
TEST_CASE("a join chain that alternates cookies ends with StackError when no stack can be mapped", "[stack]") {
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

namespace {
// Memory mappings of this process now (lines of /proc/self/maps).
std::size_t mapping_count() {
  std::FILE* f = std::fopen("/proc/self/maps", "r");
  if (!f) return 0;
  std::size_t n = 0;
  for (int c; (c = std::fgetc(f)) != EOF;) n += c == '\n';
  std::fclose(f);
  return n;
}

// Whether writing at `p` faults, tried in a child process (a guard page
// kills it with SIGSEGV, or, where a sanitizer keeps its own handler, makes
// it report and exit non-zero; the parent's memory is untouched either way).
bool write_faults(void* p) {
  const pid_t child = ::fork();
  if (child == 0) {
    std::signal(SIGSEGV, SIG_DFL); // not a sanitizer's or the runtime's report: the kernel's verdict
    *static_cast<volatile char*>(p) = 1;
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
}

// Whether this kernel has guard markers (MADV_GUARD_INSTALL, Linux 6.13).
bool kernel_has_guard_markers() {
  const std::size_t ps = detail::page_size();
  void* p = ::mmap(nullptr, 2 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  const bool ok = ::madvise(p, ps, 102 /* MADV_GUARD_INSTALL */) == 0;
  ::munmap(p, 2 * ps);
  return ok;
}
} // namespace

TEST_CASE("parked fibers share a mapping per slab of stacks, not two mappings each", "[stack]") {
  // Two mappings per fiber (stack and guard page) meet vm.max_map_count's
  // 65,530 at about 32,000 parked fibers, and the rest wait for stacks.
#if defined(__SANITIZE_THREAD__)
  // TSan maps state of its own for every fiber (about four mappings each):
  // the count says nothing of the runtime's stacks there.
  WARN("skipped under TSan: it maps memory of its own per fiber");
  return;
#endif
  const char* guard = std::getenv("CORESCHED_STACK_GUARD");
  if (!kernel_has_guard_markers() || (guard && std::string(guard) == "mprotect")) {
    WARN("skipped: no guard markers here (Linux < 6.13, or CORESCHED_STACK_GUARD=mprotect), each stack keeps its own "
         "guard mapping");
    return;
  }
  Runtime rt(topo("core:1 pu:2"));
  constexpr long kFibers = 3000;
  const std::size_t before = mapping_count();
  Event go;
  WaitGroup done;
  std::atomic<long> parked{0};
  done.add(kFibers);
  for (long i = 0; i < kFibers; ++i)
    rt.spawn(
        [&] {
          parked.fetch_add(1);
          go.wait();
          done.done();
        },
        SpawnOptions{.detached = true});
  while (parked.load() < kFibers) std::this_thread::sleep_for(1ms);
  const std::size_t during = mapping_count();
  go.set();
  done.wait();
  INFO("mappings before " << before << ", with " << kFibers << " fibers parked " << during);
  CHECK(during - before <= 2 * (kFibers / detail::SharedStackPool::kSlabStacks + 1) + 16);
}

#if !defined(__SANITIZE_ADDRESS__) // ASan would clear the shadow of 2.5 GiB of stacks given back
TEST_CASE("a batch of stacks larger than one process_madvise takes (2 GiB) all goes back", "[stack]") {
  // The kernel advises at most MAX_RW_COUNT bytes a call and says how many:
  // the rest, from inside a range, goes in the next call.
  constexpr std::size_t kStack = 5u << 20;
  detail::SharedStackPool pool(kStack);
  std::vector<detail::Stack> stacks;
  for (std::size_t i = 0; i < detail::SharedStackPool::kReleaseBatch; ++i) stacks.push_back(pool.map(kStack));
  for (const detail::Stack& s : stacks) static_cast<char*>(s.base)[0] = 1; // memory to give back
  for (const detail::Stack& s : stacks) pool.unmap(s);                     // a whole batch: released
  pool.wait_released();
  std::size_t kept = 0;
  for (std::size_t i = 0; i < detail::SharedStackPool::kReleaseBatch; ++i) {
    stacks[i] = pool.map(kStack);
    kept += static_cast<char*>(stacks[i].base)[0] != 0;
  }
  CHECK(kept == 0);
  for (const detail::Stack& s : stacks) pool.unmap(s);
}
#endif

TEST_CASE("a slab stack keeps its guard page after its memory is given back and it is carved again", "[stack]") {
  // Both ways of advising many ranges: one process_madvise, or (on kernels
  // that refuse it) a madvise each.
  if (::syscall(SYS_process_madvise, -10001, nullptr, 0, MADV_DONTNEED, 0) != 0)
    WARN("this kernel refuses process_madvise on the process itself: both ways below take a madvise per range");
  const bool one_at_a_time = GENERATE(false, true);
  INFO((one_at_a_time ? "a madvise per range" : "process_madvise where the kernel takes it"));
  detail::testing::advise_one_range_at_a_time = one_at_a_time;
  struct Restore {
    ~Restore() { detail::testing::advise_one_range_at_a_time = false; }
  } restore;
  detail::SharedStackPool pool(64 * 1024);
  std::vector<detail::Stack> stacks;
  for (std::size_t i = 0; i < detail::SharedStackPool::kReleaseBatch; ++i) stacks.push_back(pool.map(64 * 1024));
  for (const detail::Stack& s : stacks) static_cast<char*>(s.base)[0] = 1; // memory to give back
  for (const detail::Stack& s : stacks) pool.unmap(s);                     // a whole batch: released
  pool.wait_released();
  const detail::Stack again = pool.map(64 * 1024);
  CHECK(static_cast<char*>(again.base)[0] == 0); // its memory was given back: zero again
  CHECK(write_faults(static_cast<char*>(again.base) - 1));
  CHECK_FALSE(write_faults(again.base));
  pool.unmap(again);
  // A new slab's slots, all guarded at once when it was mapped.
  detail::SharedStackPool fresh(64 * 1024);
  for (std::size_t i = 0; i < detail::SharedStackPool::kSlabStacks; ++i) stacks[i] = fresh.map(64 * 1024);
  for (std::size_t i = 0; i < detail::SharedStackPool::kSlabStacks; i += i + 1 < 60 ? 9 : 1) { // 0, 9, ..., 54, 60..63
    INFO("stack " << i);
    CHECK(write_faults(static_cast<char*>(stacks[i].base) - 1));
    CHECK_FALSE(write_faults(stacks[i].base));
  }
  for (std::size_t i = 0; i < detail::SharedStackPool::kSlabStacks; ++i) fresh.unmap(stacks[i]);
}

namespace {
/// The CPUs of the runtime's own thread named `name`; 0 if there is none.
int cpus_of_thread(const char* name) {
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    if (!std::getline(comm, line) || line != name) continue;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(std::stoi(task.path().filename().string()), sizeof(set), &set) != 0) return 0;
    return CPU_COUNT(&set);
  }
  return 0;
}
} // namespace

TEST_CASE("stack memory goes back to the kernel off the worker: its other fibers keep running", "[stack]") {
  // One worker; 5,000 fibers parked on an Event finish at once, so more
  // stacks come back than the pools keep (64 + 4,096) and a batch of 512 goes
  // back to the kernel, here held until the test lets it go (a TLB flush on a
  // VM took milliseconds, at times 25 ms). The drain must end while the batch
  // is held: given back on the worker, the worker would wait for it and the
  // fibers after it would not finish. The thread that gives it back runs on
  // the CPUs this thread had, not on the worker's one (where the flush's wait
  // would still hold the worker).
  cpu_set_t mine;
  CPU_ZERO(&mine);
  REQUIRE(sched_getaffinity(0, sizeof(mine), &mine) == 0);
  coresched::Options o = test_support::topo("core:1 pu:1");
  coresched::Runtime rt(o);
  detail::testing::hold_releases = true;
  struct Release {
    ~Release() { detail::testing::hold_releases = false; }
  } release;
  const int batches_before = detail::testing::batches_released.load();
  coresched::Event go;
  coresched::WaitGroup done;
  std::atomic<int> parked{0};
  std::atomic<bool> drained{false};
  constexpr int kParked = 5000;
  done.add(kParked);
  for (int i = 0; i < kParked; ++i)
    rt.spawn([&] {
      parked.fetch_add(1);
      go.wait();
      done.done();
    }, coresched::SpawnOptions{.detached = true});
  auto setter = rt.spawn([&] {
    while (parked.load() < kParked) coresched::this_fiber::yield(); // every stack in use at once
    go.set();
    done.wait();
    drained = true;
  });
  // Generous for a sanitized build; the broken case waits for ever.
  for (int waited = 0; !drained.load() && waited < 60'000; ++waited) std::this_thread::sleep_for(1ms);
  const bool drained_while_held = drained.load();
  detail::testing::hold_releases = false;
  setter.join();
  for (int waited = 0; detail::testing::batches_released.load() == batches_before && waited < 10'000; ++waited)
    std::this_thread::sleep_for(1ms);
  CHECK(detail::testing::batches_released.load() > batches_before); // the case under test happened
  CHECK(drained_while_held);
  if (CPU_COUNT(&mine) > 1) CHECK(cpus_of_thread("coresched-stack") == CPU_COUNT(&mine));
}
