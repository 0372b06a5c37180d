// SPDX-License-Identifier: Apache-2.0
// The matrix's two yardsticks: the real sysbench (is our work loop as fast as
// theirs?) and the kernel's own core scheduling (PR_SCHED_CORE) on plain threads.
#include "kernel_tag.hpp"
#include "matrix.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sched.h>
#include <dirent.h>
#include <fstream>
#include <map>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
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

// ------------------------------------------------------------------ sysbench, tagged by the kernel

/// coresched-tag-exec, beside this program (the build tree, or an install's bin/), else in PATH.
std::optional<std::string> find_tag_exec() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    std::string dir(self, static_cast<std::size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    const std::string file = dir + "/coresched-tag-exec";
    if (::access(file.c_str(), X_OK) == 0) return file;
  }
  return find_in_path("coresched-tag-exec");
}

/// One sysbench process started through coresched-tag-exec: its output, exit status and forced idle, read from
/// /proc/PID/sched after it exited but before it is reaped (waitid WNOWAIT), so the whole run counts.
class TaggedProcess {
public:
  explicit TaggedProcess(std::vector<std::string> argv) : argv_(std::move(argv)) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      ::close(fds[1]);
      std::vector<char*> args;
      for (auto& a : argv_) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      std::fprintf(stderr, "cannot execute %s: %s\n", args[0], std::strerror(errno));
      ::_exit(127);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  TaggedProcess(const TaggedProcess&) = delete;
  TaggedProcess& operator=(const TaggedProcess&) = delete;
  ~TaggedProcess() { if (pid_ > 0) ::waitpid(pid_, nullptr, 0); if (fd_ >= 0) ::close(fd_); }

  std::string command() const {
    std::string c;
    for (const auto& a : argv_) c += (c.empty() ? "" : " ") + a;
    return c;
  }
  /// Reads the outputs of `ps` to their ends and waits for them; false (with `err`) if one could not start or
  /// failed. Meanwhile every 50 ms it samples core_forceidle_sum of each of their threads
  /// (/proc/PID/task/TID/sched: /proc/PID/sched is the main thread's alone, and sysbench works on another), so
  /// `forceidle` misses at most the last 50 ms of a worker thread's run. After an interrupt it ends them
  /// (SIGTERM) instead of waiting out their run.
  static bool finish_all(const std::vector<TaggedProcess*>& ps, std::string& err) {
    for (auto* p : ps)
      if (p->pid_ <= 0 || p->fd_ < 0) { err = fmt::format("cannot start `{}`: {}", p->command(), std::strerror(errno)); return false; }
    bool ended = false;
    for (;;) {
      std::vector<pollfd> fds;
      for (auto* p : ps)
        if (p->fd_ >= 0) fds.push_back({p->fd_, POLLIN, 0});
      if (fds.empty()) break;
      if (!ended && interrupted()) {
        for (auto* p : ps) ::kill(p->pid_, SIGTERM);
        ended = true;
      }
      ::poll(fds.data(), fds.size(), 50);
      for (auto* p : ps) {
        p->sample();
        if (p->fd_ < 0) continue;
        pollfd one{p->fd_, POLLIN, 0};
        if (::poll(&one, 1, 0) <= 0) continue;
        char buf[4096];
        const ssize_t n = ::read(p->fd_, buf, sizeof buf);
        if (n > 0) p->out.append(buf, static_cast<std::size_t>(n));
        else { ::close(p->fd_); p->fd_ = -1; }
      }
    }
    bool ok = true;
    for (auto* p : ps) {
      siginfo_t info{};
      ::waitid(P_PID, static_cast<id_t>(p->pid_), &info, WEXITED | WNOWAIT);
      p->sample();
      int status = 0;
      ::waitpid(std::exchange(p->pid_, -1), &status, 0);
      if (!p->by_thread_.empty()) {
        double sum = 0;
        for (const auto& [tid, ms] : p->by_thread_) sum += ms;
        p->forceidle = sum;
      }
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
      err = fmt::format("`{}` failed (status {}): {}", p->command(), status,
                        p->out.substr(p->out.size() > 400 ? p->out.size() - 400 : 0));
      ok = false;
    }
    return ok;
  }
  std::string out;
  std::optional<double> forceidle;

private:
  void sample() {
    if (pid_ <= 0) return;
    const std::string dir = "/proc/" + std::to_string(pid_) + "/task";
    DIR* d = ::opendir(dir.c_str());
    if (!d) return;
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      if (const auto ms = forceidle_ms(dir + "/" + e->d_name + "/sched")) by_thread_[e->d_name] = *ms;
    }
    ::closedir(d);
  }
  std::vector<std::string> argv_;
  pid_t pid_ = -1;
  int fd_ = -1;
  std::map<std::string, double> by_thread_;
};

struct TaggedTools {
  std::string sysbench, tag_exec;
};

/// sysbench takes whole seconds (--time is an integer).
unsigned sysbench_seconds(const Settings& s) { return std::max(1u, static_cast<unsigned>(s.time_s + 0.5)); }

std::vector<std::string> tagged_cmd(const TaggedTools& t, const Place& p, const Slot& slot, const Settings& s,
                                    bool memory) {
  std::vector<std::string> a{t.tag_exec, "--cpu", std::to_string(p.cpus[slot.sibling])};
  if (slot.tag == 0) a.emplace_back("--untagged");
  a.insert(a.end(), {"--", t.sysbench});
  const std::string time = fmt::format("--time={}", sysbench_seconds(s));
  if (memory)
    a.insert(a.end(), {"memory", "--threads=1", time, fmt::format("--memory-block-size={}", s.block_bytes),
                       "--memory-total-size=100T", "--memory-scope=global", "--memory-oper=write",
                       "--memory-access-mode=seq", "run"});
  else
    a.insert(a.end(), {"cpu", "--threads=1", time, fmt::format("--cpu-max-prime={}", s.cpu_max_prime), "run"});
  return a;
}

/// One configuration as two real sysbench processes: pinned to the slots' CPUs, tagged with a new kernel cookie
/// each where the slot is tagged (so A and B differ), started together.
Run run_sysbench(const TaggedTools& t, const Settings& s, const Place& p, const Config& c) {
  TaggedProcess cpu(tagged_cmd(t, p, c.cpu, s, false));
  std::optional<TaggedProcess> mem;
  if (c.mem) mem.emplace(tagged_cmd(t, p, *c.mem, s, true));
  std::string err;
  std::vector<TaggedProcess*> ps{&cpu};
  if (mem) ps.push_back(&*mem);
  if (!TaggedProcess::finish_all(ps, err)) {
    if (interrupted()) return Run{}; // ended by us: run_ways() leaves it out
    throw std::runtime_error(err);
  }
  Run r;
  r.siblings = p.siblings;
  r.thread_times = false; // separate processes: their loops' thread times are not ours to read
  auto events = [](const std::string& out, std::string_view marker) {
    return static_cast<std::uint64_t>(number_after(out, marker).value_or(0));
  };
  r.cpu.events = events(cpu.out, "total number of events:");
  r.cpu_elapsed_s = number_after(cpu.out, "total time:").value_or(s.time_s);
  r.elapsed_s = r.cpu_elapsed_s;
  double fi = cpu.forceidle.value_or(0);
  if (mem) {
    r.mem = Work{};
    r.mem->events = events(mem->out, "Total operations:");
    r.mem_elapsed_s = number_after(mem->out, "total time:").value_or(s.time_s);
    r.elapsed_s = std::max(r.elapsed_s, r.mem_elapsed_s);
    fi += mem->forceidle.value_or(0);
  }
  if (cpu.forceidle) r.forced_idle_ns = static_cast<std::uint64_t>(fi * 1e6);
  return r;
}

/// Prints a table of ours beside `theirs`, row by row: cpu and mem averages and ratio ours / theirs.
void print_ratio_table(const char* title, const char* who, const Settings& s, const std::vector<Row>& ours,
                       const std::vector<Row>& theirs) {
  Table t({"config", "ours cpu ev/s", fmt::format("{} cpu ev/s", who), "ratio", "ours mem MiB/s",
           fmt::format("{} mem MiB/s", who), "ratio"});
  for (const auto& th : theirs) {
    const Row* o = find_row(ours, th.config->name);
    if (!o) continue;
    const auto om = o->mem(s.block_bytes), km = th.mem(s.block_bytes);
    const std::optional<double> o_mem = om ? std::optional(om->avg) : std::nullopt;
    const std::optional<double> k_mem = km ? std::optional(km->avg) : std::nullopt;
    t.add_row({th.config->name, fixed(o->cpu().avg, 2), fixed(th.cpu().avg, 2),
               fixed(ratio(o->cpu().avg, th.cpu().avg), 3), fixed(o_mem, 1), fixed(k_mem, 1), fixed(ratio(o_mem, k_mem), 3)});
  }
  std::printf("\n%s:\n%s", title, t.render().c_str());
  std::fflush(stdout);
}

// ------------------------------------------------------------------ kernel

std::string kernel_tag_self() { return kernel_tag(KernelTagScope::thread); }

/// Tries a cookie on a throwaway thread, so no thread we keep is tagged.
std::string kernel_probe() {
  std::string why;
  std::thread([&why] { why = kernel_tag_self(); }).join();
  return why;
}

/// Tries the tenants' nice values on a throwaway thread, so that a run that
/// cannot weight the kernel's threads (a negative nice without root) says so
/// before any run, not after ours; "" or why not.
std::string nice_probe(const Settings& s) {
  std::string why;
  for (const int nice : kernel_nices_for_weights(s.weight(0), s.weight(1)))
    if (nice != 0 && why.empty()) std::thread([&why, nice] { why = set_own_nice(nice); }).join();
  return why;
}

/// Runs one configuration as plain threads: each pins itself, tags itself when
/// its slot is tagged (so A and B differ: one prctl CREATE each), takes its
/// tenant's nice value where the two compete for the core (as our weights
/// apply only there: elsewhere, in nosmt, a nice would split the one CPU
/// unevenly where our fibers take even turns), then loops. The threads are
/// new each run, so no nice outlives its run.
Run run_threads(const Settings& s, const Place& p, MemoryBuffer& buf, const Config& c) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = after(start, s.time_s);
  std::string errs[2];
  const auto nices = kernel_nices_for_weights(s.weight(0), s.weight(1));
  auto prepare = [&p, &c, nices](const Slot& slot, unsigned role, std::string& err) {
    err = pin_self(p.cpus[slot.sibling]);
    if (err.empty() && slot.tag != 0) err = kernel_tag_self();
    if (err.empty() && competes(c) && nices[role] != 0) err = set_own_nice(nices[role]);
  };
  Run r;
  std::optional<double> idle[2];   // each thread's core_forceidle_sum, read on it as its loop ends
  std::thread cpu([&] {
    prepare(c.cpu, 0, errs[0]);
    const auto before = own_forceidle_ms();
    r.cpu = cpu_loop(deadline, s.cpu_max_prime, s.sysbench_bookkeeping);
    if (const auto after = own_forceidle_ms(); before && after) idle[0] = *after - *before;
  });
  std::thread mem;
  if (c.mem) mem = std::thread([&] {
    prepare(*c.mem, 1, errs[1]);
    const auto before = own_forceidle_ms();
    r.mem = mem_loop(deadline, buf, s.sysbench_bookkeeping);
    if (const auto after = own_forceidle_ms(); before && after) idle[1] = *after - *before;
  });
  cpu.join();
  if (mem.joinable()) mem.join();
  for (const auto& e : errs)
    if (!e.empty()) throw std::runtime_error(e);
  r.elapsed_s = seconds(std::chrono::steady_clock::now() - start);
  r.cpu_elapsed_s = seconds(r.cpu.end - start);
  if (r.mem) r.mem_elapsed_s = seconds(r.mem->end - start);
  r.siblings = p.siblings;
  if (idle[0]) r.forced_idle_ns = static_cast<std::uint64_t>((*idle[0] + idle[1].value_or(0)) * 1e6);
  return r;
}

} // namespace

void write_unavailable(JsonWriter& j, std::string_view key, const std::string& why) {
  j.key(key).begin_object().field("available", false).field("reason", why).end_object();
}

Comparison sysbench_comparison(const Settings& s, const Place& p) {
  Comparison c{"sysbench", {}, {}, {}};
  const auto sysbench = find_in_path("sysbench");
  const auto tag_exec = find_tag_exec();
  if (!sysbench || !tag_exec) {
    c.unavailable = fmt::format("{} not found", sysbench ? "coresched-tag-exec (built beside coresched-bench)"
                                                         : "sysbench is not installed:");
    return c;
  }
  Settings only = s;
  only.time_s = sysbench_seconds(s);
  const std::string why = kernel_probe();
  if (!why.empty()) {
    std::printf("note: %s: sysbench runs the untagged configurations only\n", why.c_str());
    only.only.clear();
    for (const auto& cfg : configs)
      if (selected(s, cfg) && cfg.cpu.tag == 0 && (!cfg.mem || cfg.mem->tag == 0)) only.only.emplace_back(cfg.name);
  }
  if (only.time_s != s.time_s) std::printf("note: sysbench takes whole seconds: its runs last %g s\n", only.time_s);
  const TaggedTools tools{*sysbench, *tag_exec};
  std::printf("sysbench: e.g. %s\n", fmt::format("{} --cpu {} -- {} cpu --threads=1 --time={} --cpu-max-prime={} run",
                                                   tools.tag_exec, p.cpus[0], tools.sysbench, sysbench_seconds(s),
                                                   s.cpu_max_prime).c_str());
  std::fflush(stdout);
  c.way = Way{"matrix/sysbench", only, [tools, only, p](const Config& cfg) { return run_sysbench(tools, only, p, cfg); }};
  const bool tagged = why.empty();
  c.report = [s, tagged, secs = sysbench_seconds(s)](const std::vector<Row>& ours, const std::vector<Row>& rows,
                                                     JsonWriter& j) {
    std::printf("\nsysbench processes (pinned; kernel core-scheduling cookies where tagged; forced idle = their "
                "core_forceidle_sum):\n%s", render_rows(rows, s.block_bytes).c_str());
    print_ratio_table("ours vs. sysbench (ratio = ours / sysbench)", "sysbench", s, ours, rows);
    j.key("sysbench").begin_object().field("available", true).field("kernel_cookies", tagged);
    j.field("time_s", secs).key("configs").begin_array();
    for (const auto& r : rows) write_row(j, r, s);
    j.end_array().end_object();
  };
  return c;
}

Comparison kernel_comparison(const Settings& s, const Place& p, const Topology& t, MemoryBuffer& buffer) {
  Comparison c{"kernel", kernel_probe(), {}, {}};
  if (c.unavailable.empty()) c.unavailable = nice_probe(s);
  if (!c.unavailable.empty()) return c;
  if (!t.real_siblings())
    std::printf("note: CPUs %u and %u are not real SMT siblings (synthetic topology); kernel cookies will not "
                "keep them apart\n", p.cpus[0], p.cpus[1]);
  c.way = Way{"matrix/kernel", s, [s, p, &buffer](const Config& cfg) { return run_threads(s, p, buffer, cfg); }};
  c.report = [s](const std::vector<Row>& ours, const std::vector<Row>& rows, JsonWriter& j) {
    std::printf("\nkernel core scheduling (PR_SCHED_CORE cookies, plain pinned threads):\n%s",
                render_rows(rows, s.block_bytes).c_str());
    print_ratio_table("ours vs. kernel (ratio = ours / kernel)", "kernel", s, ours, rows);
    if (const auto shares = render_shares(s, ours, &rows); !shares.empty()) std::printf("\n%s", shares.c_str());
    const auto nices = kernel_nices_for_weights(s.weight(0), s.weight(1));
    j.key("kernel").begin_object().field("available", true);
    j.key("nice").begin_object().field("cpu", nices[0]).field("mem", nices[1]).end_object();
    j.key("configs").begin_array();
    for (const auto& r : rows) write_row(j, r, s);
    j.end_array().end_object();
  };
  return c;
}

} // namespace coresched::bench::matrix
