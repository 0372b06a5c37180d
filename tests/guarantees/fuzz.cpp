// SPDX-License-Identifier: Apache-2.0
// coresched-fuzz: generates seeded random programs over the public API
// (fuzz_generate.cpp), runs each on a Runtime of its own and checks them
// (fuzz_run.cpp, fuzz_execute.cpp). A watchdog aborts a program that hangs, after printing
// its seed, the fibers still pending and the runtime's statistics; a crash
// prints the seed of the program it hit.
//
//   coresched-fuzz --seed 1 --programs 40 --topology "core:1 pu:2"     the ctest budget
//   coresched-fuzz --seed 1000 --seconds 600 --topology all            a long hunt, all four shapes
//   coresched-fuzz --seed 4242 --programs 1 --repeat 50 --topology ... rerun one failing program
#include "fuzz_program.hpp"

#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>
#include <unistd.h>

namespace {

using Clock = std::chrono::steady_clock;

// ---- crash reports: what the program was, in a buffer a signal handler may write

char crash_note[512];
std::atomic<std::size_t> crash_note_len{0};

void set_crash_note(const std::string& s) {
  crash_note_len.store(0);
  const std::size_t n = std::min(s.size(), sizeof crash_note - 1);
  std::memcpy(crash_note, s.data(), n);
  crash_note[n] = '\n';
  crash_note_len.store(n + 1);
}

extern "C" void on_crash(int sig) {
  static const char head[] = "coresched-fuzz: crashed (signal ";
  (void)!write(2, head, sizeof head - 1);
  char num[4] = {static_cast<char>('0' + sig / 10), static_cast<char>('0' + sig % 10), ')', ' '};
  (void)!write(2, num, sizeof num);
  (void)!write(2, crash_note, crash_note_len.load());
  signal(sig, SIG_DFL);
  if (sig == SIGABRT) raise(sig); // a fault re-executes the faulting access instead
}

void install_crash_notes() {
  // Installed before the first Runtime: its stack-overflow handler chains to ours.
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) {
    struct sigaction sa {};
    sa.sa_handler = on_crash;
    sa.sa_flags = SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
}

// ---- the watchdog: nothing may hang

class Watchdog {
public:
  Watchdog() : thread_([this] { loop(); }) {}
  ~Watchdog() {
    {
      std::lock_guard lk(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  /// On a hang, also print every thread's stack through gdb (where the workers sleep, what main waits for).
  bool gdb = false;
  void arm(const fuzz::Execution* ex, std::string what, std::chrono::milliseconds limit) {
    std::lock_guard lk(mu_);
    ex_ = ex;
    what_ = std::move(what);
    limit_ = limit;
    deadline_ = Clock::now() + limit;
  }
  void disarm() {
    std::lock_guard lk(mu_);
    ex_ = nullptr;
  }

private:
  void loop() {
    std::unique_lock lk(mu_);
    while (!quit_) {
      if (ex_ && Clock::now() > deadline_) {
        std::fprintf(stderr, "coresched-fuzz: HANG: not finished after %lld ms: %s\nfibers still pending:\n%s%s",
                     static_cast<long long>(limit_.count()), what_.c_str(), ex_->pending().c_str(),
                     ex_->stats().c_str());
        ex_->dump(stderr); // the runtime's own view: cores, owners, queues, what each fiber waits for
        std::fflush(stderr);
        if (gdb) {
          const std::string cmd = "gdb -p " + std::to_string(getpid()) +
                                  " -batch -ex 'thread apply all bt 16' 1>&2 2>/dev/null </dev/null";
          (void)!std::system(cmd.c_str());
        }
        crash_note_len.store(0); // said already
        std::abort();
      }
      cv_.wait_for(lk, std::chrono::milliseconds(50));
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  const fuzz::Execution* ex_ = nullptr;
  std::string what_;
  std::chrono::milliseconds limit_{0};
  Clock::time_point deadline_;
  bool quit_ = false;
  std::thread thread_; // last: starts once the fields above exist
};

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) o += ' ';
    else o += c;
  }
  return o;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched-fuzz: seeded random programs over coresched's public API (spawn/join/detach, cookies, "
               "yield, sleeps, sync primitives, channels, exceptions, io_uring I/O), checked by an application-level "
               "isolation oracle and per-fiber bookkeeping; a watchdog reports any hang."};
  std::uint64_t seed = 1;
  int programs = 0;
  double seconds = 0;
  std::string topology = "core:1 pu:2";
  std::string json;
  int repeat = 1;
  double hang_s = 60;
  bool keep_going = false, progress = false, print = false, gdb = false;
  std::string without_list;
  app.add_option("--seed", seed, "First program seed; program i has seed + i");
  app.add_option("--programs", programs, "Programs to run (default 100, or unlimited with --seconds); scaled by "
                                         "CORESCHED_STRESS_SCALE")->check(CLI::NonNegativeNumber);
  app.add_option("--seconds", seconds, "Long mode: keep generating programs for this long")->check(CLI::NonNegativeNumber);
  app.add_option("--topology", topology, "hwloc synthetic topology, or 'all' to cycle SMT-2, SMT-4 and two multi-core shapes");
  app.add_option("--repeat", repeat, "Run every program this many times (interleavings differ)")->check(CLI::Range(1, 1000000));
  app.add_option("--json", json, "Also write the summary (and failures) to this JSON file");
  app.add_option("--hang-seconds", hang_s, "Watchdog: a program running longer than this is a hang")->check(CLI::PositiveNumber);
  app.add_flag("--keep-going", keep_going, "Do not stop at the first failing program");
  app.add_option("--without", without_list, "Generate programs without these features (comma-separated: " +
                                              fuzz::feature_names() + ")");
  app.add_flag("--gdb-on-hang", gdb, "On a hang, print every thread's stack with gdb before aborting");
  app.add_flag("--print", print, "Print each program (fibers and operations) before running it");
  app.add_flag("--progress", progress, "Report progress on stderr every 10 s (on by default with --seconds)");
  CLI11_PARSE(app, argc, argv);

  const char* scale_env = std::getenv("CORESCHED_STRESS_SCALE");
  const double scale = scale_env && std::atof(scale_env) > 0 ? std::atof(scale_env) : 1.0;
  const bool timed = seconds > 0;
  if (programs == 0 && !timed) programs = 100;
  if (programs > 0) programs = std::max(1, static_cast<int>(programs * scale));
  const auto hang_limit = std::chrono::milliseconds(static_cast<long long>(hang_s * 1000 / std::min(scale, 1.0)));
  progress = progress || timed;

  std::uint32_t without = 0;
  try {
    without = fuzz::parse_features(without_list);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-fuzz: --without: %s\n", e.what());
    return 2;
  }
  std::vector<std::string> shapes{topology};
  if (topology == "all") shapes = {"core:1 pu:2", "core:1 pu:4", "core:2 pu:2", "package:1 core:3 pu:2"};
  std::map<std::string, unsigned> pus;
  try {
    for (const auto& s : shapes) pus[s] = static_cast<unsigned>(coresched::Topology::discover(s).pus().size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-fuzz: %s\n", e.what());
    return 2;
  }

  install_crash_notes();
  Watchdog watchdog;
  watchdog.gdb = gdb;
  const auto start = Clock::now();
  auto last_progress = start;
  std::uint64_t ran = 0, fibers = 0, events = 0, checks = 0, failed = 0;
  std::uint64_t selects[6] = {};
  std::vector<std::string> failure_text;
  for (std::uint64_t i = 0;; ++i) {
    if (programs > 0 && i >= static_cast<std::uint64_t>(programs)) break;
    if (timed && Clock::now() - start >= std::chrono::duration<double>(seconds)) break;
    const std::string& shape = shapes[i % shapes.size()];
    const fuzz::Program prog = fuzz::generate(seed + i, shape, pus[shape], without);
    const std::string what = prog.describe();
    if (print) std::fprintf(stderr, "%s", prog.dump().c_str());
    const std::string repro = "coresched-fuzz --seed " + std::to_string(prog.seed) + " --programs 1 --topology \"" +
                              shape + "\"" + (without_list.empty() ? "" : " --without " + without_list);
    bool program_failed = false;
    for (int r = 0; r < repeat && (!program_failed || keep_going); ++r) {
      set_crash_note("in program " + what + "; rerun: " + repro);
      fuzz::Outcome o;
      {
        fuzz::Execution ex(prog);
        watchdog.arm(&ex, what + "; rerun: " + repro, hang_limit);
        o = ex.run();
        watchdog.disarm();
      }
      ++ran;
      fibers += o.fibers;
      events += o.events;
      checks += o.oracle_checks;
      for (int k = 0; k < 6; ++k) selects[k] += o.selects[k];
      if (!o.ok()) {
        program_failed = true;
        std::string text = "FAILED (" + std::to_string(o.failure_count) + " problem(s), run " + std::to_string(r + 1) +
                           "): " + what + "\n  rerun: " + repro + "\n";
        for (const auto& f : o.failures) text += "  - " + f + (f.empty() || f.back() != '\n' ? "\n" : "");
        std::fprintf(stderr, "coresched-fuzz: %s", text.c_str());
        failure_text.push_back(text);
      }
    }
    failed += program_failed;
    if (program_failed && !keep_going) break;
    if (progress && Clock::now() - last_progress > std::chrono::seconds(10)) {
      last_progress = Clock::now();
      std::fprintf(stderr, "coresched-fuzz: %.0f s: %llu programs, %llu fibers, %llu events, %llu failed, last seed %llu\n",
                   std::chrono::duration<double>(last_progress - start).count(), static_cast<unsigned long long>(ran),
                   static_cast<unsigned long long>(fibers), static_cast<unsigned long long>(events),
                   static_cast<unsigned long long>(failed), static_cast<unsigned long long>(seed + i));
    }
  }
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  const std::uint64_t last_seed = seed + (ran ? (ran - 1) / static_cast<std::uint64_t>(repeat) : 0);
  std::uint64_t select_total = 0;
  for (std::uint64_t k : selects) select_total += k;
  auto u = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  std::printf("coresched-fuzz: %llu programs (seeds %llu..%llu, x%d), %llu fibers, %llu events, %llu oracle checks, "
              "%llu selects (%llu recv, %llu send, %llu event, %llu timed out, %llu stopped, %llu none), "
              "topology %s%s%s, %llu failed, %.1f s\n",
              u(ran), u(seed), u(last_seed), repeat, u(fibers), u(events), u(checks), u(select_total), u(selects[0]),
              u(selects[1]), u(selects[2]), u(selects[3]), u(selects[4]), u(selects[5]), topology.c_str(),
              without_list.empty() ? "" : ", without ", without_list.c_str(), u(failed), took);
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"topology\": \"" << json_escape(topology) << "\", \"first_seed\": " << seed << ", \"last_seed\": "
        << last_seed << ", \"repeat\": " << repeat << ", \"programs\": " << ran << ", \"fibers\": " << fibers
        << ", \"events\": " << events << ", \"oracle_checks\": " << checks << ", \"selects\": " << select_total
        << ", \"failed\": " << failed
        << ", \"seconds\": " << took << ", \"failures\": [";
    for (std::size_t k = 0; k < failure_text.size(); ++k)
      out << (k ? ", " : "") << "\"" << json_escape(failure_text[k]) << "\"";
    out << "]}\n";
    if (!out) std::fprintf(stderr, "coresched-fuzz: could not write %s\n", json.c_str());
  }
  return failed ? 1 : 0;
}
