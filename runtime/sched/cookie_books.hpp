// SPDX-License-Identifier: Apache-2.0
// One worker's per-cookie books: the time its fibers ran, by segment, and the
// forced idle it suffered and caused. The worker writes them; a snapshot
// (Runtime::stats) reads them from another thread, under the books' mutex,
// and counts the segment and the forced idle in progress up to now: a cookie
// that keeps its PU for ever never closes a segment, and would read 0 ms
// while busy.
#pragma once

#include <coresched/stats.hpp>

#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace coresched::detail {

class CookieBooks {
public:
  // ---- run segments: one per stretch of one cookie on this PU, so that
  // switches within a cookie read no clock ----

  /// Whether a run of `cookie` needs a segment of its own (the worker's check
  /// at each start): none is open, or it is another cookie's.
  bool needs_segment(std::uint64_t cookie) const noexcept { return !seg_open_ || seg_cookie_ != cookie; }
  /// One more fiber run in the open segment (this worker's count alone).
  void count_run() noexcept { ++seg_runs_; }
  /// Closes the open segment, if any, and opens `cookie`'s at `now`.
  void open_segment(std::uint64_t cookie, std::uint64_t now);
  /// Closes the open segment, if any, at `now`.
  void close_segment(std::uint64_t now);

  // ---- forced idle: one span from entering it to leaving it ----

  bool forced() const noexcept { return forced_; }
  /// The cookie the span waits behind (the one asked to stop at its turn's end).
  std::uint64_t blocker() const noexcept { return blocker_; }
  /// Starts a span at `now`, wanting `wanted` behind `blocker`; false if one is open.
  bool enter_forced(std::uint64_t now, std::uint64_t wanted, std::uint64_t blocker);
  /// The core's owner changed while the span lasts: it now waits behind `blocker`.
  void wait_behind(std::uint64_t blocker);
  struct Span { std::uint64_t since, ns, wanted, blocker; };
  /// Ends the open span at `now`, charges it to both cookies, and returns it.
  Span leave_forced(std::uint64_t now);

  /// Adds these books, with the segment and span in progress up to `now`.
  void collect(std::unordered_map<std::uint64_t, CookieStats>& cookies, std::uint64_t now);

  /// For the fiber dump, without the mutex: each field may be a moment stale
  /// (TSan is told not to look). Its own functions, not forced(): the
  /// attribute covers only reads in their bodies, and a call to an accessor
  /// that is not inlined (at -O1) would be instrumented.
  __attribute__((no_sanitize_thread)) Span racy_span() const noexcept { return {since_, 0, wanted_, blocker_}; }
  __attribute__((no_sanitize_thread)) bool racy_forced() const noexcept { return forced_; }

private:
  void close_segment_locked(std::uint64_t now);
  struct Counters { std::uint64_t cpu_ns = 0, suffered_ns = 0, caused_ns = 0, runs = 0; };

  // Written under mu_ except seg_runs_ (the worker's alone, added when the
  // segment closes) and read by the worker without it (it is their writer).
  std::uint64_t seg_cookie_ = 0;
  std::uint64_t seg_start_ = 0;
  std::uint64_t seg_runs_ = 0;
  bool seg_open_ = false;
  bool forced_ = false;
  std::uint64_t since_ = 0, wanted_ = 0, blocker_ = 0;
  std::mutex mu_;
  std::unordered_map<std::uint64_t, Counters> counters_;
  // seg_cookie_'s counters, kept while its segment is closed (entries are
  // never erased, and a rehash moves no node): a worker that idles between
  // runs of one cookie, as an I/O server's do, opens and closes a segment per
  // run, and would hash the cookie twice each time. Null before the first.
  Counters* seg_counters_ = nullptr;
};

} // namespace coresched::detail
