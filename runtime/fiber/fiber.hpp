// SPDX-License-Identifier: Apache-2.0
// The fiber's scheduling record: queue links, identity, saved context, stack,
// carried exception state. What its handle keeps — the join state and the
// task — is a block of its own (join_record.hpp), so this record goes back to
// its worker's free list as soon as the fiber retires. A fiber gets a stack
// only when it first runs, so a million queued fibers hold no stacks.
#pragma once

#include "fiber/eh_state.hpp"
#include "fiber/join_record.hpp"
#include "fiber/stack_pool.hpp"
#include "platform/record_cache.hpp"

#include <algorithm>
#include <atomic>
#include <boost/context/detail/fcontext.hpp>
#include <cstddef>
#include <cstdint>

namespace coresched::detail {

namespace ctx = boost::context::detail;

enum class FiberState : std::uint8_t {
  runnable, // queued (or about to be)
  running,
  parking,  // deciding to suspend; a wake now is remembered
  parked,   // suspended; a wake must queue it
  done,
};

inline constexpr int kNotPinned = -1;

class Scheduler;

/// What ASan and TSan are told about a fiber's stack (see sanitizer.hpp).
/// Empty in normal builds, so that a fiber record stays small.
struct SanitizerState {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const void* stack_bottom = nullptr;
  std::size_t stack_size = 0;
  void* asan_fake_stack = nullptr;
  void* tsan_fiber = nullptr;
  bool owns_tsan_fiber = true;
#endif
};

struct Fiber {
  Scheduler* owner = nullptr; // the runtime it belongs to
  // --- run queue (guarded by the owning core's lock) ---
  Fiber* next = nullptr;
  std::uint32_t seq = 0;   // FIFO order across a queue's cookie lists (wraps: compare by difference)
  std::uint32_t vtime = 0; // virtual runtime within its cookie, in ticks (fiber_vtime.hpp)
  // --- identity ---
  std::uint64_t id = 0;
  std::uint64_t cookie = 0;
  int pinned = kNotPinned; // worker index, or kNotPinned
  unsigned last_worker = 0;
  // --- execution ---
  ctx::fcontext_t context = nullptr;
  Stack stack;
  std::size_t stack_size = 0;
  bool fresh = true;            // never run: no stack, no context yet
  bool is_task = true;          // false for a worker's idle context
  bool ran_out = false;         // it last stopped at a preemption point that asked it to (a runner), not by blocking
  bool unstartable = false;     // no stack could be mapped for it: it fails with StackError instead of running
  std::atomic<bool> context_saved{true}; // false while switching out after being queued
  std::atomic<FiberState> state{FiberState::runnable};
  CarriedState carried;         // exception state and errno while switched out (eh_state.hpp)
  [[no_unique_address]] SanitizerState san; // empty in normal builds
  // --- join: the handle's block, alive at least until the fiber finishes ---
  JoinRecord* join = nullptr; // null for a worker's idle context
  // --- for the fiber dump only ---
  Fiber* inline_child = nullptr; // a child it joins inline, running on this fiber's stack

};

/// The size of every recycled block: a fiber record, or a join block with a
/// task that fits (kJoinBytes). Both are 120 bytes in a normal build (128 in
/// the depot's slabs, which align records to 16); a sanitizer build's fiber
/// record is larger. One size, so one free list per worker serves both.
inline constexpr std::size_t kRecordBytes = std::max((sizeof(Fiber) + 7) / 8 * 8, kJoinBytes);

/// The process's depot of kRecordBytes blocks, shared by every runtime. Never
/// destroyed: a handle may outlive every runtime (and static destructors run
/// in no order that would let it go safely).
inline RecordDepot& spawn_records() {
  static RecordDepot* const depot = new RecordDepot(kRecordBytes);
  return *depot;
}

/// Frees a kRecordBytes block (when `recyclable`) into the calling worker's
/// cache, or the depot from a plain thread; others to malloc.
void free_record(void* mem, bool recyclable) noexcept;
/// Makes a parked fiber runnable on its own runtime (no-op unless parked or parking).
void wake_fiber(Fiber* f);

} // namespace coresched::detail
