// SPDX-License-Identifier: Apache-2.0
// The tenants' shares of the core in the matrix: what the weights ask for
// (weight / sum), and what each way measured: by the runtime's books, the
// time each cookie held the core (core_ns) and the time its fibers ran
// (cpu_ns: what the weights divide), and by the loops' thread CPU time (the
// kernel's clock, which on our side also counts the worker's idle path).
#include "kernel_tag.hpp"
#include "matrix.hpp"

#include <fmt/format.h>

namespace coresched::bench::matrix {
namespace {

/// a / (a + b) in %; unset when both are 0.
std::optional<double> share_pct(std::uint64_t a, std::uint64_t b) {
  if (a + b == 0) return std::nullopt;
  return 100.0 * static_cast<double>(a) / static_cast<double>(a + b);
}

/// Avg and stdev of a per-run share over the row's runs; unset where the
/// tenants do not compete or no run measured it.
std::optional<Summary> over_runs(const Row& r, std::optional<double> (Run::*share)() const) {
  if (!competes(*r.config)) return std::nullopt;
  std::vector<double> xs;
  for (const auto& run : r.runs)
    if (const auto v = (run.*share)()) xs.push_back(*v);
  if (xs.empty()) return std::nullopt;
  return summarize(xs);
}

std::string avg_of(const std::optional<Summary>& s) { return fixed(s ? std::optional(s->avg) : std::nullopt, 1); }
std::string stdev_of(const std::optional<Summary>& s) { return fixed(s ? std::optional(s->stdev) : std::nullopt, 1); }

} // namespace

std::optional<double> Run::cpu_core_share_pct() const {
  if (!cpu_owned_ns || !mem_owned_ns) return std::nullopt;
  return share_pct(*cpu_owned_ns, *mem_owned_ns);
}

std::optional<double> Run::cpu_run_share_pct() const {
  if (!cpu_run_ns || !mem_run_ns) return std::nullopt;
  return share_pct(*cpu_run_ns, *mem_run_ns);
}

std::optional<double> Run::cpu_thread_share_pct() const {
  if (!mem || !thread_times) return std::nullopt;
  return share_pct(cpu.thread_cpu_ns, mem->thread_cpu_ns);
}

std::optional<Summary> Row::cpu_core_share() const { return over_runs(*this, &Run::cpu_core_share_pct); }
std::optional<Summary> Row::cpu_run_share() const { return over_runs(*this, &Run::cpu_run_share_pct); }
std::optional<Summary> Row::cpu_thread_share() const { return over_runs(*this, &Run::cpu_thread_share_pct); }

std::string render_shares(const Settings& s, const std::vector<Row>& ours, const std::vector<Row>* kernel) {
  std::vector<std::string> head{"config", "expected cpu %", "ours run %", "stdev", "ours core_ns %", "stdev",
                                "ours thread-time %", "stdev"};
  if (kernel) head.insert(head.end(), {"kernel thread-time %", "stdev"});
  Table t(std::move(head));
  bool any = false;
  for (const auto& r : ours) {
    const auto expected = expected_cpu_share_pct(s, *r.config);
    if (!expected) continue;
    any = true;
    const auto run = r.cpu_run_share(), core = r.cpu_core_share(), thread = r.cpu_thread_share();
    std::vector<std::string> cells{r.config->name, fixed(expected, 1), avg_of(run), stdev_of(run), avg_of(core),
                                   stdev_of(core), avg_of(thread), stdev_of(thread)};
    if (kernel) {
      const Row* k = find_row(*kernel, r.config->name);
      const auto ks = k ? k->cpu_thread_share() : std::nullopt;
      cells.insert(cells.end(), {avg_of(ks), stdev_of(ks)});
    }
    t.add_row(std::move(cells));
  }
  if (!any) return {};
  return fmt::format("the cpu tenant's share of the core (weights cpu {} : mem {}; the mem tenant has the rest; "
                     "run: the time its fibers ran (cpu_ns), which the weights divide; core_ns: the time its "
                     "cookie held the core, hand-over gaps included; thread-time: each loop's thread CPU time, "
                     "ours with the worker's idle path):\n{}",
                     s.weight(0), s.weight(1), t.render());
}

void write_shares(JsonWriter& j, const Row& r, const Settings& s) {
  const auto expected = expected_cpu_share_pct(s, *r.config);
  if (!expected) {
    j.key("shares").null();
    return;
  }
  j.key("shares").begin_object();
  j.field("expected_cpu_pct", *expected).field("expected_mem_pct", 100.0 - *expected);
  const auto put = [&j](std::string_view cpu_key, std::string_view mem_key, const std::optional<Summary>& cpu) {
    if (!cpu) return;
    j.summary(cpu_key, *cpu, "%");
    j.summary(mem_key, Summary{100.0 - cpu->avg, cpu->stdev}, "%");
  };
  put("cpu_run_pct", "mem_run_pct", r.cpu_run_share());
  put("cpu_core_pct", "mem_core_pct", r.cpu_core_share());
  put("cpu_thread_pct", "mem_thread_pct", r.cpu_thread_share());
  j.end_object();
}

void write_weights(JsonWriter& j, const Settings& s) {
  const auto nices = kernel_nices_for_weights(s.weight(0), s.weight(1));
  j.key("weights").begin_object();
  j.field("set", s.weights.has_value()).field("cpu", s.weight(0)).field("mem", s.weight(1));
  j.key("kernel_nice").begin_object().field("cpu", nices[0]).field("mem", nices[1]).end_object();
  j.key("kernel_weight").begin_object();
  j.field("cpu", kernel_nice_weight(nices[0])).field("mem", kernel_nice_weight(nices[1])).end_object();
  j.end_object();
}

} // namespace coresched::bench::matrix
