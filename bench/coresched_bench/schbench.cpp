// SPDX-License-Identifier: Apache-2.0
// `coresched-bench schbench`: seed 001's wakeup-latency benchmark on fibers.
// Message fibers sleep, then wake their workers; each worker records the delay
// from the wake-up stamp to running, burns CPU, and waits again. Run under both
// wakeup placements (--compare), it shows what the idle mask buys at the tail.
#include "cli_options.hpp"
#include "commands.hpp"
#include "common.hpp"

#include <coresched/sync.hpp>
#include <fmt/format.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <random>

namespace coresched::bench::schbench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double percentiles[] = {50, 75, 90, 95, 99, 99.5, 99.9}; // schbench's

struct Settings {
  unsigned message_fibers = 2;
  unsigned workers = 16;
  double runtime_s = 30;
  std::uint64_t sleeptime_us = 30000;
  std::uint64_t cputime_us = 30000;
  std::optional<Placement> placement;
  bool compare = false;
  std::string topology;
  std::optional<FairnessPolicy> policy;
  std::optional<unsigned> slice_us;
  std::string json_path;
};

// ------------------------------------------------------------------ command line

void add_options(CLI::App& sub, Settings& s) {
  sub.add_option("-m,--message-fibers", s.message_fibers, "Message fibers, each waking its own workers")
      ->capture_default_str()->check(CLI::Range(1u, 10000u));
  sub.add_option("-t,--workers", s.workers, "Worker fibers per message fiber")
      ->capture_default_str()->check(CLI::Range(1u, 100000u));
  sub.add_option("--runtime", s.runtime_s, "Seconds to run")->capture_default_str()->check(positive_seconds());
  sub.add_option("--sleeptime", s.sleeptime_us, "Microseconds a message fiber sleeps between wake-ups (plus up to "
                                                "25% random jitter)")
      ->capture_default_str()->check(CLI::Range(std::uint64_t{1}, std::uint64_t{3600} * 1000000));
  sub.add_option("--cputime", s.cputime_us, "Microseconds of CPU a worker burns after each wake-up")
      ->capture_default_str()->check(CLI::Range(std::uint64_t{0}, std::uint64_t{3600} * 1000000));
  auto* placement = add_placement_option(sub, s.placement);
  sub.add_flag("--compare", s.compare, "Run with mask, then with scan placement, and print the p99 ratio mask/scan")
      ->excludes(placement);
  add_topology_option(sub, s.topology, false);
  add_policy_option(sub, s.policy);
  add_slice_option(sub, s.slice_us);
  add_json_option(sub, s.json_path);
}

// ------------------------------------------------------------------ fibers

/// One message fiber's side of the rendezvous: the workers waiting for its
/// next wake-up, and one inbox per worker for the wake-up stamp.
struct Group {
  Mutex m;
  std::vector<unsigned> waiting; ///< guarded by m
  bool closed = false;           ///< guarded by m: the run is over
  std::vector<std::unique_ptr<Channel<Clock::time_point>>> inbox;
};

/// Busy for `us` microseconds of wall time, as schbench's worker is, with
/// preemption points so other fibers get the worker when the slice ends.
std::uint64_t burn_for(std::uint64_t us) {
  const auto end = Clock::now() + std::chrono::microseconds(us);
  std::uint64_t x = 1;
  do {
    for (int i = 0; i < 256; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
    this_fiber::preempt_point();
  } while (Clock::now() < end);
  return x;
}

/// A worker: burn, register as waiting, sleep until woken, record the delay.
/// Only a worker that really waits is woken (as schbench's futex list), so a
/// worker still burning when the message fiber fires is not counted late.
LatencyRecorder worker(Group& g, unsigned me, std::uint64_t cputime_us, std::atomic<std::uint64_t>& wakeups,
                       std::atomic<std::uint64_t>& sink) {
  LatencyRecorder r;
  for (;;) {
    sink.fetch_add(burn_for(cputime_us), std::memory_order_relaxed);
    {
      std::lock_guard lk(g.m);
      if (g.closed) break;
      g.waiting.push_back(me);
    }
    const auto stamp = g.inbox[me]->recv();
    if (!stamp) break;
    r.add(micros(Clock::now() - *stamp));
    wakeups.fetch_add(1, std::memory_order_relaxed);
  }
  return r;
}

/// A message fiber: sleeps sleeptime plus up to 25% jitter, then stamps and
/// wakes every waiting worker, until the deadline (or an interrupt); then
/// releases them all.
void messenger(Group& g, const Settings& s, Clock::time_point deadline, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint64_t> jitter(0, s.sleeptime_us / 4);
  std::vector<unsigned> wake;
  while (Clock::now() < deadline && !interrupted()) {
    this_fiber::sleep_for(std::chrono::microseconds(s.sleeptime_us + jitter(rng)));
    {
      std::lock_guard lk(g.m);
      wake.swap(g.waiting);
    }
    // Each inbox is empty: its worker registered once and has not been woken since.
    for (unsigned w : wake) g.inbox[w]->send(Clock::now());
    wake.clear();
  }
  {
    std::lock_guard lk(g.m);
    g.closed = true;
  }
  for (auto& ch : g.inbox) ch->close();
}

// ------------------------------------------------------------------ one measurement

struct Result {
  Placement placement;
  LatencyRecorder latency;
  double elapsed_s = 0;
};

Result measure(Runtime& rt, const Settings& s) {
  std::atomic<std::uint64_t> wakeups{0}, sink{0};
  std::vector<std::unique_ptr<Group>> groups;
  std::vector<JoinHandle<LatencyRecorder>> workers;
  for (unsigned m = 0; m < s.message_fibers; ++m) {
    auto& g = *groups.emplace_back(std::make_unique<Group>());
    // Every inbox exists before the first worker runs: they index the vector.
    for (unsigned w = 0; w < s.workers; ++w) g.inbox.push_back(std::make_unique<Channel<Clock::time_point>>(1));
    for (unsigned w = 0; w < s.workers; ++w)
      workers.push_back(rt.spawn([&g, w, &s, &wakeups, &sink] { return worker(g, w, s.cputime_us, wakeups, sink); }));
  }
  Result r{rt.options().placement, {}, 0};
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s.runtime_s));
  const std::string label = fmt::format("schbench/{}", to_string(r.placement));
  run_with_progress(label, s.runtime_s, [&] { return fmt::format("{} wake-ups", wakeups.load()); }, [&] {
    std::vector<JoinHandle<void>> messengers;
    for (unsigned m = 0; m < s.message_fibers; ++m)
      messengers.push_back(rt.spawn([&g = *groups[m], &s, deadline, m] { messenger(g, s, deadline, m + 1); }));
    for (auto& m : messengers) m.join();
    for (auto& w : workers) r.latency.merge(w.join());
  });
  r.elapsed_s = seconds(Clock::now() - start);
  return r;
}

// ------------------------------------------------------------------ output

void print_schbench_header(const Settings& s, const Runtime& rt) {
  const auto& o = rt.options();
  print_header("schbench", rt, {
      {"policy", to_string(o.policy)},
      {"wakeup placement", s.compare ? std::string("mask, then scan (--compare)") : to_string(o.placement)},
      {"slice", fmt::format("{} us", o.slice.count())},
      {"fibers", fmt::format("{} message fiber(s) x {} workers", s.message_fibers, s.workers)},
      {"sleeptime", fmt::format("{} us (+ up to 25% jitter)", s.sleeptime_us)},
      {"cputime", fmt::format("{} us", s.cputime_us)},
      {"run length", fmt::format("{} s{}", s.runtime_s, s.compare ? " per placement" : "")},
  });
}

/// schbench's percentile block.
std::string render(const Result& r) {
  const auto sum = r.latency.summarize(percentiles);
  std::string out = fmt::format("\nLatency percentiles (usec), placement {}, {} wake-ups\n", to_string(r.placement),
                                sum.count);
  for (const auto& [p, v] : sum.percentiles) out += fmt::format("\t{}{:.1f}th: {:.0f}\n", p == 99 ? "*" : "", p, v);
  out += fmt::format("\tmin={:.0f}, max={:.0f}\n", sum.min, sum.max);
  return out;
}

/// Prints one placement's block as soon as it is measured.
Result report(Result r) {
  std::fputs(render(r).c_str(), stdout);
  std::fflush(stdout);
  return r;
}

/// p99 of mask over p99 of scan, when both ran and scan's is not zero.
std::optional<double> p99_ratio(const std::vector<Result>& rs) {
  if (rs.size() != 2) return std::nullopt;
  const double mask = rs[0].latency.summarize(percentiles).at(99), scan = rs[1].latency.summarize(percentiles).at(99);
  if (scan == 0) return std::nullopt;
  return mask / scan;
}

void write_settings(JsonWriter& j, const Settings& s) {
  j.field("message_fibers", s.message_fibers).field("workers_per_message_fiber", s.workers);
  j.field("runtime_s", s.runtime_s).field("sleeptime_us", s.sleeptime_us).field("cputime_us", s.cputime_us);
  j.field("compare", s.compare);
  j.key("units").begin_object().field("latency", "us").field("elapsed_s", "s").end_object();
}

void write_results(JsonWriter& j, const std::vector<Result>& rs) {
  j.key("placements").begin_array();
  for (const auto& r : rs) {
    j.begin_object().field("placement", to_string(r.placement)).field("elapsed_s", r.elapsed_s);
    write_latency(j, "latency", r.latency.summarize(percentiles), "us");
    j.end_object();
  }
  j.end_array();
  const auto ratio = p99_ratio(rs);
  ratio ? j.field("p99_ratio_mask_over_scan", *ratio) : j.key("p99_ratio_mask_over_scan").null();
}

int run(const Settings& s) {
  const auto runtimes = variants(runtime_options(s.topology, s.policy, s.placement, s.slice_us), s.compare, &Options::placement,
                                 {Placement::mask, Placement::scan});
  return run_variants<Result>(
      "schbench", s.json_path, runtimes, [&](const Runtime& rt) { print_schbench_header(s, rt); },
      [&](Runtime& rt) { return report(measure(rt, s)); },
      [&](JsonWriter& j, const std::vector<Result>& rs) {
        if (const auto ratio = p99_ratio(rs))
          std::printf("\np99 ratio mask/scan: %.3f (below 1: the idle mask wakes faster)\n", *ratio);
        Progress progress{0, s.runtime_s * static_cast<double>(runtimes.size()), "s"};
        for (const auto& r : rs) progress.done += r.elapsed_s;
        print_interrupted(progress);
        write_settings(j, s);
        write_results(j, rs);
        write_interrupted(j, progress);
        return true;
      });
}

} // namespace
} // namespace coresched::bench::schbench

namespace coresched::bench {

Command register_schbench(CLI::App& parent) {
  return make_command<schbench::Settings>(
      parent, "schbench",
      "How long a woken fiber waits to run, as schbench measured the idle-CPU mask for wake-up placement in the "
      "original proposal: message fibers wake their worker fibers, which then burn CPU; percentiles of the wake-up "
      "latency (p50 to p99.9), with mask or scan wakeup placement (--compare runs both)",
      schbench::add_options, schbench::run);
}

} // namespace coresched::bench
