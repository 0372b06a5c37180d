// SPDX-License-Identifier: Apache-2.0
// Option names and the statistics table.
#include <coresched/cookie.hpp>
#include <coresched/options.hpp>
#include <coresched/stats.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

namespace coresched {

const char* to_string(FairnessPolicy p) noexcept {
  return p == FairnessPolicy::core_vruntime ? "core_vruntime" : "forceidle_balance";
}

const char* to_string(Placement p) noexcept { return p == Placement::mask ? "mask" : "scan"; }
const char* to_string(IoBackend b) noexcept {
  switch (b) {
  case IoBackend::automatic: return "auto";
  case IoBackend::io_uring: return "io_uring";
  case IoBackend::epoll: return "epoll";
  }
  return "?";
}

CookieStats Stats::cookie(Cookie c) const {
  for (const auto& s : cookies)
    if (s.cookie == c) return s;
  CookieStats none;
  none.cookie = c;
  return none;
}

std::string Stats::to_table() const {
  auto ms = [](std::uint64_t ns) { return static_cast<double>(ns) / 1e6; };
  std::string out = "coresched statistics\n";
  // The cookie column holds the label ("7 (premium)"): as wide as the widest
  // (a name may have 48 bytes), so the figures stay in their columns.
  std::vector<std::string> labels;
  std::size_t width = 10;
  for (const auto& c : cookies) {
    labels.push_back(c.cookie.label());
    width = std::max(width, labels.back().size());
  }
  out += fmt::format("{:<{}} {:>6} {:>12} {:>12} {:>16} {:>16} {:>10}\n", "cookie", width, "weight", "cpu ms",
                     "core ms", "fi suffered ms", "fi caused ms", "runs");
  for (std::size_t i = 0; i < cookies.size(); ++i) {
    const CookieStats& c = cookies[i];
    out += fmt::format("{:<{}} {:>6} {:>12.3f} {:>12.3f} {:>16.3f} {:>16.3f} {:>10}\n", labels[i], width, c.weight,
                       ms(c.cpu_ns), ms(c.core_ns), ms(c.forced_idle_suffered_ns), ms(c.forced_idle_caused_ns),
                       c.runs);
  }
  out += fmt::format("{:>10} {:>16} {:>16} {:>10} {:>14} {:>14}\n", "core", "cookie switches", "forced idle ms",
                     "handovers", "gap p50 us", "gap p99 us");
  auto us = [](std::uint64_t ns) { return static_cast<double>(ns) / 1e3; };
  for (const auto& c : cores)
    out += fmt::format("{:>10} {:>16} {:>16.3f} {:>10} {:>14.1f} {:>14.1f}\n", c.core, c.cookie_switches,
                       ms(c.forced_idle_ns), c.handovers, us(c.handover_gap_p50_ns), us(c.handover_gap_p99_ns));
  out += fmt::format("{:>10} {:>12} {:>10} {:>10} {:>10} {:>10}\n", "worker", "switches", "steals", "sleeps", "stalls",
                     "rescued");
  for (const auto& w : workers)
    out += fmt::format("{:>10} {:>12} {:>10} {:>10} {:>10} {:>10}\n", w.worker, w.switches, w.steals, w.sleeps, w.stalls,
                       w.rescued);
  out += fmt::format("ticks: {}\n", ticks);
  out += fmt::format("isolation violations: {}\n", isolation_violations);
  return out;
}

} // namespace coresched
