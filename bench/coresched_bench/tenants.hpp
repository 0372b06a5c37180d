// SPDX-License-Identifier: Apache-2.0
// `coresched-bench tenants`: a compute tenant (GEMM) and a request-serving
// tenant (random reads behind a client each) on the same cores, under two
// cookies. The tenants' work, shared by the fibers (tenants.cpp) and by the
// kernel's side (tenants_kernel.cpp: the same work on plain threads tagged
// with PR_SCHED_CORE cookies).
#pragma once

#include "cli_options.hpp"
#include "common.hpp"
#include "latency_stats.hpp"
#include "tenants_gemm.hpp"

#include <coresched/sync.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace coresched::bench::tenants {

using Clock = std::chrono::steady_clock;

/// The request latency percentiles every table and result file gives.
inline constexpr double percentiles[] = {50, 95, 99, 99.9};

struct Settings {
  unsigned compute_fibers = 0; ///< 0: two per PU (none with requests_alone)
  bool requests_alone = false; ///< tenant B without tenant A: its latency with the cores to itself
  unsigned request_fibers = 0; ///< 0: two per PU
  unsigned preempt_rows = 1; ///< tenant A's preemption points: every this many GEMM rows
  unsigned reads = 16;
  unsigned table_mb = 256;
  unsigned think_us = 0; ///< > 0: each client sleeps this long between requests
  double time_s = 5;
  unsigned runs = 3;
  std::optional<FairnessPolicy> policy;
  std::optional<unsigned> slice_us;
  bool compare = false;
  bool compare_kernel = false; ///< interleave runs of the same tenants as kernel threads with kernel cookies
  std::string topology;
  std::optional<Placement> placement;
  std::string json_path;
  std::optional<TenantWeights> weights; ///< --weights A:B; unset: both Cookie::kDefaultWeight

  std::uint32_t weight(unsigned tenant) const { return weights ? (*weights)[tenant] : Cookie::kDefaultWeight; }
  /// Tenant A's share of the cores where both tenants have work, in %: its
  /// weight over the sum.
  double expected_a_share_pct() const { return 100.0 * weight(0) / (static_cast<double>(weight(0)) + weight(1)); }
};

// ------------------------------------------------------------------ tenant A: compute

/// The GEMM inputs: small integers, so every product and sum is exact in
/// float and the result's checksum is the same on every ISA.
struct GemmInputs {
  PageMatrix a, b;
  double checksum = 0; ///< sum of all elements of a * b
  GemmInputs();
};

struct ComputeResult {
  std::uint64_t gemms = 0;
  std::uint64_t bad = 0; ///< results whose checksum is wrong
};

/// GEMMs until the deadline or an interrupt, a preemption point after every
/// `preempt_rows` rows (nothing on a plain thread).
ComputeResult compute(const GemmInputs& in, Clock::time_point deadline, unsigned preempt_rows);

// ------------------------------------------------------------------ tenant B: requests

/// The table: word i holds i * table_key, so a client can check any reply
/// without reading the table itself.
std::vector<std::uint64_t> make_table(std::size_t mb);

/// A request's link between its client and its server.
struct Link {
  Channel<std::uint64_t> requests{1}; ///< request seeds
  Channel<std::uint64_t> replies{1};  ///< sums of the rows read
};

/// A request server: reads the rows of each request and replies with their
/// sum, until its client closes the link.
void serve(Link& l, const std::vector<std::uint64_t>& table, unsigned reads);

struct ClientResult {
  LatencyRecorder latency;
  std::uint64_t bad = 0; ///< replies with a wrong sum
};

/// A client: one request at a time until the deadline, then closes the link.
/// With a think time it sleeps between requests and times each from when it
/// was due (an open loop).
ClientResult client(Link& l, unsigned reads, std::size_t rows, std::uint64_t first_seed, Clock::time_point deadline,
                    std::chrono::microseconds think);

// ------------------------------------------------------------------ one run

struct Run {
  double elapsed_s = 0;
  std::uint64_t requests = 0, gemms = 0, bad = 0;
  LatencySummary latency;
  double a_cpu_s = 0, b_cpu_s = 0;   ///< CPU time of each tenant
  double a_core_s = 0, b_core_s = 0; ///< time each tenant's cookie held a core (the runtime's core_ns; 0 for the kernel)
  double forced_idle_pct = 0;        ///< % of all PU time spent forced idle

  double requests_per_s() const { return static_cast<double>(requests) / elapsed_s; }
  double gemms_per_s() const { return static_cast<double>(gemms) / elapsed_s; }
};

struct Shared {
  GemmInputs gemm;
  std::vector<std::uint64_t> table;
};

/// Adds the clients' latencies and the compute results to `r`.
void add_results(Run& r, std::vector<ClientResult>& clients, const std::vector<ComputeResult>& computed);

// ------------------------------------------------------------------ the kernel's side (tenants_kernel.cpp)

/// Why the kernel's side cannot run here ("" if it can): no PR_SCHED_CORE
/// (a kernel without CONFIG_SCHED_CORE, no SMT), or a weight whose nice value
/// this process may not take.
std::string kernel_unavailable(const Settings& s);

/// One run of the same tenants as plain threads, as many as the fibers, each
/// free to run on `cpus` (the runtime's), each tenant's threads sharing one
/// kernel core-scheduling cookie and, with --weights, the nice values of the
/// same ratio. Forced idle: the threads' core_forceidle_sum (schedstats).
Run kernel_run(const Settings& s, const Shared& sh, const std::vector<unsigned>& cpus, std::uint64_t first_seed);

} // namespace coresched::bench::tenants
