// SPDX-License-Identifier: Apache-2.0
// Runs a fuzz program on a Runtime (or two) of its own: rivals beside its root
// fibers, shutdown once every fiber has settled, then the checks of the whole
// run (each fiber ran once and finished, no oracle overlap, no FiberLocal left).
#include "fuzz_execution.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fcntl.h>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace fuzz {

Outcome Execution::Impl::run() {
  {
    std::lock_guard lk(rt_mu);
    Options opts = p.options;
    opts.stack_size *= kStackFactor;
    opts.cpus = p.cpus[0];
    rt = std::make_unique<Runtime>(opts);
    if (!p.cpus[1].empty()) {
      opts.cpus = p.cpus[1];
      rt2 = std::make_unique<Runtime>(opts);
    }
  }
  machine = rt2 ? Topology::discover(p.options.topology) : rt->topology();
  oracle = std::make_unique<Oracle>(*machine);
  oracle->prime(*rt);
  if (rt2) oracle->prime(*rt2);
  if (::pipe2(idle_pipe, O_CLOEXEC) != 0) fail("pipe2 failed");
  std::atomic<bool> rivals_stop{false};
  std::vector<JoinHandle<void>> rivals;
  for (std::size_t k = 0; k < p.rivals.size(); ++k) {
    const Cookie c = p.cookies[static_cast<std::size_t>(p.rivals[k].cookie)];
    rivals.push_back(rt->spawn([this, c, k, &rivals_stop] {
      Scope s(*oracle, c, "fuzz rival");
      for (unsigned n = 0; !rivals_stop.load(std::memory_order_relaxed); ++n) {
        s.burn(std::chrono::microseconds(10 + 10 * ((n + k) % 4)));
        if (n % 3 == 2) s.preempt_point();
        else s.yield();
      }
    }, SpawnOptions{.cookie = c, .pin_to_pu = p.rivals[k].pin}));
  }
  std::vector<Pending> joined;
  for (const auto& root : p.roots) {
    auto h = spawn_fiber(root.fiber, expected_cookie(root.fiber, nullptr), nullptr, !root.joined);
    if (root.joined) joined.push_back({root.fiber, std::move(h)});
  }
  for (auto& x : joined) check_join(nullptr, -1, x.h, x.child, value_of(x.child)); // from a plain thread
  // Shutdown refuses new spawns, so it comes only once every fiber has
  // finished but those left waiting for it (the watchdog guards this loop).
  auto settled = [&] {
    for (std::size_t i = 0; i < p.fibers.size(); ++i)
      if (!recs[i].done.load() && !(p.fibers[i].long_wait != LongWait::none && recs[i].long_waiting.load())) return false;
    return true;
  };
  while (!settled()) std::this_thread::sleep_for(200us);
  if (const std::string e = room->settle(); !e.empty()) fail(e); // every select has returned
  rivals_stop.store(true);
  for (auto& r : rivals) r.join();
  std::this_thread::sleep_for(2ms); // the waiters announced themselves just before waiting
  rt->shutdown();
  if (rt2) rt2->shutdown();
  for (int fd : idle_pipe) ::close(fd);
  for (std::size_t i = 0; i < p.fibers.size(); ++i) {
    const int i2 = static_cast<int>(i);
    if (recs[i].runs.load() != 1) fail(who(i2) + " ran " + std::to_string(recs[i].runs.load()) + " times");
    else if (!recs[i].done.load()) fail(who(i2) + " did not finish");
  }
  if (oracle->violations.load() || oracle->slot_mismatches.load()) fail(oracle->report());
  if (locals_gone.load() != locals_made.load())
    fail(std::to_string(locals_made.load()) + " FiberLocal values were made and " + std::to_string(locals_gone.load()) +
         " destroyed");
  Outcome o;
  o.failure_count = failure_count.load();
  std::unique_lock lk(fail_mu);
  o.failures = failures;
  o.fibers = p.fibers.size();
  o.events = events.load();
  o.oracle_checks = oracle->checks.load();
  room->count(o.selects);
  return o;
}

std::string Execution::Impl::pending() const {
  std::string s;
  int listed = 0;
  for (std::size_t i = 0; i < p.fibers.size(); ++i) {
    const Rec& r = recs[i];
    if (r.done.load()) continue;
    if (++listed > 40) {
      s += "  ...\n";
      break;
    }
    const FiberSpec& f = p.fibers[i];
    const int op = r.op.load();
    std::string at = r.runs.load() == 0 ? "never started"
                     : op == -2         ? "joining its children / role action / final wait"
                     : op >= 0          ? "in op " + std::to_string(op) + " (" + to_string(f.ops[static_cast<std::size_t>(op)].kind) + ")"
                                        : "starting";
    if (const int line = r.line.load(); line >= SelectRoom::kSelectLine)
      at += ", waiting at fuzz_select.cpp:" + std::to_string(line - SelectRoom::kSelectLine);
    else if (line) at += ", waiting at fuzz_execute.cpp:" + std::to_string(line);
    if (r.long_waiting.load()) at += ", waiting for shutdown";
    s += "  " + who(static_cast<int>(i)) + " cookie " + std::to_string(r.cookie.load()) + ": " + at + "\n";
  }
  return s.empty() ? "  (every fiber finished)\n" : s;
}

Execution::Execution(const Program& p) : impl_(std::make_unique<Impl>(p)) {}
Execution::~Execution() = default;
Outcome Execution::run() { return impl_->run(); }
std::string Execution::pending() const { return impl_->pending(); }
std::string Execution::stats() const {
  std::lock_guard lk(impl_->rt_mu);
  if (!impl_->rt) return "(no runtime yet)\n";
  return impl_->rt->stats().to_table() + (impl_->rt2 ? "second runtime:\n" + impl_->rt2->stats().to_table() : "");
}

void Execution::dump(std::FILE* out) const {
  std::lock_guard lk(impl_->rt_mu);
  if (impl_->rt) impl_->rt->dump(out);
  if (impl_->rt2) impl_->rt2->dump(out);
}

} // namespace fuzz
