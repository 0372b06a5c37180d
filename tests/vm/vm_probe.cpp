// SPDX-License-Identifier: Apache-2.0
// Checks, on a machine (or guest) with real SMT siblings, what no synthetic topology can show:
//   coresched_vm_probe topology       Topology::discover("auto") reports REAL siblings, the same as sysfs
//   coresched_vm_probe binding        every worker runs on the CPU it was bound to, seen from fibers
//   coresched_vm_probe kernel-cookie  Options::kernel_cookie tags every worker thread (PR_SCHED_CORE_GET), and
//                                     the kernel then keeps an untagged process off a core our worker runs on
// Run by the ctest label `vm` inside scripts/smt-vm.sh; prints what it found and exits 1 on a failed check, 77
// (ctest's skip) when the machine has no SMT siblings or no core scheduling.
#include <coresched/coresched.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PR_SCHED_CORE
#define PR_SCHED_CORE 62
#endif
#ifndef PR_SCHED_CORE_GET
#define PR_SCHED_CORE_GET 0
#endif
#ifndef PR_SCHED_CORE_CREATE
#define PR_SCHED_CORE_CREATE 1
#endif

using namespace coresched;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "  ok  " : "  FAIL", what.c_str());
  if (!ok) ++failures;
}

// "0-1,4" -> {0, 1, 4}
std::set<unsigned> parse_cpu_list(const std::string& s) {
  std::set<unsigned> out;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (part.empty() || part == "\n") continue;
    const auto dash = part.find('-');
    const unsigned a = static_cast<unsigned>(std::stoul(part.substr(0, dash)));
    const unsigned b = dash == std::string::npos ? a : static_cast<unsigned>(std::stoul(part.substr(dash + 1)));
    for (unsigned c = a; c <= b; ++c) out.insert(c);
  }
  return out;
}

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::string to_string(const std::set<unsigned>& s) {
  std::string out;
  for (unsigned c : s) out += (out.empty() ? "" : ",") + std::to_string(c);
  return "{" + out + "}";
}

std::set<unsigned> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof set, &set);
  std::set<unsigned> out;
  for (unsigned c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.insert(c);
  return out;
}

// ---------------------------------------------------------------------------------------------------- topology
int topology() {
  const Topology t = Topology::discover("auto");
  std::printf("%s\n", t.describe().c_str());
  check(t.real_siblings(), "the topology's siblings are REAL (source: the machine, not synthetic or xml)");
  check(t.max_siblings() >= 2, "cores have " + std::to_string(t.max_siblings()) + " PUs (SMT)");
  const auto cpus = allowed_cpus();
  check(t.pus().size() == cpus.size(),
        std::to_string(t.pus().size()) + " PUs, one for each of the " + std::to_string(cpus.size()) + " CPUs we may use");
  std::set<unsigned> seen;
  for (const auto& core : t.cores()) {
    std::set<unsigned> ours;
    for (unsigned p : core.pus) {
      const auto& pu = t.pus()[p];
      ours.insert(pu.os_index);
      seen.insert(pu.cpu);
      if (pu.cpu != pu.os_index)
        check(false, "PU " + std::to_string(p) + " is bound to CPU " + std::to_string(pu.cpu) + ", not its OS index");
    }
    for (unsigned p : core.pus) {
      const unsigned cpu = t.pus()[p].os_index;
      const std::string path = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/thread_siblings_list";
      std::set<unsigned> sysfs = parse_cpu_list(read_line(path));
      std::set<unsigned> usable;  // siblings outside our affinity mask are not ours to use
      for (unsigned c : sysfs)
        if (cpus.count(c)) usable.insert(c);
      check(usable == ours, "core " + std::to_string(core.index) + ": CPU " + std::to_string(cpu) + " siblings " +
                                to_string(ours) + ", sysfs thread_siblings_list " + read_line(path));
    }
  }
  check(seen == cpus, "the PUs cover the allowed CPUs " + to_string(cpus) + " exactly once");
  return failures ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------------- binding
int binding() {
  Options o;
  o.topology = "auto";
  Runtime rt(o);
  const Topology& t = rt.topology();
  std::printf("%s\n", t.describe().c_str());
  struct Seen { unsigned pu, want_cpu; std::set<int> cpus; std::set<unsigned> affinity; unsigned location_cpu; };
  std::vector<Seen> seen(t.pus().size());
  std::vector<JoinHandle<void>> hs;
  for (const auto& pu : t.pus()) {
    Seen& s = seen[pu.index];
    s.pu = pu.index;
    s.want_cpu = pu.cpu;
    hs.push_back(rt.spawn([&s] {
      s.affinity = allowed_cpus();   // the worker thread's mask, read on it
      s.location_cpu = this_fiber::location().cpu;
      for (int i = 0; i < 200; ++i) {
        s.cpus.insert(sched_getcpu());
        const auto until = Clock::now() + 50us;
        while (Clock::now() < until) {}
        this_fiber::yield();
      }
    }, SpawnOptions{.pin_to_pu = pu.index}));
  }
  for (auto& h : hs) h.join();
  for (const auto& s : seen) {
    std::string cpus;
    for (int c : s.cpus) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
    check(s.cpus == std::set<int>{static_cast<int>(s.want_cpu)} && s.location_cpu == s.want_cpu &&
              s.affinity == std::set<unsigned>{s.want_cpu},
          "PU " + std::to_string(s.pu) + " bound to CPU " + std::to_string(s.want_cpu) + ": sched_getcpu() saw {" +
              cpus + "}, location().cpu " + std::to_string(s.location_cpu) + ", affinity " + to_string(s.affinity));
  }
  return failures ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------------- kernel cookie
std::uint64_t core_cookie_of(pid_t tid) {   // the kernel's hash of the cookie; 0 = none (or hash key not ready)
  std::uint64_t id = 0;
  if (prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET, tid, 0 /* PIDTYPE_PID */, &id) != 0) return ~0ull;
  return id;
}

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string sched_field(const std::string& path, const std::string& name) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(name, 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "n/a";
}

// An untagged process pinned to `cpu` spins for `seconds` once told to start, and reports its CPU time.
struct Rival {
  pid_t pid = -1;
  int go = -1, result = -1;
  Rival(unsigned cpu, double seconds) {
    int p1[2], p2[2];
    if (pipe(p1) != 0 || pipe(p2) != 0) return;
    pid = fork();
    if (pid == 0) {
      close(p1[1]);
      close(p2[0]);
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      sched_setaffinity(0, sizeof set, &set);
      char c;
      if (read(p1[0], &c, 1) != 1) _exit(1);
      const auto until = Clock::now() + std::chrono::duration<double>(seconds);
      while (Clock::now() < until) {}
      timespec ts{};
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
      const double s = static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
      if (write(p2[1], &s, sizeof s) != sizeof s) _exit(1);
      if (read(p1[0], &c, 1) < 0) _exit(1);   // wait until the parent has read /proc/PID/sched (a byte, not EOF:
                                              // a later rival holds a copy of our pipe's write end)
      _exit(0);
    }
    close(p1[0]);
    close(p2[1]);
    go = p1[1];
    result = p2[0];
  }
  void start() { (void)!write(go, "g", 1); }
  double finish() {
    double s = -1;
    if (read(result, &s, sizeof s) != sizeof s) s = -1;
    return s;
  }
  void reap() {
    (void)!write(go, "q", 1);
    close(go);
    waitpid(pid, nullptr, 0);
    close(result);
  }
};

// The CPU of core 0's second PU, where the rival spins.
unsigned sibling_cpu_of_core0(const Topology& t) { return t.pus()[t.cores()[0].pus[1]].cpu; }

// Our worker on PU 0 of core 0 runs a busy fiber for `seconds` while `rival`, an untagged process (forked before
// any kernel cookie existed in this process: a child inherits its parent's cookie), spins on the sibling's CPU.
// Returns (worker CPU + rival CPU) / wall: about 2 when the kernel lets them share the core, at most about 1
// when it keeps them apart (core scheduling: they never run at the same instant).
double co_run(Runtime& rt, Rival& rival, double seconds, bool print_sched) {
  const unsigned pu0 = rt.topology().cores()[0].pus[0];
  double worker_cpu = 0;
  pid_t worker_tid = 0;
  const auto t0 = Clock::now();
  rt.spawn([&] {
    worker_tid = static_cast<pid_t>(syscall(SYS_gettid));
    const double c0 = thread_cpu_s();
    rival.start();
    const auto until = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < until) this_fiber::preempt_point();
    worker_cpu = thread_cpu_s() - c0;
  }, SpawnOptions{.pin_to_pu = pu0}).join();
  const double rival_cpu = rival.finish();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("    rival's PR_SCHED_CORE_GET cookie %#llx\n", static_cast<unsigned long long>(core_cookie_of(rival.pid)));
  std::printf("    worker CPU %.2f s + untagged rival CPU %.2f s over %.2f s wall = %.2f\n", worker_cpu, rival_cpu,
              wall, (worker_cpu + rival_cpu) / wall);
  if (print_sched) {
    const std::string me = "/proc/self/task/" + std::to_string(worker_tid) + "/sched",
                      them = "/proc/" + std::to_string(rival.pid) + "/sched";
    std::printf("    core_forceidle_sum (ms): worker %s, rival %s\n", sched_field(me, "core_forceidle_sum").c_str(),
                sched_field(them, "core_forceidle_sum").c_str());
  }
  rival.reap();
  return (worker_cpu + rival_cpu) / wall;
}

int kernel_cookie() {
  // 1. May this kernel tag at all? And 2: PR_SCHED_CORE_GET does not return the cookie but a 32-bit hash of its
  // address (kernel/sched/core_sched.c: ptr_to_hashval(), the hash %p prints). Until the kernel has filled the
  // hash key it returns -EBUSY, GET ignores that and copies out 0: a tagged task reads 0. The key is filled by a
  // work item once the random pool is initialised (rng_is_initialized()), and that work retries every 2 s
  // (lib/vsprintf.c, fill_ptr_key_workfn), so right after boot, and for up to 2 s after the pool is ready, every
  // cookie reads 0 (smt-vm.sh gives the guest virtio-rng and random.trust_cpu=on, so the pool is ready early).
  // So: tag a throwaway thread and wait until its own cookie reads non-zero; only then is 0 a real "no cookie".
  {
    double waited = -1;
    bool pool_ready_at_start = false;
    std::thread t([&] {
      char b;
      pool_ready_at_start = getrandom(&b, 1, GRND_NONBLOCK) == 1;
      if (prctl(PR_SCHED_CORE, PR_SCHED_CORE_CREATE, 0, 0, 0) != 0) {
        std::printf("prctl(PR_SCHED_CORE, CREATE) failed: %s: no kernel core scheduling here\n", std::strerror(errno));
        std::exit(77);
      }
      const auto w0 = Clock::now();
      while (core_cookie_of(0) == 0 && Clock::now() - w0 < 60s) std::this_thread::sleep_for(10ms);
      if (core_cookie_of(0) != 0 && core_cookie_of(0) != ~0ull)
        waited = std::chrono::duration<double>(Clock::now() - w0).count();
    });
    t.join();
    std::printf("random pool %s at start; a tagged thread's PR_SCHED_CORE_GET read non-zero after %.2f s\n",
                pool_ready_at_start ? "ready" : "NOT ready", waited);
    check(waited >= 0, "the kernel's pointer-hash key is ready (else every PR_SCHED_CORE_GET reads 0)");
  }

  // 3. Baseline: no kernel cookie, the rival shares the core with our worker. Both rivals are forked now, while
  // this process has no cookie yet.
  const Topology machine = Topology::discover("auto");
  if (machine.cores()[0].pus.size() < 2) { std::printf("no SMT siblings: nothing to check\n"); return 77; }
  const unsigned rival_cpu = sibling_cpu_of_core0(machine);
  Rival rival_a(rival_cpu, 2.0), rival_b(rival_cpu, 2.0);
  double untagged;
  {
    Options o;
    o.topology = "auto";
    o.stall_threshold = 0ms;
    Runtime rt(o);
    std::printf("%s\n", rt.topology().describe().c_str());
    std::printf("without Options::kernel_cookie:\n");
    untagged = co_run(rt, rival_a, 2.0, false);
  }
  // 4. With the kernel cookie: every worker thread has it, and the rival never runs beside our worker.
  Options o;
  o.topology = "auto";
  o.stall_threshold = 0ms;
  o.kernel_cookie = true;
  std::printf("starting a runtime with Options::kernel_cookie\n");
  Runtime rt(o);
  const std::uint64_t main_cookie = core_cookie_of(0);
  std::printf("main thread cookie %#llx; reading the workers'\n", static_cast<unsigned long long>(main_cookie));
  std::vector<std::uint64_t> cookies(rt.topology().pus().size());
  {
    std::vector<JoinHandle<void>> hs;
    for (const auto& pu : rt.topology().pus())
      hs.push_back(rt.spawn([&cookies, i = pu.index] { cookies[i] = core_cookie_of(0); },
                            SpawnOptions{.pin_to_pu = pu.index}));
    for (auto& h : hs) h.join();
  }
  for (std::size_t i = 0; i < cookies.size(); ++i) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "%#llx", static_cast<unsigned long long>(cookies[i]));
    check(cookies[i] != 0 && cookies[i] != ~0ull && cookies[i] == main_cookie,
          "worker " + std::to_string(i) + " thread's PR_SCHED_CORE_GET cookie " + hex + " (non-zero, the process's)");
  }
  std::printf("with Options::kernel_cookie:\n");
  const double tagged = co_run(rt, rival_b, 2.0, true);
  if (untagged < 1.5)
    std::printf("note: the baseline %.2f < 1.5: the host gave the guest less than two CPUs, so this run shows less\n"
                "      than it could (exclusion is still checked: sharing would add the rival's CPU to ours)\n",
                untagged);
  check(tagged <= 1.2, "with the kernel cookie our worker and the untagged process never ran together (CPU/wall " +
                           std::to_string(tagged) + " <= 1.2; without it " + std::to_string(untagged) + ")");
  return failures ? 1 : 0;
}

} // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    if (what == "topology") return topology();
    if (what == "binding") return binding();
    if (what == "kernel-cookie") return kernel_cookie();
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: coresched_vm_probe topology|binding|kernel-cookie\n");
  return 2;
}
