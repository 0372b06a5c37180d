// SPDX-License-Identifier: Apache-2.0
// --compare-alternation: the hand-over figure's yardstick on this machine.
// `both tagged` asks how many cpu events a cookie gets per ms it holds the
// core, against a cpu fiber alone. Part of what it loses is not the runtime's:
// a CPU that sleeps through the other cookie's turn and then resumes runs
// slower for a while (on this VM the vCPU halts, and its caches and its host
// core go to others). To tell the two apart, two plain threads pinned to the
// same two CPUs take turns with no runtime at all: the cpu thread runs cpu
// events for a turn, hands over through a futex word and sleeps in the kernel
// until handed back, and the mem thread does the same with memory events. Its
// events per ms of turn, over a cpu thread running alone, is what an ideal
// scheduler that sleeps the waiting sibling could reach here.
#include "kernel_tag.hpp"
#include "matrix.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <linux/futex.h>
#include <stdexcept>
#include <string_view>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>

namespace coresched::bench::matrix {
namespace {

using Clock = std::chrono::steady_clock;

/// Whose turn it is, and a futex on it. Holders: 0 the cpu thread, 1 the mem
/// thread; kDone ends both.
class Baton {
public:
  static constexpr int kDone = 2;

  /// Sleeps until it is `me`'s turn or the end; returns false at the end.
  bool wait_for(int me) {
    for (;;) {
      const int v = word_.load(std::memory_order_acquire);
      if (v == me) return true;
      if (v == kDone) return false;
      ::syscall(SYS_futex, reinterpret_cast<int*>(&word_), FUTEX_WAIT_PRIVATE, v, nullptr, nullptr, 0);
    }
  }
  /// Hands the turn to `next` (or kDone) at `when`, and wakes the other.
  void hand(int next, Clock::time_point when) {
    handed_at_ = when;
    word_.store(next, std::memory_order_release);
    ::syscall(SYS_futex, reinterpret_cast<int*>(&word_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
  }
  /// When the turn now held was handed over (read by its holder only).
  Clock::time_point handed_at() const { return handed_at_; }

private:
  std::atomic<int> word_{0};
  Clock::time_point handed_at_{}; // written before the release store, read after the acquire load
};
static_assert(sizeof(std::atomic<int>) == sizeof(int), "the futex word is the atomic itself");

/// Runs `batch` (a loop_until with a deadline) in turns of `turn` until
/// `deadline` or an interrupt, adding the work of each. Returns the ns its
/// turns lasted, counted from the moment the other handed over, as the runtime
/// counts a cookie's hold on the core from the moment it changed.
template <class Batch>
std::uint64_t take_turns(Baton& baton, int me, Clock::time_point deadline, Clock::duration turn, Work& total,
                         Batch&& batch) {
  std::uint64_t held = 0;
  while (baton.wait_for(me)) {
    const auto start = baton.handed_at();
    const Work w = batch(std::min(Clock::now() + turn, deadline));
    total.events += w.events;
    total.checksum += w.checksum;
    total.end = w.end;
    total.thread_cpu_ns += w.thread_cpu_ns;
    held += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(w.end - start).count());
    baton.hand(w.end >= deadline || interrupted() ? Baton::kDone : 1 - me, w.end);
  }
  return held;
}

/// `Alone`: a cpu thread on sibling 0's CPU, without turns. `both tagged`:
/// the cpu and mem threads taking turns of one slice.
Run run_alternation(const Settings& s, const Place& p, MemoryBuffer& buf, const Config& c, Clock::duration turn) {
  const auto start = Clock::now();
  const auto deadline = after(start, s.time_s);
  std::string errs[2];
  Run r;
  r.siblings = p.siblings;
  if (!c.mem) {
    std::thread cpu([&] {
      errs[0] = pin_self(p.cpus[0]);
      r.cpu = cpu_loop(deadline, s.cpu_max_prime, s.sysbench_bookkeeping);
    });
    cpu.join();
  } else {
    Baton baton;
    baton.hand(0, start);
    std::uint64_t cpu_held = 0;
    Work mem_work;
    std::thread cpu([&] {
      errs[0] = pin_self(p.cpus[0]);
      cpu_held = take_turns(baton, 0, deadline, turn, r.cpu, [&](Clock::time_point until) {
        return cpu_loop(until, s.cpu_max_prime, s.sysbench_bookkeeping);
      });
    });
    std::thread mem([&] {
      errs[1] = pin_self(p.cpus[1]);
      take_turns(baton, 1, deadline, turn, mem_work, [&](Clock::time_point until) {
        return mem_loop(until, buf, s.sysbench_bookkeeping);
      });
    });
    cpu.join();
    mem.join();
    r.mem = mem_work;
    r.mem_elapsed_s = seconds(mem_work.end - start);
    r.cpu_owned_ns = cpu_held;
  }
  for (const auto& e : errs)
    if (!e.empty()) throw std::runtime_error(e);
  r.elapsed_s = seconds(Clock::now() - start);
  r.cpu_elapsed_s = seconds(r.cpu.end - start);
  return r;
}

} // namespace

Comparison alternation_comparison(const Settings& s, const Place& p, MemoryBuffer& buffer,
                                  std::chrono::microseconds slice) {
  Comparison c{"alternation", {}, {}, {}};
  Settings mine = s;
  mine.only.clear();
  mine.weights.reset(); // the turns are equal whatever --weights says: expect an even split
  for (const std::string_view name : {"Alone", "both tagged"})
    if (s.only.empty() || std::find(s.only.begin(), s.only.end(), name) != s.only.end()) mine.only.emplace_back(name);
  if (mine.only.size() < 2) {
    c.unavailable = "it needs both the Alone and the both tagged configurations (drop --config, or name both)";
    return c;
  }
  const Clock::duration turn = slice;
  c.way = Way{"matrix/alternation", mine, [s, p, &buffer, turn](const Config& cfg) {
                return run_alternation(s, p, buffer, cfg, turn);
              }};
  c.report = [s, mine, slice](const std::vector<Row>& ours, const std::vector<Row>& rows, JsonWriter& j) {
    // The alternation's rows carry the ns its cpu thread held its turns where
    // ours carry the ns the cookie held the core, so one function reads both.
    const auto their_rate = owned_rate(rows);
    const auto our_rate = owned_rate(ours);
    std::optional<double> theirs, ours_ratio;
    if (their_rate) theirs = their_rate->over_alone;
    if (our_rate) ours_ratio = our_rate->over_alone;
    std::printf("\nalternation without a runtime (two plain threads pinned to the same CPUs, turns of %lld us handed "
                "over through a futex, the waiting one asleep):\n%s",
                static_cast<long long>(slice.count()), render_rows(rows, s.block_bytes).c_str());
    if (theirs) std::printf("both tagged: cpu events per ms of its turn = %.3f of its Alone's per ms", *theirs);
    if (theirs && ours_ratio) std::printf("; ours (per ms its cookie held the core) over that: %.3f", *ours_ratio / *theirs);
    std::printf("\n");
    j.key("alternation").begin_object().field("available", true);
    j.field("turn_us", static_cast<std::uint64_t>(slice.count()));
    if (theirs) j.field("both_tagged_cpu_events_per_turn_ms_over_alone", *theirs);
    if (theirs && ours_ratio) j.field("ours_over_alternation", *ours_ratio / *theirs);
    j.key("configs").begin_array();
    for (const auto& r : rows) write_row(j, r, mine);
    j.end_array().end_object();
  };
  return c;
}

} // namespace coresched::bench::matrix
