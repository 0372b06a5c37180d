// SPDX-License-Identifier: Apache-2.0
// The matrix's two yardsticks: the real sysbench (is our work loop as fast as
// theirs?) and the kernel's own core scheduling (PR_SCHED_CORE) on plain threads.
#include "matrix.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sched.h>
#include <sys/prctl.h>
#include <thread>
#include <unistd.h>

namespace coresched::bench::matrix {
namespace {

// ------------------------------------------------------------------ helpers

/// The full path of an executable found in PATH.
std::optional<std::string> find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const std::size_t colon = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = dirs.substr(start, colon - start);
    const std::string file = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(file.c_str(), X_OK) == 0) return file;
    start = colon + 1;
  }
  return std::nullopt;
}

/// The number after `marker` in some text, e.g. "events per second:  1306.90".
std::optional<double> number_after(const std::string& text, std::string_view marker) {
  const auto at = text.find(marker);
  if (at == std::string::npos) return std::nullopt;
  const char* p = text.c_str() + at + marker.size();
  char* end = nullptr;
  const double v = std::strtod(p, &end);
  if (end == p) return std::nullopt;
  return v;
}

/// A ratio, or nothing when either side is missing or zero.
std::optional<double> ratio(std::optional<double> ours, std::optional<double> theirs) {
  if (!ours || !theirs || *theirs == 0) return std::nullopt;
  return *ours / *theirs;
}

const Row* find_row(const std::vector<Row>& rows, std::string_view name) {
  for (const auto& r : rows)
    if (name == r.config->name) return &r;
  return nullptr;
}

void write_unavailable(JsonWriter& j, std::string_view k, const std::string& why) {
  j.key(k).begin_object().field("available", false).field("reason", why).end_object();
}

// ------------------------------------------------------------------ sysbench

/// A child process whose output we read (popen: sysbench writes a page at most,
/// so reading the two children one after the other cannot block either).
class Child {
public:
  explicit Child(const std::string& cmd) : cmd_(cmd), f_(::popen((cmd + " 2>&1").c_str(), "r")) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { if (f_) ::pclose(f_); }

  /// Waits for the child; returns its output, or nothing (with `err`) on failure.
  std::optional<std::string> finish(std::string& err) {
    if (!f_) { err = fmt::format("cannot start `{}`: {}", cmd_, std::strerror(errno)); return std::nullopt; }
    std::string out;
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f_)) > 0;) out.append(buf, n);
    const int status = ::pclose(std::exchange(f_, nullptr));
    if (status == 0) return out;
    err = fmt::format("`{}` failed (status {}): {}", cmd_, status, out.substr(out.size() > 400 ? out.size() - 400 : 0));
    return std::nullopt;
  }

private:
  std::string cmd_;
  std::FILE* f_;
};

struct SysbenchTools {
  std::string sysbench, taskset;
};

std::string cpu_cmd(const SysbenchTools& t, const Settings& s, unsigned cpu) {
  return fmt::format("{} -c {} {} cpu --threads=1 --time={} --cpu-max-prime={} run", t.taskset, cpu, t.sysbench,
                     s.time_s, s.cpu_max_prime);
}

// A total large enough that --time, not the byte count, ends the run.
std::string mem_cmd(const SysbenchTools& t, const Settings& s, unsigned cpu) {
  return fmt::format("{} -c {} {} memory --threads=1 --time={} --memory-block-size={} --memory-total-size=100T "
                     "--memory-scope=global --memory-oper=write --memory-access-mode=seq run",
                     t.taskset, cpu, t.sysbench, s.time_s, s.block_bytes);
}

/// One sysbench measurement: cpu ev/s, and mem MiB/s when the memory test ran.
struct SysbenchFigures {
  std::optional<double> cpu_eps, mem_mibs;
  std::string error;
};

SysbenchFigures sysbench_alone(const SysbenchTools& t, const Settings& s, const Place& p) {
  SysbenchFigures f;
  progress_line("matrix/sysbench", fmt::format("Alone: sysbench cpu on CPU {} ({} s)", p.cpus[0], s.time_s));
  Child cpu(cpu_cmd(t, s, p.cpus[0]));
  if (auto out = cpu.finish(f.error)) f.cpu_eps = number_after(*out, "events per second:");
  return f;
}

// nosmt: both benchmarks share sibling 0's CPU, started together as in the seed.
SysbenchFigures sysbench_nosmt(const SysbenchTools& t, const Settings& s, const Place& p) {
  SysbenchFigures f;
  progress_line("matrix/sysbench",
                fmt::format("nosmt: sysbench cpu + memory both on CPU {} ({} s)", p.cpus[0], s.time_s));
  Child cpu(cpu_cmd(t, s, p.cpus[0]));
  Child mem(mem_cmd(t, s, p.cpus[0]));
  if (auto out = cpu.finish(f.error)) f.cpu_eps = number_after(*out, "events per second:");
  if (auto out = mem.finish(f.error)) f.mem_mibs = number_after(*out, "MiB transferred (");
  return f;
}

void report_sysbench(const Settings& s, const std::vector<Row>& ours, const SysbenchFigures (&theirs)[2],
                     JsonWriter& j) {
  Table t({"config", "ours cpu ev/s", "sysbench cpu ev/s", "ratio", "ours mem MiB/s", "sysbench mem MiB/s", "ratio"});
  j.key("sysbench").begin_object().field("available", true).field("runs", 1u).key("configs").begin_array();
  const char* names[2] = {"Alone", "nosmt"};
  for (int i = 0; i < 2; ++i) {
    const Row* r = find_row(ours, names[i]);
    const std::optional<double> cpu = r ? std::optional(r->cpu().avg) : std::nullopt;
    const auto ms = r ? r->mem(s.block_bytes) : std::nullopt;
    const std::optional<double> mem = ms ? std::optional(ms->avg) : std::nullopt;
    t.add_row({names[i], fixed(cpu, 2), fixed(theirs[i].cpu_eps, 2), fixed(ratio(cpu, theirs[i].cpu_eps), 3),
               fixed(mem, 1), fixed(theirs[i].mem_mibs, 1), fixed(ratio(mem, theirs[i].mem_mibs), 3)});
    j.begin_object().field("name", names[i]);
    auto num = [&j](std::string_view k, std::optional<double> v) { v ? j.field(k, *v) : j.key(k).null(); };
    num("sysbench_cpu_events_per_s", theirs[i].cpu_eps);
    num("cpu_ratio_ours_over_sysbench", ratio(cpu, theirs[i].cpu_eps));
    num("sysbench_mem_mib_per_s", theirs[i].mem_mibs);
    num("mem_ratio_ours_over_sysbench", ratio(mem, theirs[i].mem_mibs));
    if (!theirs[i].error.empty()) j.field("error", theirs[i].error);
    j.end_object();
  }
  j.end_array().end_object();
  std::printf("\nsysbench comparison (one sysbench run each; ratio = ours / sysbench)%s:\n%s",
              s.buffer_bytes == s.block_bytes ? "" : "; note: sysbench rewrites one block, ours walks a larger buffer",
              t.render().c_str());
  for (const auto& f : theirs)
    if (!f.error.empty()) std::printf("sysbench error: %s\n", f.error.c_str());
  std::fflush(stdout);
}

// ------------------------------------------------------------------ kernel

constexpr int kPrSchedCore = 62;       // PR_SCHED_CORE
constexpr int kPrSchedCoreCreate = 1;  // PR_SCHED_CORE_CREATE
constexpr unsigned long kPidTypePid = 0; // PIDTYPE_PID: the calling thread only

/// Gives the calling thread a new kernel core-scheduling cookie; "" or why not.
std::string kernel_tag_self() {
  if (::prctl(kPrSchedCore, kPrSchedCoreCreate, 0, kPidTypePid, 0) == 0) return {};
  const int err = errno;
  std::string why = fmt::format("prctl(PR_SCHED_CORE, PR_SCHED_CORE_CREATE) failed: {}", std::strerror(err));
  if (err == EINVAL) why += " (EINVAL: kernel built without CONFIG_SCHED_CORE, or too old)";
  else if (err == ENODEV) why += " (ENODEV: no SMT on this machine)";
  else if (err == EPERM) why += " (EPERM: not permitted)";
  return why;
}

/// Tries a cookie on a throwaway thread, so no thread we keep is tagged.
std::string kernel_probe() {
  std::string why;
  std::thread([&why] { why = kernel_tag_self(); }).join();
  return why;
}

std::string pin_self(unsigned cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof set, &set) == 0) return {};
  return fmt::format("sched_setaffinity(CPU {}) failed: {}", cpu, std::strerror(errno));
}

/// Runs one configuration as plain threads: each pins itself, tags itself when
/// its slot is tagged (so A and B differ: one prctl CREATE each), then loops.
Run run_threads(const Settings& s, const Place& p, MemoryBuffer& buf, const Config& c) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = after(start, s.time_s);
  std::string errs[2];
  auto prepare = [&p](const Slot& slot, std::string& err) {
    err = pin_self(p.cpus[slot.sibling]);
    if (err.empty() && slot.tag != 0) err = kernel_tag_self();
  };
  Run r;
  std::thread cpu([&] { prepare(c.cpu, errs[0]); r.cpu = cpu_loop(deadline, s.cpu_max_prime); });
  std::thread mem;
  if (c.mem) mem = std::thread([&] { prepare(*c.mem, errs[1]); r.mem = mem_loop(deadline, buf); });
  cpu.join();
  if (mem.joinable()) mem.join();
  for (const auto& e : errs)
    if (!e.empty()) throw std::runtime_error(e);
  r.elapsed_s = seconds(std::chrono::steady_clock::now() - start);
  r.cpu_elapsed_s = seconds(r.cpu.end - start);
  if (r.mem) r.mem_elapsed_s = seconds(r.mem->end - start);
  return r;
}

void report_kernel(const Settings& s, const std::vector<Row>& ours, const std::vector<Row>& kernel, JsonWriter& j) {
  std::printf("\nkernel core scheduling (PR_SCHED_CORE cookies, plain pinned threads):\n%s",
              render_rows(kernel, s.block_bytes).c_str());
  Table t({"config", "ours cpu ev/s", "kernel cpu ev/s", "ratio", "ours mem MiB/s", "kernel mem MiB/s", "ratio"});
  for (std::size_t i = 0; i < kernel.size() && i < ours.size(); ++i) {
    const auto om = ours[i].mem(s.block_bytes), km = kernel[i].mem(s.block_bytes);
    const std::optional<double> o_mem = om ? std::optional(om->avg) : std::nullopt;
    const std::optional<double> k_mem = km ? std::optional(km->avg) : std::nullopt;
    t.add_row({kernel[i].config->name, fixed(ours[i].cpu().avg, 2), fixed(kernel[i].cpu().avg, 2),
               fixed(ratio(ours[i].cpu().avg, kernel[i].cpu().avg), 3), fixed(o_mem, 1), fixed(k_mem, 1),
               fixed(ratio(o_mem, k_mem), 3)});
  }
  std::printf("\nours vs. kernel (ratio = ours / kernel):\n%s", t.render().c_str());
  std::fflush(stdout);
  j.key("kernel").begin_object().field("available", true).key("configs").begin_array();
  for (const auto& r : kernel) write_row(j, r, s);
  j.end_array().end_object();
}

} // namespace

void compare_sysbench(const Settings& s, const Place& p, const std::vector<Row>& ours, JsonWriter& j) {
  const auto sysbench = find_in_path("sysbench");
  const auto taskset = find_in_path("taskset");
  if (!sysbench || !taskset) {
    const std::string why = fmt::format("{} is not installed (not found in PATH)", sysbench ? "taskset" : "sysbench");
    std::printf("\nsysbench comparison skipped: %s\n", why.c_str());
    write_unavailable(j, "sysbench", why);
    return;
  }
  const SysbenchTools tools{*sysbench, *taskset};
  const SysbenchFigures theirs[2] = {sysbench_alone(tools, s, p), sysbench_nosmt(tools, s, p)};
  report_sysbench(s, ours, theirs, j);
}

void compare_kernel(const Settings& s, const Place& p, const Topology& t, MemoryBuffer& buffer,
                    const std::vector<Row>& ours, JsonWriter& j) {
  const std::string why = kernel_probe();
  if (!why.empty()) {
    std::printf("\nkernel comparison skipped: %s\n", why.c_str());
    write_unavailable(j, "kernel", why);
    return;
  }
  if (!t.real_siblings())
    std::printf("\nnote: CPUs %u and %u are not real SMT siblings (synthetic topology); kernel cookies will not "
                "keep them apart\n", p.cpus[0], p.cpus[1]);
  const auto kernel = run_rows("matrix/kernel", s, [&](const Config& c) { return run_threads(s, p, buffer, c); });
  report_kernel(s, ours, kernel, j);
}

} // namespace coresched::bench::matrix
