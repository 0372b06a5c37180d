// SPDX-License-Identifier: Apache-2.0
// `coresched-bench matrix`: seed 000's sysbench matrix on one core's siblings.
#include "cli_options.hpp"
#include "commands.hpp"
#include "kernel_tag.hpp"
#include "matrix.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <memory>

namespace coresched::bench::matrix {
namespace {

// ------------------------------------------------------------------ command line

// Validators see the text before conversion, so they parse it themselves.
CLI::Validator multiple_of_8() {
  return CLI::Validator(
      [](std::string& v) {
        std::uint64_t n = 0;
        const bool ok = CLI::detail::lexical_cast(v, n) && n >= 8 && n % 8 == 0;
        return ok ? std::string() : std::string("must be a multiple of 8 bytes (64-bit stores)");
      },
      "MULTIPLE OF 8");
}

void add_options(CLI::App& sub, Settings& s) {
  sub.add_option_function<unsigned>("--core", [&s](unsigned c) { s.core = c; },
                                    "Core to run on (default: the first core with two or more PUs)");
  sub.add_option("--time", s.time_s, "Seconds per run")->capture_default_str()->check(positive_seconds());
  sub.add_option("--runs", s.runs, "Runs per configuration")->capture_default_str()->check(CLI::Range(1u, 1000000u));
  sub.add_option("--cpu-max-prime", s.cpu_max_prime, "Upper bound of the prime search of one cpu event")
      ->capture_default_str()->check(CLI::Range(std::uint64_t{3}, std::uint64_t{1} << 40));
  // transform() runs before check(), so the multiple-of-8 test sees bytes.
  sub.add_option("--memory-block-size", s.block_bytes, "Bytes written by one memory event (K/M/G suffixes)")
      ->default_str("1K")->transform(CLI::AsSizeValue(false))->check(multiple_of_8());
  sub.add_option("--memory-buffer-size", s.buffer_bytes,
                 "Shared buffer the memory events walk through, block by block (K/M/G; default: one block, as "
                 "sysbench rewrites one; a larger one, 64M say, streams past the caches)")
      ->default_str("1K")->transform(CLI::AsSizeValue(false))->check(multiple_of_8());
  sub.add_flag("!--no-sysbench-bookkeeping", s.sysbench_bookkeeping,
               "Leave out sysbench's per-event work (three clock reads, a mutex, a latency histogram update) that "
               "our loops otherwise pay, as sysbench does, so that our figures compare with its");
  add_topology_option(sub, s.topology, true);
  add_policy_option(sub, s.policy);
  add_slice_option(sub, s.slice_us);
  std::vector<std::string> names;
  for (const auto& c : configs) names.emplace_back(c.name);
  sub.add_option("--config", s.only, "Run only these configurations (repeatable; default: all)")
      ->check(CLI::IsMember(names));
  add_json_option(sub, s.json_path);
  add_weights_option(sub, s.weights, "CPU:MEM");
  sub.add_flag("--compare-sysbench", s.compare_sysbench,
               "Also run the matrix as real sysbench processes (if in PATH), pinned and tagged with kernel cookies by "
               "coresched-tag-exec (untagged configurations only where the kernel cannot tag), and print our/their ratio");
  sub.add_flag("--compare-kernel", s.compare_kernel,
               "Also run the pairs as plain threads with kernel core-scheduling cookies (PR_SCHED_CORE), if the "
               "kernel supports it");
  sub.add_flag("--compare-alternation", s.compare_alternation,
               "Also run Alone and both tagged as two plain threads pinned to the same CPUs that take turns of one "
               "slice through a futex, with no runtime, and print what that reaches per ms of turn beside ours per "
               "ms the cookie held the core (what this machine itself costs a core that changes hands)");
}

// ------------------------------------------------------------------ setup

/// The core to use and its first two siblings; nullopt (after printing why)
/// if the topology has no suitable core.
std::optional<Place> choose_place(const Settings& s, const Topology& t) {
  const auto core = s.core ? s.core : first_smt_core(t);
  if (!core) {
    std::fprintf(stderr,
                 "coresched-bench matrix: no core with two or more PUs in this topology, so there are no siblings "
                 "to share.\n%s\nTry --topology \"package:1 l3cache:1 core:1 pu:2\" (synthetic siblings).\n",
                 t.describe().c_str());
    return std::nullopt;
  }
  if (*core >= t.cores().size() || t.cores()[*core].pus.size() < 2) {
    std::fprintf(stderr, "coresched-bench matrix: --core %u: the topology has %zu core(s) and this one needs two "
                         "or more PUs\n", *core, t.cores().size());
    return std::nullopt;
  }
  const auto& pus = t.cores()[*core].pus;
  return Place{*core, {pus[0], pus[1]}, {t.pus()[pus[0]].cpu, t.pus()[pus[1]].cpu},
               static_cast<unsigned>(pus.size())};
}

void print_matrix_header(const Settings& s, const Runtime& rt, const Place& p, std::uint64_t primes) {
  const auto& o = rt.options();
  const auto nices = kernel_nices_for_weights(s.weight(0), s.weight(1));
  print_header("matrix", rt, {
      {"core", fmt::format("{} (PUs {}; sibling 0 = PU {} on CPU {}, sibling 1 = PU {} on CPU {})", p.core,
                           join_list(rt.topology().cores()[p.core].pus), p.pus[0], p.cpus[0], p.pus[1], p.cpus[1])},
      {"placement", "cpu fiber on sibling 0, mem fiber on sibling 1 (nosmt: both on sibling 0), pinned"},
      {"policy", to_string(o.policy)},
      {"wakeup placement", to_string(o.placement)},
      {"slice", fmt::format("{} us", o.slice.count())},
      {"time", fmt::format("{} s per run", s.time_s)},
      {"runs", fmt::format("{} per configuration", s.runs)},
      {"cpu event", fmt::format("primes below {} ({} per event)", s.cpu_max_prime, primes)},
      {"memory event", fmt::format("{} B of 64-bit stores (as sysbench's), {}", s.block_bytes,
                                   s.buffer_bytes <= s.block_bytes
                                       ? std::string("rewriting one block (as sysbench)")
                                       : fmt::format("walking a {} B shared buffer", s.buffer_bytes))},
      {"weights", fmt::format("cpu {} : mem {}{} (where their cookies compete for the core; kernel threads: nice {} "
                              ": {})", s.weight(0), s.weight(1), s.weights ? "" : " (default)", nices[0], nices[1])},
      {"per event", s.sysbench_bookkeeping ? "sysbench's bookkeeping (3 clock reads, an event count, a histogram update)"
                                           : "no bookkeeping (--no-sysbench-bookkeeping)"},
  });
}

// ------------------------------------------------------------------ one run

/// The fiber options of one slot: pinned to its sibling, with its cookie.
SpawnOptions spawn_options(const Place& p, const Slot& slot, const std::array<Cookie, 3>& cookies) {
  SpawnOptions o;
  o.pin_to_pu = p.pus[slot.sibling];
  o.cookie = cookies[static_cast<std::size_t>(slot.tag)];
  return o;
}

/// The cookies of one run, by tag: untagged, A, B. Fresh ones per run, as the
/// seed tagged fresh processes each run (reusing them would hide how the
/// runtime places a new cookie against the long-lived untagged one), each
/// named and weighted after the benchmark that carries it. Where a benchmark
/// runs untagged against a tagged one, the untagged cookie takes its weight
/// for the run, and gets its old weight back after, since it is the
/// process's.
class RunCookies {
public:
  RunCookies(const Settings& s, const Config& c) {
    const std::optional<Slot> slots[2] = {c.cpu, c.mem};
    for (unsigned role = 0; role < 2; ++role) {
      if (!slots[role]) continue;
      const auto tag = static_cast<std::size_t>(slots[role]->tag);
      if (tag != 0) {
        cookies_[tag] = Cookie::create(role == 0 ? "cpu" : "mem", s.weight(role));
      } else if (competes(c)) {
        old_untagged_weight_ = Cookie{}.weight();
        Cookie{}.set_weight(s.weight(role));
      }
    }
  }
  RunCookies(const RunCookies&) = delete;
  RunCookies& operator=(const RunCookies&) = delete;
  ~RunCookies() {
    if (old_untagged_weight_) Cookie{}.set_weight(*old_untagged_weight_);
  }
  const std::array<Cookie, 3>& all() const { return cookies_; }

private:
  std::array<Cookie, 3> cookies_{};
  std::optional<std::uint32_t> old_untagged_weight_; ///< set where the run weighted the untagged cookie
};

/// Runs one configuration once on the runtime's fibers. Both fibers share one
/// start time and deadline, so time lost waiting for the core counts.
Run run_fibers(Runtime& rt, const Settings& s, const Place& p, MemoryBuffer& buf, const Config& c) {
  const RunCookies run_cookies(s, c);
  const std::array<Cookie, 3>& cookies = run_cookies.all();
  const Stats before = rt.stats();
  const std::uint64_t idle_before = before.cores[p.core].forced_idle_ns;
  const Cookie cpu_cookie = cookies[static_cast<std::size_t>(c.cpu.tag)];
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = after(start, s.time_s);
  auto cpu = rt.spawn([deadline, prime = s.cpu_max_prime, bk = s.sysbench_bookkeeping] { return cpu_loop(deadline, prime, bk); },
                      spawn_options(p, c.cpu, cookies));
  JoinHandle<Work> mem;
  if (c.mem)
    mem = rt.spawn([deadline, &buf, bk = s.sysbench_bookkeeping] { return mem_loop(deadline, buf, bk); }, spawn_options(p, *c.mem, cookies));
  Run r;
  r.cpu = cpu.join();
  if (c.mem) r.mem = mem.join();
  r.elapsed_s = seconds(std::chrono::steady_clock::now() - start);
  r.cpu_elapsed_s = seconds(r.cpu.end - start);
  if (r.mem) r.mem_elapsed_s = seconds(r.mem->end - start);
  const Stats after = rt.stats();
  r.forced_idle_ns = after.cores[p.core].forced_idle_ns - idle_before;
  r.cpu_owned_ns = after.cookie(cpu_cookie).core_ns - before.cookie(cpu_cookie).core_ns;
  r.cpu_run_ns = after.cookie(cpu_cookie).cpu_ns - before.cookie(cpu_cookie).cpu_ns;
  if (c.mem) {
    const Cookie mem_cookie = cookies[static_cast<std::size_t>(c.mem->tag)];
    r.mem_owned_ns = after.cookie(mem_cookie).core_ns - before.cookie(mem_cookie).core_ns;
    r.mem_run_ns = after.cookie(mem_cookie).cpu_ns - before.cookie(mem_cookie).cpu_ns;
  }
  r.siblings = p.siblings;
  return r;
}

/// Every cpu event must have found the same number of primes; a wrong sum
/// means a fiber's state was corrupted (a runtime bug, not a slow run).
bool checksums_ok(const std::vector<Row>& rows, std::uint64_t primes) {
  bool ok = true;
  for (const auto& row : rows)
    for (const auto& r : row.runs)
      if (r.cpu.checksum != r.cpu.events * primes) {
        std::fprintf(stderr, "coresched-bench matrix: %s: cpu checksum %llu != %llu events x %llu primes\n",
                     row.config->name, static_cast<unsigned long long>(r.cpu.checksum),
                     static_cast<unsigned long long>(r.cpu.events), static_cast<unsigned long long>(primes));
        ok = false;
      }
  return ok;
}

// ------------------------------------------------------------------ JSON

void write_json_head(JsonWriter& j, const Settings& s, const Runtime& rt, const Place& p, std::uint64_t primes) {
  const auto& o = rt.options();
  j.field("benchmark", "matrix").field("coresched_version", CORESCHED_VERSION);
  write_topology(j, rt.topology(), {p.pus[0], p.pus[1]});
  write_io_backend(j, rt);
  j.field("core", p.core).field("policy", to_string(o.policy)).field("wakeup_placement", to_string(o.placement));
  j.field("slice_us", static_cast<std::uint64_t>(o.slice.count()));
  j.field("time_s", s.time_s).field("runs", s.runs).field("cpu_max_prime", s.cpu_max_prime);
  j.field("primes_per_cpu_event", primes);
  j.field("memory_block_size_bytes", s.block_bytes).field("memory_buffer_size_bytes", s.buffer_bytes);
  j.field("sysbench_bookkeeping", s.sysbench_bookkeeping);
  j.key("units").begin_object();
  j.field("cpu_events_per_s", "events/s").field("mem_mib_per_s", "MiB/s (2^20 bytes/s)");
  j.field("forced_idle_pct", "% of run time x siblings").field("elapsed_s", "s").field("forced_idle_ns", "ns");
  j.field("shares", "% of the time either benchmark's cookie held the core (core: the runtime's core_ns) or of "
                    "both loops' thread CPU time (thread)");
  j.end_object();
}

int run(const Settings& s) {
  if (!check_json_path("matrix", s.json_path)) return exit_setup;
  // A core named with --core is the user's choice: no fallback then.
  const Options opts = runtime_options(s.core ? s.topology : smt_topology("matrix", s.topology), s.policy, {}, s.slice_us);
  auto rt_owner = std::make_unique<Runtime>(opts); // one runtime for every run, as one long-lived process would be
  Runtime& rt = *rt_owner;
  const auto place = choose_place(s, rt.topology());
  if (!place) return exit_setup;
  const std::uint64_t primes = cpu_event(s.cpu_max_prime);
  print_matrix_header(s, rt, *place, primes);
  MemoryBuffer buf(s.block_bytes, s.buffer_bytes);

  // The comparisons run interleaved with ours, run by run (run_ways), so
  // their notes and any reason one cannot run come first.
  std::vector<Comparison> comparisons;
  if (s.compare_sysbench) comparisons.push_back(sysbench_comparison(s, *place));
  if (s.compare_kernel) comparisons.push_back(kernel_comparison(s, *place, rt.topology(), buf));
  if (s.compare_alternation) comparisons.push_back(alternation_comparison(s, *place, buf, rt.options().slice));
  std::vector<Way> ways{{"matrix", s, [&](const Config& c) { return run_fibers(rt, s, *place, buf, c); }}};
  for (const auto& c : comparisons) {
    if (c.unavailable.empty()) ways.push_back(c.way);
    else std::printf("%s comparison skipped: %s\n", c.key.c_str(), c.unavailable.c_str());
  }
  std::printf("# expected time: %s\n", expected_time(ways).c_str());
  std::fflush(stdout);
  const auto results = run_ways(ways);
  const auto& rows = results.front();
  Progress progress{0, 0, "runs"};
  for (std::size_t w = 0; w < ways.size(); ++w) {
    progress.planned += planned_runs(ways[w]);
    for (const auto& row : results[w]) progress.done += static_cast<double>(row.runs.size());
  }
  print_interrupted(progress);
  std::fputs(("\n" + render_rows(rows, s.block_bytes)).c_str(), stdout);
  if (const auto shares = render_shares(s, rows, nullptr); !shares.empty()) std::printf("\n%s", shares.c_str());
  std::fflush(stdout);

  JsonWriter j;
  j.begin_object();
  write_json_head(j, s, rt, *place, primes);
  write_weights(j, s);
  j.key("configs").begin_array();
  for (const auto& r : rows) write_row(j, r, s);
  j.end_array();
  report_handover(rows, rt.stats().cores[place->core], j);
  for (std::size_t k = 0, w = 1; k < comparisons.size(); ++k) {
    if (!comparisons[k].unavailable.empty()) write_unavailable(j, comparisons[k].key, comparisons[k].unavailable);
    else comparisons[k].report(rows, results[w++], j);
  }
  write_interrupted(j, progress);
  j.end_object();

  if (!save_json("matrix", s.json_path, j)) return exit_failure;
  return checksums_ok(rows, primes) ? 0 : exit_failure;
}

} // namespace
} // namespace coresched::bench::matrix

namespace coresched::bench {

Command register_matrix(CLI::App& parent) {
  auto s = std::make_shared<matrix::Settings>();
  CLI::App* sub = parent.add_subcommand(
      "matrix", "How fairly and steadily two tenants share one core: a sysbench cpu loop and a sysbench memory loop "
                "on the two siblings of one core, as in the original core-scheduling measurements (two pinned 1-thread "
                "sysbench runs, tagged four ways); cpu events/s, memory MiB/s and forced idle, average and stdev over "
                "the runs, under Alone, nosmt, no tag, cpu tagged, mem tagged and both tagged");
  matrix::add_options(*sub, *s);
  return {sub, [s] { return matrix::run(*s); }};
}

} // namespace coresched::bench
