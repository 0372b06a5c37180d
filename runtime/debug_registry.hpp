// SPDX-License-Identifier: Apache-2.0
// The runtimes alive in this process, found from outside the scheduler: by
// the dump signal (a thread that must reach every runtime asking for dumps)
// and by debuggers. tools/gdb/coresched.py reads the list through the symbol
// `coresched_debug_runtimes` in a live process or a core file, so its layout
// is kept plain and in step with that script.
#pragma once

#include <cstdint>

namespace coresched::detail {
class Scheduler;
}

extern "C" {
/// One live runtime. `stacks` is its list of mapped stacks (the sentinel
/// StackHeader of SharedStackPool), where every started fiber is found.
struct coresched_debug_runtime {
  coresched_debug_runtime* next;
  coresched::detail::Scheduler* scheduler;
  const void* stacks;
  int dump_signal; // 0: none
};
/// Head of the list; changed only under the registry's lock.
extern coresched_debug_runtime* coresched_debug_runtimes;
}

namespace coresched::detail {

/// Adds a runtime (its constructor, once the workers run) and installs the
/// dump signal's handler if it asks for one.
void register_runtime(coresched_debug_runtime* entry);
/// Removes it (its shutdown, before the workers go); waits for a dump in progress.
void unregister_runtime(coresched_debug_runtime* entry);
/// Options::dump_signal, or CORESCHED_DUMP_SIGNAL when that is 0; throws UsageError for a bad one.
int resolve_dump_signal(int option);

} // namespace coresched::detail
