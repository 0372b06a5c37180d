// SPDX-License-Identifier: Apache-2.0
#include "record_cache.hpp"

#include <new>
#include <sanitizer/asan_interface.h>

namespace coresched::detail {

namespace {
using Node = RecordChain::Node;

// A free record is poisoned past its link, so ASan still reports a use after
// the fiber was released although the memory was not returned to malloc.
void poison(Node* n) noexcept { ASAN_POISON_MEMORY_REGION(n + 1, kRecordBytes - sizeof(Node)); }
void unpoison(Node* n) noexcept { ASAN_UNPOISON_MEMORY_REGION(n, kRecordBytes); }

void push(RecordChain& c, Node* n) noexcept {
  n->next = c.head;
  c.head = n;
  ++c.count;
}

Node* pop(RecordChain& c) noexcept {
  Node* n = c.head;
  c.head = n->next;
  --c.count;
  return n;
}

// Detaches the first `n` records of `c` as a chain of their own.
RecordChain split_front(RecordChain& c, std::size_t n) noexcept {
  RecordChain front{c.head, n};
  Node* last = c.head;
  for (std::size_t i = 1; i < n; ++i) last = last->next;
  c.head = last->next;
  c.count -= n;
  last->next = nullptr;
  return front;
}
} // namespace

void free_records(RecordChain chain) noexcept {
  while (chain.head) {
    Node* n = pop(chain);
    unpoison(n);
    ::operator delete(static_cast<void*>(n));
  }
}

RecordDepot::~RecordDepot() {
  for (RecordChain& c : batches_) free_records(c);
}

bool RecordDepot::take(RecordChain& out) {
  std::lock_guard lk(mu_);
  if (batches_.empty()) return false;
  out = batches_.back();
  batches_.pop_back();
  records_ -= out.count;
  return true;
}

void RecordDepot::give(RecordChain batch) noexcept {
  {
    std::lock_guard lk(mu_);
    if (records_ + batch.count <= kMaxRecords) {
      try {
        batches_.push_back(batch);
        records_ += batch.count;
        return;
      } catch (...) {
      }
    }
  }
  free_records(batch);
}

RecordCache::~RecordCache() {
  if (free_.count) depot_.give(free_);
}

void* RecordCache::get() {
  if (!free_.head && !depot_.take(free_)) return ::operator new(kRecordBytes);
  Node* n = pop(free_);
  unpoison(n);
  return n;
}

void RecordCache::put(void* p) noexcept {
  auto* n = static_cast<Node*>(p);
  push(free_, n);
  poison(n);
  if (free_.count >= kLocalMax) depot_.give(split_front(free_, kBatch));
}

} // namespace coresched::detail
