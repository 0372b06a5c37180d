// SPDX-License-Identifier: Apache-2.0
#include "sched/cookie_books.hpp"

namespace coresched::detail {

void CookieBooks::open_segment(std::uint64_t cookie, std::uint64_t now) {
  std::lock_guard lk(mu_);
  close_segment_locked(now);
  if (!seg_counters_ || seg_cookie_ != cookie) seg_counters_ = &counters_[cookie];
  seg_open_ = true;
  seg_cookie_ = cookie;
  seg_start_ = now;
}

void CookieBooks::close_segment(std::uint64_t now) {
  if (!seg_open_) return;
  std::lock_guard lk(mu_);
  close_segment_locked(now);
}

void CookieBooks::close_segment_locked(std::uint64_t now) {
  if (!seg_open_) return;
  Counters& c = *seg_counters_; // the open segment's cookie's (open_segment)
  c.cpu_ns += now - seg_start_;
  c.runs += seg_runs_;
  seg_runs_ = 0;
  seg_open_ = false;
}

bool CookieBooks::enter_forced(std::uint64_t now, std::uint64_t wanted, std::uint64_t blocker) {
  if (forced_) return false;
  std::lock_guard lk(mu_);
  forced_ = true;
  since_ = now;
  wanted_ = wanted;
  blocker_ = blocker;
  return true;
}

void CookieBooks::wait_behind(std::uint64_t blocker) {
  std::lock_guard lk(mu_);
  blocker_ = blocker;
}

CookieBooks::Span CookieBooks::leave_forced(std::uint64_t now) {
  std::lock_guard lk(mu_);
  const Span s{since_, now - since_, wanted_, blocker_};
  counters_[wanted_].suffered_ns += s.ns;
  counters_[blocker_].caused_ns += s.ns;
  forced_ = false;
  return s;
}

void CookieBooks::collect(std::unordered_map<std::uint64_t, CookieStats>& cookies, std::uint64_t now) {
  std::lock_guard lk(mu_);
  if (seg_open_) { // the run in progress counts up to now
    auto& out = cookies[seg_cookie_];
    out.cookie = Cookie::from_value(seg_cookie_);
    out.cpu_ns += now > seg_start_ ? now - seg_start_ : 0;
  }
  if (forced_) { // and so does a forced idle in progress
    const std::uint64_t span = now > since_ ? now - since_ : 0;
    auto& wanted = cookies[wanted_];
    wanted.cookie = Cookie::from_value(wanted_);
    wanted.forced_idle_suffered_ns += span;
    auto& blocker = cookies[blocker_];
    blocker.cookie = Cookie::from_value(blocker_);
    blocker.forced_idle_caused_ns += span;
  }
  for (auto& [cookie, c] : counters_) {
    auto& out = cookies[cookie];
    out.cookie = Cookie::from_value(cookie);
    out.cpu_ns += c.cpu_ns;
    out.forced_idle_suffered_ns += c.suffered_ns;
    out.forced_idle_caused_ns += c.caused_ns;
    out.runs += c.runs;
  }
}

} // namespace coresched::detail
