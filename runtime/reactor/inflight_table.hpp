// SPDX-License-Identifier: Apache-2.0
// A reactor's operations in flight, each in a slot of one growing table,
// found again by a sequence number that names its slot. Owner thread only.
//
// Why not a hash set of IoOp*: an insert allocated a node, so every I/O
// operation paid a malloc and a free. Here a slot is reused through a free
// list threaded through the free slots, and the table only grows, to the
// most operations ever in flight at once (16 bytes each).
//
// Why the sequence number: an IoOp lives on its fiber's stack, and a
// cancellation from another thread names it by pointer after it may have
// finished and the stack slot been reused (or unmapped). contains() decides
// from the table alone, never reading the op: the slot must hold this op
// under this very number, and a number comes back only after 2^40 - 1 adds.
#pragma once

#include <cassert>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace coresched::detail {

template <class Op> class InflightTable {
public:
  /// `first_round`: where the count of adds starts (tests start it near its
  /// wrap).
  explicit InflightTable(std::uint64_t first_round = 1) noexcept : next_round_(first_round) {}

  /// Takes a slot for `op`; returns its number (never 0: a RecvStream reads
  /// 0 as "nothing submitted"), which the caller stores in the op for
  /// remove().
  std::uint64_t add(Op* op) {
    std::uint32_t slot;
    if (free_head_ != kNone) {
      slot = free_head_;
      free_head_ = static_cast<std::uint32_t>(slots_[slot].seq);
    } else {
      if (slots_.size() > kMaxSlot)
        throw std::length_error("coresched: more than 2^24 I/O operations in flight on one worker");
      slot = static_cast<std::uint32_t>(slots_.size());
      slots_.push_back({});
    }
    const std::uint64_t seq = (next_round_ << kSlotBits) | slot;
    next_round_ = next_round_ == kLastRound ? 1 : next_round_ + 1; // round 0 never: seq would be 0 in slot 0
    slots_[slot] = {op, seq};
    ++size_;
    return seq;
  }

  /// Frees the slot of `seq`, which add() returned for an op still here.
  void remove(std::uint64_t seq) {
    const std::uint32_t slot = slot_of(seq);
    assert(slot < slots_.size() && slots_[slot].seq == seq && slots_[slot].op);
    slots_[slot] = {nullptr, free_head_};
    free_head_ = slot;
    --size_;
  }

  /// Whether `op` is here under `seq` (false once it was removed, even if
  /// another op now has its slot or its address).
  bool contains(const Op* op, std::uint64_t seq) const noexcept {
    const std::uint32_t slot = slot_of(seq);
    return slot < slots_.size() && slots_[slot].op == op && slots_[slot].seq == seq;
  }

  std::size_t size() const noexcept { return size_; }

  /// The ops here now, in slot order.
  std::vector<Op*> snapshot() const {
    std::vector<Op*> ops;
    ops.reserve(size_);
    for (const Slot& s : slots_)
      if (s.op) ops.push_back(s.op);
    return ops;
  }

private:
  // The low bits of a number name the slot; the high 40 count adds, from 1
  // to kLastRound and round again, so a number comes back only after 2^40 - 1
  // adds (a day and more at ten million a second), long after any
  // cancellation that named it was handled (at the reap after it was asked).
  static constexpr unsigned kSlotBits = 24;
  static constexpr std::uint64_t kLastRound = (std::uint64_t{1} << (64 - kSlotBits)) - 1;
  static constexpr std::size_t kMaxSlot = (std::size_t{1} << kSlotBits) - 1;
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  static std::uint32_t slot_of(std::uint64_t seq) noexcept {
    return static_cast<std::uint32_t>(seq & ((std::uint64_t{1} << kSlotBits) - 1));
  }

  struct Slot {
    Op* op = nullptr;
    std::uint64_t seq = 0; // a free slot: the next free slot's index (kNone ends)
  };
  std::vector<Slot> slots_;
  std::uint32_t free_head_ = kNone;
  std::uint64_t next_round_ = 1;
  std::size_t size_ = 0;
};

} // namespace coresched::detail
