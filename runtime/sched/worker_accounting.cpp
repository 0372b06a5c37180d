// SPDX-License-Identifier: Apache-2.0
// What a worker reports: its cookie books (cookie_books.hpp) and counters for
// a snapshot, and its state for the fiber dump.
#include "sched/worker.hpp"

#include <unordered_map>

namespace coresched::detail {

// Out of line: a run of another cookie than the last is rare on the paths
// that switch most (yield, spawn and join within one cookie), and its clock
// read and call would cost every switch a heavier frame.
__attribute__((noinline)) void Worker::open_segment(std::uint64_t cookie) { books_.open_segment(cookie, now_ns()); }

// No lock and deliberately racy: see View. (TSan is told not to look.)
__attribute__((no_sanitize_thread)) Worker::View Worker::view() const noexcept {
  const CookieBooks::Span s = books_.racy_span();
  return {current_, idle_, books_.racy_forced(), s.since, s.wanted, s.blocker, !local_.racy_empty()};
}

void Worker::collect(std::unordered_map<std::uint64_t, CookieStats>& cookies, WorkerStats& ws) {
  books_.collect(cookies, now_ns());
  ws.worker = pu_.index;
  ws.switches = switches.load(std::memory_order_relaxed);
  ws.steals = steals_.load(std::memory_order_relaxed);
  ws.sleeps = sleeps_.load(std::memory_order_relaxed);
  ws.stalls = stalls.load(std::memory_order_relaxed);
  ws.rescued = rescued.load(std::memory_order_relaxed);
}

} // namespace coresched::detail
