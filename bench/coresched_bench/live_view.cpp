// SPDX-License-Identifier: Apache-2.0
#include "live_view.hpp"

#include "common.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace coresched::bench {

LiveView::LiveView(const Runtime& rt, std::FILE* out, std::chrono::milliseconds interval, bool json,
                   std::optional<std::chrono::nanoseconds> length)
    : rt_(rt), out_(out), interval_(interval), json_(json), length_(length), thread_([this] { loop(); }) {}

LiveView::~LiveView() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool LiveView::wait_done(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return done_; });
}

void LiveView::finish() {
  std::unique_lock lk(mu_);
  finish_ = true;
  cv_.notify_all();
  cv_.wait(lk, [&] { return done_; });
}

// Frames fall due at fixed times from the start (start + k x interval), so a
// late frame does not push the later ones back, and the last falls at the
// length exactly.
void LiveView::loop() {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  Stats before = rt_.stats();
  auto t0 = start;
  std::unique_lock lk(mu_);
  for (std::int64_t k = 1; !done_; ++k) {
    auto due = start + k * interval_;
    const bool last = length_ && due >= start + *length_;
    if (last) due = start + *length_;
    cv_.wait_until(lk, due, [&] { return stop_ || finish_; });
    if (stop_) break;
    Stats after = rt_.stats();
    const auto t1 = Clock::now();
    done_ = last || finish_;
    if (!finish_ || t1 - t0 >= std::chrono::milliseconds(1)) {
      const std::string f = frame(before, after, seconds(t1 - t0), rt_.topology(), json_, seconds(t1 - start));
      std::fputs(f.c_str(), out_);
      std::fflush(out_);
    }
    before = std::move(after);
    t0 = t1;
  }
  done_ = true;
  cv_.notify_all();
}

namespace {

// One cookie's figures over the interval.
struct CookieShare {
  const CookieStats* stats;
  double cpu = 0;  // of all PUs' time
  double core = 0; // of the SMT cores' time
};

// Each cookie's share of the interval: cpu = the PU time its fibers ran over
// elapsed x PUs; core = the time it held an SMT core over elapsed x SMT cores
// (0 where no core has two PUs).
std::vector<CookieShare> shares(const Stats& before, const Stats& after, double interval_ns, const Topology& topo) {
  std::size_t smt_cores = 0;
  for (const auto& c : topo.cores()) smt_cores += c.pus.size() > 1;
  std::vector<CookieShare> out;
  for (const auto& c : after.cookies) {
    const CookieStats old = before.cookie(c.cookie);
    CookieShare s{&c};
    s.cpu = static_cast<double>(c.cpu_ns - std::min(c.cpu_ns, old.cpu_ns)) /
            (interval_ns * static_cast<double>(topo.pus().size()));
    if (smt_cores)
      s.core = static_cast<double>(c.core_ns - std::min(c.core_ns, old.core_ns)) /
               (interval_ns * static_cast<double>(smt_cores));
    out.push_back(s);
  }
  return out;
}

// One line per frame: drops the writer's line breaks and indentation (its
// strings never hold a raw newline: they are escaped).
std::string one_line(const std::string& text) {
  std::string line;
  bool indent = false;
  for (char ch : text) {
    if (ch == '\n') indent = true;
    else if (!(indent && ch == ' ')) indent = false, line += ch;
  }
  return line + "\n";
}

} // namespace

std::string LiveView::frame(const Stats& before, const Stats& after, double secs, const Topology& topo, bool json,
                            double t) {
  if (secs <= 0) secs = 1e-9;
  const double interval_ns = secs * 1e9;
  JsonWriter j;
  Table cores({"core", "owner", "forced idle %", "hand-overs/s", "queued per cookie"});
  if (json) j.begin_object().field("t", t).key("cores").begin_array();
  for (const CoreStats& c : after.cores) {
    const CoreStats* b = nullptr;
    for (const auto& x : before.cores)
      if (x.core == c.core) b = &x;
    const double pus = static_cast<double>(c.core < topo.cores().size() ? topo.cores()[c.core].pus.size() : 1);
    const double fi = b ? static_cast<double>(c.forced_idle_ns - std::min(c.forced_idle_ns, b->forced_idle_ns)) : 0;
    const double switches =
        b ? static_cast<double>(c.cookie_switches - std::min(c.cookie_switches, b->cookie_switches)) : 0;
    const double fi_pct = 100.0 * fi / (interval_ns * pus);
    if (json) {
      j.begin_object().field("core", c.core);
      if (c.has_owner) j.field("owner", c.owner.value()).field("owner_name", c.owner.name());
      else j.key("owner").null().key("owner_name").null();
      j.field("forced_idle_pct", fi_pct).field("forced_idle_pus_now", c.forced_idle_pus).field("handovers_per_s", switches / secs);
      j.key("queued").begin_object();
      for (const auto& q : c.queued) j.field(std::to_string(q.cookie.value()), q.fibers);
      j.end_object().end_object();
    } else {
      std::string queued;
      for (const auto& q : c.queued) queued += fmt::format("{}{}: {}", queued.empty() ? "" : ", ", q.cookie.label(), q.fibers);
      cores.add_row({std::to_string(c.core), c.has_owner ? c.owner.label() : "-", fmt::format("{:.1f}", fi_pct),
                     fmt::format("{:.0f}", switches / secs), queued.empty() ? "-" : queued});
    }
  }
  const std::vector<CookieShare> cookies = shares(before, after, interval_ns, topo);
  if (json) {
    j.end_array().key("cpu_share").begin_object();
    for (const auto& s : cookies) j.field(std::to_string(s.stats->cookie.value()), s.cpu);
    j.end_object().key("cookies").begin_array();
    for (const auto& s : cookies)
      j.begin_object()
          .field("cookie", s.stats->cookie.value())
          .field("name", s.stats->name)
          .field("weight", s.stats->weight)
          .field("cpu_share", s.cpu)
          .field("core_share", s.core)
          .end_object();
    j.end_array().end_object();
    return one_line(j.str());
  }
  Table tenants({"cookie", "weight", "cpu %", "core %"});
  for (const auto& s : cookies)
    tenants.add_row({s.stats->cookie.label(), std::to_string(s.stats->weight), fmt::format("{:.0f}", 100 * s.cpu),
                     fmt::format("{:.0f}", 100 * s.core)});
  return fmt::format("--- t={:.1f} s (last {:.2f} s)\n{}{}", t, secs, cores.render(),
                     cookies.empty() ? std::string() : tenants.render());
}

} // namespace coresched::bench
