// SPDX-License-Identifier: Apache-2.0
// The part of a fiber that its JoinHandle keeps: whether it has finished, who
// waits for it, and its task (the callable, then the result or exception)
// right behind, in one block.
//
// Why apart from the scheduling record (fiber.hpp): a handle may be kept long
// after its fiber finished (a million spawned, then joined). The scheduling
// record — queue links, saved context, stack, carried exception state — is
// dead weight then; it goes back to its worker's free list the moment the
// fiber retires, and the handle keeps only this block (48 bytes and the task).
#pragma once

#include "platform/spin_lock.hpp"

#include <coresched/join_handle.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace coresched::detail {

struct Fiber;

struct JoinRecord {
  /// For the fiber `f` (its record not built yet) with id `id`; `detached`:
  /// no handle. All at once: a spawn writes each field once.
  JoinRecord(Fiber* f, std::uint64_t fiber_id, bool detached, bool recyclable_block) noexcept
      : refs(detached ? 1 : 2), handle_gone(detached), recyclable(recyclable_block), fiber(f), id(fiber_id) {}

  std::atomic<int> refs;           // the fiber's, and the handle's while it has one
  std::atomic<std::uint32_t> done{0}; // 1 once the fiber's user code is over; never goes back
  SpinLock lock;                   // guards the fields below that are not atomic
  bool thread_joiner = false;      // a plain thread is blocked in join (futex on `done`)
  bool handle_gone;                // detached, or its handle dropped before it finished: nobody
                                   // collects the result, so the fiber destroys it itself
  bool recyclable;                 // a kRecordBytes block (fiber.hpp, record_cache.hpp)
  // The fiber's scheduling record, set at spawn; stale once the fiber has
  // retired. Only ever compared until the record is known to be queued on the
  // caller's worker: it may have been freed and reused by another fiber since
  // (Worker::run_inline checks `join` back).
  Fiber* fiber;
  Fiber* joiner = nullptr;         // a fiber suspended in join
  std::uint64_t id;                // the fiber's, for JoinHandle::id()
  void* locals = nullptr;          // its FiberLocal values (fiber_local.hpp); only the fiber touches it

  Task* task() noexcept;
  static JoinRecord* of(const Task* t) noexcept;
};

/// Where the task lives behind the join record: 16-byte alignment, what the
/// depot's records have (record_cache.hpp) and what plain operator new gives
/// a larger block (an aligned new would take glibc's slow memalign path).
inline constexpr std::size_t kTaskAlign = alignof(std::max_align_t);
inline constexpr std::size_t kTaskOffset = (sizeof(JoinRecord) + kTaskAlign - 1) / kTaskAlign * kTaskAlign;
/// The smallest recyclable join block: room for tasks up to 72 bytes (a
/// callable with a few captures and a small result). Recycled blocks are
/// kRecordBytes (fiber.hpp), at least this; larger tasks use malloc.
inline constexpr std::size_t kJoinBytes = kTaskOffset + 72;
// A spawn's block is 120 bytes (128 in a slab); a larger record would take
// 16 bytes more of every block.
static_assert(sizeof(JoinRecord) <= 48, "JoinRecord outgrew its 48 bytes");

inline Task* JoinRecord::task() noexcept {
  return reinterpret_cast<Task*>(reinterpret_cast<char*>(this) + kTaskOffset);
}
inline JoinRecord* JoinRecord::of(const Task* t) noexcept {
  return reinterpret_cast<JoinRecord*>(reinterpret_cast<char*>(const_cast<Task*>(t)) - kTaskOffset);
}

/// Drops one reference; the last destroys the task (only what a handle took
/// over or left empty is left of it by then) and frees the block.
void release_join(JoinRecord* j) noexcept;

} // namespace coresched::detail
