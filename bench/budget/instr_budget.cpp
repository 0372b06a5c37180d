// SPDX-License-Identifier: Apache-2.0
// coresched-instr-budget: runs one hot path many times between callgrind
// client requests, so `valgrind --tool=callgrind` counts the instructions of
// exactly that stretch (check_budgets.py divides by the operation count).
// Instruction counts do not depend on the machine's load, unlike timings.
//
// Outside valgrind the client requests are a few no-op instructions, so the
// program also runs natively (that is how its test checks it).
#include "core/core_coordinator.hpp"
#include "sched/worker.hpp"

#include <coresched/coresched.hpp>
#include <coresched/io.hpp>

#include <CLI/CLI.hpp>
#include <valgrind/callgrind.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/socket.h>
#include <unistd.h>

namespace {
using namespace coresched;

// Measures `body(n)` after a warm-up of the same size (first-touch costs:
// stacks, malloc arenas, queue nodes), and prints the operation count.
void measure(const char* name, long ops_per_unit, long n, const std::function<void(long)>& body) {
  body(n);
  CALLGRIND_ZERO_STATS;
  body(n);
  CALLGRIND_DUMP_STATS_AT(name);
  std::printf("%s %ld\n", name, n * ops_per_unit);
}

// A runtime whose ticker never fires during a measurement (its thread would
// add instructions that depend on wall time).
Options quiet(const char* topology) {
  Options o;
  o.topology = topology;
  o.slice = std::chrono::hours(1);
  o.stall_threshold = std::chrono::milliseconds(0);
  return o;
}

void yield_op(long n) {
  Runtime rt(quiet("core:1 pu:1"));
  rt.spawn([n] {
      measure("yield", 2, n, [](long k) {
        auto other = coresched::spawn([&] {
          for (long i = 0; i < k; ++i) this_fiber::yield();
        });
        for (long i = 0; i < k; ++i) this_fiber::yield();
        other.join();
      });
    }).join();
}

void spawn_join_op(long n) {
  Runtime rt(quiet("core:1 pu:1"));
  rt.spawn([n] {
      measure("spawn_join", 1, n, [](long k) {
        for (long i = 0; i < k; ++i) coresched::spawn([] {}).join();
      });
    }).join();
}

void preempt_point_op(long n) {
  Runtime rt(quiet("core:1 pu:1"));
  rt.spawn([n] {
      measure("preempt_point", 1, n, [](long k) {
        for (long i = 0; i < k; ++i) this_fiber::preempt_point();
      });
    }).join();
}

// One FiberLocal read: the calling fiber's value for a key it has set.
void fiber_local_get_op(long n) {
  Runtime rt(quiet("core:1 pu:1"));
  rt.spawn([n] {
      static FiberLocal<long> local;
      local.reset(new long(1));
      measure("fiber_local_get", 1, n, [](long k) {
        long sum = 0;
        for (long i = 0; i < k; ++i) sum += *local.get();
        asm volatile("" : : "r"(sum));
      });
    }).join();
}

// One requeue + core-wide pick on a two-PU core whose sibling runs a fiber,
// with fibers of two cookies queued (the multi-cookie path reads the clock).
void pick_op(long n) {
  using namespace coresched::detail;
  CoreCoordinator core(0, {0, 1}, CoreConfig{});
  std::vector<Fiber> f(4);
  WakeList w;
  for (std::size_t i = 0; i < f.size(); ++i) f[i].cookie = i % 2 + 1;
  core.lock().lock();
  (void)core.enqueue_locked(1, &f[3], w);
  (void)core.pick_locked(1, w);
  for (std::size_t i = 0; i < 3; ++i) core.requeue_locked(0, &f[i]);
  Fiber* running = core.pick_locked(0, w).fiber;
  core.lock().unlock();
  measure("pick_two_cookies", 1, n, [&](long k) {
    for (long i = 0; i < k; ++i) {
      core.lock().lock();
      if (running) core.requeue_locked(0, running);
      running = core.pick_locked(0, w).fiber;
      core.lock().unlock();
    }
  });
}

// One io::send and one io::recv of 64 bytes over a socket pair, by one fiber
// on one worker: each parks, and the worker's reap submits the request and
// collects its completion (the data is there, so both complete at once).
// The kernel's part is not counted; the runtime's is: the request, its
// tracking, the park, the reap, the wake-up.
void io_send_recv_op(long n) {
  Runtime rt(quiet("core:1 pu:1"));
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) throw std::runtime_error("socketpair failed");
  rt.spawn([n, fds] {
      measure("io_send_recv", 1, n, [fds](long k) {
        std::array<std::byte, 64> out{}, in{};
        for (long i = 0; i < k; ++i) {
          if (io::send(fds[0], out).value != 64 || io::recv(fds[1], in).value != 64)
            throw std::runtime_error("a send or recv moved less than 64 bytes");
        }
      });
    }).join();
  ::close(fds[0]);
  ::close(fds[1]);
}

// Ping-pong between fibers pinned to workers on two cores: each release()
// wakes the fiber parked on the other worker. The idle worker's spinning
// depends on timing, so check_budgets.py counts only the instructions inside
// wake_fiber (callgrind --toggle-collect), per call: the waker's side of a
// cross-worker wake (state change, placement, the target core's lock and
// queue, the notify).
void cross_worker_wake_op(long n) {
  Runtime rt(quiet("core:2 pu:1"));
  {
    const long k = n;
    Semaphore ping(0), pong(0);
    auto a = rt.spawn(
        [&] {
          for (long i = 0; i < k; ++i) {
            ping.release();
            pong.acquire();
          }
        },
        SpawnOptions{.pin_to_pu = 0});
    auto b = rt.spawn(
        [&] {
          for (long i = 0; i < k; ++i) {
            ping.acquire();
            pong.release();
          }
        },
        SpawnOptions{.pin_to_pu = 1});
    a.join();
    b.join();
  }
  std::printf("cross_worker_wake %ld\n", 2 * n); // wake-ups (some may find the fiber still parking)
}

} // namespace

int main(int argc, char** argv) {
  const std::map<std::string, void (*)(long)> ops = {{"yield", yield_op},
                                                     {"spawn_join", spawn_join_op},
                                                     {"preempt_point", preempt_point_op},
                                                     {"fiber_local_get", fiber_local_get_op},
                                                     {"pick_two_cookies", pick_op},
                                                     {"io_send_recv", io_send_recv_op},
                                                     {"cross_worker_wake", cross_worker_wake_op}};
  CLI::App app{"coresched-instr-budget: one hot path, n times, between callgrind client requests.\n"
               "Run under bench/budget/check_budgets.py, which counts and compares with budgets.json."};
  std::string op;
  long n = 20000;
  std::vector<std::string> names;
  for (const auto& [name, fn] : ops) names.push_back(name);
  app.add_option("op", op, "the operation")->required()->check(CLI::IsMember(names));
  app.add_option("-n,--count", n, "operations to count")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  // Under valgrind a worker sleeping in io_uring_enter would stall every thread.
  detail::testing::idle_never_sleeps.store(true);
  try {
    ops.at(op)(n);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-instr-budget: %s\n", e.what());
    return 1;
  }
  return 0;
}
