// SPDX-License-Identifier: Apache-2.0
// `tenants --compare-kernel`: the same two tenants as plain threads under the
// kernel's core scheduling. One thread per fiber of ours (compute threads;
// a server and a client thread per request link), every one free to run on
// the runtime's CPUs, each tenant's threads sharing one PR_SCHED_CORE cookie
// (the first creates it, the others copy it), and with --weights the nice
// values whose kernel weights stand in the same ratio. The work is the same
// code (tenants.cpp): on a plain thread a preemption point does nothing, a
// fiber sleep sleeps the thread and a channel wakes a thread by futex.
#include "kernel_tag.hpp"
#include "tenants.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <latch>
#include <memory>
#include <mutex>
#include <sched.h>
#include <stdexcept>
#include <thread>

namespace coresched::bench::tenants {
namespace {

/// Restricts the calling thread to `cpus`; "" or why not.
std::string allow_cpus(const std::vector<unsigned>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (unsigned c : cpus) CPU_SET(c, &set);
  if (::sched_setaffinity(0, sizeof set, &set) == 0) return {};
  return fmt::format("sched_setaffinity failed: {}", std::strerror(errno));
}

double thread_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

/// One tenant's threads: the first creates the cookie, the others take it
/// from the first once it has (`tagged`).
struct TenantTag {
  std::atomic<pid_t> leader{0};
  std::latch tagged{1};
  int nice = 0;
};

/// What every thread does before its work: its CPUs, its tenant's cookie,
/// its tenant's nice value. The first error wins.
class Preparation {
public:
  Preparation(const std::vector<unsigned>& cpus, std::size_t threads)
      : cpus_(cpus), ready_(static_cast<std::ptrdiff_t>(threads)) {}

  /// Call first thing on each thread; then every thread starts together.
  void prepare(TenantTag& t, bool leader) {
    std::string err = allow_cpus(cpus_);
    if (leader) {
      if (err.empty()) err = kernel_tag(KernelTagScope::thread);
      t.leader = static_cast<pid_t>(::syscall(SYS_gettid));
      t.tagged.count_down();
    } else {
      t.tagged.wait();
      if (err.empty()) err = kernel_tag_from(t.leader.load());
    }
    if (err.empty() && t.nice != 0) err = set_own_nice(t.nice);
    if (!err.empty()) {
      const std::lock_guard lock(mu_);
      if (error_.empty()) error_ = err;
    }
    ready_.arrive_and_wait();
  }
  /// The thread that starts them: arrives without taking a cookie or CPUs.
  void start() { ready_.arrive_and_wait(); }
  std::string error() const { return error_; }

private:
  const std::vector<unsigned>& cpus_;
  std::latch ready_;
  std::mutex mu_;
  std::string error_;
};

/// Per thread: its CPU time and forced idle over its work.
struct Usage {
  double cpu_s = 0;
  std::optional<double> forceidle_ms;
};

template <class F> auto measured(Usage& u, F work) {
  const double cpu0 = thread_cpu_s();
  const auto idle0 = own_forceidle_ms();
  auto result = work();
  u.cpu_s = thread_cpu_s() - cpu0;
  if (const auto idle1 = own_forceidle_ms(); idle0 && idle1) u.forceidle_ms = *idle1 - *idle0;
  return result;
}

} // namespace

std::string kernel_unavailable(const Settings& s) {
  std::string why;
  std::thread([&why] { why = kernel_tag(KernelTagScope::thread); }).join(); // a throwaway thread: nothing we keep is tagged
  for (const int nice : kernel_nices_for_weights(s.weight(0), s.weight(1)))
    if (why.empty() && nice != 0) std::thread([&why, nice] { why = set_own_nice(nice); }).join();
  return why;
}

Run kernel_run(const Settings& s, const Shared& sh, const std::vector<unsigned>& cpus, std::uint64_t first_seed) {
  const auto nices = kernel_nices_for_weights(s.weight(0), s.weight(1));
  TenantTag a, b;
  a.nice = nices[0];
  b.nice = nices[1];
  const std::size_t n_threads = s.compute_fibers + 2 * std::size_t{s.request_fibers};
  Preparation prep(cpus, n_threads + 1); // + this thread, which starts the clock
  std::vector<ComputeResult> computed(s.compute_fibers);
  std::vector<ClientResult> clients(s.request_fibers);
  std::vector<std::unique_ptr<Link>> links;
  for (unsigned i = 0; i < s.request_fibers; ++i) links.push_back(std::make_unique<Link>());
  std::vector<Usage> usage_a(s.compute_fibers), usage_b(2 * std::size_t{s.request_fibers});
  Clock::time_point deadline{};
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < s.compute_fibers; ++i)
    threads.emplace_back([&, i] {
      prep.prepare(a, i == 0);
      computed[i] = measured(usage_a[i], [&] { return compute(sh.gemm, deadline, s.preempt_rows); });
    });
  for (unsigned i = 0; i < s.request_fibers; ++i) {
    threads.emplace_back([&, i] {
      prep.prepare(b, i == 0);
      measured(usage_b[2 * i], [&] {
        serve(*links[i], sh.table, s.reads);
        return 0;
      });
    });
    threads.emplace_back([&, i] {
      prep.prepare(b, false);
      const std::uint64_t seed = first_seed + (std::uint64_t{i} << 40);
      clients[i] = measured(usage_b[2 * i + 1], [&] {
        return client(*links[i], s.reads, sh.table.size(), seed, deadline, std::chrono::microseconds(s.think_us));
      });
    });
  }
  // Every thread is tagged and waits at the latch; the deadline is set before
  // it opens (the latch orders the write before their reads).
  const auto start = Clock::now();
  deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s.time_s));
  prep.start();
  for (auto& t : threads) t.join();
  if (const std::string err = prep.error(); !err.empty()) throw std::runtime_error(err);
  Run r;
  r.elapsed_s = seconds(Clock::now() - start);
  add_results(r, clients, computed);
  double idle_ms = 0;
  bool idle_seen = false;
  for (const auto& u : usage_a) {
    r.a_cpu_s += u.cpu_s;
    idle_ms += u.forceidle_ms.value_or(0);
    idle_seen |= u.forceidle_ms.has_value();
  }
  for (const auto& u : usage_b) {
    r.b_cpu_s += u.cpu_s;
    idle_ms += u.forceidle_ms.value_or(0);
    idle_seen |= u.forceidle_ms.has_value();
  }
  // core_forceidle_sum is the time a thread ran while a sibling of its core
  // was forced idle: over all threads, the forced-idle PU time.
  r.forced_idle_pct = idle_seen ? 100.0 * idle_ms / 1e3 / (r.elapsed_s * static_cast<double>(cpus.size())) : 0;
  return r;
}

} // namespace coresched::bench::tenants
