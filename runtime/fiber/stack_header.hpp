// SPDX-License-Identifier: Apache-2.0
// What a fiber dump (dump.cpp) and the gdb extension (tools/gdb/coresched.py)
// read about a started fiber: a small header at the top of every fiber stack.
//
// Why on the stack and not in a list of fibers: a list would cost every spawn
// and every exit a locked insert and remove (spawn+join is ~480 instructions;
// a list adds ~10 %). A started fiber always owns a stack, and the runtime
// already touches the stack's memory when it hands one over, so naming the
// fiber that runs on it is one store. The stacks themselves are listed
// (SharedStackPool): they are mapped and unmapped rarely, and that list is
// the registry the dump walks. Fibers that never ran have no stack; they sit
// in run queues, which the dump reads under the core's lock.
//
// A parked fiber says what it waits for in `wait`, written where it parks:
// its own stack, so no other cache line is touched.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace coresched::detail {

struct Fiber;

/// What a parked fiber waits for (kept in step with tools/gdb/coresched.py).
enum class WaitKind : std::uint8_t {
  none,  // running or runnable
  join,  // `arg` is the id of the fiber it joins
  sync,  // `what` names the primitive, `object` is its address
  io,    // `what` names the operation, `arg` is the fd (-1 if none)
  sleep, // `arg` is the deadline (steady clock, ns)
};

struct WaitInfo {
  WaitKind kind = WaitKind::none;
  const char* what = nullptr;   // a string literal
  const void* object = nullptr;
  std::int64_t arg = 0;
  std::uint64_t since_ns = 0;   // steady clock when it parked (coarse: as of the last kernel tick)
  const void* frame = nullptr;  // Worker::park's frame: where the dump's frame walk starts
};

struct StackHeader {
  StackHeader* prev = nullptr; // the runtime's list of mapped stacks (SharedStackPool's registry lock)
  StackHeader* next = nullptr;
  std::atomic<Fiber*> running{nullptr}; // the fiber that owns this stack (children it joins inline run
                                        // above it: Fiber::inline_child); null while the stack is pooled
  WaitInfo wait;                        // written by the innermost fiber on it as it parks
};

/// Bytes kept at the top of every stack for its header (two cache lines).
inline constexpr std::size_t kStackHeaderBytes = 128;
static_assert(sizeof(StackHeader) <= kStackHeaderBytes);

} // namespace coresched::detail
