// SPDX-License-Identifier: Apache-2.0
// Small helpers shared by the test files.
#pragma once

#include <coresched/options.hpp>
#include <coresched/this_fiber.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace test_support {

/// Options for a runtime on the given topology (usually synthetic).
inline coresched::Options topo(const char* spec,
                               coresched::FairnessPolicy policy = coresched::FairnessPolicy::core_vruntime) {
  coresched::Options o;
  o.topology = spec;
  o.policy = policy;
  return o;
}

/// Sanitizer builds scale the stress tests down (they run 5-50x slower): CORESCHED_STRESS_SCALE.
inline double stress_scale() {
  const char* s = std::getenv("CORESCHED_STRESS_SCALE");
  return s ? std::atof(s) : 1.0;
}

/// `n` scaled by stress_scale(), at least 1.
inline int scaled(int n) { return std::max(1, static_cast<int>(n * stress_scale())); }

/// Keeps the PU busy for about `iters` loop turns, so that an interval an
/// isolation checker stamps is long enough for an overlapping sibling to see it.
inline void spin(int iters) {
  for (int i = 0; i < iters; ++i) asm volatile("" ::: "memory");
}

/// A CPU-bound fiber's body: arithmetic with a preemption point every few
/// microseconds, until `stop`.
inline void busy_until(const std::atomic<bool>& stop) {
  while (!stop.load(std::memory_order_relaxed)) {
    std::uint64_t x = 1;
    for (int i = 0; i < 500; ++i) x = x * 6364136223846793005ull + 1;
    asm volatile("" : : "r"(x));
    coresched::this_fiber::preempt_point();
  }
}

/// How long the runtime's worker threads have been runnable but not running
/// (ns): the kernel ran something else on their CPU. The second field of
/// /proc/self/task/<tid>/schedstat, for the threads named coresched-w<N>.
/// Timing tests use it to tell a noisy try from a failing one.
inline std::uint64_t workers_runqueue_wait_ns() {
  std::uint64_t sum = 0;
  std::error_code ec;
  for (const auto& d : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(d.path() / "comm");
    std::string name;
    if (!std::getline(comm, name) || name.rfind("coresched-w", 0) != 0) continue;
    std::ifstream st(d.path() / "schedstat");
    std::uint64_t run = 0, wait = 0;
    if (st >> run >> wait) sum += wait;
  }
  return sum;
}

} // namespace test_support
