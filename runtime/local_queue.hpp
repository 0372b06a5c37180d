// SPDX-License-Identifier: Apache-2.0
// A plain intrusive FIFO of fibers, owned by one worker thread (no locking).
// Used on single-PU cores, where no sibling needs cookies sorted out, so the
// yield fast path is two pointer updates.
#pragma once

#include "fiber.hpp"

namespace coresched::detail {

class LocalQueue {
public:
  bool empty() const noexcept { return head_ == nullptr; }
  /// Fibers queued that are not pinned to this worker (others could run them).
  unsigned unpinned() const noexcept { return unpinned_; }
  void push(Fiber* f) noexcept {
    unpinned_ += f->pinned == kNotPinned;
    f->next = nullptr;
    if (tail_) tail_->next = f;
    else head_ = f;
    tail_ = f;
  }
  Fiber* pop() noexcept {
    Fiber* f = head_;
    if (f) {
      unpinned_ -= f->pinned == kNotPinned;
      head_ = f->next;
      if (!head_) tail_ = nullptr;
      f->next = nullptr;
    }
    return f;
  }
  bool contains(const Fiber* f) const noexcept {
    for (const Fiber* x = head_; x; x = x->next)
      if (x == f) return true;
    return false;
  }
  bool remove(Fiber* f) noexcept {
    Fiber* prev = nullptr;
    for (Fiber* x = head_; x; prev = x, x = x->next) {
      if (x != f) continue;
      unpinned_ -= x->pinned == kNotPinned;
      (prev ? prev->next : head_) = x->next;
      if (tail_ == x) tail_ = prev;
      x->next = nullptr;
      return true;
    }
    return false;
  }

private:
  Fiber* head_ = nullptr;
  Fiber* tail_ = nullptr;
  unsigned unpinned_ = 0;
};

} // namespace coresched::detail
