// SPDX-License-Identifier: Apache-2.0
#include "platform/record_cache.hpp"

#include <new>
#include <utility>
#include <sanitizer/asan_interface.h>
#include <sys/mman.h>

namespace coresched::detail {

namespace {
using Node = RecordChain::Node;

Node* pop(RecordChain& c) noexcept {
  Node* n = c.head;
  c.head = n->next;
  --c.count;
  return n;
}

void push(RecordChain& c, Node* n) noexcept {
  n->next = c.head;
  c.head = n;
  ++c.count;
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

// A slab aligned to its size, so that the kernel can back it with one huge
// page (where transparent huge pages are enabled for madvise or always).
void* map_slab(std::size_t bytes) {
  void* raw = ::mmap(nullptr, 2 * bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto at = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (at + bytes - 1) / bytes * bytes;
  if (aligned > at) ::munmap(raw, aligned - at);
  if (aligned + bytes < at + 2 * bytes) ::munmap(reinterpret_cast<void*>(aligned + bytes), at + bytes - aligned);
  ::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE); // a hint: without it, 4 KiB pages
  return reinterpret_cast<void*>(aligned);
}
} // namespace

RecordDepot::~RecordDepot() {
  for (void* s : slabs_) ::munmap(s, kSlabBytes);
}

void RecordDepot::carve(RecordChain& out) {
  for (std::size_t i = 0; i < kBatch; ++i) {
    if (slab_next_ + bytes_ > slab_end_) {
      slabs_.reserve(slabs_.size() + 1); // (before the mapping, which would leak if this threw)
      slab_next_ = static_cast<char*>(map_slab(kSlabBytes));
      slab_end_ = slab_next_ + kSlabBytes;
      slabs_.push_back(slab_next_);
    }
    push(out, reinterpret_cast<Node*>(slab_next_));
    slab_next_ += bytes_;
    carved_ += bytes_;
  }
}

// Kept batches first, then the loose records, then a new batch (mu_ held).
RecordChain RecordDepot::take_locked() {
  RecordChain out;
  if (!batches_.empty()) {
    out = batches_.back();
    batches_.pop_back();
  } else if (loose_.count > 0) {
    std::swap(out, loose_);
  } else {
    carve(out);
  }
  return out;
}

RecordChain RecordDepot::take() {
  std::lock_guard lk(mu_);
  return take_locked();
}

void RecordDepot::give(RecordChain batch) noexcept {
  std::lock_guard lk(mu_);
  try {
    batches_.push_back(batch);
  } catch (...) {
    // No room to note the batch: its records join the loose ones, one by one.
    while (batch.head) push(loose_, pop(batch));
  }
}

void* RecordDepot::take_one() {
  std::lock_guard lk(mu_);
  if (loose_.count == 0) loose_ = take_locked();
  Node* n = pop(loose_);
  ASAN_UNPOISON_MEMORY_REGION(n, bytes_);
  return n;
}

void RecordDepot::give_one(void* p) noexcept {
  auto* n = static_cast<Node*>(p);
  ASAN_POISON_MEMORY_REGION(n + 1, bytes_ - sizeof(Node));
  std::lock_guard lk(mu_);
  push(loose_, n);
}

std::size_t RecordDepot::carved_bytes() const {
  std::lock_guard lk(mu_);
  return carved_;
}

RecordCache::~RecordCache() {
  if (free_.count) depot_.give(free_);
}

void* RecordCache::refill_and_get() {
  free_ = depot_.take();
  return get();
}

void RecordCache::give_batch() noexcept { depot_.give(split_front(free_, kBatch)); }

} // namespace coresched::detail
