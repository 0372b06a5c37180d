// SPDX-License-Identifier: Apache-2.0
// A worker's private queue of fibers, owned by one worker thread (no locking).
// Used on single-PU cores, where no sibling needs cookies sorted out, so the
// yield fast path is a comparison and two pointer updates. Ordered by virtual
// runtime (fiber_list.hpp).
#pragma once

#include "fiber/fiber_list.hpp"

namespace coresched::detail {

class LocalQueue {
public:
  bool empty() const noexcept { return list_.empty(); }
  /// For the fiber dump, from another thread without a lock: may be a moment
  /// stale. Reads the head itself: a call to empty() that is not inlined (at
  /// -O1) would be instrumented, and TSan would report the dump's read.
  __attribute__((no_sanitize_thread)) bool racy_empty() const noexcept { return list_.head == nullptr; }
  /// Fibers queued that are not pinned to this worker (others could run them).
  unsigned unpinned() const noexcept { return unpinned_; }
  /// Queues `f` in vtime order, as if its vtime were `key`.
  void insert(Fiber* f, std::uint32_t key) noexcept {
    unpinned_ += f->pinned == kNotPinned;
    list_.insert(f, key);
  }
  void push(Fiber* f) noexcept { insert(f, f->vtime); }
  /// Queues `f` behind every other fiber (an explicit yield).
  void push_behind_all(Fiber* f) noexcept {
    unpinned_ += f->pinned == kNotPinned;
    list_.append_behind_all(f);
  }
  Fiber* pop() noexcept {
    Fiber* f = list_.pop_front();
    if (f) unpinned_ -= f->pinned == kNotPinned;
    return f;
  }
  /// Looks for `f` by address: it may be stale, so nothing of it is read
  /// until it is found here. If found and `ok(f)`, unlinks it and sets
  /// `removed`. Returns whether it was found. One walk: an inline join pays
  /// for this on every spawn+join.
  template <class Ok> bool find_and_remove(const Fiber* f, Ok ok, bool& removed) noexcept {
    Fiber* prev = nullptr;
    for (Fiber* x = list_.head; x; prev = x, x = x->next) {
      if (x != f) continue;
      if (ok(x)) {
        unpinned_ -= x->pinned == kNotPinned;
        list_.unlink(prev, x);
        removed = true;
      }
      return true;
    }
    return false;
  }
  bool remove(Fiber* f) noexcept {
    bool removed = false;
    find_and_remove(f, [](const Fiber*) { return true; }, removed);
    return removed;
  }

private:
  FiberList list_;
  unsigned unpinned_ = 0;
};

} // namespace coresched::detail
