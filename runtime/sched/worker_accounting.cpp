// SPDX-License-Identifier: Apache-2.0
// A worker's accounting: the open run segment of a cookie, its closing, and
// the snapshot that counts a run or forced idle in progress.
#include "sched/worker.hpp"

#include <coresched/cookie.hpp>

#include <mutex>
#include <unordered_map>

namespace coresched::detail {

// ---------------------------------------------------------------- accounting

// Out of line: a run of another cookie than the last is rare on the paths
// that switch most (yield, spawn and join within one cookie), and its clock
// read and call would cost every switch a heavier frame.
__attribute__((noinline)) void Worker::open_segment(std::uint64_t cookie) { open_segment(cookie, now_ns()); }

// The segment's cookie, start and openness change only under stats_mu_, so a
// snapshot (collect) can add the open segment's time so far: a cookie that
// keeps its PU for ever is never closed, and read 0 ms while busy.
void Worker::open_segment(std::uint64_t cookie, std::uint64_t now) {
  std::lock_guard lk(stats_mu_);
  close_segment_locked(now);
  seg_open_ = true;
  seg_cookie_ = cookie;
  seg_start_ = now;
}

void Worker::close_segment(std::uint64_t now) {
  if (!seg_open_) return;
  std::lock_guard lk(stats_mu_);
  close_segment_locked(now);
}

void Worker::close_segment_locked(std::uint64_t now) {
  if (!seg_open_) return;
  auto& c = cookie_stats_[seg_cookie_];
  c.cpu_ns += now - seg_start_;
  c.runs += seg_runs_;
  seg_runs_ = 0;
  seg_open_ = false;
}

// No lock and deliberately racy: see View. (TSan is told not to look.)
__attribute__((no_sanitize_thread)) Worker::View Worker::view() const noexcept {
  return {current_, idle_, forced_, forced_since_, forced_wanted_, forced_blocker_, !local_.empty()};
}

void Worker::collect(std::unordered_map<std::uint64_t, CookieStats>& cookies, WorkerStats& ws) {
  std::lock_guard lk(stats_mu_);
  const std::uint64_t now = now_ns();
  if (seg_open_) { // the run in progress counts up to now
    auto& out = cookies[seg_cookie_];
    out.cookie = Cookie::from_value(seg_cookie_);
    out.cpu_ns += now > seg_start_ ? now - seg_start_ : 0;
  }
  if (forced_) { // and so does a forced idle in progress (forced_idle.cpp)
    const std::uint64_t span = now > forced_since_ ? now - forced_since_ : 0;
    auto& wanted = cookies[forced_wanted_];
    wanted.cookie = Cookie::from_value(forced_wanted_);
    wanted.forced_idle_suffered_ns += span;
    auto& blocker = cookies[forced_blocker_];
    blocker.cookie = Cookie::from_value(forced_blocker_);
    blocker.forced_idle_caused_ns += span;
  }
  for (auto& [cookie, c] : cookie_stats_) {
    auto& out = cookies[cookie];
    out.cookie = Cookie::from_value(cookie);
    out.cpu_ns += c.cpu_ns;
    out.forced_idle_suffered_ns += c.suffered_ns;
    out.forced_idle_caused_ns += c.caused_ns;
    out.runs += c.runs;
  }
  ws.worker = pu_.index;
  ws.switches = switches.load(std::memory_order_relaxed);
  ws.steals = steals_.load(std::memory_order_relaxed);
  ws.sleeps = sleeps_.load(std::memory_order_relaxed);
  ws.stalls = stalls.load(std::memory_order_relaxed);
  ws.rescued = rescued.load(std::memory_order_relaxed);
}

} // namespace coresched::detail
