// SPDX-License-Identifier: Apache-2.0
// An intrusive singly linked list of queued fibers, ordered by virtual
// runtime and FIFO among equals (fiber_vtime.hpp says why). Both kinds of run
// queue keep their fibers in one: a worker's private LocalQueue and each
// cookie's list in a core's RunQueue. Not thread-safe.
#pragma once

#include "fiber/fiber.hpp"
#include "fiber/fiber_vtime.hpp"

namespace coresched::detail {

struct FiberList {
  Fiber* head = nullptr;
  Fiber* tail = nullptr;

  bool empty() const noexcept { return head == nullptr; }

  /// Inserts `f` before the first fiber whose vtime is above `key` (usually
  /// f->vtime). The common cases cost one comparison: a fiber that ran goes
  /// last, a woken one with credit goes first. Otherwise the walk is bounded
  /// (a queue of a million fibers must not make every insert a million
  /// steps): past kMaxWalk fibers it appends, so order is then only FIFO.
  void insert(Fiber* f, std::uint32_t key) noexcept {
    if (!tail || !vtime::before(key, tail->vtime)) return append(f);
    if (vtime::before(key, head->vtime)) {
      f->next = head;
      head = f;
      return;
    }
    constexpr int kMaxWalk = 32;
    Fiber* prev = head;
    for (int i = 0; i < kMaxWalk && prev->next; ++i, prev = prev->next) {
      if (vtime::before(key, prev->next->vtime)) {
        f->next = prev->next;
        prev->next = f;
        return;
      }
    }
    append(f);
  }

  /// Behind every queued fiber (an explicit yield): its vtime is raised to
  /// the last one's, which keeps the list sorted.
  void append_behind_all(Fiber* f) noexcept {
    if (tail && vtime::before(f->vtime, tail->vtime)) f->vtime = tail->vtime;
    append(f);
  }

  Fiber* pop_front() noexcept {
    Fiber* f = head;
    if (f) {
      head = f->next;
      if (!head) tail = nullptr;
      f->next = nullptr;
    }
    return f;
  }

  /// Unlinks `f`, whose predecessor is `prev` (null: it is the head).
  void unlink(Fiber* prev, Fiber* f) noexcept {
    (prev ? prev->next : head) = f->next;
    if (tail == f) tail = prev;
    f->next = nullptr;
  }

private:
  void append(Fiber* f) noexcept {
    f->next = nullptr;
    if (tail) tail->next = f;
    else head = f;
    tail = f;
  }
};

} // namespace coresched::detail
