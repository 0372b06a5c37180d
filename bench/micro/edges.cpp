// SPDX-License-Identifier: Apache-2.0
// coresched-edges-bench: the promise at its edges, as a user meets them.
//   chain     a join chain of --depth fibers; alternating cookies (no child runs
//             inline) meets vm.max_map_count: it completes or ends in StackError
//   shutdown  a fiber spawning in a sleep-paced loop while shutdown() runs
//   runtimes  two runtimes on one machine: on the same cores (refused) and on
//             cores of their own (Options::cpus), with an oracle across them
// Each prints one line per case, or a JSON object with --json.
#include "../cli_finite.hpp"

#include <coresched/coresched.hpp>

#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace coresched;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string max_map_count() {
  std::ifstream f("/proc/sys/vm/max_map_count");
  std::string v;
  return f >> v ? v : "?";
}

std::string json_str(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
  return q + "\"";
}

int chain(const std::string& topology, long depth, bool alternate, bool json) {
  Options o;
  o.topology = topology;
  Runtime rt(o);
  const Cookie ab[2] = {Cookie::create(), Cookie::create()};
  std::atomic<long> deepest{0};
  std::function<long(long)> link = [&](long d) -> long {
    if (d > deepest.load(std::memory_order_relaxed)) deepest.store(d, std::memory_order_relaxed);
    if (d == depth) return d;
    return spawn([&link, d] { return link(d + 1); }, SpawnOptions{.cookie = ab[alternate ? (d + 1) % 2 : 0]}).join();
  };
  const auto t0 = Clock::now();
  std::string outcome = "completed", error;
  try {
    (void)rt.spawn([&] { return link(0); }, SpawnOptions{.cookie = ab[0]}).join();
  } catch (const StackError& e) {
    outcome = "StackError";
    error = e.what();
  }
  const double secs = seconds_since(t0);
  if (json)
    std::printf("{\"case\":\"chain\",\"depth\":%ld,\"alternate\":%s,\"outcome\":\"%s\",\"deepest\":%ld,\"seconds\":%.3f,"
                "\"max_map_count\":\"%s\",\"error\":%s}\n",
                depth, alternate ? "true" : "false", outcome.c_str(), deepest.load(), secs, max_map_count().c_str(),
                json_str(error).c_str());
  else
    std::printf("chain depth %ld (%s): %s after %.3f s, deepest fiber %ld, vm.max_map_count %s%s%s\n", depth,
                alternate ? "alternating cookies" : "one cookie", outcome.c_str(), secs, deepest.load(), max_map_count().c_str(),
                error.empty() ? "" : "\n  ", error.c_str());
  return 0;
}

int shutdown_case(const std::string& topology, double run_s, bool json) {
  Options o;
  o.topology = topology;
  Runtime rt(o);
  std::atomic<long> accepted{0}, during{0};
  std::atomic<bool> stopping{false};
  rt.spawn([&] {
    for (;;) {
      try {
        spawn([] {}, SpawnOptions{.detached = true});
      } catch (const UsageError&) {
        return;
      }
      accepted.fetch_add(1, std::memory_order_relaxed);
      if (stopping.load(std::memory_order_relaxed)) during.fetch_add(1, std::memory_order_relaxed);
      this_fiber::sleep_for(std::chrono::milliseconds(1));
    }
  }, SpawnOptions{.detached = true});
  std::this_thread::sleep_for(std::chrono::duration<double>(run_s));
  stopping.store(true);
  const auto t0 = Clock::now();
  rt.shutdown();
  const double secs = seconds_since(t0);
  if (json)
    std::printf("{\"case\":\"shutdown\",\"shutdown_ms\":%.3f,\"spawns_before\":%ld,\"spawns_during\":%ld}\n",
                secs * 1e3, accepted.load() - during.load(), during.load());
  else
    std::printf("shutdown beside a spawning fiber: %.3f ms; spawns accepted before it %ld, during it %ld\n",
                secs * 1e3, accepted.load() - during.load(), during.load());
  return 0;
}

// Overlaps seen by a user-level oracle: one slot per PU OS index, stamped with
// the cookie a fiber runs under and compared with its core's other slots.
struct CrossOracle {
  explicit CrossOracle(const Topology& machine) : t(machine), slots(machine.pus().size() + 64) {
    for (auto& s : slots) s.store(kEmpty);
  }
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  void run_stamped(std::uint64_t cookie, int rounds) {
    const Topology& mine = Runtime::current()->topology();
    for (int i = 0; i < rounds; ++i) {
      const auto& pu = mine.pus()[this_fiber::location().worker];
      slots[pu.os_index].store(cookie, std::memory_order_seq_cst);
      for (int k = 0; k < 50; ++k)
        for (unsigned os : mine.cores()[pu.core].os_pus) {
          if (os == pu.os_index) continue;
          const std::uint64_t other = slots[os].load(std::memory_order_seq_cst);
          checks.fetch_add(1, std::memory_order_relaxed);
          if (other != kEmpty && other != cookie) overlaps.fetch_add(1, std::memory_order_relaxed);
        }
      slots[pu.os_index].store(kEmpty, std::memory_order_seq_cst);
      this_fiber::yield();
    }
  }
  const Topology& t;
  std::vector<std::atomic<std::uint64_t>> slots;
  std::atomic<std::uint64_t> overlaps{0}, checks{0};
};

// Two fibers of each cookie in each runtime, every one stamping `rounds` times.
void run_tenants(std::vector<std::unique_ptr<Runtime>>& rts, CrossOracle& oracle, int rounds) {
  const Cookie a = Cookie::create(), b = Cookie::create();
  std::vector<JoinHandle<void>> hs;
  for (std::size_t r = 0; r < rts.size(); ++r)
    for (const Cookie c : {r % 2 ? b : a, r % 2 ? a : b})
      for (int k = 0; k < 2; ++k)
        hs.push_back(rts[r]->spawn([&, c] { oracle.run_stamped(c.value(), rounds); }, SpawnOptions{.cookie = c}));
  for (auto& h : hs) h.join();
}

int runtimes_case(const std::string& topology, int rounds, bool json) {
  const Topology machine = Topology::discover(topology);
  // The same cores: refused (or, where a runtime allowed it, what ran).
  std::string refusal;
  CrossOracle same(machine);
  {
    Options o;
    o.topology = topology;
    std::vector<std::unique_ptr<Runtime>> rts;
    rts.push_back(std::make_unique<Runtime>(o));
    try {
      rts.push_back(std::make_unique<Runtime>(o));
      run_tenants(rts, same, rounds);
    } catch (const UsageError& e) {
      refusal = e.what();
    }
  }
  // Cores of their own: the first half of the cores, and the rest.
  std::string cpus[2];
  const std::size_t n = machine.cores().size();
  for (std::size_t c = 0; c < n; ++c)
    for (unsigned pu : machine.cores()[c].pus)
      cpus[c < n / 2 ? 0 : 1] += (cpus[c < n / 2 ? 0 : 1].empty() ? "" : ",") + std::to_string(machine.pus()[pu].os_index);
  CrossOracle oracle(machine);
  if (n >= 2) {
    std::vector<std::unique_ptr<Runtime>> rts;
    for (const auto& list : cpus) {
      Options o;
      o.topology = topology;
      o.cpus = list;
      rts.push_back(std::make_unique<Runtime>(o));
    }
    run_tenants(rts, oracle, rounds);
  }
  if (json)
    std::printf("{\"case\":\"runtimes\",\"topology\":%s,\"same_cores_refused\":%s,\"same_cores_overlaps\":%llu,"
                "\"split\":[%s,%s],\"overlaps\":%llu,\"checks\":%llu}\n",
                json_str(topology).c_str(), refusal.empty() ? "false" : "true",
                static_cast<unsigned long long>(same.overlaps.load()), json_str(cpus[0]).c_str(),
                json_str(cpus[1]).c_str(), static_cast<unsigned long long>(oracle.overlaps.load()),
                static_cast<unsigned long long>(oracle.checks.load()));
  else
    std::printf("two runtimes on \"%s\": same cores %s (%llu overlaps in %llu checks); cores of their own (%s | %s): "
                "%llu overlaps in %llu checks\n",
                topology.c_str(), refusal.empty() ? "ACCEPTED" : "refused",
                static_cast<unsigned long long>(same.overlaps.load()), static_cast<unsigned long long>(same.checks.load()),
                cpus[0].c_str(), cpus[1].c_str(),
                static_cast<unsigned long long>(oracle.overlaps.load()),
                static_cast<unsigned long long>(oracle.checks.load()));
  return refusal.empty() ? 1 : 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched-edges-bench: join chains that run out of stacks, shutdown beside a spawning fiber, and "
               "two runtimes in one process"};
  app.require_subcommand(1);
  std::string topology = "core:1 pu:2";
  bool json = false;
  app.add_option("--topology", topology, "hwloc synthetic string, XML path or auto")->capture_default_str();
  app.add_flag("--json", json, "one JSON object per case");
  long depth = 33000;
  bool same = false;
  auto* c = app.add_subcommand("chain", "a join chain of --depth fibers (alternating cookies unless --same-cookie)");
  c->add_option("--depth", depth, "fibers in the chain")->check(CLI::Range(1L, 10'000'000L))->capture_default_str();
  c->add_flag("--same-cookie", same, "one cookie (children run inline)");
  double run_s = 0.2;
  auto* s = app.add_subcommand("shutdown", "shutdown() beside a fiber that spawns every millisecond");
  s->add_option("--run", run_s, "seconds before shutdown")->check(coresched::bench::finite_range(0, 60));
  int rounds = 20000;
  auto* r = app.add_subcommand("runtimes", "two runtimes in one process: same cores, and cores of their own");
  r->add_option("--rounds", rounds, "stamped rounds per fiber")->check(CLI::Range(1, 10'000'000))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (*c) return chain(topology, depth, !same, json);
    if (*s) return shutdown_case(topology, run_s, json);
    return runtimes_case(topology, rounds, json);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-edges-bench: %s\n", e.what());
    return 1;
  }
}
