// SPDX-License-Identifier: Apache-2.0
// Recycles the blocks of one size that every spawn takes — a fiber's
// scheduling record, and its join record with the task (join_record.hpp) when
// the task is small — as Go recycles its goroutine structs: each worker keeps
// a short free list and hands a batch to a shared depot when the list
// overflows; a worker whose list is empty takes a batch from the depot before
// it asks malloc.
//
// Why not malloc alone: a fiber spawned on one worker often finishes on
// another (stolen). glibc frees such a block into the spawner's arena under
// that arena's lock, and the spawner's arena keeps growing: a million empty
// spawns run by a second worker spend most of their time in page faults and in
// futex waits on the arena lock. (mimalloc solves this too, but Debian's build
// replaces malloc for the whole process when linked: not a library's call.)
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

/// Free records of one size shared by a runtime's workers, kept as whole
/// batches so that giving and taking are O(1) under the lock. Bounded; the
/// excess is freed.
class RecordDepot {
public:
  /// Records of `bytes` each (at least a pointer's size).
  explicit RecordDepot(std::size_t bytes) noexcept : bytes_(bytes) {}
  ~RecordDepot();
  RecordDepot(const RecordDepot&) = delete;
  RecordDepot& operator=(const RecordDepot&) = delete;

  /// Takes one batch; false if there is none.
  bool take(RecordChain& out);
  /// Keeps `batch` (or frees it if the depot is full).
  void give(RecordChain batch) noexcept;
  /// The size of its records.
  std::size_t bytes() const noexcept { return bytes_; }

private:
  static constexpr std::size_t kMaxRecords = 16384; // 2-3 MiB at the sizes used
  const std::size_t bytes_;
  std::mutex mu_;
  std::vector<RecordChain> batches_; // guarded by mu_
  std::size_t records_ = 0;          // guarded by mu_
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
  /// Takes back a block of that size (from any worker's cache or malloc).
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
  static constexpr std::size_t kBatch = 128, kLocalMax = 2 * kBatch;
  void* refill_and_get();
  void give_batch() noexcept;
  RecordDepot& depot_;
  RecordChain free_;
};

/// Frees every record of a chain of `bytes`-sized records.
void free_records(RecordChain chain, std::size_t bytes) noexcept;

} // namespace coresched::detail
