// SPDX-License-Identifier: Apache-2.0
// A worker's run queue: one list per cookie, so the core-wide pick can take
// "the next fiber of cookie K" without scanning fibers of other cookies (the
// kernel keeps an rbtree keyed by cookie for the same reason). Each list is
// ordered by virtual runtime, FIFO among equals (fiber_list.hpp); on
// single-PU cores the lowest vtime of any cookie runs next, a sequence number
// breaking ties.
// Not thread-safe: guarded by the owning core's lock.
#pragma once

#include "fiber/fiber_list.hpp"

#include <cstdint>
#include <vector>

namespace coresched::detail {

class RunQueue {
public:
  /// Queues `f` in vtime order among its cookie's fibers, as if its vtime were `key`.
  void insert(Fiber* f, std::uint32_t key) noexcept;
  void push(Fiber* f) noexcept { insert(f, f->vtime); }
  /// Queues `f` behind every fiber of its cookie (an explicit yield).
  void push_behind_all(Fiber* f) noexcept;
  /// Next fiber of `cookie` (lowest vtime), or null.
  Fiber* pop(std::uint64_t cookie) noexcept;
  /// Next fiber of any cookie (lowest vtime, then oldest), or null.
  Fiber* pop_oldest() noexcept;
  /// Next unpinned fiber of `cookie` (any cookie if `any`), for another worker.
  Fiber* steal(std::uint64_t cookie, bool any) noexcept;
  /// Whether `f` is queued here. Reads no field of `f` (it may be running elsewhere).
  bool contains(const Fiber* f) const noexcept;
  /// Removes `f` if it is queued here; returns whether it was.
  bool remove(Fiber* f) noexcept;
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  /// Number of fibers queued with `cookie`.
  std::size_t count(std::uint64_t cookie) const noexcept;
  /// Calls `fn(cookie, count)` for each cookie with fibers queued.
  template <class Fn> void for_each_cookie(Fn fn) const {
    for (const auto& l : lists_)
      if (l.count) fn(l.cookie, l.count);
  }
  /// Calls `fn(const Fiber&)` for each queued fiber, cookie by cookie (the fiber dump).
  template <class Fn> void for_each(Fn fn) const {
    for (const auto& l : lists_)
      for (const Fiber* f = l.fibers.head; f; f = f->next) fn(*f);
  }

private:
  struct List {
    std::uint64_t cookie;
    FiberList fibers;
    std::size_t count = 0;
  };
  List& list_for(std::uint64_t cookie);
  List* find(std::uint64_t cookie) noexcept;
  const List* find(std::uint64_t cookie) const noexcept;
  static Fiber* unlink_first_unpinned(List& l) noexcept;
  std::vector<List> lists_;
  std::uint32_t next_seq_ = 0;
  std::size_t size_ = 0;
};

} // namespace coresched::detail
