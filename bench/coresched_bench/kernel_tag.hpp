// SPDX-License-Identifier: Apache-2.0
// The kernel's core scheduling, for the side-by-side benchmarks: a new
// PR_SCHED_CORE cookie and pinning for the calling thread or process. Shared
// by `matrix --compare-kernel` (plain threads) and coresched-tag-exec (the
// sysbench processes), so both refuse with the same reasons.
#pragma once

#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <sched.h>
#include <string>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace coresched::bench {

/// PR_SCHED_CORE_CREATE's scope: the calling thread, or its whole thread group.
enum class KernelTagScope : unsigned long { thread = 0 /* PIDTYPE_PID */, process = 1 /* PIDTYPE_TGID */ };

/// Gives the caller a new kernel core-scheduling cookie; "" or why not.
inline std::string kernel_tag(KernelTagScope scope) {
  constexpr int kPrSchedCore = 62, kCreate = 1; // PR_SCHED_CORE, PR_SCHED_CORE_CREATE (Linux 5.14)
  if (::prctl(kPrSchedCore, kCreate, 0, static_cast<unsigned long>(scope), 0) == 0) return {};
  const int err = errno;
  std::string why = std::string("prctl(PR_SCHED_CORE, PR_SCHED_CORE_CREATE) failed: ") + std::strerror(err);
  if (err == EINVAL) why += " (EINVAL: kernel built without CONFIG_SCHED_CORE, or too old)";
  else if (err == ENODEV) why += " (ENODEV: no SMT on this machine)";
  else if (err == EPERM) why += " (EPERM: not permitted)";
  return why;
}

/// Pins the calling thread to `cpu`; "" or why not.
inline std::string pin_self(unsigned cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof set, &set) == 0) return {};
  return "sched_setaffinity(CPU " + std::to_string(cpu) + ") failed: " + std::strerror(errno);
}

/// The kernel's CFS weight of each nice value, -20 to 19 (kernel/sched/core.c,
/// sched_prio_to_weight): nice 0 = 1024, each step about 1.25x.
inline constexpr std::array<std::uint32_t, 40> kernel_nice_weights{
    88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916, 9548, 7620, 6100, 4904,
    3906,  3121,  2501,  1991,  1586,  1277,  1024,  820,   655,   526,   423,   335,  272,  215,
    172,   137,   110,   87,    70,    56,    45,    36,    29,    23,    18,    15};

/// The kernel weight of a nice value (-20 to 19).
inline std::uint32_t kernel_nice_weight(int nice) { return kernel_nice_weights[static_cast<std::size_t>(nice + 20)]; }

/// The nice value whose weight over nice 0's is nearest `ratio`, nearest by
/// log (a ratio of 3 is as far from 2.44 as from 3.69), so 3 maps to nice -5
/// (3121 / 1024 = 3.05) and 1/3 to nice 5 (335 / 1024 = 0.33).
inline int kernel_nice_for_ratio(double ratio) {
  int best = 0;
  double best_err = INFINITY;
  for (int n = -20; n <= 19; ++n) {
    const double err = std::fabs(std::log(kernel_nice_weight(n) / 1024.0) - std::log(ratio));
    if (err < best_err) {
      best = n;
      best_err = err;
    }
  }
  return best;
}

/// The nice values that give two tenants of cgroup weights `a` and `b` the
/// nearest ratio of kernel weights: the tenant at the default weight (100)
/// stays at nice 0, or, if neither is, the one nearer it (by ratio), so the
/// other alone moves. Equal weights: both nice 0.
inline std::array<int, 2> kernel_nices_for_weights(std::uint32_t a, std::uint32_t b) {
  const auto distance = [](std::uint32_t w) { return std::fabs(std::log(w / 100.0)); };
  if (distance(b) <= distance(a)) return {kernel_nice_for_ratio(static_cast<double>(a) / b), 0};
  return {0, kernel_nice_for_ratio(static_cast<double>(b) / a)};
}

/// Sets the calling thread's nice value (setpriority on its tid: on Linux
/// nice is per thread); "" or why not. Below the current nice it needs root
/// or CAP_SYS_NICE, and without them the kernel's rows would run unweighted
/// beside our weighted ones, so the caller fails the run instead.
inline std::string set_own_nice(int nice) {
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  if (::setpriority(PRIO_PROCESS, tid, nice) == 0) return {};
  const int err = errno;
  std::string why = "setpriority(nice " + std::to_string(nice) + ") failed: " + std::strerror(err);
  if (err == EACCES || err == EPERM) why += " (a negative nice needs root or CAP_SYS_NICE)";
  return why;
}

/// core_forceidle_sum (ms) of a /proc/.../sched file: the time the task ran
/// while a sibling of its core was forced idle (kernel core scheduling; shown
/// with schedstats on: sysctl kernel.sched_schedstats=1, or schedstats=enable
/// on the kernel's command line, as scripts/smt-vm.sh boots it).
inline std::optional<double> forceidle_ms(const std::string& sched_path) {
  std::ifstream f(sched_path);
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("core_forceidle_sum", 0) == 0) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) return std::nullopt;
      return std::strtod(line.c_str() + colon + 1, nullptr);
    }
  return std::nullopt;
}

/// The calling thread's core_forceidle_sum (ms), where schedstats show it.
inline std::optional<double> own_forceidle_ms() {
  return forceidle_ms("/proc/self/task/" + std::to_string(::syscall(SYS_gettid)) + "/sched");
}

/// Gives the calling thread the kernel core-scheduling cookie of thread
/// `tid` (PR_SCHED_CORE_SHARE_FROM), so that a tenant's threads share one
/// cookie; "" or why not.
inline std::string kernel_tag_from(pid_t tid) {
  constexpr int kPrSchedCore = 62, kShareFrom = 3; // PR_SCHED_CORE, PR_SCHED_CORE_SHARE_FROM
  if (::prctl(kPrSchedCore, kShareFrom, static_cast<unsigned long>(tid), 0UL /* PIDTYPE_PID */, 0) == 0) return {};
  return std::string("prctl(PR_SCHED_CORE, PR_SCHED_CORE_SHARE_FROM) failed: ") + std::strerror(errno);
}

} // namespace coresched::bench
