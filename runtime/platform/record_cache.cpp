// SPDX-License-Identifier: Apache-2.0
#include "platform/record_cache.hpp"

#include <new>
#include <sanitizer/asan_interface.h>

namespace coresched::detail {

namespace {
using Node = RecordChain::Node;

void unpoison(Node* n, std::size_t bytes) noexcept { ASAN_UNPOISON_MEMORY_REGION(n, bytes); }

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

void free_records(RecordChain chain, std::size_t bytes) noexcept {
  while (chain.head) {
    Node* n = pop(chain);
    unpoison(n, bytes);
    ::operator delete(static_cast<void*>(n));
  }
}

RecordDepot::~RecordDepot() {
  for (RecordChain& c : batches_) free_records(c, bytes_);
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
  free_records(batch, bytes_);
}

RecordCache::~RecordCache() {
  if (free_.count) depot_.give(free_);
}

void* RecordCache::refill_and_get() {
  if (!depot_.take(free_)) return ::operator new(depot_.bytes());
  return get();
}

void RecordCache::give_batch() noexcept { depot_.give(split_front(free_, kBatch)); }

} // namespace coresched::detail
