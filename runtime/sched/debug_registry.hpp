// SPDX-License-Identifier: Apache-2.0
// The runtimes alive in this process, found from outside the scheduler: by
// the dump signal (a thread that must reach every runtime asking for dumps)
// and by debuggers. tools/gdb/coresched.py reads the list through the symbol
// `coresched_debug_runtimes` in a live process or a core file.
//
// Where it has no type information (a build without -g, a stripped program)
// the extension takes the records' layout from `coresched_debug_layout`, a
// table the compiler fills with this build's offsets and sizes: a layout
// written into the extension by hand goes stale as the records change (on
// a Release build no fiber would show as parked, and none a backtrace).
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

/// Where one field lies, named as the gdb extension names it ("f.id": Fiber::id;
/// "rt." coresched_debug_runtime, "sh." StackHeader, "wi." WaitInfo, "f." Fiber).
struct coresched_debug_field {
  char name[24];         // NUL-terminated
  std::uint32_t offset;  // bytes from the start of its record
  std::uint16_t size;    // bytes
  std::uint16_t is_signed;
};
/// The records' layout in this build. Plain bytes, no pointers: a debugger
/// reads it from a core file too (through the program's file).
struct coresched_debug_layout_table {
  char magic[16];              // "coresched-layout"
  std::uint32_t format;        // of this table: 1
  std::uint32_t field_count;   // entries used in `fields`
  char fiber_states[64];       // FiberState's names by value, NUL-separated, then an empty name
  char wait_kinds[64];         // WaitKind's, likewise
  std::uint64_t no_cookie;     // kNoCookie
  std::int64_t not_pinned;     // kNotPinned
  coresched_debug_field fields[32];
};
__attribute__((visibility("default"))) extern const coresched_debug_layout_table coresched_debug_layout;

/// The name of a cookie (Cookie::create(name, weight)), or null: for a
/// debugger, which calls it in a live process by its C name, with or without
/// debug information. The string lives as long as the process. It takes the
/// cookie table's reader lock, so a process stopped while one of its threads
/// creates a cookie or sets a weight would block the call.
__attribute__((visibility("default"))) const char* coresched_cookie_name(std::uint64_t cookie) noexcept;
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
