// SPDX-License-Identifier: Apache-2.0
#include "platform/kernel_cookie.hpp"

#include <cerrno>
#include <cstring>
#include <sys/prctl.h>

#ifndef PR_SCHED_CORE
#define PR_SCHED_CORE 62
#endif
#ifndef PR_SCHED_CORE_CREATE
#define PR_SCHED_CORE_CREATE 1
#endif

namespace coresched::detail {

bool tag_threads_with_kernel_cookie(std::string& why) {
  constexpr unsigned long kPidTypeTgid = 1; // PIDTYPE_TGID: every thread of this process
  if (prctl(PR_SCHED_CORE, PR_SCHED_CORE_CREATE, 0, kPidTypeTgid, 0) == 0) return true;
  const int err = errno;
  why = std::string("prctl(PR_SCHED_CORE) failed: ") + std::strerror(err);
  if (err == EINVAL) why += " (kernel built without CONFIG_SCHED_CORE)";
  else if (err == ENODEV) why += " (no SMT siblings)";
  return false;
}

} // namespace coresched::detail
