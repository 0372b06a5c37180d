// SPDX-License-Identifier: Apache-2.0
#include "live_view.hpp"

#include "common.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace coresched::bench {

LiveView::LiveView(const Runtime& rt, std::FILE* out, std::chrono::milliseconds interval, bool json)
    : rt_(rt), out_(out), interval_(interval), json_(json), thread_([this] { loop(); }) {}

LiveView::~LiveView() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void LiveView::loop() {
  const auto start = std::chrono::steady_clock::now();
  Stats before = rt_.stats();
  auto t0 = start;
  std::unique_lock lk(mu_);
  while (!cv_.wait_for(lk, interval_, [&] { return stop_; })) {
    Stats after = rt_.stats();
    const auto t1 = std::chrono::steady_clock::now();
    const std::string f = frame(before, after, seconds(t1 - t0), rt_.topology(), json_, seconds(t1 - start));
    std::fputs(f.c_str(), out_);
    std::fflush(out_);
    before = std::move(after);
    t0 = t1;
  }
}

namespace {
std::string cookie_text(const Cookie& c) { return c.value() == 0 ? std::string("0") : fmt::format("{}", c.value()); }
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
    std::string queued;
    for (const auto& q : c.queued) queued += fmt::format("{}{}:{}", queued.empty() ? "" : " ", cookie_text(q.cookie), q.fibers);
    if (json) {
      j.begin_object().field("core", c.core);
      if (c.has_owner) j.field("owner", c.owner.value());
      else j.key("owner").null();
      j.field("forced_idle_pct", fi_pct).field("forced_idle_pus_now", c.forced_idle_pus).field("handovers_per_s", switches / secs);
      j.key("queued").begin_object();
      for (const auto& q : c.queued) j.field(std::to_string(q.cookie.value()), q.fibers);
      j.end_object().end_object();
    } else {
      cores.add_row({std::to_string(c.core), c.has_owner ? cookie_text(c.owner) : "-", fmt::format("{:.1f}", fi_pct),
                     fmt::format("{:.0f}", switches / secs), queued.empty() ? "-" : queued});
    }
  }
  std::map<std::uint64_t, double> cpu; // per cookie: CPU share of all PUs in the interval
  for (const auto& c : after.cookies) {
    const CookieStats old = before.cookie(c.cookie);
    cpu[c.cookie.value()] = static_cast<double>(c.cpu_ns - std::min(c.cpu_ns, old.cpu_ns)) /
                            (interval_ns * static_cast<double>(topo.pus().size()));
  }
  if (json) {
    j.end_array().key("cpu_share").begin_object();
    for (auto [cookie, share] : cpu) j.field(std::to_string(cookie), share);
    j.end_object().end_object();
    // One line per frame: drop the writer's line breaks and indentation (its
    // strings never hold a raw newline: they are escaped).
    std::string line;
    bool indent = false;
    for (char ch : j.str()) {
      if (ch == '\n') indent = true;
      else if (!(indent && ch == ' ')) indent = false, line += ch;
    }
    return line + "\n";
  }
  std::string share;
  for (auto [cookie, s] : cpu) share += fmt::format("  cookie {}: {:.0f}%", cookie, 100 * s);
  return fmt::format("--- t={:.1f} s (last {:.2f} s) cpu share:{}\n{}", t, secs, share.empty() ? " -" : share,
                     cores.render());
}

} // namespace coresched::bench
