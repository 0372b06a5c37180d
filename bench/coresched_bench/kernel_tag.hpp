// SPDX-License-Identifier: Apache-2.0
// The kernel's core scheduling, for the side-by-side benchmarks: a new
// PR_SCHED_CORE cookie and pinning for the calling thread or process. Shared
// by `matrix --compare-kernel` (plain threads) and coresched-tag-exec (the
// sysbench processes), so both refuse with the same reasons.
#pragma once

#include <cerrno>
#include <cstring>
#include <sched.h>
#include <string>
#include <sys/prctl.h>

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

} // namespace coresched::bench
