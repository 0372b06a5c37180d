// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file common.hpp
/// What every coresched-bench subcommand shares: statistics, runtime options
/// and topology fallback, the header, the result table, progress lines, a
/// small JSON writer, and the driver of runs that compare runtime variants.

#include "latency_stats.hpp"

#include <coresched/coresched.hpp>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace coresched::bench {

/// Exit codes: 1 for a failed run, 2 for a setup problem (topology, arguments
/// the parser could not catch), matching CLI11's parse errors being non-zero too.
inline constexpr int exit_failure = 1;
inline constexpr int exit_setup = 2;

// ------------------------------------------------------------------ statistics

/// Mean and population standard deviation (the seeds compare runs of one
/// fixed set, not a sample of a larger population).
struct Summary {
  double avg = 0;
  double stdev = 0;
};
Summary summarize(const std::vector<double>& xs);

/// Seconds between two steady-clock points.
double seconds(std::chrono::steady_clock::duration d);

// ------------------------------------------------------------------ topology

/// The first core with at least two PUs, if any.
std::optional<unsigned> first_smt_core(const Topology& t);

/// "0,1" for a list of numbers.
std::string join_list(const std::vector<unsigned>& xs);

/// The real CPUs behind some PUs.
std::vector<unsigned> cpus_of(const Topology& t, const std::vector<unsigned>& pus);

/// Runtime options from the settings every subcommand has (unset: defaults).
Options runtime_options(const std::string& topology, std::optional<FairnessPolicy> policy,
                        std::optional<Placement> placement, std::optional<unsigned> slice_us = {});

/// The runtimes of a run: `base` alone, or with --compare one copy of it per
/// value of `field` (mask then scan; core_vruntime then forceidle_balance).
template <class T>
std::vector<Options> variants(const Options& base, bool compare, T Options::*field, std::initializer_list<T> values) {
  if (!compare) return {base};
  std::vector<Options> out;
  for (const T& v : values) {
    out.push_back(base);
    out.back().*field = v;
  }
  return out;
}

/// The synthetic machine used where the real one has no SMT: one core of two
/// sibling PUs, mapped onto two real CPUs.
inline constexpr const char* synthetic_smt_topology = "package:1 l3cache:1 core:1 pu:2";

/// The topology spec for a benchmark that needs SMT siblings: `requested` when
/// given; else "" (the real machine, or CORESCHED_TOPOLOGY) if that has a core
/// with two PUs; else synthetic_smt_topology, with a note on stderr. The main
/// job runs on whatever machine it lands on, and without siblings a
/// core-scheduling benchmark has nothing to measure.
std::string smt_topology(std::string_view bench, const std::string& requested);

// ------------------------------------------------------------------ output

/// "epoll (io_uring_setup: Operation not permitted)": the runtime's I/O
/// backend and why it was chosen.
std::string describe_io_backend(const Runtime& rt);

/// Prints the run header on stdout, each line starting with "# " so the table
/// below stays easy to parse: program, version, the topology description (real
/// or synthetic siblings), the I/O backend, then the benchmark's own key/value
/// settings.
void print_header(std::string_view bench, const Runtime& rt,
                  const std::vector<std::pair<std::string, std::string>>& settings);

/// Progress on stderr, so stdout holds only the header and the results.
/// begin() writes "[bench] what" without a newline; end() finishes the line.
void progress_begin(std::string_view bench, const std::string& what);
void progress_end(const std::string& result);
void progress_line(std::string_view bench, const std::string& what);

/// Runs `body` on this thread. If it should take more than a few seconds
/// (`expected_s`), a helper thread meanwhile prints "[bench] t/expected s
/// <status()>" on stderr every second, so a long run shows it is alive.
/// `status` is called from that thread: it must only read atomics.
void run_with_progress(std::string_view bench, double expected_s, const std::function<std::string()>& status,
                       const std::function<void()>& body);

/// A plain text table: first column left-aligned, the others right-aligned.
class Table {
public:
  explicit Table(std::vector<std::string> headers);
  void add_row(std::vector<std::string> cells);
  std::string render() const;

private:
  std::vector<std::vector<std::string>> rows_; // rows_[0] holds the headers
};

/// A number with a fixed count of decimals, or "-" when absent.
std::string fixed(std::optional<double> v, int decimals);

// ------------------------------------------------------------------ JSON

/// A streaming JSON writer: enough for result files, no dependency. Keys and
/// values are written in call order; commas and nesting are tracked here.
class JsonWriter {
public:
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  /// The key of the next value (inside an object).
  JsonWriter& key(std::string_view k);

  JsonWriter& value(std::string_view s);
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(double d); // non-finite numbers become null
  JsonWriter& value(std::uint64_t u);
  JsonWriter& value(unsigned u) { return value(static_cast<std::uint64_t>(u)); }
  JsonWriter& value(int i);
  JsonWriter& value(bool b);
  JsonWriter& null();
  JsonWriter& value(const std::vector<unsigned>& xs);
  JsonWriter& value(const std::vector<double>& xs);

  /// key(k).value(v) in one call.
  template <class T> JsonWriter& field(std::string_view k, const T& v) { return key(k).value(v); }

  /// A {"avg", "stdev", "unit"} object.
  JsonWriter& summary(std::string_view k, const Summary& s, std::string_view unit);

  const std::string& str() const noexcept { return out_; }

private:
  void before_value();
  void newline();
  void write_string(std::string_view s);
  std::string out_;
  std::vector<bool> first_; // one entry per open container: nothing written in it yet
  bool after_key_ = false;
};

/// A latency object: count, min, max, avg, stdev (population), stdev_mean,
/// the percentiles as "p50", "p99.5", ... and the unit.
void write_latency(JsonWriter& j, std::string_view k, const LatencySummary& s, std::string_view unit);

/// "p50", "p99.5": the name of a percentile in tables and JSON.
std::string percentile_name(double p);

/// The topology block every result file carries: source, spec, real_siblings,
/// description, and the cores/PUs/CPUs the benchmark used.
void write_topology(JsonWriter& j, const Topology& t, const std::vector<unsigned>& pus_used);

/// The I/O backend the runtime chose and why: "io_backend" ("io_uring" or
/// "epoll") and "io_backend_reason".
void write_io_backend(JsonWriter& j, const Runtime& rt);

/// The fields every result file starts with: benchmark, coresched_version,
/// the topology block (all PUs used), io_backend and io_backend_reason,
/// policy, wakeup_placement and slice_us.
void write_run_head(JsonWriter& j, std::string_view bench, const Runtime& rt);

/// Checks before a long benchmark that the result file can be written: its
/// directory takes a new file (write_file() writes one there and renames it),
/// and an existing file is writable. Creates nothing: an existing file is left
/// as it is, and none appears, until the final write.
bool can_write(const std::string& path, std::string& err);

/// Writes text to a file, whole or not at all: to a new file beside it, then
/// renamed over it, so a run ended while writing (a second Ctrl-C) never leaves
/// it empty or cut short. A path that exists and is not a plain file
/// (/dev/stdout, a pipe, a symbolic link) is written in place. On failure
/// returns false with the reason in `err`.
bool write_file(const std::string& path, const std::string& text, std::string& err);

/// can_write() for an optional --json path (empty: nothing to check); prints
/// "coresched-bench BENCH: reason" on failure.
bool check_json_path(std::string_view bench, const std::string& path);

/// write_file() for an optional --json path (empty: nothing to write); prints
/// the reason on failure.
bool save_json(std::string_view bench, const std::string& path, const JsonWriter& j);

// ------------------------------------------------------------------ interruption

/// Makes SIGINT (Ctrl-C) and SIGTERM set a flag instead of ending the process,
/// so that a command stopped early still prints, and writes to --json, what
/// it gathered. main() calls it once, before the subcommand runs. The handler
/// only sets the flag, and fires once per signal (SA_RESETHAND): a second
/// Ctrl-C ends the process at once, as if nothing were caught.
void catch_interrupts();

/// Whether SIGINT or SIGTERM came. Long loops check it and stop early; the
/// command then reports what it has and says how far it got.
bool interrupted() noexcept;

/// The exit status of a command that returned `status`: after an interrupt,
/// 128 + the signal (130 for SIGINT, as a shell reports a process the signal
/// ended), unless the command failed for a reason of its own.
int exit_status(int status) noexcept;

/// How far a command got: `done` of `planned` `unit`.
struct Progress {
  double done = 0;    ///< runs that finished, or seconds measured
  double planned = 0; ///< what the command line asked for
  std::string unit;   ///< "runs", "s", "wake rounds"
};

/// After an interrupt, says so as a header line: "# interrupted by SIGINT
/// after 7 of 30 runs: the results are those gathered until then" (on stdout
/// unless `to` says otherwise). Nothing otherwise.
void print_interrupted(const Progress& p, std::FILE* to = stdout);

/// The "interrupted" field of a result file: null, or after an interrupt
/// {"signal", "done", "planned", "unit"}.
void write_interrupted(JsonWriter& j, const Progress& p);

// ------------------------------------------------------------------ driver

/// The shape of a benchmark that measures once per runtime variant (--compare
/// runs two): checks the --json path first; builds each runtime in turn (its
/// options are fixed at construction, and two at once would fight over the
/// CPUs); on the first, prints the header (`header`) and writes the JSON head;
/// measures each (`measure`, which prints its own result); then `finish`
/// prints any comparison and writes the rest of the JSON, returning whether
/// the results are sound. After an interrupt it starts no further variant,
/// and leaves out a result without runs (where R has `runs`), so `finish`
/// sees only what was measured. Returns the exit status.
template <class R>
int run_variants(std::string_view bench, const std::string& json_path, const std::vector<Options>& variants,
                 const std::function<void(const Runtime&)>& header, const std::function<R(Runtime&)>& measure,
                 const std::function<bool(JsonWriter&, const std::vector<R>&)>& finish) {
  if (!check_json_path(bench, json_path)) return exit_setup;
  JsonWriter j;
  j.begin_object();
  std::vector<R> results;
  bool first = true;
  for (const auto& o : variants) {
    if (!first && interrupted()) break;
    Runtime rt(o);
    if (std::exchange(first, false)) {
      header(rt);
      write_run_head(j, bench, rt);
    }
    R r = measure(rt);
    if constexpr (requires { r.runs.empty(); })
      if (r.runs.empty()) continue;
    results.push_back(std::move(r));
  }
  const bool sound = finish(j, results);
  j.end_object();
  const bool saved = save_json(bench, json_path, j);
  return sound && saved ? 0 : exit_failure;
}

} // namespace coresched::bench
