// SPDX-License-Identifier: Apache-2.0
#include "fiber/run_queue.hpp"

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

RunQueue::List& RunQueue::list_for(std::uint64_t cookie) {
  if (List* l = find(cookie)) return *l;
  // Reuse an empty list before growing: cookies come and go.
  for (auto& e : lists_)
    if (e.count == 0) return e = List{cookie};
  return lists_.emplace_back(List{cookie});
}

void RunQueue::insert(Fiber* f, std::uint32_t key) noexcept {
  List& l = list_for(f->cookie);
  f->seq = next_seq_++;
  l.fibers.insert(f, key);
  ++l.count;
  ++size_;
}

void RunQueue::push_behind_all(Fiber* f) noexcept {
  List& l = list_for(f->cookie);
  f->seq = next_seq_++;
  l.fibers.append_behind_all(f);
  ++l.count;
  ++size_;
}

Fiber* RunQueue::pop(std::uint64_t cookie) noexcept {
  List* l = find(cookie);
  if (!l || l->fibers.empty()) return nullptr;
  --l->count;
  --size_;
  return l->fibers.pop_front();
}

Fiber* RunQueue::pop_oldest() noexcept {
  List* best = nullptr;
  for (auto& l : lists_) {
    const Fiber* h = l.fibers.head;
    if (!h) continue;
    const Fiber* b = best ? best->fibers.head : nullptr;
    if (!b || vtime::before(h->vtime, b->vtime) ||
        (h->vtime == b->vtime && static_cast<std::int32_t>(h->seq - b->seq) < 0))
      best = &l;
  }
  return best ? pop(best->cookie) : nullptr;
}

Fiber* RunQueue::unlink_first_unpinned(List& l) noexcept {
  Fiber* prev = nullptr;
  for (Fiber* f = l.fibers.head; f; prev = f, f = f->next) {
    if (f->pinned != kNotPinned) continue;
    l.fibers.unlink(prev, f);
    --l.count;
    return f;
  }
  return nullptr;
}

Fiber* RunQueue::steal(std::uint64_t cookie, bool any) noexcept {
  for (auto& l : lists_) {
    if (l.fibers.empty() || (!any && l.cookie != cookie)) continue;
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
    for (const Fiber* x = l.fibers.head; x; x = x->next)
      if (x == f) return true;
  return false;
}

bool RunQueue::remove(Fiber* f) noexcept {
  List* l = find(f->cookie);
  if (!l) return false;
  Fiber* prev = nullptr;
  for (Fiber* x = l->fibers.head; x; prev = x, x = x->next) {
    if (x != f) continue;
    l->fibers.unlink(prev, x);
    --l->count;
    --size_;
    return true;
  }
  return false;
}

std::size_t RunQueue::count(std::uint64_t cookie) const noexcept {
  const List* l = find(cookie);
  return l ? l->count : 0;
}

} // namespace coresched::detail
