// SPDX-License-Identifier: Apache-2.0
// The matrix's per-run figures, summaries, table and JSON; shared by the fiber
// runs and the kernel-thread comparison.
#include "matrix.hpp"

#include <fmt/format.h>

#include <cmath>

namespace coresched::bench::matrix {

std::optional<double> Run::mem_mib_per_s(std::uint64_t block_bytes) const {
  if (!mem) return std::nullopt;
  const double bytes = static_cast<double>(mem->events) * static_cast<double>(block_bytes);
  return bytes / mem_elapsed_s / (1024.0 * 1024.0);
}

std::optional<double> Run::forced_idle_pct() const {
  if (!forced_idle_ns) return std::nullopt;
  return 100.0 * static_cast<double>(*forced_idle_ns) / (elapsed_s * 1e9 * siblings);
}

Summary Row::cpu() const {
  std::vector<double> xs;
  for (const auto& r : runs) xs.push_back(r.cpu_events_per_s());
  return summarize(xs);
}

std::optional<Summary> Row::mem(std::uint64_t block_bytes) const {
  std::vector<double> xs;
  for (const auto& r : runs)
    if (auto v = r.mem_mib_per_s(block_bytes)) xs.push_back(*v);
  if (xs.empty()) return std::nullopt;
  return summarize(xs);
}

std::optional<Summary> Row::forced_idle() const {
  std::vector<double> xs;
  for (const auto& r : runs)
    if (auto v = r.forced_idle_pct()) xs.push_back(*v);
  if (xs.empty()) return std::nullopt;
  return summarize(xs);
}

namespace {

std::string run_result(const Run& r, std::uint64_t block_bytes) {
  std::string s = fmt::format(" cpu {:.2f} ev/s", r.cpu_events_per_s());
  if (auto m = r.mem_mib_per_s(block_bytes)) s += fmt::format(", mem {:.1f} MiB/s", *m);
  if (auto f = r.forced_idle_pct()) s += fmt::format(", forced idle {:.1f}%", *f);
  return s;
}

} // namespace

std::vector<std::vector<Row>> run_ways(const std::vector<Way>& ways) {
  std::vector<std::vector<Row>> rows(ways.size());
  const unsigned runs = ways.empty() ? 0 : ways.front().settings.runs;
  for (const auto& c : configs) {
    for (std::size_t w = 0; w < ways.size(); ++w)
      if (selected(ways[w].settings, c)) rows[w].push_back(Row{&c, {}});
    for (unsigned i = 1; i <= runs && !interrupted(); ++i)
      for (std::size_t w = 0; w < ways.size() && !interrupted(); ++w) {
        if (!selected(ways[w].settings, c)) continue;
        const Settings& s = ways[w].settings;
        progress_begin(ways[w].label, fmt::format("{} run {}/{} ({} s) ...", c.name, i, runs, s.time_s));
        const Run r = ways[w].one(c);
        if (interrupted()) {
          progress_end(" interrupted: left out");
          break;
        }
        rows[w].back().runs.push_back(r);
        progress_end(run_result(r, s.block_bytes));
      }
  }
  for (auto& way_rows : rows) std::erase_if(way_rows, [](const Row& r) { return r.runs.empty(); });
  return rows;
}

namespace {

unsigned selected_configs(const Settings& s) {
  unsigned n = 0;
  for (const auto& c : configs) n += selected(s, c);
  return n;
}

std::string about(double s) {
  if (s < 120) return fmt::format("about {:.0f} s", s);
  const auto min = static_cast<long long>(std::llround(s / 60));
  return min < 120 ? fmt::format("about {} min", min) : fmt::format("about {} h {} min", min / 60, min % 60);
}

} // namespace

unsigned planned_runs(const Way& way) { return selected_configs(way.settings) * way.settings.runs; }

std::string expected_time(const std::vector<Way>& ways) {
  double total = 0;
  std::string parts;
  for (const auto& w : ways) {
    const Settings& s = w.settings;
    total += planned_runs(w) * s.time_s;
    const unsigned n = selected_configs(s);
    if (parts.empty())
      parts = fmt::format("{}{} configuration{} x {} run{} x {} s", ways.size() > 1 ? "ours: " : "", n,
                          n == 1 ? "" : "s", s.runs, s.runs == 1 ? "" : "s", s.time_s);
    else
      parts += fmt::format("; {}: {} x {} x {} s", w.label.substr(w.label.find('/') + 1), n, s.runs, s.time_s);
  }
  return fmt::format("{} ({})", about(total), parts);
}

std::string render_rows(const std::vector<Row>& rows, std::uint64_t block_bytes) {
  Table t({"config", "cpu ev/s avg", "stdev", "mem MiB/s avg", "stdev", "forced-idle %"});
  for (const auto& r : rows) {
    const Summary cpu = r.cpu();
    const auto mem = r.mem(block_bytes);
    const auto idle = r.forced_idle();
    t.add_row({r.config->name, fixed(cpu.avg, 2), fixed(cpu.stdev, 2), fixed(mem ? mem->avg : std::optional<double>{}, 1),
               fixed(mem ? mem->stdev : std::optional<double>{}, 1),
               fixed(idle ? idle->avg : std::optional<double>{}, 1)});
  }
  return t.render();
}

const Row* find_row(const std::vector<Row>& rows, std::string_view name) {
  for (const auto& r : rows)
    if (name == r.config->name) return &r;
  return nullptr;
}

std::optional<OwnedRate> owned_rate(const std::vector<Row>& rows) {
  const Row* alone = find_row(rows, "Alone");
  const Row* both = find_row(rows, "both tagged");
  if (!alone || !both) return std::nullopt;
  double events = 0, owned_ms = 0, alone_events = 0, alone_ms = 0;
  for (const auto& r : both->runs)
    if (r.cpu_owned_ns) { events += static_cast<double>(r.cpu.events); owned_ms += static_cast<double>(*r.cpu_owned_ns) / 1e6; }
  for (const auto& r : alone->runs) { alone_events += static_cast<double>(r.cpu.events); alone_ms += r.cpu_elapsed_s * 1e3; }
  if (owned_ms <= 0 || alone_ms <= 0 || alone_events <= 0) return std::nullopt;
  const double per_owned = events / owned_ms;
  return OwnedRate{per_owned, per_owned / (alone_events / alone_ms)};
}

void report_handover(const std::vector<Row>& rows, const CoreStats& core, JsonWriter& j) {
  const auto rate = owned_rate(rows);
  std::optional<double> per_owned, ratio;
  if (rate) per_owned = rate->per_owned_ms, ratio = rate->over_alone;
  std::printf("\nhand-over: %llu cookie changes with work left; gap p50 %.1f us, p99 %.1f us, max %.1f us",
              static_cast<unsigned long long>(core.handovers), static_cast<double>(core.handover_gap_p50_ns) / 1e3,
              static_cast<double>(core.handover_gap_p99_ns) / 1e3, static_cast<double>(core.handover_gap_max_ns) / 1e3);
  if (ratio) std::printf("; both tagged: %.1f cpu events per ms its cookie held the core = %.3f of Alone's per ms", *per_owned, *ratio);
  std::printf("\n");
  std::fflush(stdout);
  j.key("handover").begin_object();
  j.field("count", core.handovers).field("gap_p50_ns", core.handover_gap_p50_ns);
  j.field("gap_p99_ns", core.handover_gap_p99_ns).field("gap_max_ns", core.handover_gap_max_ns);
  if (ratio) j.field("both_tagged_cpu_events_per_owned_ms", *per_owned).field("over_alone", *ratio);
  j.end_object();
}

namespace {

void write_slot(JsonWriter& j, std::string_view k, const std::optional<Slot>& slot) {
  if (!slot) { j.key(k).null(); return; }
  j.key(k).begin_object().field("sibling", slot->sibling).field("cookie", tag_name(slot->tag)).end_object();
}

void write_run(JsonWriter& j, const Run& r, std::uint64_t block_bytes) {
  j.begin_object();
  j.field("elapsed_s", r.elapsed_s);
  j.field("cpu_events", r.cpu.events).field("cpu_elapsed_s", r.cpu_elapsed_s);
  j.field("cpu_events_per_s", r.cpu_events_per_s());
  if (r.cpu_owned_ns) j.field("cpu_owned_ns", *r.cpu_owned_ns);
  if (r.cpu_run_ns) j.field("cpu_run_ns", *r.cpu_run_ns);
  if (r.thread_times) j.field("cpu_thread_cpu_ns", r.cpu.thread_cpu_ns);
  if (r.mem) {
    j.field("mem_events", r.mem->events).field("mem_elapsed_s", r.mem_elapsed_s);
    j.field("mem_mib_per_s", *r.mem_mib_per_s(block_bytes));
    if (r.mem_owned_ns) j.field("mem_owned_ns", *r.mem_owned_ns);
    if (r.mem_run_ns) j.field("mem_run_ns", *r.mem_run_ns);
    if (r.thread_times) j.field("mem_thread_cpu_ns", r.mem->thread_cpu_ns);
  }
  if (r.forced_idle_ns) {
    j.field("forced_idle_ns", *r.forced_idle_ns).field("siblings", r.siblings);
    j.field("forced_idle_pct", *r.forced_idle_pct());
  }
  j.end_object();
}

} // namespace

void write_row(JsonWriter& j, const Row& r, const Settings& s) {
  j.begin_object();
  j.field("name", r.config->name);
  write_slot(j, "cpu", r.config->cpu);
  write_slot(j, "mem", r.config->mem);
  j.summary("cpu_events_per_s", r.cpu(), "events/s");
  if (auto m = r.mem(s.block_bytes)) j.summary("mem_mib_per_s", *m, "MiB/s");
  else j.key("mem_mib_per_s").null();
  if (auto f = r.forced_idle()) j.summary("forced_idle_pct", *f, "%");
  write_shares(j, r, s);
  j.key("runs").begin_array();
  for (const auto& run : r.runs) write_run(j, run, s.block_bytes);
  j.end_array();
  j.end_object();
}

} // namespace coresched::bench::matrix
