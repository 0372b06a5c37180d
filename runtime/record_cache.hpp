// SPDX-License-Identifier: Apache-2.0
// Recycles fiber records (the control block and its task, one allocation) of
// the common size, as Go recycles its goroutine structs: each worker keeps a
// short free list and hands a batch to a shared depot when the list overflows;
// a worker whose list is empty takes a batch from the depot before it asks
// malloc.
//
// Why not malloc alone: a fiber spawned on one worker often finishes on
// another (stolen). glibc frees such a block into the spawner's arena under
// that arena's lock, and the spawner's arena keeps growing: a million empty
// spawns run by a second worker spent most of their time in page faults and in
// futex waits on the arena lock. (mimalloc solves this too, but Debian's build
// replaces malloc for the whole process when linked: not a library's call.)
#pragma once

#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

namespace coresched::detail {

/// The size of a recyclable record. Larger ones come from and go to malloc.
inline constexpr std::size_t kRecordBytes = 208; // a 144-byte control block and a 64-byte task

/// A chain of free records linked through their first word.
struct RecordChain {
  struct Node {
    Node* next;
  };
  Node* head = nullptr;
  std::size_t count = 0;
};

/// Free records shared by a runtime's workers, kept as whole batches so that
/// giving and taking are O(1) under the lock. Bounded; the excess is freed.
class RecordDepot {
public:
  RecordDepot() = default;
  ~RecordDepot();
  RecordDepot(const RecordDepot&) = delete;
  RecordDepot& operator=(const RecordDepot&) = delete;

  /// Takes one batch; false if there is none.
  bool take(RecordChain& out);
  /// Keeps `batch` (or frees it if the depot is full).
  void give(RecordChain batch) noexcept;

private:
  static constexpr std::size_t kMaxRecords = 16384; // 3 MiB
  std::mutex mu_;
  std::vector<RecordChain> batches_; // guarded by mu_
  std::size_t records_ = 0;          // guarded by mu_
};

/// One worker's free records. Owner thread only.
class RecordCache {
public:
  explicit RecordCache(RecordDepot& depot) : depot_(depot) {}
  ~RecordCache();
  RecordCache(const RecordCache&) = delete;
  RecordCache& operator=(const RecordCache&) = delete;

  /// A block of kRecordBytes. Throws std::bad_alloc.
  void* get();
  /// Takes back a block of kRecordBytes (from any worker's cache or malloc).
  void put(void* p) noexcept;

private:
  static constexpr std::size_t kBatch = 128, kLocalMax = 2 * kBatch;
  RecordDepot& depot_;
  RecordChain free_;
};

/// Frees every record of a chain.
void free_records(RecordChain chain) noexcept;

} // namespace coresched::detail
