// SPDX-License-Identifier: Apache-2.0
// `coresched-bench tenants`: seed 002's two tenants sharing cores under core
// scheduling. Tenant A computes (64x64 float GEMMs, the seed's AVX threads);
// tenant B serves OLTP-like requests (random reads over a large table, the
// seed's mysql), each from a client fiber that measures throughput and latency.
// The two carry different cookies, so a core runs one tenant at a time and the
// fairness policy decides which; --compare runs both policies.
#include "cli_options.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "tenants_gemm.hpp"

#include <coresched/sync.hpp>
#include <fmt/format.h>

#include <atomic>
#include <memory>

namespace coresched::bench::tenants {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double percentiles[] = {50, 95, 99};

struct Settings {
  unsigned compute_fibers = 0; ///< 0: two per PU
  unsigned request_fibers = 0; ///< 0: two per PU
  unsigned reads = 16;
  unsigned table_mb = 256;
  unsigned think_us = 0; ///< > 0: each client sleeps this long between requests
  double time_s = 5;
  unsigned runs = 3;
  std::optional<FairnessPolicy> policy;
  std::optional<unsigned> slice_us;
  bool compare = false;
  std::string topology;
  std::optional<Placement> placement;
  std::string json_path;
  std::optional<TenantWeights> weights; ///< --weights A:B; unset: both Cookie::kDefaultWeight

  std::uint32_t weight(unsigned tenant) const { return weights ? (*weights)[tenant] : Cookie::kDefaultWeight; }
  /// Tenant A's share of the cores where both tenants have work, in %: its
  /// weight over the sum.
  double expected_a_share_pct() const { return 100.0 * weight(0) / (static_cast<double>(weight(0)) + weight(1)); }
};

// ------------------------------------------------------------------ command line

void add_options(CLI::App& sub, Settings& s) {
  sub.add_option("--compute-fibers", s.compute_fibers, "Tenant A's GEMM fibers (default: two per PU)")
      ->check(CLI::Range(1u, 100000u));
  sub.add_option("--request-fibers", s.request_fibers,
                 "Tenant B's request fibers, each with its own client fiber (default: two per PU)")
      ->check(CLI::Range(1u, 100000u));
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
}

// ------------------------------------------------------------------ tenant A: compute

/// The GEMM inputs: small integers, so every product and sum is exact in
/// float and the result's checksum is the same on every ISA.
struct GemmInputs {
  PageMatrix a, b;
  double checksum = 0; ///< sum of all elements of a * b
  GemmInputs() {
    for (std::size_t i = 0; i < gemm_n; ++i)
      for (std::size_t j = 0; j < gemm_n; ++j) {
        a[i * gemm_n + j] = static_cast<float>(static_cast<int>((i + j) % 7) - 3);
        b[i * gemm_n + j] = static_cast<float>(static_cast<int>((i * j) % 5) - 2);
      }
    for (std::size_t i = 0; i < gemm_n; ++i)
      for (std::size_t k = 0; k < gemm_n; ++k)
        for (std::size_t j = 0; j < gemm_n; ++j) checksum += double{a[i * gemm_n + k]} * b[k * gemm_n + j];
  }
};

struct ComputeResult {
  std::uint64_t gemms = 0;
  std::uint64_t bad = 0; ///< results whose checksum is wrong
};

ComputeResult compute(const GemmInputs& in, Clock::time_point deadline) {
  PageMatrix c;
  ComputeResult r;
  do {
    gemm64(in.a.data(), in.b.data(), c.data());
    double sum = 0;
    for (float x : c) sum += x;
    if (sum != in.checksum) ++r.bad;
    ++r.gemms;
    this_fiber::preempt_point();
  } while (Clock::now() < deadline && !interrupted());
  return r;
}

// ------------------------------------------------------------------ tenant B: requests

/// The table: word i holds i * key, so a client can check any reply without
/// reading the table itself.
constexpr std::uint64_t table_key = 0x9E3779B97F4A7C15ull;

std::vector<std::uint64_t> make_table(std::size_t mb) {
  std::vector<std::uint64_t> t(mb * (1u << 20) / sizeof(std::uint64_t));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = i * table_key;
  return t;
}

/// The rows request `seed` reads: splitmix64 over the seed.
std::uint64_t row(std::uint64_t seed, unsigned i, std::size_t rows) {
  std::uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) % rows;
}

struct Link {
  Channel<std::uint64_t> requests{1}; ///< request seeds
  Channel<std::uint64_t> replies{1};  ///< sums of the rows read
};

/// A request fiber: reads the rows of each request and replies with their sum.
void serve(Link& l, const std::vector<std::uint64_t>& table, unsigned reads) {
  while (const auto seed = l.requests.recv()) {
    std::uint64_t sum = 0;
    for (unsigned i = 0; i < reads; ++i) sum += table[row(*seed, i, table.size())];
    l.replies.send(sum);
  }
}

struct ClientResult {
  LatencyRecorder latency;
  std::uint64_t bad = 0; ///< replies with a wrong sum
};

/// A client: one request at a time until the deadline (a closed loop, like
/// sysbench's OLTP threads), then closes the link, which ends its server.
/// With a think time it sleeps between requests, so tenant B sleeps too, and
/// each request is timed from when it was due: what a caller outside the
/// runtime would see, the wait for the core after the sleep included (timed
/// from the fiber's own restart, that wait would not show).
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

// ------------------------------------------------------------------ one run

struct Run {
  double elapsed_s = 0;
  std::uint64_t requests = 0, gemms = 0, bad = 0;
  LatencySummary latency;
  double a_cpu_s = 0, b_cpu_s = 0; ///< CPU time of each tenant
  double a_core_s = 0, b_core_s = 0; ///< time each tenant's cookie held a core (the runtime's core_ns)
  double forced_idle_pct = 0;      ///< % of all PU time spent forced idle

  double requests_per_s() const { return static_cast<double>(requests) / elapsed_s; }
  double gemms_per_s() const { return static_cast<double>(gemms) / elapsed_s; }
};

struct Shared {
  GemmInputs gemm;
  std::vector<std::uint64_t> table;
};

std::uint64_t forced_idle_ns(const Stats& st) {
  std::uint64_t ns = 0;
  for (const auto& c : st.cores) ns += c.forced_idle_ns;
  return ns;
}

std::vector<JoinHandle<ComputeResult>> spawn_compute(Runtime& rt, const Settings& s, const Shared& sh, Cookie a,
                                                     Clock::time_point deadline) {
  std::vector<JoinHandle<ComputeResult>> fibers;
  for (unsigned i = 0; i < s.compute_fibers; ++i)
    fibers.push_back(rt.spawn([&sh, deadline] { return compute(sh.gemm, deadline); }, {.cookie = a}));
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
  LatencyRecorder latency;
  for (auto& c : t.clients) {
    const ClientResult cr = c.join();
    latency.merge(cr.latency);
    r.bad += cr.bad;
  }
  for (auto& h : t.servers) h.join();
  for (auto& h : compute_fibers) {
    const ComputeResult cr = h.join();
    r.gemms += cr.gemms;
    r.bad += cr.bad;
  }
  r.requests = latency.stats().count();
  r.latency = latency.summarize(percentiles);
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

struct Result {
  FairnessPolicy policy;
  std::vector<Run> runs;

  template <class F> Summary over_runs(F f) const {
    std::vector<double> xs;
    for (const auto& r : runs) xs.push_back(f(r));
    return summarize(xs);
  }
  Summary requests_per_s() const { return over_runs([](const Run& r) { return r.requests_per_s(); }); }
  Summary latency_avg() const { return over_runs([](const Run& r) { return r.latency.avg; }); }
  Summary latency_p95() const { return over_runs([](const Run& r) { return r.latency.at(95); }); }
  Summary gemms_per_s() const { return over_runs([](const Run& r) { return r.gemms_per_s(); }); }
  Summary forced_idle_pct() const { return over_runs([](const Run& r) { return r.forced_idle_pct; }); }
  Summary a_cpu_share_pct() const {
    return over_runs([](const Run& r) { return 100.0 * r.a_cpu_s / std::max(r.a_cpu_s + r.b_cpu_s, 1e-9); });
  }
  Summary a_core_share_pct() const {
    return over_runs([](const Run& r) { return 100.0 * r.a_core_s / std::max(r.a_core_s + r.b_core_s, 1e-9); });
  }
};

/// The runs, until an interrupt, which cuts the run under way short: that
/// one is left out.
Result measure(Runtime& rt, const Settings& s, const Shared& sh) {
  Result res{rt.options().policy, {}};
  const std::string label = fmt::format("tenants/{}", to_string(res.policy));
  for (unsigned i = 1; i <= s.runs && !interrupted(); ++i) {
    progress_begin(label, fmt::format("run {}/{} ({} s) ...", i, s.runs, s.time_s));
    Run last = run_once(rt, s, sh, std::uint64_t{i} << 56);
    if (interrupted()) {
      progress_end(" interrupted: left out");
      break;
    }
    const Run& r = res.runs.emplace_back(std::move(last));
    progress_end(fmt::format(" {:.0f} req/s, latency avg {:.1f} us p95 {:.1f} us, {:.0f} GEMM/s, forced idle {:.1f}%",
                             r.requests_per_s(), r.latency.avg, r.latency.at(95), r.gemms_per_s(), r.forced_idle_pct));
  }
  return res;
}

// ------------------------------------------------------------------ output

void print_tenants_header(const Settings& s, const Runtime& rt) {
  const auto& o = rt.options();
  print_header("tenants", rt, {
      {"policy", s.compare ? std::string("core_vruntime, then forceidle_balance (--compare)") : to_string(o.policy)},
      {"wakeup placement", to_string(o.placement)},
      {"slice", fmt::format("{} us", o.slice.count())},
      {"tenant A", fmt::format("{} compute fibers, {}x{} float GEMMs, own cookie", s.compute_fibers, gemm_n, gemm_n)},
      {"tenant B", fmt::format("{} request fibers + {} client fibers, {} random reads per request over a {} MiB table, "
                               "own cookie{}", s.request_fibers, s.request_fibers, s.reads, s.table_mb,
                               s.think_us ? fmt::format("; clients think {} us between requests (latency from when "
                                                        "each was due)", s.think_us)
                                          : std::string())},
      {"weights", fmt::format("A {} : B {}{} (A's expected share where both have work: {:.1f}%)", s.weight(0),
                              s.weight(1), s.weights ? "" : " (default)", s.expected_a_share_pct())},
      {"run length", fmt::format("{} s x {} run(s){}", s.time_s, s.runs, s.compare ? " per policy" : "")},
  });
}

/// The throughput table, then tenant A's share of the cores beside the share
/// its weight asks for: by core_ns (the time A's cookie held a core, over
/// both tenants') and by cpu_ns (its fibers' CPU time, over both tenants').
std::string render(const Settings& s, const std::vector<Result>& rs) {
  Table t({"policy", "req/s avg", "stdev", "lat avg us", "stdev", "lat p95 us", "stdev", "GEMM/s avg", "stdev",
           "forced-idle %"});
  Table shares({"policy", "A expected %", "A core_ns %", "stdev", "A cpu_ns %", "stdev"});
  for (const auto& r : rs) {
    const Summary rps = r.requests_per_s(), avg = r.latency_avg(), p95 = r.latency_p95(), g = r.gemms_per_s();
    t.add_row({to_string(r.policy), fixed(rps.avg, 0), fixed(rps.stdev, 0), fixed(avg.avg, 1), fixed(avg.stdev, 1),
               fixed(p95.avg, 1), fixed(p95.stdev, 1), fixed(g.avg, 0), fixed(g.stdev, 0),
               fixed(r.forced_idle_pct().avg, 1)});
    const Summary core = r.a_core_share_pct(), cpu = r.a_cpu_share_pct();
    shares.add_row({to_string(r.policy), fixed(s.expected_a_share_pct(), 1), fixed(core.avg, 1), fixed(core.stdev, 1),
                    fixed(cpu.avg, 1), fixed(cpu.stdev, 1)});
  }
  return "\n" + t.render() + "\ntenant A's share of the cores (B has the rest):\n" + shares.render();
}

/// core_vruntime over forceidle_balance, as the seed compares them.
struct Ratios {
  double throughput, latency_avg, latency_p95, gemms;
};

std::optional<Ratios> ratios(const std::vector<Result>& rs) {
  if (rs.size() != 2) return std::nullopt;
  auto ratio = [&](Summary (Result::*f)() const) {
    const double theirs = (rs[1].*f)().avg;
    return theirs == 0 ? 0.0 : (rs[0].*f)().avg / theirs;
  };
  return Ratios{ratio(&Result::requests_per_s), ratio(&Result::latency_avg), ratio(&Result::latency_p95),
                ratio(&Result::gemms_per_s)};
}

void write_settings(JsonWriter& j, const Settings& s) {
  j.field("compute_fibers", s.compute_fibers).field("request_fibers", s.request_fibers);
  j.field("client_fibers", s.request_fibers).field("reads_per_request", s.reads).field("table_mb", s.table_mb);
  j.field("think_us", s.think_us);
  j.field("gemm_n", static_cast<unsigned>(gemm_n)).field("time_s", s.time_s).field("runs", s.runs);
  j.field("compare", s.compare);
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
  j.field("a_cpu_s", r.a_cpu_s).field("b_cpu_s", r.b_cpu_s).field("a_core_s", r.a_core_s).field("b_core_s", r.b_core_s).field("forced_idle_pct", r.forced_idle_pct);
  j.field("bad_results", r.bad).end_object();
}

void write_results(JsonWriter& j, const std::vector<Result>& rs) {
  j.key("policies").begin_array();
  for (const auto& r : rs) {
    j.begin_object().field("policy", to_string(r.policy));
    j.summary("requests_per_s", r.requests_per_s(), "requests/s");
    j.summary("latency_avg", r.latency_avg(), "us").summary("latency_p95", r.latency_p95(), "us");
    j.summary("gemms_per_s", r.gemms_per_s(), "GEMMs/s");
    j.summary("a_cpu_share_pct", r.a_cpu_share_pct(), "%").summary("a_core_share_pct", r.a_core_share_pct(), "%").summary("forced_idle_pct", r.forced_idle_pct(), "%");
    j.key("runs").begin_array();
    for (const auto& run : r.runs) write_run(j, run);
    j.end_array().end_object();
  }
  j.end_array();
  if (const auto q = ratios(rs)) {
    j.key("core_vruntime_over_forceidle_balance").begin_object().field("requests_per_s", q->throughput);
    j.field("latency_avg", q->latency_avg).field("latency_p95", q->latency_p95).field("gemms_per_s", q->gemms);
    j.end_object();
  } else {
    j.key("core_vruntime_over_forceidle_balance").null();
  }
}

/// A wrong GEMM or reply is corrupted fiber state, not a slow run.
bool results_ok(const std::vector<Result>& rs) {
  std::uint64_t bad = 0;
  for (const auto& r : rs)
    for (const auto& run : r.runs) bad += run.bad;
  if (bad) std::fprintf(stderr, "coresched-bench tenants: %llu wrong GEMM result(s) or reply(ies)\n",
                        static_cast<unsigned long long>(bad));
  return bad == 0;
}

int run(Settings s) {
  const Options base = runtime_options(smt_topology("tenants", s.topology), s.policy, s.placement, s.slice_us);
  progress_line("tenants", fmt::format("filling a {} MiB table ...", s.table_mb));
  const Shared shared{GemmInputs(), make_table(s.table_mb)};
  const auto runtimes =
      variants(base, s.compare, &Options::policy, {FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance});
  return run_variants<Result>(
      "tenants", s.json_path, runtimes,
      [&](const Runtime& rt) {
        const auto pus = static_cast<unsigned>(rt.topology().pus().size());
        if (!s.compute_fibers) s.compute_fibers = 2 * pus;
        if (!s.request_fibers) s.request_fibers = 2 * pus;
        print_tenants_header(s, rt);
      },
      [&](Runtime& rt) { return measure(rt, s, shared); },
      [&](JsonWriter& j, const std::vector<Result>& rs) {
        Progress progress{0, static_cast<double>(s.runs * runtimes.size()), "runs"};
        for (const auto& r : rs) progress.done += static_cast<double>(r.runs.size());
        print_interrupted(progress);
        std::fputs(render(s, rs).c_str(), stdout);
        if (const auto q = ratios(rs))
          std::printf("\ncore_vruntime / forceidle_balance: req/s %.3f, latency avg %.3f, p95 %.3f, GEMM/s %.3f\n",
                      q->throughput, q->latency_avg, q->latency_p95, q->gemms);
        std::fflush(stdout);
        write_settings(j, s);
        write_results(j, rs);
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
