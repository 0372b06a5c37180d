// SPDX-License-Identifier: Apache-2.0
#include "common.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <condition_variable>
#include <fcntl.h>
#include <fstream>
#include <mutex>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

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

Options runtime_options(const std::string& topology, std::optional<FairnessPolicy> policy,
                        std::optional<Placement> placement, std::optional<unsigned> slice_us) {
  Options o;
  o.topology = topology;
  if (policy) o.policy = *policy;
  if (placement) o.placement = *placement;
  if (slice_us) o.slice = std::chrono::microseconds(*slice_us);
  return o;
}

std::string smt_topology(std::string_view bench, const std::string& requested) {
  if (!requested.empty() || first_smt_core(Topology::discover(""))) return requested;
  std::fprintf(stderr, "coresched-bench %.*s: this machine's topology has no core with two PUs (no SMT); using "
                       "SYNTHETIC siblings \"%s\" mapped onto real CPUs.\n",
               static_cast<int>(bench.size()), bench.data(), synthetic_smt_topology);
  return synthetic_smt_topology;
}

// ------------------------------------------------------------------ output

std::string describe_io_backend(const Runtime& rt) {
  return fmt::format("{} ({})", to_string(rt.io_backend()), rt.io_backend_reason());
}

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
  h += fmt::format("# io backend: {}\n", describe_io_backend(rt));
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

void run_with_progress(std::string_view bench, double expected_s, const std::function<std::string()>& status,
                       const std::function<void()>& body) {
  constexpr double quiet_below_s = 3; // a short run's result comes before anyone wonders
  if (expected_s <= quiet_below_s) return body();
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::thread ticker([&] {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock lk(m);
    for (int tick = 1; !cv.wait_for(lk, start + std::chrono::seconds(tick) - std::chrono::steady_clock::now(),
                                    [&] { return done; });
         ++tick)
      progress_line(bench, fmt::format("{}/{} s {}", tick, expected_s, status()));
  });
  // Stop the ticker even if the body throws, or its destructor would terminate.
  struct Stop {
    std::mutex& m;
    std::condition_variable& cv;
    bool& done;
    std::thread& t;
    ~Stop() {
      { std::lock_guard g(m); done = true; }
      cv.notify_one();
      t.join();
    }
  } stop{m, cv, done, ticker};
  body();
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

void write_latency(JsonWriter& j, std::string_view k, const LatencySummary& s, std::string_view unit) {
  j.key(k).begin_object();
  j.field("count", s.count).field("min", s.min).field("max", s.max).field("avg", s.avg);
  j.field("stdev", s.stdev).field("stdev_mean", s.stdev_mean);
  j.key("percentiles").begin_object();
  for (const auto& [p, v] : s.percentiles) j.field(percentile_name(p), v);
  j.end_object();
  j.field("unit", unit);
  j.end_object();
}

std::string percentile_name(double p) { return fmt::format("p{}", p); }

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

void write_io_backend(JsonWriter& j, const Runtime& rt) {
  j.field("io_backend", to_string(rt.io_backend())).field("io_backend_reason", rt.io_backend_reason());
}

void write_run_head(JsonWriter& j, std::string_view bench, const Runtime& rt) {
  const auto& o = rt.options();
  j.field("benchmark", bench).field("coresched_version", CORESCHED_VERSION);
  std::vector<unsigned> all(rt.topology().pus().size());
  for (unsigned i = 0; i < all.size(); ++i) all[i] = i;
  write_topology(j, rt.topology(), all);
  write_io_backend(j, rt);
  j.field("policy", to_string(o.policy)).field("wakeup_placement", to_string(o.placement));
  j.field("slice_us", static_cast<std::uint64_t>(o.slice.count()));
}

namespace {

// Whether `path` is written in place: it exists and is not a plain file (a
// device such as /dev/stdout, a pipe, a symbolic link), which a rename would
// replace instead of writing to.
bool write_in_place(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
}

// The new file write_file() fills before renaming it over `path`: beside it,
// so that the rename stays on one file system.
std::string beside(const std::string& path) { return fmt::format("{}.tmp{}", path, ::getpid()); }

bool cannot_write(const std::string& path, int error, std::string& err) {
  err = fmt::format("cannot write {}: {}", path, std::strerror(error));
  return false;
}

} // namespace

bool can_write(const std::string& path, std::string& err) {
  if (write_in_place(path)) {
    std::ofstream f(path, std::ios::binary | std::ios::app); // it exists: opening it creates nothing
    return f ? true : cannot_write(path, errno, err);
  }
  if (::access(path.c_str(), F_OK) == 0 && ::access(path.c_str(), W_OK) != 0) return cannot_write(path, errno, err);
  const std::string probe = beside(path);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return cannot_write(path, errno, err);
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

bool write_file(const std::string& path, const std::string& text, std::string& err) {
  const bool in_place = write_in_place(path);
  const std::string target = in_place ? path : beside(path);
  std::ofstream f(target, std::ios::binary | std::ios::trunc);
  if (f) f << text;
  if (f) f.close();
  const bool renamed = f && (in_place || ::rename(target.c_str(), path.c_str()) == 0);
  if (renamed) return true;
  const int error = errno;
  if (!in_place) ::unlink(target.c_str());
  return cannot_write(path, error, err);
}

bool check_json_path(std::string_view bench, const std::string& path) {
  std::string err;
  if (path.empty() || can_write(path, err)) return true;
  std::fprintf(stderr, "coresched-bench %.*s: %s\n", static_cast<int>(bench.size()), bench.data(), err.c_str());
  return false;
}

bool save_json(std::string_view bench, const std::string& path, const JsonWriter& j) {
  std::string err;
  if (path.empty() || write_file(path, j.str(), err)) return true;
  std::fprintf(stderr, "coresched-bench %.*s: %s\n", static_cast<int>(bench.size()), bench.data(), err.c_str());
  return false;
}

// ------------------------------------------------------------------ interruption

namespace {

// The signal that came (SIGINT or SIGTERM); 0 before. Lock-free, so that the
// handler may set it.
std::atomic<int> interrupt_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

// The handler: records the first signal, nothing else (async-signal-safe).
void on_interrupt(int sig) noexcept {
  int none = 0;
  interrupt_signal.compare_exchange_strong(none, sig, std::memory_order_relaxed);
}

std::string signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : fmt::format("signal {}", sig);
}

// 7 as "7", 12.34 as "12.3".
std::string amount(double v) { return v == std::floor(v) ? fmt::format("{:.0f}", v) : fmt::format("{:.1f}", v); }

} // namespace

void catch_interrupts() {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_RESETHAND; // blocking calls go on; the next one of the same signal ends the process
  for (const int sig : {SIGINT, SIGTERM}) {
    struct sigaction old {};
    // A signal ignored from the start (nohup, a background job of a non-interactive shell) stays ignored.
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    ::sigaction(sig, &sa, nullptr);
  }
}

bool interrupted() noexcept { return interrupt_signal.load(std::memory_order_relaxed) != 0; }

int exit_status(int status) noexcept {
  const int sig = interrupt_signal.load(std::memory_order_relaxed);
  return sig && status == 0 ? 128 + sig : status;
}

void print_interrupted(const Progress& p, std::FILE* to) {
  const int sig = interrupt_signal.load(std::memory_order_relaxed);
  if (!sig) return;
  std::fprintf(to, "# interrupted by %s after %s of %s %s: the results are those gathered until then\n",
               signal_name(sig).c_str(), amount(p.done).c_str(), amount(p.planned).c_str(), p.unit.c_str());
  std::fflush(to);
}

void write_interrupted(JsonWriter& j, const Progress& p) {
  const int sig = interrupt_signal.load(std::memory_order_relaxed);
  if (!sig) {
    j.key("interrupted").null();
    return;
  }
  j.key("interrupted").begin_object().field("signal", signal_name(sig)).field("done", p.done);
  j.field("planned", p.planned).field("unit", p.unit).end_object();
}

} // namespace coresched::bench
