// SPDX-License-Identifier: Apache-2.0
// A binary min-heap of pointers to intrusive items, each knowing its place,
// so that any item can be withdrawn in O(log n): the timers of the epoll
// reactor and the deadline timer's waits, which are mostly withdrawn before
// they expire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace coresched::detail {

/// `Key` is the item's deadline; `Index` its place (-1: not in the heap).
template <class T, std::uint64_t T::*Key, int T::*Index> class IndexedHeap {
public:
  bool empty() const noexcept { return items_.empty(); }
  std::size_t size() const noexcept { return items_.size(); }
  /// The item with the least key; the heap must not be empty.
  T* top() const noexcept { return items_.front(); }
  static bool contains(const T* t) noexcept { return t->*Index >= 0; }

  void push(T* t) {
    items_.push_back(t);
    place(items_.size() - 1, t);
    sift_up(items_.size() - 1);
  }

  /// Takes `t`, which must be in the heap, out of it.
  void remove(T* t) noexcept {
    const auto i = static_cast<std::size_t>(t->*Index);
    t->*Index = -1;
    T* last = items_.back();
    items_.pop_back();
    if (last == t) return;
    place(i, last);
    sift_down(i);
    sift_up(static_cast<std::size_t>(last->*Index));
  }

private:
  void place(std::size_t i, T* t) noexcept {
    items_[i] = t;
    t->*Index = static_cast<int>(i);
  }
  bool less(std::size_t a, std::size_t b) const noexcept { return items_[a]->*Key < items_[b]->*Key; }
  void swap(std::size_t a, std::size_t b) noexcept {
    T* t = items_[a];
    place(a, items_[b]);
    place(b, t);
  }
  void sift_up(std::size_t i) noexcept {
    while (i > 0) {
      const std::size_t parent = (i - 1) / 2;
      if (!less(i, parent)) return;
      swap(i, parent);
      i = parent;
    }
  }
  void sift_down(std::size_t i) noexcept {
    for (;;) {
      std::size_t least = i;
      for (std::size_t c = 2 * i + 1; c <= 2 * i + 2 && c < items_.size(); ++c)
        if (less(c, least)) least = c;
      if (least == i) return;
      swap(i, least);
      i = least;
    }
  }

  std::vector<T*> items_;
};

} // namespace coresched::detail
