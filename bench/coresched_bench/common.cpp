// SPDX-License-Identifier: Apache-2.0
#include "common.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace coresched::bench {

// ------------------------------------------------------------------ statistics

Summary summarize(const std::vector<double>& xs) {
  Summary s;
  if (xs.empty()) return s;
  double sum = 0;
  for (double x : xs) sum += x;
  s.avg = sum / static_cast<double>(xs.size());
  double sq = 0;
  for (double x : xs) sq += (x - s.avg) * (x - s.avg);
  s.stdev = std::sqrt(sq / static_cast<double>(xs.size())); // population: divide by n, not n-1
  return s;
}

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ------------------------------------------------------------------ topology

std::optional<unsigned> first_smt_core(const Topology& t) {
  for (const auto& c : t.cores())
    if (c.pus.size() >= 2) return c.index;
  return std::nullopt;
}

std::string join_list(const std::vector<unsigned>& xs) {
  std::string s;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(xs[i]);
  }
  return s;
}

std::vector<unsigned> cpus_of(const Topology& t, const std::vector<unsigned>& pus) {
  std::vector<unsigned> cpus;
  for (unsigned p : pus) cpus.push_back(t.pus()[p].cpu);
  return cpus;
}

// ------------------------------------------------------------------ output

void print_header(std::string_view bench, const Runtime& rt,
                  const std::vector<std::pair<std::string, std::string>>& settings) {
  std::string h = fmt::format("# coresched-bench {} (coresched {})\n", bench, CORESCHED_VERSION);
  // describe() may span lines; prefix each so the whole header stays commented.
  std::string d = rt.topology().describe();
  std::size_t start = 0;
  while (start <= d.size()) {
    const std::size_t nl = std::min(d.find('\n', start), d.size());
    h += "# " + d.substr(start, nl - start) + "\n";
    start = nl + 1;
  }
  for (const auto& [k, v] : settings) h += fmt::format("# {}: {}\n", k, v);
  std::fputs(h.c_str(), stdout);
  std::fflush(stdout);
}

void progress_begin(std::string_view bench, const std::string& what) {
  std::fprintf(stderr, "[%.*s] %s", static_cast<int>(bench.size()), bench.data(), what.c_str());
  std::fflush(stderr);
}

void progress_end(const std::string& result) { std::fprintf(stderr, "%s\n", result.c_str()); }

void progress_line(std::string_view bench, const std::string& what) {
  progress_begin(bench, what);
  progress_end("");
}

Table::Table(std::vector<std::string> headers) { rows_.push_back(std::move(headers)); }

void Table::add_row(std::vector<std::string> cells) {
  cells.resize(rows_[0].size());
  rows_.push_back(std::move(cells));
}

std::string Table::render() const {
  std::vector<std::size_t> width(rows_[0].size(), 0);
  for (const auto& r : rows_)
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  std::string out;
  for (const auto& r : rows_) {
    for (std::size_t c = 0; c < r.size(); ++c) {
      if (c) out += "  ";
      out += c == 0 ? fmt::format("{:<{}}", r[c], width[c]) : fmt::format("{:>{}}", r[c], width[c]);
    }
    out += "\n";
  }
  return out;
}

std::string fixed(std::optional<double> v, int decimals) {
  return v ? fmt::format("{:.{}f}", *v, decimals) : std::string("-");
}

// ------------------------------------------------------------------ JSON

void JsonWriter::newline() {
  out_ += '\n';
  out_.append(2 * first_.size(), ' ');
}

// Called before every value and key: a comma unless first in its container.
void JsonWriter::before_value() {
  if (after_key_) { after_key_ = false; return; }
  if (first_.empty()) return;
  if (!first_.back()) out_ += ',';
  first_.back() = false;
  newline();
}

JsonWriter& JsonWriter::begin_object() {
  before_value();
  out_ += '{';
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::end_object() {
  const bool empty = first_.back();
  first_.pop_back();
  if (!empty) newline();
  out_ += '}';
  if (first_.empty()) out_ += '\n';
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  before_value();
  out_ += '[';
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  const bool empty = first_.back();
  first_.pop_back();
  if (!empty) newline();
  out_ += ']';
  return *this;
}

JsonWriter& JsonWriter::key(std::string_view k) {
  before_value();
  write_string(k);
  out_ += ": ";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view s) {
  before_value();
  write_string(s);
  return *this;
}

void JsonWriter::write_string(std::string_view s) {
  out_ += '"';
  for (char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') { out_ += '\\'; out_ += ch; }
    else if (ch == '\n') out_ += "\\n";
    else if (ch == '\t') out_ += "\\t";
    else if (u < 0x20) out_ += fmt::format("\\u{:04x}", u);
    else out_ += ch; // UTF-8 (the topology text has an em dash) passes through
  }
  out_ += '"';
}

JsonWriter& JsonWriter::value(double d) {
  if (!std::isfinite(d)) return null();
  before_value();
  out_ += fmt::format("{}", d); // shortest text that reads back to the same double
  return *this;
}

JsonWriter& JsonWriter::value(std::uint64_t u) {
  before_value();
  out_ += std::to_string(u);
  return *this;
}

JsonWriter& JsonWriter::value(int i) {
  before_value();
  out_ += std::to_string(i);
  return *this;
}

JsonWriter& JsonWriter::value(bool b) {
  before_value();
  out_ += b ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::null() {
  before_value();
  out_ += "null";
  return *this;
}

JsonWriter& JsonWriter::value(const std::vector<unsigned>& xs) {
  begin_array();
  for (unsigned x : xs) value(x);
  return end_array();
}

JsonWriter& JsonWriter::value(const std::vector<double>& xs) {
  begin_array();
  for (double x : xs) value(x);
  return end_array();
}

JsonWriter& JsonWriter::summary(std::string_view k, const Summary& s, std::string_view unit) {
  key(k).begin_object();
  field("avg", s.avg).field("stdev", s.stdev).field("unit", unit);
  return end_object();
}

void write_topology(JsonWriter& j, const Topology& t, const std::vector<unsigned>& pus_used) {
  const char* src = t.source() == Topology::Source::machine ? "machine"
                    : t.source() == Topology::Source::xml   ? "xml"
                                                            : "synthetic";
  std::vector<unsigned> cores;
  for (unsigned p : pus_used) cores.push_back(t.pus()[p].core);
  std::sort(cores.begin(), cores.end());
  cores.erase(std::unique(cores.begin(), cores.end()), cores.end());
  j.key("topology").begin_object();
  j.field("source", src).field("spec", t.spec()).field("real_siblings", t.real_siblings());
  j.field("description", t.describe());
  j.field("cores_total", static_cast<unsigned>(t.cores().size()));
  j.field("pus_total", static_cast<unsigned>(t.pus().size()));
  j.field("cores_used", cores).field("pus_used", pus_used).field("cpus_used", cpus_of(t, pus_used));
  j.end_object();
}

bool can_write(const std::string& path, std::string& err) {
  std::ofstream f(path, std::ios::binary | std::ios::app);
  if (f) return true;
  err = fmt::format("cannot write {}: {}", path, std::strerror(errno));
  return false;
}

bool write_file(const std::string& path, const std::string& text, std::string& err) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (f) f << text;
  if (f) f.close();
  if (!f) {
    err = fmt::format("cannot write {}: {}", path, std::strerror(errno));
    return false;
  }
  return true;
}

} // namespace coresched::bench
