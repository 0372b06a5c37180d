// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file common.hpp
/// What every coresched-bench subcommand shares: statistics, the header, the
/// result table, progress lines and a small JSON writer.

#include <coresched/coresched.hpp>

#include <chrono>
#include <cstdint>
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

// ------------------------------------------------------------------ output

/// Prints the run header on stdout, each line starting with "# " so the table
/// below stays easy to parse: program, version, the topology description (real
/// or synthetic siblings), then the benchmark's own key/value settings.
void print_header(std::string_view bench, const Runtime& rt,
                  const std::vector<std::pair<std::string, std::string>>& settings);

/// Progress on stderr, so stdout holds only the header and the results.
/// begin() writes "[bench] what" without a newline; end() finishes the line.
void progress_begin(std::string_view bench, const std::string& what);
void progress_end(const std::string& result);
void progress_line(std::string_view bench, const std::string& what);

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

/// The topology block every result file carries: source, spec, real_siblings,
/// description, and the cores/PUs/CPUs the benchmark used.
void write_topology(JsonWriter& j, const Topology& t, const std::vector<unsigned>& pus_used);

/// Checks before a long benchmark that the result file can be written (opens
/// it for append: an existing file is left as it is until the final write).
bool can_write(const std::string& path, std::string& err);

/// Writes text to a file; on failure returns false with the reason in `err`.
bool write_file(const std::string& path, const std::string& text, std::string& err);

} // namespace coresched::bench
