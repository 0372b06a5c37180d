// SPDX-License-Identifier: Apache-2.0
// What the simulation checks as it runs (sim_core.hpp): isolation and the
// wait bounds at every step, each fiber's wait, and the share of two cookies
// over windows of turns. The events that drive the coordinator are in
// sim_core.cpp.
#include "sim_core.hpp"

#include "platform/cookie_registry.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace sim {

void CoreSim::observe() {
  // (c) isolation: one cookie at most is published across the core; and a
  // sibling running a fiber publishes that fiber's cookie.
  std::uint64_t pub = kNoCookie;
  for (unsigned s = 0; s < n_; ++s) {
    const std::uint64_t r = core_.sibling(s).running.load(std::memory_order_relaxed);
    if (r != kNoCookie && pub != kNoCookie && r != pub)
      fail("isolation: sibling " + std::to_string(s) + " publishes cookie " + std::to_string(r) + " beside " +
           std::to_string(pub));
    if (r != kNoCookie) pub = r;
    if (pus_[s].st == PuSt::running && records_[static_cast<std::size_t>(pus_[s].fiber)].cookie != r)
      fail("sibling " + std::to_string(s) + " runs a fiber whose cookie it does not publish");
  }
  if (pub != published_) {
    if (pub != kNoCookie) {
      CookieState& cs = cookies_[pub];
      if (cs.arrived != kNever) {
        const std::uint64_t lat = now() - cs.arrived;
        cs.log.max_arrival_ns = std::max(cs.log.max_arrival_ns, lat);
        if (now() > cs.deadline)
          fail_bound("(a) cookie " + std::to_string(pub) + " owned the core " + std::to_string(lat / kUs) +
                     " us after it arrived (bound " + std::to_string((cs.deadline - cs.arrived) / kUs) + " us)");
        cs.arrived = cs.deadline = kNever;
      }
      if (cs.waiting_since != kNever) {
        const std::uint64_t wait = now() - cs.waiting_since;
        cs.log.max_wait_ns = std::max(cs.log.max_wait_ns, wait);
        cs.waiting_since = kNever;
        const std::uint64_t bound = wait_bound_of[pub] ? wait_bound_of[pub] : wait_bound;
        if (wait > bound)
          fail_bound("cookie " + std::to_string(pub) + " waited " + std::to_string(wait / kUs) +
                     " us for the core (bound " + std::to_string(bound / kUs) + " us)");
      }
    }
    if (published_ != kNoCookie && cookies_[published_].queued > 0 && cookies_[published_].waiting_since == kNever)
      cookies_[published_].waiting_since = now();
    published_ = pub;
  }
  // (d) work conservation: queued fibers and nothing published is a hand-over
  // in flight (a wake-up) or lost work.
  if (pub != kNoCookie || queued_total_ == 0)
    idle_since_ = kNever;
  else if (idle_since_ == kNever)
    idle_since_ = now();
  // (d) the coordinator counts what the simulation queued.
  if (core_.queued_hint() != queued_total_)
    fail("(d) coordinator counts " + std::to_string(core_.queued_hint()) + " queued fibers, the simulation " +
         std::to_string(queued_total_));
  schedule_notices();
}

// A fiber notices its preempt flag at its next preempt point; a young turn's
// request (Sibling::repick_at) at the first one after its re-pick time
// (Worker::preempt). Any other request clears that time, and is noticed at
// the next point.
void CoreSim::schedule_notices() {
  for (unsigned s = 0; s < n_; ++s) {
    Pu& p = pus_[s];
    const Sibling& sib = core_.sibling(s);
    if (p.st != PuSt::running || !sib.preempt.load(std::memory_order_relaxed)) continue;
    const std::uint64_t from = std::max(now(), sib.repick_at.load(std::memory_order_relaxed));
    if (p.notice_at != kNever && p.notice_from <= from) continue;
    p.notice_from = from;
    p.notice_at = from + notice_latency(fibers_[static_cast<std::size_t>(p.fiber)]);
  }
}

void CoreSim::check_fibers() {
  if (idle_since_ != kNever && now() - idle_since_ > idle_bound)
    return fail_bound("(d) the core has published no cookie for " + std::to_string((now() - idle_since_) / kUs) +
                      " us with " + std::to_string(queued_total_) + " fibers queued");
  for (std::size_t i = 0; i < fibers_.size(); ++i)
    if (fibers_[i].st == St::queued && now() - fibers_[i].since > fiber_bound)
      return fail_bound("(d) fiber " + std::to_string(i) + " (cookie " + std::to_string(records_[i].cookie) +
                        ") has been queued for " + std::to_string((now() - fibers_[i].since) / kUs) + " us");
  for (std::size_t c = 0; c < kMaxCookies; ++c) {
    const CookieState& cs = cookies_[c];
    if (cs.arrived != kNever && now() > cs.deadline)
      return fail_bound("(a) cookie " + std::to_string(c) + " arrived " + std::to_string((now() - cs.arrived) / kUs) +
                        " us ago and has not owned the core (bound " +
                        std::to_string((cs.deadline - cs.arrived) / kUs) + " us)");
    const std::uint64_t bound = wait_bound_of[c] ? wait_bound_of[c] : wait_bound;
    if (cs.waiting_since != kNever && now() - cs.waiting_since > bound)
      return fail_bound("cookie " + std::to_string(c) + " has waited " +
                        std::to_string((now() - cs.waiting_since) / kUs) + " us for the core (bound " +
                        std::to_string(bound / kUs) + " us)");
  }
}

void CoreSim::reset_logs() noexcept {
  for (auto& c : cookies_) c.log = CookieLog{};
}

void CoreSim::track(const std::vector<std::uint64_t>& cookies) {
  tracked_ = cookies;
  if (tracked_.size() > kMaxTracked) fail("track: more than kMaxTracked cookies");
  track_start_ = now();
  track_slices_.clear();
}

template <class F> void CoreSim::for_windows(std::size_t window, F&& f) {
  const std::size_t full = (now() - track_start_) / kSlice; // complete slices only
  track_slices_.resize(std::max(track_slices_.size(), full), {});
  std::array<double, kMaxTracked> sum{};
  for (std::size_t i = 0; i < full && !failed(); ++i) {
    for (std::size_t k = 0; k < tracked_.size(); ++k) sum[k] += track_slices_[i][k];
    if (i >= window)
      for (std::size_t k = 0; k < tracked_.size(); ++k) sum[k] -= track_slices_[i - window][k];
    if (i + 1 >= window) f(i + 1 - window, sum);
  }
  tracked_.clear();
}

void CoreSim::check_pair_windows(std::size_t window, double tol, double& worst) {
  const std::uint64_t a = tracked_.at(0), b = tracked_.at(1);
  for_windows(window, [&](std::size_t first, const std::array<double, kMaxTracked>& sum) {
    const double share = sum[0] + sum[1] > 0 ? sum[0] / (sum[0] + sum[1]) : 0.0;
    worst = std::min({worst, share, 1.0 - share});
    if (std::fabs(share - 0.5) > tol) {
      char m[200];
      std::snprintf(m, sizeof m, "(b) slices %zu-%zu after tracking began: cookie %llu had %.1f%%, cookie %llu %.1f%%",
                    first, first + window - 1, static_cast<unsigned long long>(a), 100 * share,
                    static_cast<unsigned long long>(b), 100 * (1 - share));
      fail(m);
    }
  });
}

void CoreSim::check_share_windows(std::size_t window, const std::vector<double>& expected,
                                  const std::vector<double>& tol, double& worst) {
  const std::vector<std::uint64_t> cookies = tracked_;
  for_windows(window, [&](std::size_t first, const std::array<double, kMaxTracked>& sum) {
    double total = 0;
    for (std::size_t k = 0; k < cookies.size(); ++k) total += sum[k];
    for (std::size_t k = 0; k < cookies.size() && !failed(); ++k) {
      if (tol[k] < 0) continue;
      const double off = (total > 0 ? sum[k] / total : 0.0) / expected[k] - 1.0;
      worst = std::max(worst, std::fabs(off));
      if (std::fabs(off) <= tol[k]) continue;
      char m[240];
      std::snprintf(m, sizeof m,
                    "(b) slices %zu-%zu after tracking began: cookie %llu (weight %u) had %.2f%% of the core, "
                    "expected %.2f%% +- %.0f%%",
                    first, first + window - 1, static_cast<unsigned long long>(cookies[k]),
                    cookie_weight(cookies[k]), 100 * sum[k] / total, 100 * expected[k], 100 * tol[k]);
      fail(m);
    }
  });
}

} // namespace sim
