// SPDX-License-Identifier: Apache-2.0
// Linux core scheduling (PR_SCHED_CORE) for the runtime's own threads.
#pragma once

#include <string>

namespace coresched::detail {

/// Gives the whole process one new kernel core-scheduling cookie, so no other
/// process shares our cores. Returns false with the reason where the kernel
/// refuses (EINVAL: built without CONFIG_SCHED_CORE; ENODEV: no SMT).
bool tag_threads_with_kernel_cookie(std::string& why);

} // namespace coresched::detail
