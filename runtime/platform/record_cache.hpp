// SPDX-License-Identifier: Apache-2.0
// Recycles the blocks of one size that every spawn takes — a fiber's
// scheduling record, and its join record with the task (join_record.hpp) when
// the task is small — as Go recycles its goroutine structs: each worker keeps
// a short free list and hands a batch to a shared depot when the list
// overflows; a worker whose list is empty takes a batch from the depot, which
// carves new records from slabs of its own when it has no free ones.
//
// Why not malloc: a fiber spawned on one worker often finishes on another
// (stolen). glibc frees such a block into the spawner's arena under that
// arena's lock, and the spawner's arena keeps growing: a million empty spawns
// run by a second worker spent most of their time in page faults and in futex
// waits on the arena lock. (mimalloc solves this too, but Debian's build
// replaces malloc for the whole process when linked: not a library's call.)
//
// Why slabs on transparent huge pages: a million spawns whose handles are kept
// hold 128 MB of records, and in 4 KiB pages every 32 records cost a page
// fault (tens of microseconds in a VM: more than the spawns, and most of the
// figure's spread from run to run); one 2 MiB page holds 16,384 records. A
// record never goes back to the kernel: the free ones wait for the next
// spawns, so a process keeps the memory of its peak number of live records.
#pragma once

#include <cstddef>
#include <mutex>
#include <sanitizer/asan_interface.h>
#include <utility>
#include <vector>

namespace coresched::detail {

/// A chain of free records linked through their first word.
struct RecordChain {
  struct Node {
    Node* next;
  };
  Node* head = nullptr;
  std::size_t count = 0;
};

/// Free records of one size shared by workers (of any runtime: the process
/// has one depot, spawn_records() in fiber.hpp), kept as whole batches so
/// that giving and taking are O(1) under the lock, and the slabs they come
/// from. Records are 16-byte aligned (what operator new gives, and what a
/// task's place in a join block assumes).
class RecordDepot {
public:
  /// Records of `bytes` each (at least a pointer's size), rounded up to 16.
  explicit RecordDepot(std::size_t bytes) noexcept : bytes_((bytes + 15) / 16 * 16) {}
  /// Unmaps the slabs: every record carved from them must be gone.
  ~RecordDepot();
  RecordDepot(const RecordDepot&) = delete;
  RecordDepot& operator=(const RecordDepot&) = delete;

  /// One batch of free records: kept ones, else newly carved. Throws
  /// std::bad_alloc when no slab can be mapped.
  RecordChain take();
  /// Keeps `batch` for a later take().
  void give(RecordChain batch) noexcept;
  /// One record for a plain thread (no worker's cache at hand).
  void* take_one();
  /// Gives back one record from a plain thread.
  void give_one(void* p) noexcept;
  /// The size of its records.
  std::size_t bytes() const noexcept { return bytes_; }
  /// Bytes of records carved so far (free or in use).
  std::size_t carved_bytes() const;

  static constexpr std::size_t kBatch = 128;

private:
  static constexpr std::size_t kSlabBytes = std::size_t{2} << 20;
  void carve(RecordChain& out); // a batch from the slab (mu_ held)
  RecordChain take_locked();
  const std::size_t bytes_;
  mutable std::mutex mu_;
  std::vector<RecordChain> batches_; // guarded by mu_, as all below
  RecordChain loose_;                // single records from plain threads
  std::vector<void*> slabs_;
  char* slab_next_ = nullptr;
  char* slab_end_ = nullptr;
  std::size_t carved_ = 0;
};

/// One worker's free records of its depot's size. Owner thread only.
class RecordCache {
public:
  explicit RecordCache(RecordDepot& depot) : depot_(depot) {}
  ~RecordCache();
  RecordCache(const RecordCache&) = delete;
  RecordCache& operator=(const RecordCache&) = delete;

  /// A block of the depot's size. Throws std::bad_alloc. Inline: every
  /// spawn takes two, and the call costs more than the pop.
  void* get() {
    if (!free_.head) [[unlikely]]
      return refill_and_get();
    RecordChain::Node* n = free_.head;
    free_.head = n->next;
    --free_.count;
    ASAN_UNPOISON_MEMORY_REGION(n, depot_.bytes());
    return n;
  }
  /// Takes back a record of its depot (from any worker's cache).
  void put(void* p) noexcept {
    auto* n = static_cast<RecordChain::Node*>(p);
    n->next = free_.head;
    free_.head = n;
    // A free record is poisoned past its link, so ASan still reports a use
    // after the fiber was released although the memory was not returned to malloc.
    ASAN_POISON_MEMORY_REGION(n + 1, depot_.bytes() - sizeof(RecordChain::Node));
    if (++free_.count >= kLocalMax) [[unlikely]]
      give_batch();
  }

private:
  static constexpr std::size_t kBatch = RecordDepot::kBatch, kLocalMax = 2 * kBatch;
  void* refill_and_get();
  void give_batch() noexcept;
  RecordDepot& depot_;
  RecordChain free_;
};

} // namespace coresched::detail
