// SPDX-License-Identifier: Apache-2.0
// parallel_sum: a data-parallel job that shows work stealing.
//
// One fiber splits the sum of a large vector into many chunk fibers. It spawns all of them itself, so they start
// out queued on a single worker; the other workers are idle and steal them. At the end the program prints how many
// chunks each worker ran (this_fiber::location().worker) and the runtime's per-worker steal counts, and checks the
// parallel sum against a plain serial loop: it exits 1 if they differ (or if fewer workers than --min-workers took
// part).
#include <coresched/coresched.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <set>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Deterministic pseudo-random data (splitmix64), so the sum is not something a closed formula gives away.
std::vector<std::uint32_t> make_data(std::size_t n) {
  std::vector<std::uint32_t> v(n);
  std::uint64_t x = 0x9e3779b97f4a7c15ULL;
  for (auto& e : v) {
    x += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    e = static_cast<std::uint32_t>(z >> 32);
  }
  return v;
}

} // namespace

int main(int argc, char** argv) {
  std::size_t elements = std::size_t{1} << 24; // 16 Mi x 4 bytes = 64 MiB
  std::size_t chunk = std::size_t{1} << 16;    // 256 chunks by default
  unsigned min_workers = 1;

  CLI::App app{"parallel_sum: sum a large vector with one fiber per chunk and show which workers ran them "
               "(work stealing). Exits 1 if the result differs from the serial sum."};
  app.add_option("--elements", elements, "Number of 32-bit elements to sum")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 32));
  app.add_option("--chunk", chunk, "Elements per fiber")->check(CLI::Range(std::size_t{1}, std::size_t{1} << 32));
  app.add_option("--min-workers", min_workers,
                 "Fail unless at least this many workers ran chunks (a check that stealing happened)")
      ->check(CLI::Range(1u, 4096u));
  CLI11_PARSE(app, argc, argv);

  try {
    coresched::Runtime rt; // its workers sleep (using no CPU) while the data is prepared and summed serially
    const auto& topo = rt.topology();
    std::printf("%s\n", topo.describe().c_str());
    if (min_workers > topo.pus().size()) {
      std::fprintf(stderr, "error: --min-workers %u but the runtime has only %zu workers\n", min_workers,
                   topo.pus().size());
      return 2;
    }

    const std::vector<std::uint32_t> data = make_data(elements);
    auto t0 = Clock::now();
    const std::uint64_t serial = std::accumulate(data.begin(), data.end(), std::uint64_t{0});
    const double serial_ms = ms_since(t0);

    const std::size_t n_chunks = (elements + chunk - 1) / chunk;
    // ran_on[c] = the worker that ran chunk c. Each chunk writes only its own slot, and join() orders that write
    // before our read, so no atomics are needed.
    std::vector<unsigned> ran_on(n_chunks);

    t0 = Clock::now();
    const std::uint64_t parallel = rt.spawn([&] {
      std::vector<coresched::JoinHandle<std::uint64_t>> parts;
      parts.reserve(n_chunks);
      // Spawning everything before joining anything queues all chunks on this fiber's worker; idle workers
      // find them there and steal them. (Joining a chunk nobody has started yet runs it inline on this fiber.)
      for (std::size_t c = 0; c < n_chunks; ++c) {
        parts.push_back(coresched::spawn([&, c] {
          ran_on[c] = coresched::this_fiber::location().worker;
          const std::size_t begin = c * chunk, end = std::min(begin + chunk, data.size());
          std::uint64_t s = 0;
          for (std::size_t i = begin; i < end; ++i) {
            s += data[i];
            // Fibers are cooperative: offer the scheduler a switch now and then (a flag read when nothing is due).
            if ((i & 0xfff) == 0) coresched::this_fiber::preempt_point();
          }
          return s;
        }));
      }
      std::uint64_t sum = 0;
      for (auto& p : parts) sum += p.join();
      return sum;
    }).join();
    const double parallel_ms = ms_since(t0);

    const coresched::Stats stats = rt.stats();
    std::vector<std::size_t> per_worker(topo.pus().size());
    for (unsigned w : ran_on) ++per_worker[w];
    const auto used = static_cast<unsigned>(std::count_if(per_worker.begin(), per_worker.end(),
                                                          [](std::size_t n) { return n > 0; }));

    std::printf("\n%zu chunks of %zu elements\n", n_chunks, chunk);
    std::printf("%8s %6s %8s %8s\n", "worker", "core", "chunks", "steals");
    for (const auto& pu : topo.pus()) {
      std::uint64_t steals = 0;
      for (const auto& w : stats.workers)
        if (w.worker == pu.index) steals = w.steals;
      std::printf("%8u %6u %8zu %8llu\n", pu.index, pu.core, per_worker[pu.index],
                  static_cast<unsigned long long>(steals));
    }
    std::printf("(steals: fibers taken from another core's queues; SMT siblings share their core's queues, so a\n"
                " sibling running its neighbour's chunks is not counted as a steal)\n");
    std::printf("\nserial   sum %llu in %.2f ms\nparallel sum %llu in %.2f ms (%u of %zu workers ran chunks)\n",
                static_cast<unsigned long long>(serial), serial_ms, static_cast<unsigned long long>(parallel),
                parallel_ms, used, topo.pus().size());

    if (parallel != serial) {
      std::fprintf(stderr, "FAIL: the parallel sum differs from the serial sum\n");
      return 1;
    }
    if (used < min_workers) {
      std::fprintf(stderr, "FAIL: only %u workers ran chunks, --min-workers is %u\n", used, min_workers);
      return 1;
    }
    std::printf("OK: sums match\n");
    return 0;
  } catch (const std::exception& e) { // e.g. a bad CORESCHED_TOPOLOGY
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
