// SPDX-License-Identifier: Apache-2.0
#include "run_queue.hpp"

namespace coresched::detail {

RunQueue::List* RunQueue::find(std::uint64_t cookie) noexcept {
  for (auto& l : lists_)
    if (l.cookie == cookie) return &l;
  return nullptr;
}

const RunQueue::List* RunQueue::find(std::uint64_t cookie) const noexcept {
  for (const auto& l : lists_)
    if (l.cookie == cookie) return &l;
  return nullptr;
}

void RunQueue::push(Fiber* f) noexcept {
  List* l = find(f->cookie);
  if (!l) {
    // Reuse an empty list before growing: cookies come and go.
    for (auto& e : lists_)
      if (e.count == 0) { l = &e; break; }
    if (!l) l = &lists_.emplace_back();
    *l = List{f->cookie};
  }
  f->next = nullptr;
  f->seq = next_seq_++;
  if (l->tail) l->tail->next = f;
  else l->head = f;
  l->tail = f;
  ++l->count;
  ++size_;
}

Fiber* RunQueue::pop(std::uint64_t cookie) noexcept {
  List* l = find(cookie);
  if (!l || !l->head) return nullptr;
  Fiber* f = l->head;
  l->head = f->next;
  if (!l->head) l->tail = nullptr;
  --l->count;
  --size_;
  f->next = nullptr;
  return f;
}

Fiber* RunQueue::pop_oldest() noexcept {
  List* best = nullptr;
  for (auto& l : lists_)
    if (l.head && (!best || l.head->seq < best->head->seq)) best = &l;
  return best ? pop(best->cookie) : nullptr;
}

Fiber* RunQueue::unlink_first_unpinned(List& l) noexcept {
  Fiber* prev = nullptr;
  for (Fiber* f = l.head; f; prev = f, f = f->next) {
    if (f->pinned != kNotPinned) continue;
    (prev ? prev->next : l.head) = f->next;
    if (l.tail == f) l.tail = prev;
    --l.count;
    f->next = nullptr;
    return f;
  }
  return nullptr;
}

Fiber* RunQueue::steal(std::uint64_t cookie, bool any) noexcept {
  for (auto& l : lists_) {
    if (!l.head || (!any && l.cookie != cookie)) continue;
    if (Fiber* f = unlink_first_unpinned(l)) {
      --size_;
      return f;
    }
  }
  return nullptr;
}

// Compares pointers only: `f` may be running on another core, where
// set_cookie may be changing its cookie right now, so none of its fields may
// be read until it is known to be queued here (and so stopped).
bool RunQueue::contains(const Fiber* f) const noexcept {
  for (const auto& l : lists_)
    for (const Fiber* x = l.head; x; x = x->next)
      if (x == f) return true;
  return false;
}

bool RunQueue::remove(Fiber* f) noexcept {
  List* l = find(f->cookie);
  if (!l) return false;
  Fiber* prev = nullptr;
  for (Fiber* x = l->head; x; prev = x, x = x->next) {
    if (x != f) continue;
    (prev ? prev->next : l->head) = x->next;
    if (l->tail == x) l->tail = prev;
    --l->count;
    --size_;
    x->next = nullptr;
    return true;
  }
  return false;
}

std::size_t RunQueue::count(std::uint64_t cookie) const noexcept {
  const List* l = find(cookie);
  return l ? l->count : 0;
}

} // namespace coresched::detail
