// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file matrix.hpp
/// Internals shared by matrix.cpp (the runtime's fibers) and
/// matrix_compare.cpp (sysbench processes and kernel-tagged threads).

#include "cli_options.hpp"
#include "common.hpp"
#include "sysbench_work.hpp"

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <time.h>
#include <vector>

namespace coresched::bench::matrix {

/// Everything the command line sets.
struct Settings {
  std::optional<unsigned> core; ///< unset: the first core with two PUs
  double time_s = 30;
  unsigned runs = 10;
  std::uint64_t cpu_max_prime = 10000;
  std::uint64_t block_bytes = 1024;
  std::uint64_t buffer_bytes = 1024; ///< = the block: sysbench rewrites one block
  bool sysbench_bookkeeping = true;   ///< pay sysbench's per-event clock reads, mutex and histogram
  std::string topology;
  std::optional<FairnessPolicy> policy;
  std::optional<unsigned> slice_us;
  std::string json_path;
  bool compare_sysbench = false;
  bool compare_kernel = false;
  bool compare_alternation = false;
  std::vector<std::string> only; ///< configurations to run; empty: all six
  std::optional<TenantWeights> weights; ///< --weights CPU:MEM; unset: both Cookie::kDefaultWeight

  /// The weight of the cpu benchmark's cookie (role 0) or the memory one's (role 1).
  std::uint32_t weight(unsigned role) const { return weights ? (*weights)[role] : Cookie::kDefaultWeight; }
};

/// Where one benchmark runs in a configuration: which sibling of the core, and
/// which tag (0 untagged, 1 cookie A, 2 cookie B).
struct Slot {
  unsigned sibling;
  int tag;
};

/// One row of the seed's table.
struct Config {
  const char* name;
  Slot cpu;
  std::optional<Slot> mem; ///< unset: the cpu benchmark runs alone
};

/// The seed's rows, in its order.
inline const std::array<Config, 6> configs{{
    {"Alone", {0, 0}, std::nullopt},
    {"nosmt", {0, 0}, Slot{0, 0}},
    {"no tag", {0, 0}, Slot{1, 0}},
    {"cpu tagged", {0, 1}, Slot{1, 0}},
    {"mem tagged", {0, 0}, Slot{1, 1}},
    {"both tagged", {0, 1}, Slot{1, 2}},
}};

/// Whether the settings ask for this configuration.
inline bool selected(const Settings& s, const Config& c) {
  if (s.only.empty()) return true;
  for (const auto& n : s.only)
    if (n == c.name) return true;
  return false;
}

/// Whether the two benchmarks carry different cookies on sibling PUs, so
/// that they compete for the core and the weights divide its time. Alone has
/// no rival; nosmt and no tag share one cookie (nosmt's two fibers take turns
/// on one PU by the worker's own queue, which no weight reaches).
inline bool competes(const Config& c) { return c.mem && c.mem->tag != c.cpu.tag && c.mem->sibling != c.cpu.sibling; }

/// The share of the core the cpu benchmark should get where the two compete
/// (weight / sum of weights), in %; nullopt where they do not.
inline std::optional<double> expected_cpu_share_pct(const Settings& s, const Config& c) {
  if (!competes(c)) return std::nullopt;
  return 100.0 * s.weight(0) / (static_cast<double>(s.weight(0)) + s.weight(1));
}

/// Name of a tag for output.
inline const char* tag_name(int tag) { return tag == 0 ? "untagged" : tag == 1 ? "A" : "B"; }

/// What one benchmark loop did.
struct Work {
  std::uint64_t events = 0;
  std::uint64_t checksum = 0; ///< sum of event results: keeps them live, and checks them
  std::chrono::steady_clock::time_point end;
  /// CPU time of the thread that ran the loop, over the loop (the kernel's
  /// clock, not the runtime's books): a pinned fiber alone on its worker,
  /// whose worker sleeps while forced idle, or a plain thread.
  std::uint64_t thread_cpu_ns = 0;
};

/// CLOCK_THREAD_CPUTIME_ID now, in ns.
inline std::uint64_t thread_cpu_now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

/// Runs `event` until `deadline`, reading the clock every `check_every` events
/// (the clock costs ~28 ns: fine beside a cpu event, not beside a memory one).
/// preempt_point() between events lets the runtime switch cookies on the core;
/// on a plain thread it does nothing. An interrupt (interrupted()) ends it
/// early, at the same check: run_ways() then leaves the run out.
template <class Event>
Work loop_until(std::chrono::steady_clock::time_point deadline, unsigned check_every, Event&& event) {
  Work w;
  const std::uint64_t cpu_start = thread_cpu_now_ns();
  for (;;) {
    for (unsigned i = 0; i < check_every; ++i) {
      w.checksum += event();
      this_fiber::preempt_point();
    }
    w.events += check_every;
    w.end = std::chrono::steady_clock::now();
    if (w.end >= deadline || interrupted()) {
      w.thread_cpu_ns = thread_cpu_now_ns() - cpu_start;
      return w;
    }
  }
}

inline constexpr unsigned mem_check_every = 256;

/// The cpu benchmark: sysbench cpu events until the deadline; with
/// `bookkeeping`, each with sysbench's per-event work around it.
inline Work cpu_loop(std::chrono::steady_clock::time_point deadline, std::uint64_t max_prime, bool bookkeeping) {
  if (!bookkeeping) return loop_until(deadline, 1, [max_prime] { return cpu_event(max_prime); });
  SysbenchBookkeeping books;
  return loop_until(deadline, 1, [&books, max_prime] { return books.around([max_prime] { return cpu_event(max_prime); }); });
}

/// The memory benchmark: sysbench memory events until the deadline; with
/// `bookkeeping`, each with sysbench's per-event work around it (what makes
/// our MiB/s comparable with sysbench's: see SysbenchBookkeeping).
inline Work mem_loop(std::chrono::steady_clock::time_point deadline, MemoryBuffer& buf, bool bookkeeping) {
  MemoryCursor cur(buf);
  auto event = [&cur] {
    cur.event();
    return std::uint64_t{0};
  };
  if (!bookkeeping) return loop_until(deadline, mem_check_every, event);
  SysbenchBookkeeping books;
  return loop_until(deadline, mem_check_every, [&books, &event] { return books.around(event); });
}

/// start + seconds, on the steady clock.
inline std::chrono::steady_clock::time_point after(std::chrono::steady_clock::time_point start, double s) {
  return start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

/// One run of one configuration.
struct Run {
  double elapsed_s = 0;     ///< start to both benchmarks joined
  Work cpu;
  double cpu_elapsed_s = 0; ///< start to the cpu loop's last clock read
  std::optional<Work> mem;
  double mem_elapsed_s = 0;
  std::optional<std::uint64_t> forced_idle_ns; ///< unset where not measured (threads, sysbench)
  /// How long the cpu benchmark's cookie held the core (coresched's fibers only).
  std::optional<std::uint64_t> cpu_owned_ns;
  /// How long the memory benchmark's cookie held the core (likewise).
  std::optional<std::uint64_t> mem_owned_ns;
  /// How long the cpu benchmark's cookie's fibers ran (its cpu_ns: fibers
  /// only, without the worker's idle path; coresched's fibers only).
  std::optional<std::uint64_t> cpu_run_ns;
  /// How long the memory benchmark's cookie's fibers ran (likewise).
  std::optional<std::uint64_t> mem_run_ns;
  unsigned siblings = 2;
  bool thread_times = true; ///< Work::thread_cpu_ns was measured (not for sysbench's processes)

  /// The cpu benchmark's share of the core, in %, by the runtime's books:
  /// its cookie's core_ns over both cookies'. Unset without both.
  std::optional<double> cpu_core_share_pct() const;
  /// The same by the time each cookie's fibers ran (cpu_ns).
  std::optional<double> cpu_run_share_pct() const;
  /// The same by the loops' own thread CPU times.
  std::optional<double> cpu_thread_share_pct() const;

  /// cpu events per ms its cookie held the core; unset where not measured.
  std::optional<double> cpu_events_per_owned_ms() const {
    if (!cpu_owned_ns || *cpu_owned_ns == 0) return std::nullopt;
    return static_cast<double>(cpu.events) / (static_cast<double>(*cpu_owned_ns) / 1e6);
  }

  double cpu_events_per_s() const { return static_cast<double>(cpu.events) / cpu_elapsed_s; }
  std::optional<double> mem_mib_per_s(std::uint64_t block_bytes) const;
  std::optional<double> forced_idle_pct() const;
};

/// All runs of one configuration.
struct Row {
  const Config* config;
  std::vector<Run> runs;
  Summary cpu() const;
  std::optional<Summary> mem(std::uint64_t block_bytes) const;
  std::optional<Summary> forced_idle() const;
  std::optional<Summary> cpu_core_share() const;   ///< over Run::cpu_core_share_pct(), where the tenants compete
  std::optional<Summary> cpu_run_share() const;    ///< over Run::cpu_run_share_pct(), where the tenants compete
  std::optional<Summary> cpu_thread_share() const; ///< over Run::cpu_thread_share_pct(), where the tenants compete
};

/// One way of running the configurations: coresched's fibers, plain threads
/// with kernel cookies, or sysbench processes.
struct Way {
  std::string label;                     ///< progress prefix, "[label] <config> run i/n ..."
  Settings settings;                     ///< its selection of configurations (and, for sysbench, whole seconds)
  std::function<Run(const Config&)> one; ///< runs one configuration once
};

/// Runs every way's configurations `runs` times, interleaved: for each
/// configuration, run 1 of every way, then run 2 of every way, and so on. A
/// machine whose speed drifts (an emulated guest on a busy host can read the
/// same loop 2x apart in phases a minute apart) then slows every way alike, and a
/// ratio between ways compares runs made seconds apart. Returns one list of
/// rows per way, in the order given. After an interrupt (interrupted()) it
/// starts no further run and leaves out the run it cut short, and the rows
/// hold only the runs that finished (a configuration with none is left out).
std::vector<std::vector<Row>> run_ways(const std::vector<Way>& ways);

/// The runs run_ways() makes of one way: its configurations x its runs.
unsigned planned_runs(const Way& way);

/// How long run_ways() should take, for the header: "about 30 min (6
/// configurations x 10 runs x 30 s)", with each comparison's part where there
/// are several ways ("ours: ...; kernel: 6 x 10 x 30 s").
std::string expected_time(const std::vector<Way>& ways);

/// The result table: config, cpu ev/s avg and stdev, mem MiB/s avg and stdev,
/// forced-idle %.
std::string render_rows(const std::vector<Row>& rows, std::uint64_t block_bytes);

/// The row of configuration `name`, or null.
const Row* find_row(const std::vector<Row>& rows, std::string_view name);

/// `both tagged`'s cpu events per ms its cookie held the core, and that over
/// `Alone`'s events per ms of run; nullopt without both rows or without time.
struct OwnedRate {
  double per_owned_ms;
  double over_alone;
};
std::optional<OwnedRate> owned_rate(const std::vector<Row>& rows);

/// The hand-over figure: `both tagged`'s cpu events per ms its
/// cookie held the core, over `Alone`'s events per ms of run; and the core's
/// hand-over gaps. Printed after our table, and written under "handover".
void report_handover(const std::vector<Row>& rows, const CoreStats& core, JsonWriter& j);

/// One configuration's figures in JSON (summaries and per-run raw values).
void write_row(JsonWriter& j, const Row& r, const Settings& s);

/// The tenants' shares of the core, config by config: the expected share
/// (weight / sum), ours by the runtime's core_ns and by thread CPU time,
/// and, given `kernel`, the kernel's by thread CPU time, each avg and stdev
/// over the runs; only the configurations where the tenants compete
/// (matrix_shares.cpp). Empty when none ran.
std::string render_shares(const Settings& s, const std::vector<Row>& ours, const std::vector<Row>* kernel);

/// Writes a row's "shares" object (null where the tenants do not compete).
void write_shares(JsonWriter& j, const Row& r, const Settings& s);

/// Writes the "weights" object of the result: the two tenants' weights, and
/// for the kernel's threads the nice values they map to.
void write_weights(JsonWriter& j, const Settings& s);

/// What the matrix runs on: the chosen core's first two siblings.
struct Place {
  unsigned core;
  std::array<unsigned, 2> pus;  ///< Topology::pus() indexes of siblings 0 and 1
  std::array<unsigned, 2> cpus; ///< the real CPUs behind them
  unsigned siblings;            ///< PUs of the core (forced idle is per sibling)
};

/// A way to run beside ours (--compare-sysbench, --compare-kernel): how to
/// run it, or why it cannot run here, and how to report it.
struct Comparison {
  std::string key;         ///< its JSON key: "sysbench" or "kernel"
  std::string unavailable; ///< why it cannot run here; empty: it runs
  Way way;
  /// Prints its table and its ratios to ours, and writes it under `key`.
  std::function<void(const std::vector<Row>& ours, const std::vector<Row>& theirs, JsonWriter& j)> report;
};

/// --compare-sysbench: two real sysbench processes pinned to the same CPUs,
/// tagged with kernel cookies by coresched-tag-exec where the kernel has them.
Comparison sysbench_comparison(const Settings& s, const Place& p);

/// --compare-kernel: the same loops on plain threads with kernel cookies
/// (PR_SCHED_CORE), where the kernel supports it.
Comparison kernel_comparison(const Settings& s, const Place& p, const Topology& t, MemoryBuffer& buffer);

/// --compare-alternation: `Alone` and `both tagged` as two plain threads on
/// the same CPUs taking turns of `slice` through a futex, with no runtime: what
/// the hand-over figure could reach on this machine (matrix_alternation.cpp).
Comparison alternation_comparison(const Settings& s, const Place& p, MemoryBuffer& buffer,
                                  std::chrono::microseconds slice);

/// Writes {"available": false, "reason": why} under `key`.
void write_unavailable(JsonWriter& j, std::string_view key, const std::string& why);

} // namespace coresched::bench::matrix
