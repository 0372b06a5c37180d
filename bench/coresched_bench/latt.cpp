// SPDX-License-Identifier: Apache-2.0
// `coresched-bench latt`: seed 003's wakeup-latency tester on fibers. A waker
// sleeps a random interval, then sends a timestamp to every client; each client
// records how long its wake-up took, then compresses 64 KiB with zlib and
// records how long that took.
#include "../cli_finite.hpp"
#include "cli_options.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "latt_work.hpp"

#include <coresched/sync.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char** environ;

namespace coresched::bench::latt {
namespace {

constexpr double percentiles[] = {50, 90, 99};

struct Settings {
  unsigned clients = 8;
  double min_wait_ms = 100;
  double max_wait_ms = 500;
  unsigned work_kb = 64;
  double time_s = 10;
  std::optional<std::uint64_t> rounds; ///< --runs: stop after this many wake rounds instead of --time
  unsigned load_fibers = 0;
  bool tag_load = false;
  bool compare_threads = false;
  std::string load_cmd;
  std::string topology;
  std::optional<FairnessPolicy> policy;
  std::optional<unsigned> slice_us;
  std::optional<Placement> placement;
  std::string json_path;
};

Shape shape(const Settings& s) {
  return {.clients = s.clients, .min_wait_ms = s.min_wait_ms, .max_wait_ms = s.max_wait_ms, .time_s = s.time_s,
          .rounds = s.rounds, .load = s.load_fibers};
}

// ------------------------------------------------------------------ command line

void add_options(CLI::App& sub, Settings& s) {
  sub.add_option("-c,--clients", s.clients, "Client fibers, each woken through its own channel")
      ->capture_default_str()->check(CLI::Range(1u, 100000u));
  sub.add_option("--min-wait", s.min_wait_ms, "Shortest sleep of the waker between wake rounds, ms")
      ->capture_default_str()->check(finite_range(0.0, 1e6));
  sub.add_option("--max-wait", s.max_wait_ms, "Longest sleep of the waker between wake rounds, ms")
      ->capture_default_str()->check(finite_range(0.0, 1e6));
  sub.add_option("--work-kb", s.work_kb, "KiB each client compresses (zlib level 7) after each wake-up; 0: none")
      ->capture_default_str()->check(CLI::Range(0u, 1u << 20));
  sub.add_option("--time", s.time_s, "Seconds to run (the last round starts before this)")
      ->capture_default_str()->check(positive_seconds());
  sub.add_option_function<std::uint64_t>("--runs", [&s](std::uint64_t n) { s.rounds = n; },
                                         "Stop after this many wake rounds instead of after --time")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  sub.add_option("--load-fibers", s.load_fibers, "CPU-bound background fibers in the same runtime")
      ->capture_default_str()->check(CLI::Range(0u, 100000u));
  sub.add_flag("--tag-load", s.tag_load,
               "Give the background fibers a cookie of their own (the clients stay untagged), so on SMT cores "
               "they cannot share a core with the clients");
  sub.add_option("--load-cmd", s.load_cmd,
                 "Background load as a process: `/bin/sh -c CMD`, started before the measurement and killed (with "
                 "its process group) after it; its stdout goes to our stderr");
  sub.add_flag("--compare-threads", s.compare_threads,
               "Then run the same experiment on plain kernel threads (clients blocked on pipes, as the seed's latt; "
               "--load-fibers busy threads), and print both and the ratios fibers / threads");
  add_topology_option(sub, s.topology, false);
  add_policy_option(sub, s.policy);
  add_slice_option(sub, s.slice_us);
  add_placement_option(sub, s.placement);
  add_json_option(sub, s.json_path);
}

// ------------------------------------------------------------------ the work

// ------------------------------------------------------------------ background process

/// `/bin/sh -c CMD` in a process group of its own, so that make -j4 and its
/// children all go when we kill the group.
class LoadProcess {
public:
  explicit LoadProcess(const std::string& cmd) {
    posix_spawnattr_t attr;
    posix_spawn_file_actions_t fa;
    ::posix_spawnattr_init(&attr);
    ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    ::posix_spawnattr_setpgroup(&attr, 0);
    ::posix_spawn_file_actions_init(&fa);
    ::posix_spawn_file_actions_adddup2(&fa, STDERR_FILENO, STDOUT_FILENO); // our stdout holds only the results
    const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
    const int rc = ::posix_spawn(&pid_, "/bin/sh", &fa, &attr, const_cast<char* const*>(argv), environ);
    ::posix_spawn_file_actions_destroy(&fa);
    ::posix_spawnattr_destroy(&attr);
    if (rc != 0) throw std::runtime_error(fmt::format("cannot start `{}`: {}", cmd, std::strerror(rc)));
  }
  LoadProcess(const LoadProcess&) = delete;
  LoadProcess& operator=(const LoadProcess&) = delete;
  ~LoadProcess() { stop(); }

  /// Kills the group (SIGTERM, then SIGKILL after a grace period) and reaps
  /// the shell. Returns whether it had already exited on its own.
  bool stop() {
    if (pid_ <= 0) return exited_early_;
    int status = 0;
    exited_early_ = ::waitpid(pid_, &status, WNOHANG) == pid_;
    if (!exited_early_) {
      ::kill(-pid_, SIGTERM);
      if (!reaped_within(std::chrono::seconds(2))) {
        ::kill(-pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
      }
    }
    ::kill(-pid_, SIGKILL); // whatever the shell left behind in its group
    pid_ = -1;
    return exited_early_;
  }

private:
  bool reaped_within(std::chrono::milliseconds grace) {
    const auto end = Clock::now() + grace;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

  pid_t pid_ = -1;
  bool exited_early_ = false;
};

// ------------------------------------------------------------------ the measurement

/// One client: waits on its own channel (one channel per client, so a wake-up
/// is one client's, not a thundering herd's), records the delay since the
/// stamp, then does the work and records its time.
ClientResult client(Channel<Clock::time_point>& ch, const std::vector<unsigned char>& in, std::size_t expected,
                    std::atomic<std::uint64_t>& entries) {
  return serve([&ch] { return ch.recv(); }, in, expected, entries);
}

/// The waker: sleeps a random interval, then stamps and sends to each client
/// in turn (a stamp per send, so each client's delay is its own), until the
/// time or the rounds are up, or an interrupt. Closes the channels at the
/// end, which ends the clients. Returns the rounds done.
std::uint64_t waker(std::vector<std::unique_ptr<Channel<Clock::time_point>>>& chans, const Shape& s,
                    Clock::time_point deadline) {
  WakeIntervals intervals(s);
  std::uint64_t round = 0;
  for (; (!s.rounds || round < *s.rounds) && !interrupted(); ++round) {
    const auto at = Clock::now() + intervals.next();
    if (!s.rounds && at > deadline) break;
    this_fiber::sleep_until(at);
    for (auto& ch : chans) ch->send(Clock::now());
  }
  for (auto& ch : chans) ch->close();
  return round;
}

/// The background fibers, busy until `stop`; with --tag-load under a cookie
/// of their own (spawned from this plain thread, the others are untagged).
std::vector<JoinHandle<std::uint64_t>> spawn_load(Runtime& rt, const Settings& s, const std::atomic<bool>& stop) {
  const Cookie cookie = s.tag_load ? Cookie::create() : Cookie{};
  std::vector<JoinHandle<std::uint64_t>> load;
  for (unsigned i = 0; i < s.load_fibers; ++i)
    load.push_back(rt.spawn([&stop] { return burn(stop); }, {.cookie = cookie}));
  return load;
}

struct Clients {
  std::vector<std::unique_ptr<Channel<Clock::time_point>>> channels; ///< one per client
  std::vector<JoinHandle<ClientResult>> fibers;
};

Clients spawn_clients(Runtime& rt, const Settings& s, const std::vector<unsigned char>& in, std::size_t expected,
                      std::atomic<std::uint64_t>& entries) {
  Clients c;
  for (unsigned i = 0; i < s.clients; ++i) {
    // Room for a few stamps: a client still busy with its work must not hold
    // up the waker's sends to the others.
    auto& ch = *c.channels.emplace_back(std::make_unique<Channel<Clock::time_point>>(4));
    c.fibers.push_back(rt.spawn([&ch, &in, expected, &entries] { return client(ch, in, expected, entries); }));
  }
  return c;
}

Measurement measure(Runtime& rt, const Settings& s, const std::vector<unsigned char>& in, std::size_t expected) {
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> entries{0};
  auto load = spawn_load(rt, s, stop);
  Clients clients = spawn_clients(rt, s, in, expected, entries);
  Measurement m;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s.time_s));
  const double mean_wait_s = (s.min_wait_ms + s.max_wait_ms) / 2000;
  const double expected_s = s.rounds ? static_cast<double>(*s.rounds) * mean_wait_s : s.time_s;
  run_with_progress("latt", expected_s, [&] { return fmt::format("{} entries", entries.load()); }, [&] {
    m.rounds = rt.spawn([&] { return waker(clients.channels, shape(s), deadline); }).join();
    for (auto& c : clients.fibers) {
      const ClientResult r = c.join();
      m.wakeup.merge(r.wakeup);
      m.work.merge(r.work);
      m.bad_outputs += r.bad_outputs;
    }
  });
  m.elapsed_s = seconds(Clock::now() - start);
  stop = true;
  for (auto& l : load) l.join();
  return m;
}

// ------------------------------------------------------------------ output

void print_latt_header(const Settings& s, const Runtime& rt, std::size_t compressed) {
  const auto& o = rt.options();
  std::string load = fmt::format("{} CPU-bound fiber(s){}", s.load_fibers,
                                 s.load_fibers && s.tag_load ? " with their own cookie" : "");
  if (!s.load_cmd.empty()) load += fmt::format("; process `{}`", s.load_cmd);
  print_header("latt", rt, {
      {"policy", to_string(o.policy)},
      {"wakeup placement", to_string(o.placement)},
      {"slice", fmt::format("{} us", o.slice.count())},
      {"clients", fmt::format("{}, each on its own channel", s.clients)},
      {"waker sleep", fmt::format("{} to {} ms, uniform", s.min_wait_ms, s.max_wait_ms)},
      {"work", fmt::format("zlib level {} of {} KiB ({} B compressed)", zlib_level, s.work_kb, compressed)},
      {"run length", s.rounds ? fmt::format("{} wake rounds", *s.rounds) : fmt::format("{} s", s.time_s)},
      {"background load", load},
  });
}

/// One block in latt's layout.
std::string render_block(const char* title, const Welford& w) {
  std::string out = fmt::format("{} (usec)\n------------------------------\n", title);
  const std::pair<const char*, double> rows[] = {
      {"Max", w.max()}, {"Avg", w.mean()}, {"Stdev", w.stdev()}, {"Stdev mean", w.stdev_mean()}};
  for (const auto& [name, v] : rows) out += fmt::format("\t{:<12}{:>10.0f} usec\n", name, v);
  return out;
}

std::string render(const char* who, const Settings& s, const Measurement& m) {
  return fmt::format("\n{}Entries: {} (clients={})\n\n{}\n{}", who, m.wakeup.stats().count(), s.clients,
                     render_block("Wakeup", m.wakeup.stats()), render_block("Work", m.work.stats()));
}

double ratio(double a, double b) { return b > 0 ? a / b : 0; }

std::string render_ratios(const Measurement& fibers, const Measurement& threads) {
  return fmt::format("\nfibers / kernel threads (avg): wakeup {:.2f} ({:.0f} / {:.0f} usec), work {:.2f} ({:.0f} / "
                     "{:.0f} usec)\n",
                     ratio(fibers.wakeup.stats().mean(), threads.wakeup.stats().mean()), fibers.wakeup.stats().mean(),
                     threads.wakeup.stats().mean(), ratio(fibers.work.stats().mean(), threads.work.stats().mean()),
                     fibers.work.stats().mean(), threads.work.stats().mean());
}

void write_figures(JsonWriter& j, const Measurement& m) {
  j.field("rounds", m.rounds).field("elapsed_s", m.elapsed_s);
  j.field("entries", m.wakeup.stats().count());
  write_latency(j, "wakeup", m.wakeup.summarize(percentiles), "us");
  write_latency(j, "work", m.work.summarize(percentiles), "us");
}

JsonWriter write_json(const Settings& s, const Runtime& rt, const Measurement& m, const Measurement* threads,
                      std::size_t compressed, bool load_exited_early, const Progress& progress) {
  JsonWriter j;
  j.begin_object();
  write_run_head(j, "latt", rt);
  j.field("clients", s.clients).field("min_wait_ms", s.min_wait_ms).field("max_wait_ms", s.max_wait_ms);
  j.field("work_kb", s.work_kb).field("zlib_level", zlib_level).field("compressed_bytes", std::uint64_t{compressed});
  j.field("time_s", s.time_s);
  s.rounds ? j.field("rounds_requested", *s.rounds) : j.key("rounds_requested").null();
  j.key("load").begin_object().field("fibers", s.load_fibers).field("fibers_tagged", s.tag_load);
  s.load_cmd.empty() ? j.key("cmd").null() : j.field("cmd", s.load_cmd);
  j.field("cmd_exited_early", load_exited_early).end_object();
  j.key("units").begin_object().field("wakeup", "us").field("work", "us").field("elapsed_s", "s").end_object();
  write_figures(j, m);
  if (threads) {
    j.key("threads").begin_object();
    write_figures(j, *threads);
    j.end_object();
    j.key("ratios_fibers_over_threads").begin_object();
    j.field("wakeup_avg", ratio(m.wakeup.stats().mean(), threads->wakeup.stats().mean()));
    j.field("work_avg", ratio(m.work.stats().mean(), threads->work.stats().mean()));
    j.end_object();
  } else {
    j.key("threads").null();
  }
  write_interrupted(j, progress);
  j.end_object();
  return j;
}

int run(const Settings& s) {
  if (s.min_wait_ms > s.max_wait_ms) {
    std::fprintf(stderr, "coresched-bench latt: --min-wait (%g ms) is above --max-wait (%g ms)\n", s.min_wait_ms,
                 s.max_wait_ms);
    return exit_setup;
  }
  if (!check_json_path("latt", s.json_path)) return exit_setup;
  Runtime rt(runtime_options(s.topology, s.policy, s.placement, s.slice_us));
  const auto in = make_input(std::size_t{s.work_kb} * 1024);
  const std::size_t compressed = Compressor(in.size()).compress(in); // the reference every client must match
  print_latt_header(s, rt, compressed);

  std::unique_ptr<LoadProcess> load;
  if (!s.load_cmd.empty()) load = std::make_unique<LoadProcess>(s.load_cmd);
  const Measurement m = measure(rt, s, in, compressed);
  std::optional<Measurement> threads;
  if (s.compare_threads && !interrupted()) {
    // The runtime's workers sleep meanwhile (nothing is queued): the threads have the CPUs to themselves.
    std::atomic<std::uint64_t> entries{0};
    const double expected_s = s.rounds ? static_cast<double>(*s.rounds) * (s.min_wait_ms + s.max_wait_ms) / 2000
                                       : s.time_s;
    run_with_progress("latt/threads", expected_s, [&] { return fmt::format("{} entries", entries.load()); },
                      [&] { threads = measure_threads(shape(s), in, compressed, entries); });
  }
  const bool exited_early = load && load->stop();
  if (exited_early)
    std::fprintf(stderr, "coresched-bench latt: note: the load command exited before the measurement ended\n");
  const double ways = s.compare_threads ? 2 : 1;
  Progress progress{m.elapsed_s, s.time_s * ways, "s"};
  if (s.rounds) progress = {static_cast<double>(m.rounds), static_cast<double>(*s.rounds) * ways, "wake rounds"};
  if (threads) progress.done += s.rounds ? static_cast<double>(threads->rounds) : threads->elapsed_s;
  print_interrupted(progress);
  std::fputs(render(threads ? "coresched fibers\n" : "", s, m).c_str(), stdout);
  if (threads) {
    std::fputs(render("kernel threads (the same work, clients blocked on pipes)\n", s, *threads).c_str(), stdout);
    std::fputs(render_ratios(m, *threads).c_str(), stdout);
  }
  std::fflush(stdout);

  if (!save_json("latt", s.json_path,
                 write_json(s, rt, m, threads ? &*threads : nullptr, compressed, exited_early, progress)))
    return exit_failure;
  if (threads && threads->bad_outputs) {
    std::fprintf(stderr, "coresched-bench latt: %llu compressions on threads differ from the reference\n",
                 static_cast<unsigned long long>(threads->bad_outputs));
    return exit_failure;
  }
  if (m.bad_outputs) {
    std::fprintf(stderr, "coresched-bench latt: %llu compressions differ from the reference (%zu B): corrupted state\n",
                 static_cast<unsigned long long>(m.bad_outputs), compressed);
    return exit_failure;
  }
  return 0;
}

} // namespace
} // namespace coresched::bench::latt

namespace coresched::bench {

Command register_latt(CLI::App& parent) {
  return make_command<latt::Settings>(
      parent, "latt",
      "How long a sleeping client takes to wake, as the latt tester (Jens Axboe's, from the BFS vs. mainline "
      "scheduler discussion) measures it: clients woken by a timer fiber at random intervals, each through its own "
      "channel, report the delay, then compress 64 KiB with zlib; wakeup and work time (Max / Avg / Stdev, as latt "
      "prints them), idle or beside background load",
      latt::add_options, latt::run);
}

} // namespace coresched::bench
