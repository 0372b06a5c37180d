// SPDX-License-Identifier: Apache-2.0
// `coresched-bench tenants`: two tenants sharing cores under core scheduling.
// Tenant A computes (64x64 float GEMMs, the AVX threads of the original
// comparison); tenant B serves OLTP-like requests (random reads over a large
// table, its mysql), each from a client fiber that measures throughput and
// latency. The two carry different cookies, so a core runs one tenant at a
// time and the fairness policy decides which; --compare runs both policies,
// --compare-kernel the same tenants as kernel threads, run by run.
#include "commands.hpp"
#include "kernel_tag.hpp"
#include "tenants.hpp"

#include <fmt/format.h>

#include <atomic>
#include <memory>

namespace coresched::bench::tenants {

// ------------------------------------------------------------------ tenant A: compute

GemmInputs::GemmInputs() {
  for (std::size_t i = 0; i < gemm_n; ++i)
    for (std::size_t j = 0; j < gemm_n; ++j) {
      a[i * gemm_n + j] = static_cast<float>(static_cast<int>((i + j) % 7) - 3);
      b[i * gemm_n + j] = static_cast<float>(static_cast<int>((i * j) % 5) - 2);
    }
  for (std::size_t i = 0; i < gemm_n; ++i)
    for (std::size_t k = 0; k < gemm_n; ++k)
      for (std::size_t j = 0; j < gemm_n; ++j) checksum += double{a[i * gemm_n + k]} * b[k * gemm_n + j];
}

ComputeResult compute(const GemmInputs& in, Clock::time_point deadline, unsigned preempt_rows) {
  PageMatrix c;
  ComputeResult r;
  do {
    // A preemption point every `preempt_rows` rows: a woken request of the
    // other tenant waits for the next one before the core turns to it (a
    // whole GEMM takes 4-5 ms in the emulated SMT guest). A plain thread's
    // preempt_point() does nothing: the kernel preempts it.
    for (std::size_t row = 0; row < gemm_n; row += preempt_rows) {
      gemm64_rows(in.a.data(), in.b.data(), c.data(), row, std::min(gemm_n, row + preempt_rows));
      this_fiber::preempt_point();
    }
    double sum = 0;
    for (float x : c) sum += x;
    if (sum != in.checksum) ++r.bad;
    ++r.gemms;
  } while (Clock::now() < deadline && !interrupted());
  return r;
}

// ------------------------------------------------------------------ tenant B: requests

namespace {

constexpr std::uint64_t table_key = 0x9E3779B97F4A7C15ull;

/// The rows request `seed` reads: splitmix64 over the seed.
std::uint64_t row(std::uint64_t seed, unsigned i, std::size_t rows) {
  std::uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) % rows;
}

} // namespace

std::vector<std::uint64_t> make_table(std::size_t mb) {
  std::vector<std::uint64_t> t(mb * (1u << 20) / sizeof(std::uint64_t));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = i * table_key;
  return t;
}

void serve(Link& l, const std::vector<std::uint64_t>& table, unsigned reads) {
  while (const auto seed = l.requests.recv()) {
    std::uint64_t sum = 0;
    for (unsigned i = 0; i < reads; ++i) sum += table[row(*seed, i, table.size())];
    l.replies.send(sum);
  }
}

// A closed loop without a think time, like sysbench's OLTP threads. With one,
// each request is timed from when it was due: what a caller outside the
// runtime would see, the wait for the core after the sleep included (timed
// from the fiber's own restart, that wait would not show).
ClientResult client(Link& l, unsigned reads, std::size_t rows, std::uint64_t first_seed, Clock::time_point deadline,
                    std::chrono::microseconds think) {
  ClientResult r;
  for (std::uint64_t seed = first_seed; Clock::now() < deadline && !interrupted(); ++seed) {
    auto t0 = Clock::now();
    if (think.count() > 0) {
      t0 += think;
      this_fiber::sleep_until(t0);
    }
    l.requests.send(seed);
    const auto sum = l.replies.recv();
    r.latency.add(micros(Clock::now() - t0));
    std::uint64_t expected = 0;
    for (unsigned i = 0; i < reads; ++i) expected += row(seed, i, rows) * table_key;
    if (sum != expected) ++r.bad;
  }
  l.requests.close();
  return r;
}

void add_results(Run& r, std::vector<ClientResult>& clients, const std::vector<ComputeResult>& computed) {
  LatencyRecorder latency;
  for (const auto& c : clients) {
    latency.merge(c.latency);
    r.bad += c.bad;
  }
  for (const auto& c : computed) {
    r.gemms += c.gemms;
    r.bad += c.bad;
  }
  r.requests = latency.stats().count();
  r.latency = latency.summarize(percentiles);
}

namespace {

// ------------------------------------------------------------------ command line

void add_options(CLI::App& sub, Settings& s) {
  auto* compute = sub.add_option("--compute-fibers", s.compute_fibers, "Tenant A's GEMM fibers (default: two per PU)")
                      ->check(CLI::Range(1u, 100000u));
  auto* alone = sub.add_flag("--requests-alone", s.requests_alone,
                             "Run tenant B without tenant A: the latency its requests have with the cores to "
                             "themselves, the floor under the table with both")
                    ->excludes(compute);
  sub.add_option("--request-fibers", s.request_fibers,
                 "Tenant B's request fibers, each with its own client fiber (default: two per PU)")
      ->check(CLI::Range(1u, 100000u));
  sub.add_option("--preempt-rows", s.preempt_rows,
                 "Tenant A's fibers call this_fiber::preempt_point() after every this many rows of a 64x64 GEMM")
      ->capture_default_str()->check(CLI::Range(1u, static_cast<unsigned>(gemm_n)));
  sub.add_option("--reads", s.reads, "Random table reads per request")
      ->capture_default_str()->check(CLI::Range(1u, 1000000u));
  sub.add_option("--table-mb", s.table_mb, "Size of tenant B's in-memory table, MiB")
      ->capture_default_str()->check(CLI::Range(1u, 1u << 20));
  sub.add_option("--think-us", s.think_us,
                 "Each client sleeps this long between requests (0: none, a closed loop); latency is then timed "
                 "from when the request was due, so it includes the wait for the core after the sleep")
      ->capture_default_str()->check(CLI::Range(0u, 10000000u));
  sub.add_option("--time", s.time_s, "Seconds per run")->capture_default_str()->check(positive_seconds());
  sub.add_option("--runs", s.runs, "Runs per policy")->capture_default_str()->check(CLI::Range(1u, 100000u));
  auto* policy = add_policy_option(sub, s.policy);
  add_slice_option(sub, s.slice_us);
  sub.add_flag("--compare", s.compare, "Run under core_vruntime, then forceidle_balance, and print the ratios")
      ->excludes(policy);
  add_topology_option(sub, s.topology, true);
  add_placement_option(sub, s.placement);
  add_json_option(sub, s.json_path);
  add_weights_option(sub, s.weights, "A:B (compute:requests)");
  sub.add_flag("--compare-kernel", s.compare_kernel,
               "Also run the same tenants as plain threads (as many as the fibers, on the same CPUs) tagged with one "
               "kernel core-scheduling cookie per tenant (PR_SCHED_CORE) and, with --weights, nice values of the same "
               "ratio, interleaved run by run; skipped where the kernel lacks CONFIG_SCHED_CORE")
      ->excludes("--compare");
  // Options about tenant A, or about the two tenants' split, mean nothing without it.
  alone->excludes("--preempt-rows")->excludes("--weights")->excludes("--compare");
}

// ------------------------------------------------------------------ one run

std::uint64_t forced_idle_ns(const Stats& st) {
  std::uint64_t ns = 0;
  for (const auto& c : st.cores) ns += c.forced_idle_ns;
  return ns;
}

std::vector<JoinHandle<ComputeResult>> spawn_compute(Runtime& rt, const Settings& s, const Shared& sh, Cookie a,
                                                     Clock::time_point deadline) {
  std::vector<JoinHandle<ComputeResult>> fibers;
  for (unsigned i = 0; i < s.compute_fibers; ++i)
    fibers.push_back(rt.spawn([&sh, &s, deadline] { return compute(sh.gemm, deadline, s.preempt_rows); }, {.cookie = a}));
  return fibers;
}

struct RequestTenant {
  std::vector<std::unique_ptr<Link>> links;
  std::vector<JoinHandle<void>> servers;
  std::vector<JoinHandle<ClientResult>> clients;
};

/// Tenant B: request fibers, each with its client. The clients carry B's
/// cookie too: they are the tenant's own front end, and untagged they would
/// conflict with both tenants.
RequestTenant spawn_requests(Runtime& rt, const Settings& s, const Shared& sh, Cookie b, std::uint64_t first_seed,
                             Clock::time_point deadline) {
  RequestTenant t;
  for (unsigned i = 0; i < s.request_fibers; ++i) {
    Link& l = *t.links.emplace_back(std::make_unique<Link>());
    t.servers.push_back(rt.spawn([&l, &sh, &s] { serve(l, sh.table, s.reads); }, {.cookie = b}));
    const std::uint64_t seed = first_seed + (std::uint64_t{i} << 40); // disjoint seeds per client
    t.clients.push_back(rt.spawn([&l, &s, &sh, seed, deadline] {
      return client(l, s.reads, sh.table.size(), seed, deadline, std::chrono::microseconds(s.think_us));
    }, {.cookie = b}));
  }
  return t;
}

/// Joins both tenants; fills the run's counts and latency.
void collect(Run& r, RequestTenant& t, std::vector<JoinHandle<ComputeResult>>& compute_fibers) {
  std::vector<ClientResult> clients;
  for (auto& c : t.clients) clients.push_back(c.join());
  for (auto& h : t.servers) h.join();
  std::vector<ComputeResult> computed;
  for (auto& h : compute_fibers) computed.push_back(h.join());
  add_results(r, clients, computed);
}

Run run_once(Runtime& rt, const Settings& s, const Shared& sh, std::uint64_t first_seed) {
  // Fresh cookies per run, as matrix does: each run starts both tenants new to the cores.
  const Cookie a = Cookie::create("A", s.weight(0)), b = Cookie::create("B", s.weight(1));
  const std::uint64_t idle_before = forced_idle_ns(rt.stats());
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s.time_s));
  auto compute_fibers = spawn_compute(rt, s, sh, a, deadline);
  RequestTenant requests = spawn_requests(rt, s, sh, b, first_seed, deadline);
  Run r;
  collect(r, requests, compute_fibers);
  r.elapsed_s = seconds(Clock::now() - start);
  const Stats st = rt.stats();
  r.a_cpu_s = static_cast<double>(st.cookie(a).cpu_ns) / 1e9;
  r.b_cpu_s = static_cast<double>(st.cookie(b).cpu_ns) / 1e9;
  r.a_core_s = static_cast<double>(st.cookie(a).core_ns) / 1e9;
  r.b_core_s = static_cast<double>(st.cookie(b).core_ns) / 1e9;
  r.forced_idle_pct = 100.0 * static_cast<double>(forced_idle_ns(st) - idle_before) /
                      (r.elapsed_s * 1e9 * static_cast<double>(rt.topology().pus().size()));
  return r;
}

/// The runs of one side: ours under one policy, or the kernel's.
struct Runs {
  std::vector<Run> runs;

  template <class F> Summary over_runs(F f) const {
    std::vector<double> xs;
    for (const auto& r : runs) xs.push_back(f(r));
    return summarize(xs);
  }
  Summary requests_per_s() const { return over_runs([](const Run& r) { return r.requests_per_s(); }); }
  Summary latency_avg() const { return over_runs([](const Run& r) { return r.latency.avg; }); }
  Summary latency_at(double p) const { return over_runs([p](const Run& r) { return r.latency.at(p); }); }
  Summary latency_p95() const { return latency_at(95); }
  Summary gemms_per_s() const { return over_runs([](const Run& r) { return r.gemms_per_s(); }); }
  Summary forced_idle_pct() const { return over_runs([](const Run& r) { return r.forced_idle_pct; }); }
  Summary a_cpu_share_pct() const {
    return over_runs([](const Run& r) { return 100.0 * r.a_cpu_s / std::max(r.a_cpu_s + r.b_cpu_s, 1e-9); });
  }
  Summary a_core_share_pct() const {
    return over_runs([](const Run& r) { return 100.0 * r.a_core_s / std::max(r.a_core_s + r.b_core_s, 1e-9); });
  }
};

struct Result : Runs {
  FairnessPolicy policy;
  std::optional<Runs> kernel; ///< --compare-kernel where the kernel can: its runs, interleaved with ours
};

/// The CPUs the runtime's workers run on: the kernel's threads get the same.
std::vector<unsigned> runtime_cpus(const Runtime& rt) {
  std::vector<unsigned> cpus;
  for (const auto& pu : rt.topology().pus())
    if (std::find(cpus.begin(), cpus.end(), pu.cpu) == cpus.end()) cpus.push_back(pu.cpu);
  return cpus;
}

void report_run(const Run& r) {
  progress_end(fmt::format(" {:.0f} req/s, latency p50 {:.1f} us p99 {:.1f} us, {:.0f} GEMM/s, forced idle {:.1f}%",
                           r.requests_per_s(), r.latency.at(50), r.latency.at(99), r.gemms_per_s(), r.forced_idle_pct));
}

/// The runs, until an interrupt, which cuts the run under way short: that
/// one is left out. With the kernel's side, each of our runs is followed by
/// one of the kernel's, so that both see the same state of the machine.
Result measure(Runtime& rt, const Settings& s, const Shared& sh, bool kernel) {
  Result res;
  res.policy = rt.options().policy;
  if (kernel) res.kernel.emplace();
  const std::string label = fmt::format("tenants/{}", to_string(res.policy));
  const std::vector<unsigned> cpus = runtime_cpus(rt);
  for (unsigned i = 1; i <= s.runs && !interrupted(); ++i) {
    progress_begin(label, fmt::format("run {}/{} ({} s) ...", i, s.runs, s.time_s));
    Run last = run_once(rt, s, sh, std::uint64_t{i} << 56);
    if (interrupted()) {
      progress_end(" interrupted: left out");
      break;
    }
    report_run(res.runs.emplace_back(std::move(last)));
    if (!kernel) continue;
    progress_begin("tenants/kernel", fmt::format("run {}/{} ({} s) ...", i, s.runs, s.time_s));
    last = kernel_run(s, sh, cpus, std::uint64_t{i} << 56);
    if (interrupted()) {
      progress_end(" interrupted: left out");
      break;
    }
    report_run(res.kernel->runs.emplace_back(std::move(last)));
  }
  return res;
}

// ------------------------------------------------------------------ output

void print_tenants_header(const Settings& s, const Runtime& rt, const std::string& kernel_why) {
  const auto& o = rt.options();
  print_header("tenants", rt, {
      {"policy", s.compare ? std::string("core_vruntime, then forceidle_balance (--compare)") : to_string(o.policy)},
      {"wakeup placement", to_string(o.placement)},
      {"slice", fmt::format("{} us", o.slice.count())},
      {"tenant A", s.requests_alone ? std::string("none (--requests-alone)")
                                    : fmt::format("{} compute fibers, {}x{} float GEMMs, a preemption point every {} "
                                                  "rows, own cookie", s.compute_fibers, gemm_n, gemm_n, s.preempt_rows)},
      {"tenant B", fmt::format("{} request fibers + {} client fibers, {} random reads per request over a {} MiB table, "
                               "own cookie{}", s.request_fibers, s.request_fibers, s.reads, s.table_mb,
                               s.think_us ? fmt::format("; clients think {} us between requests (latency from when "
                                                        "each was due)", s.think_us)
                                          : std::string())},
      {"weights", s.requests_alone ? std::string("- (no tenant A to share with)")
                                   : fmt::format("A {} : B {}{} (A's expected share where both have work: {:.1f}%)",
                                                 s.weight(0), s.weight(1), s.weights ? "" : " (default)",
                                                 s.expected_a_share_pct())},
      {"run length", fmt::format("{} s x {} run(s){}", s.time_s, s.runs, s.compare ? " per policy" : "")},
      {"kernel", !s.compare_kernel   ? std::string("not compared (--compare-kernel)")
                 : kernel_why.empty() ? std::string("the same tenants as plain threads with kernel cookies, after each "
                                                    "run of ours (--compare-kernel)")
                                      : "skipped: " + kernel_why},
  });
}

/// The throughput table, then tenant A's share of the cores beside the share
/// its weight asks for: by core_ns (the time A's cookie held a core, over
/// both tenants'; the runtime's books, so ours only) and by cpu_ns (its
/// threads' or fibers' CPU time, over both tenants').
std::string render(const Settings& s, const std::vector<Result>& rs) {
  Table t({"who", "req/s avg", "stdev", "lat p50 us", "lat p99 us", "stdev", "lat p99.9 us", "stdev", "GEMM/s avg",
           "stdev", "forced-idle %"});
  Table shares({"who", "A expected %", "A core_ns %", "stdev", "A cpu_ns %", "stdev"});
  auto add = [&](const std::string& who, const Runs& r, bool books) {
    const Summary rps = r.requests_per_s(), p99 = r.latency_at(99), p999 = r.latency_at(99.9), g = r.gemms_per_s();
    t.add_row({who, fixed(rps.avg, 0), fixed(rps.stdev, 0), fixed(r.latency_at(50).avg, 1), fixed(p99.avg, 1),
               fixed(p99.stdev, 1), fixed(p999.avg, 1), fixed(p999.stdev, 1), fixed(g.avg, 0), fixed(g.stdev, 0),
               fixed(r.forced_idle_pct().avg, 1)});
    const Summary core = r.a_core_share_pct(), cpu = r.a_cpu_share_pct();
    shares.add_row({who, fixed(s.expected_a_share_pct(), 1), books ? fixed(core.avg, 1) : "-",
                    books ? fixed(core.stdev, 1) : "-", fixed(cpu.avg, 1), fixed(cpu.stdev, 1)});
  };
  for (const auto& r : rs) {
    add(to_string(r.policy), r, true);
    if (r.kernel) add("kernel", *r.kernel, false);
  }
  if (s.requests_alone) return "\n" + t.render(); // no tenant A: no shares to give
  return "\n" + t.render() + "\ntenant A's share of the cores (B has the rest):\n" + shares.render();
}

/// One side's figures over another's, averages over runs; no GEMM ratio
/// where the other side ran none (--requests-alone).
struct Ratios {
  double throughput, latency_avg, latency_p95, latency_p99, latency_p999;
  std::optional<double> gemms;
};

Ratios ratios(const Runs& ours, const Runs& theirs) {
  auto ratio = [](const Summary& a, const Summary& b) { return b.avg == 0 ? 0.0 : a.avg / b.avg; };
  return Ratios{ratio(ours.requests_per_s(), theirs.requests_per_s()), ratio(ours.latency_avg(), theirs.latency_avg()),
                ratio(ours.latency_p95(), theirs.latency_p95()), ratio(ours.latency_at(99), theirs.latency_at(99)),
                ratio(ours.latency_at(99.9), theirs.latency_at(99.9)),
                theirs.gemms_per_s().avg == 0 ? std::nullopt
                                              : std::optional(ratio(ours.gemms_per_s(), theirs.gemms_per_s()))};
}

/// core_vruntime over forceidle_balance, as the original comparison has them.
std::optional<Ratios> policy_ratios(const std::vector<Result>& rs) {
  if (rs.size() != 2) return std::nullopt;
  return ratios(rs[0], rs[1]);
}

/// Ours over the kernel's, in the same invocation.
std::optional<Ratios> kernel_ratios(const std::vector<Result>& rs) {
  if (rs.size() != 1 || !rs[0].kernel || rs[0].kernel->runs.empty() || rs[0].runs.empty()) return std::nullopt;
  return ratios(rs[0], *rs[0].kernel);
}

void write_ratios(JsonWriter& j, std::string_view key, const std::optional<Ratios>& q) {
  if (!q) {
    j.key(key).null();
    return;
  }
  j.key(key).begin_object().field("requests_per_s", q->throughput).field("latency_avg", q->latency_avg);
  j.field("latency_p95", q->latency_p95).field("latency_p99", q->latency_p99).field("latency_p999", q->latency_p999);
  if (q->gemms)
    j.field("gemms_per_s", *q->gemms);
  else
    j.key("gemms_per_s").null();
  j.end_object();
}

void write_settings(JsonWriter& j, const Settings& s) {
  j.field("compute_fibers", s.compute_fibers).field("requests_alone", s.requests_alone);
  j.field("request_fibers", s.request_fibers);
  j.field("client_fibers", s.request_fibers).field("reads_per_request", s.reads).field("table_mb", s.table_mb);
  j.field("think_us", s.think_us);
  j.field("gemm_n", static_cast<unsigned>(gemm_n)).field("preempt_rows", s.preempt_rows);
  j.field("time_s", s.time_s).field("runs", s.runs);
  j.field("compare", s.compare).field("compare_kernel", s.compare_kernel);
  j.key("weights").begin_object().field("set", s.weights.has_value()).field("a", s.weight(0)).field("b", s.weight(1));
  j.field("expected_a_share_pct", s.expected_a_share_pct()).end_object();
  j.key("units").begin_object();
  j.field("requests_per_s", "requests/s").field("latency", "us").field("gemms_per_s", "GEMMs/s");
  j.field("a_cpu_share_pct", "% of both tenants' CPU time");
  j.field("a_core_share_pct", "% of the time either tenant's cookie held a core").field("forced_idle_pct", "% of all PU time");
  j.end_object();
}

void write_run(JsonWriter& j, const Run& r) {
  j.begin_object().field("elapsed_s", r.elapsed_s).field("requests", r.requests).field("gemms", r.gemms);
  j.field("requests_per_s", r.requests_per_s()).field("gemms_per_s", r.gemms_per_s());
  write_latency(j, "latency", r.latency, "us");
  j.field("a_cpu_s", r.a_cpu_s).field("b_cpu_s", r.b_cpu_s).field("a_core_s", r.a_core_s).field("b_core_s", r.b_core_s);
  j.field("forced_idle_pct", r.forced_idle_pct).field("bad_results", r.bad).end_object();
}

/// One side's summaries over runs, then its runs (inside an open object).
void write_runs(JsonWriter& j, const Runs& r) {
  j.summary("requests_per_s", r.requests_per_s(), "requests/s");
  j.summary("latency_avg", r.latency_avg(), "us").summary("latency_p50", r.latency_at(50), "us");
  j.summary("latency_p95", r.latency_p95(), "us").summary("latency_p99", r.latency_at(99), "us");
  j.summary("latency_p999", r.latency_at(99.9), "us").summary("gemms_per_s", r.gemms_per_s(), "GEMMs/s");
  j.summary("a_cpu_share_pct", r.a_cpu_share_pct(), "%").summary("a_core_share_pct", r.a_core_share_pct(), "%");
  j.summary("forced_idle_pct", r.forced_idle_pct(), "%");
  j.key("runs").begin_array();
  for (const auto& run : r.runs) write_run(j, run);
  j.end_array();
}

void write_results(JsonWriter& j, const Settings& s, const std::vector<Result>& rs, const std::string& kernel_why) {
  j.key("policies").begin_array();
  for (const auto& r : rs) {
    j.begin_object().field("policy", to_string(r.policy));
    write_runs(j, r);
    j.end_object();
  }
  j.end_array();
  write_ratios(j, "core_vruntime_over_forceidle_balance", policy_ratios(rs));
  if (!s.compare_kernel) {
    j.key("kernel").null();
  } else if (!kernel_why.empty()) {
    j.key("kernel").begin_object().field("available", false).field("reason", kernel_why).end_object();
  } else {
    const auto nices = kernel_nices_for_weights(s.weight(0), s.weight(1));
    j.key("kernel").begin_object().field("available", true);
    j.key("nice").begin_object().field("a", nices[0]).field("b", nices[1]).end_object();
    if (!rs.empty() && rs[0].kernel) write_runs(j, *rs[0].kernel);
    j.end_object();
  }
  write_ratios(j, "coresched_over_kernel", kernel_ratios(rs));
}

/// A wrong GEMM or reply is corrupted state, not a slow run.
bool results_ok(const std::vector<Result>& rs) {
  std::uint64_t bad = 0;
  for (const auto& r : rs) {
    for (const auto& run : r.runs) bad += run.bad;
    if (r.kernel)
      for (const auto& run : r.kernel->runs) bad += run.bad;
  }
  if (bad) std::fprintf(stderr, "coresched-bench tenants: %llu wrong GEMM result(s) or reply(ies)\n",
                        static_cast<unsigned long long>(bad));
  return bad == 0;
}

void print_ratios(const std::vector<Result>& rs) {
  auto gemms = [](const Ratios& q) { return q.gemms ? fmt::format("; GEMM/s {:.3f}", *q.gemms) : std::string(); };
  if (const auto q = policy_ratios(rs))
    std::printf("\ncore_vruntime / forceidle_balance: req/s %.3f, latency avg %.3f, p95 %.3f%s\n", q->throughput,
                q->latency_avg, q->latency_p95, gemms(*q).c_str());
  if (const auto q = kernel_ratios(rs))
    std::printf("\ncoresched / kernel, same invocation: request latency p99 %.3f, p99.9 %.3f, avg %.3f; req/s %.3f%s\n",
                q->latency_p99, q->latency_p999, q->latency_avg, q->throughput, gemms(*q).c_str());
}

int run(Settings s) {
  const Options base = runtime_options(smt_topology("tenants", s.topology), s.policy, s.placement, s.slice_us);
  const std::string kernel_why = s.compare_kernel ? kernel_unavailable(s) : std::string();
  const bool kernel = s.compare_kernel && kernel_why.empty();
  progress_line("tenants", fmt::format("filling a {} MiB table ...", s.table_mb));
  const Shared shared{GemmInputs(), make_table(s.table_mb)};
  const auto runtimes =
      variants(base, s.compare, &Options::policy, {FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance});
  return run_variants<Result>(
      "tenants", s.json_path, runtimes,
      [&](const Runtime& rt) {
        const auto pus = static_cast<unsigned>(rt.topology().pus().size());
        if (!s.compute_fibers && !s.requests_alone) s.compute_fibers = 2 * pus;
        if (!s.request_fibers) s.request_fibers = 2 * pus;
        print_tenants_header(s, rt, kernel_why);
        if (kernel && !rt.topology().real_siblings())
          std::printf("note: the PUs are synthetic: kernel cookies will not keep the tenants' threads apart\n");
      },
      [&](Runtime& rt) { return measure(rt, s, shared, kernel); },
      [&](JsonWriter& j, const std::vector<Result>& rs) {
        Progress progress{0, static_cast<double>(s.runs * runtimes.size() * (kernel ? 2 : 1)), "runs"};
        for (const auto& r : rs)
          progress.done += static_cast<double>(r.runs.size() + (r.kernel ? r.kernel->runs.size() : 0));
        print_interrupted(progress);
        std::fputs(render(s, rs).c_str(), stdout);
        print_ratios(rs);
        std::fflush(stdout);
        write_settings(j, s);
        write_results(j, s, rs, kernel_why);
        write_interrupted(j, progress);
        return results_ok(rs);
      });
}

} // namespace
} // namespace coresched::bench::tenants

namespace coresched::bench {

Command register_tenants(CLI::App& parent) {
  return make_command<tenants::Settings>(
      parent, "tenants",
      "How fairly a core is shared between a compute tenant and a request-serving tenant, as in the original "
      "core-scheduling fairness comparison (AVX threads against mysql threads, core-wide vruntime against forced-idle "
      "balancing): GEMM fibers and random-read request fibers under different cookies; requests/s, latency, GEMM rate "
      "and forced idle under each fairness policy (--compare runs both)",
      tenants::add_options, tenants::run);
}

} // namespace coresched::bench
