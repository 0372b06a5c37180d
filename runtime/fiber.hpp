// SPDX-License-Identifier: Apache-2.0
// The fiber control block: scheduling state, saved context, join state. It is
// allocated in one piece with the user's task (see kTaskOffset), so a spawn
// costs one allocation. A fiber gets a stack only when it first runs, so a
// million queued fibers hold no stacks.
#pragma once

#include "eh_state.hpp"
#include "spin_lock.hpp"
#include "stack_pool.hpp"

#include <coresched/join_handle.hpp>

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
  bool recyclable = false;      // a kRecordBytes block (record_cache.hpp)
  std::atomic<bool> context_saved{true}; // false while switching out after being queued
  std::atomic<FiberState> state{FiberState::runnable};
  CarriedState carried;         // exception state and errno while switched out (eh_state.hpp)
  [[no_unique_address]] SanitizerState san; // empty in normal builds
  // --- lifetime and join ---
  std::atomic<int> refs{1};
  SpinLock join_lock;
  std::atomic<std::uint32_t> done{0};
  Fiber* joiner = nullptr;   // a fiber suspended in join
  bool thread_joiner = false; // a plain thread blocked in join (futex on `done`)
  bool handle_gone = false;   // detached, or its handle dropped before it finished: nobody
                              // collects the result, so the fiber destroys it itself
  // --- for the fiber dump only (in what was padding: the record did not grow) ---
  Fiber* inline_child = nullptr; // a child it joins inline, running on this fiber's stack

  Task* task() noexcept;
  static Fiber* of(const Task* t) noexcept;
};

/// Where the task lives behind the control block. Plain operator new (16-byte
/// alignment) keeps the block in malloc's per-thread cache; an aligned new
/// would take glibc's slow memalign path on every spawn.
inline constexpr std::size_t kTaskAlign = alignof(std::max_align_t);
inline constexpr std::size_t kTaskOffset = (sizeof(Fiber) + kTaskAlign - 1) / kTaskAlign * kTaskAlign;

inline Task* Fiber::task() noexcept {
  return reinterpret_cast<Task*>(reinterpret_cast<char*>(this) + kTaskOffset);
}
inline Fiber* Fiber::of(const Task* t) noexcept {
  return reinterpret_cast<Fiber*>(reinterpret_cast<char*>(const_cast<Task*>(t)) - kTaskOffset);
}

/// Destroys the task and frees the block when the last reference goes.
void release_fiber(Fiber* f) noexcept;
/// Frees a fiber's memory block: into the calling worker's record cache if
/// it is recyclable and the worker belongs to `owner`, otherwise to malloc.
void free_record(void* mem, bool recyclable, const Scheduler* owner) noexcept;
/// Makes a parked fiber runnable on its own runtime (no-op unless parked or parking).
void wake_fiber(Fiber* f);

} // namespace coresched::detail
