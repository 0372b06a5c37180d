// SPDX-License-Identifier: Apache-2.0
// A deterministic discrete-event simulation of one core: the REAL
// CoreCoordinator, driven on a simulated clock (CoreConfig::clock) by models
// of what the workers (runtime/sched/worker.cpp) and the slice ticker
// (Scheduler::tick) do around it. Fake fibers are plain detail::Fiber records;
// "running" one means only that simulated time passes until its next
// scheduling point.
//
// What is modelled, and what is not:
// - A running fiber reaches its next preempt_point() a random latency after
//   its sibling's preempt flag is set (uniform over its own gap between
//   preempt points), and then yields: requeue_locked + pick_locked, as
//   Worker::yield. It parks (pick_locked, then a timer re-enqueues it, as
//   Scheduler::place), finishes (pick_locked), or calls set_cookie
//   (change_running_cookie_locked; yields if refused) at random times.
// - The ticker (Ticker, Scheduler::tick) ticks every slice/4 while fibers
//   wait behind a busy sibling and no sibling is forced idle, and for 8 ticks
//   after it last saw that or was asked to (Scheduler::want_fine_ticks: a
//   fiber queued behind another cookie with no forced-idle sibling); otherwise
//   every slice, a tick counting the quarter slices since the last. It stops
//   once no sibling has been busy for 64 quarter slices and restarts (fine)
//   when one starts a fiber. Its rule: a busy sibling that
//   has not switched for 4 quarter slices, or 2 while a sibling of the core
//   is forced idle, gets its preempt flag.
// - A forced-idle sibling going to sleep arms a timer for the end of the
//   owner's turn (turn_due_locked). When it fires (a timer latency later) it
//   asks the owner to stop (request_stop) and picks again, as
//   Worker::sleep_until_turn_end; an overdue turn's end is acted on once
//   (the real one then sleeps until the hand-over wakes it). A forced-idle
//   sibling that goes on with a fiber of the cookie that still owns the core
//   asks the ticker for its fine period if fibers are still queued
//   (Worker::leave_forced_idle).
// - Idle siblings follow Worker::find_work: re-pick while spinning (16
//   rounds, 256 while holding a spinner slot, at most half the idle PUs),
//   then sleep_once (pick, prepare_sleep_locked); a sibling whose wake word
//   the coordinator bumped (WakeList::notify) wakes after a random latency.
//   Spin rounds are batched (kRoundsPerStep picks' worth of time per re-pick):
//   nothing on the core changes between two events anyway. A sibling that
//   found work while more stays queued wakes a sleeping one
//   (Scheduler::wake_helper).
// - Every lock section is instantaneous and they are serialised, as the core
//   lock makes them.
// - The ticker's own wake-ups may come late (tick_late_max): it is a thread
//   on the CPUs the busy workers hold.
// - Not modelled: other cores (no stealing, no placement index: a woken fiber
//   goes to its pinned PU, its last PU or a random one), I/O, spawns from
//   fibers, run_inline joins, stall reports.
#pragma once

#include "core/core_coordinator.hpp"

#include <coresched/options.hpp>

#include <array>
#include <cstdint>
#include <deque>
#include <mutex>
#include <queue>
#include <string>
#include <vector>

namespace sim {

using namespace coresched::detail;
using coresched::FairnessPolicy;

/// splitmix64: small, fast, and the same sequence on every standard library.
class Rng {
public:
  explicit Rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi].
  std::uint64_t range(std::uint64_t lo, std::uint64_t hi) noexcept { return lo + next() % (hi - lo + 1); }
  bool chance(double p) noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }
  /// Exponentially distributed with the given mean, at least 1.
  std::uint64_t exp(std::uint64_t mean) noexcept;

private:
  std::uint64_t s_;
};

inline constexpr std::uint64_t kUs = 1'000;
inline constexpr std::uint64_t kSlice = 1'000 * kUs; // Options::slice's default
inline constexpr std::uint64_t kNever = ~std::uint64_t{0};
inline constexpr std::size_t kMaxCookies = 64; // simulated cookies are 0 .. 63

/// What a fake fiber does while it runs.
struct FiberSpec {
  std::uint64_t cookie = 1;
  int pinned = kNotPinned;         // a sibling index
  std::uint64_t pp_gap = 20 * kUs; // time between two of its preempt points (at most)
  std::uint64_t run_mean = 0;      // > 0: parks after ~this much running ...
  std::uint64_t sleep_mean = 0;    // ... for ~this long (a sleeper)
  std::uint64_t storm_mean = 0;    // > 0: set_cookie every ~this much running ...
  std::uint64_t storm_cookies = 0; // ... to one of cookies 1 .. storm_cookies
  std::uint64_t storm_first = 0;   // > 0: ... to the next of storm_first .. storm_cookies in turn instead
  bool exact = false;              // the means above are exact lengths, not exponential ones
};

/// Per cookie, what the simulation saw.
struct CookieLog {
  std::uint64_t owned_ns = 0;       // time some sibling published it
  std::uint64_t arrivals = 0;       // became runnable from absent
  std::uint64_t max_arrival_ns = 0; // worst time from arrival to owning the core
  std::uint64_t max_wait_ns = 0;    // worst stretch runnable (queued) but not owning the core
};

class CoreSim {
public:
  CoreSim(unsigned pus, FairnessPolicy policy, std::uint64_t seed);
  ~CoreSim();

  /// Adds a fiber that arrives (is enqueued) at `at`; returns its index.
  int add(const FiberSpec& spec, std::uint64_t at);
  /// The fiber finishes at its next scheduling point (queued: once it runs).
  void depart(int fiber);
  /// Simulates until `t`, or the first failure.
  void run_until(std::uint64_t t);
  /// Every fiber departs; true once all finished and every sibling sleeps, within `limit`.
  bool drain(std::uint64_t limit);

  std::uint64_t now() const noexcept;
  /// Simulated time since the start.
  std::uint64_t elapsed() const noexcept { return now() - t0_; }
  bool failed() const noexcept { return !failure_.empty(); }
  const std::string& failure() const noexcept { return failure_; }
  void fail(const std::string& what);
  void fail_bound(const std::string& what);

  // ---- checks ----
  /// (a): a cookie arriving beside one other must own the core within this
  /// (kNever: unchecked): the granularity, a tick slice (1.25 slices) and two
  /// preempt-point gaps of at most 0.1 slice each. Beside more cookies it may
  /// wait further turns, at most `turn` each (granularity + a tick slice +
  /// a gap + a wake-up): core_vruntime places it at the floor, level with the
  /// most-behind cookie, which may go first (one turn); forceidle_balance
  /// places it level with the owner, behind every cookie that waited longer
  /// (a turn for each other cookie but the owner).
  std::uint64_t arrival_bound = 2 * kSlice;
  std::uint64_t turn = 5 * kSlice / 2;
  /// A cookie with queued fibers must own the core within this.
  std::uint64_t wait_bound = kNever;
  /// (d): a queued fiber must run within this.
  std::uint64_t fiber_bound = 100 * kSlice;
  /// (d): the core may publish no cookie while fibers are queued for at most
  /// this: a hand-over's wake-up, not a lost one.
  std::uint64_t idle_bound = kSlice;
  /// Model Worker::leave_forced_idle's request for fine ticks (off: to
  /// measure what it is for).
  bool fine_ticks_on_leave = true;
  /// The ticker is a thread like any other: where the busy workers hold
  /// every CPU, the kernel runs its timer wake-up late, ms late at times
  /// (the wake-up granularity). > 0: each tick comes 0-50 us late, and one in
  /// ten up to this late. 0: on time.
  std::uint64_t tick_late_max = 0;
  /// Every wake-up of a sleeping sibling takes 100-300 us (a VM's, or a
  /// thread waiting for a CPU it shares with a busy one), longer than a
  /// light cookie's least turn.
  bool slow_wakes = false;
  /// Per cookie, overrides of wait_bound, for cookies of unequal weights; 0:
  /// wait_bound.
  std::array<std::uint64_t, kMaxCookies> wait_bound_of{};
  /// Per-slice ownership of cookies `a` and `b` from now on, for window checks.
  void track_pair(std::uint64_t a, std::uint64_t b) { track({a, b}); }
  /// (b): over every window of `window` slices tracked so far, both shares in
  /// 0.5 +- tol; stops tracking. Reports the worst share seen.
  void check_pair_windows(std::size_t window, double tol, double& worst);
  /// Per-slice ownership of up to kMaxTracked cookies from now on.
  void track(const std::vector<std::uint64_t>& cookies);
  static constexpr std::size_t kMaxTracked = 8;
  /// Over every window of `window` slices tracked so far, each tracked
  /// cookie's share of the time the tracked cookies owned the core is within
  /// `tol[i]` (relative) of `expected[i]` (tol[i] < 0: unchecked); stops
  /// tracking. Reports the worst |share / expected - 1| of the checked ones.
  void check_share_windows(std::size_t window, const std::vector<double>& expected, const std::vector<double>& tol,
                           double& worst);
  /// Forgets per-cookie logs (after a warm-up).
  void reset_logs() noexcept;

  const CookieLog& log(std::uint64_t cookie) const noexcept { return cookies_[cookie].log; }
  CoreCoordinator& core() noexcept { return core_; }
  std::uint64_t events() const noexcept { return events_; }
  /// The longest any fiber stayed queued before it ran.
  std::uint64_t max_fiber_wait() const noexcept { return max_fiber_wait_; }
  std::size_t fibers() const noexcept { return fibers_.size(); }
  /// How often a forced-idle sibling went on with a fiber of the cookie that
  /// still owned the core (it stopped waiting without a hand-over).
  std::uint64_t forced_took_owner() const noexcept { return forced_took_owner_; }
  bool done(int fiber) const noexcept { return fibers_[fiber].st == St::done; }

private:
  enum class St { pending, queued, running, parked, done };
  struct SimFiber {
    FiberSpec spec;
    St st = St::pending;
    std::uint64_t since = 0;      // queued or running since
    std::uint64_t burst_left = 0; // sleeper: running left before it parks
    std::uint64_t storm_left = 0; // storm: running left before its next set_cookie
    bool leaving = false;
  };
  enum class PuSt { running, spinning, asleep, waking };
  struct Pu {
    PuSt st = PuSt::spinning;
    int fiber = -1;
    std::uint64_t next = 0;                             // its next event (idle steps, wake-up)
    std::uint64_t notice_at = kNever, stop_at = kNever; // running: preempt noticed, voluntary stop
    std::uint64_t notice_from = 0; // running: the flag's notice is for a preemption point after this (repick_at)
    int rounds = 0;                                     // find_work's spin rounds
    bool spinning = false, idle = false, forced = false;
    std::uint32_t epoch = 0;                   // wake word when it went to sleep
    std::uint64_t turn_end = 0;                // asleep forced idle: the owner's turn's end its timer is for
    std::uint64_t turn_end_seen = 0;           // the last turn's end it acted on (Worker::turn_end_spun_)
    std::uint64_t blocker = kNoCookie;         // the cookie it asks to stop
    std::uint64_t switches = 0, tick_seen = 0; // what the ticker reads
    int ticks_same = 0;
  };
  struct CookieState {
    int queued = 0, running = 0; // fibers, as the simulation sees them
    std::uint64_t arrived = kNever, deadline = kNever, waiting_since = kNever;
    CookieLog log;
  };
  struct Timer {
    std::uint64_t at, seq;
    int fiber;
    bool operator>(const Timer& o) const noexcept { return at != o.at ? at > o.at : seq > o.seq; }
  };
  struct Trace {
    std::uint64_t t;
    int pu, what, fiber;
    std::uint64_t cookie;
  };

  // lock sections, as the worker runs them
  void notify(WakeList& w);
  Pick pick(unsigned s);
  void place(int f);
  void yield(unsigned s);
  void stop(unsigned s, bool park);
  void set_cookie(unsigned s);
  void after_pick(unsigned s, const Pick& p);
  void start(unsigned s, int f);
  void find_work(unsigned s);
  void wake_helper(unsigned from);
  void pu_event(unsigned s);
  void tick();
  void turn_end_timer(unsigned s);
  void want_fine_ticks();
  // bookkeeping
  void queued(int f);
  void unqueued(int f);
  void set_running(int f, unsigned s);
  void advance(std::uint64_t t);
  void observe();
  void check_fibers();
  void schedule_notices();
  void set_idle(unsigned s, bool on);
  std::uint64_t wake_latency() noexcept;
  std::uint64_t tick_lateness() noexcept;
  std::uint64_t notice_latency(const SimFiber& f) noexcept;
  std::uint64_t length(std::uint64_t mean, bool exact) noexcept; // a run, sleep or storm length
  void trace(unsigned pu, int what, int fiber);

  Rng rng_;
  CoreCoordinator core_;
  // Single-threaded: every step runs under the core lock, as a worker's do
  // (the coordinator checks it holds where the lock is required).
  std::unique_lock<SpinLock> held_{core_.lock()};
  unsigned n_;
  FairnessPolicy policy_;
  std::uint64_t t0_ = 0;      // when the simulation began
  std::deque<Fiber> records_; // stable addresses; Fiber::id is the index
  std::vector<SimFiber> fibers_;
  std::array<Pu, kMaxPusPerCore> pus_{};
  std::array<CookieState, kMaxCookies> cookies_{};
  std::priority_queue<Timer, std::vector<Timer>, std::greater<>> timers_;
  std::uint64_t timer_seq_ = 0, next_tick_ = 0, events_ = 0, max_fiber_wait_ = 0, forced_took_owner_ = 0;
  std::uint64_t next_check_ = 0;                 // the bounds are checked every quarter slice
  std::uint64_t last_tick_ = 0;
  bool tick_fine_ = true, tick_stopped_ = false; // the ticker's period, as Ticker keeps it
  int tick_hold_ = 8;                            // Ticker::kFineHold
  unsigned tick_idle_units_ = 0;
  int queued_total_ = 0, idle_count_ = 0, spinners_ = 0;
  std::uint64_t published_ = kNoCookie;
  std::uint64_t idle_since_ = kNever; // no cookie published while fibers are queued, since
  std::vector<std::uint64_t> tracked_;
  std::uint64_t track_start_ = 0;
  std::vector<std::array<std::uint32_t, kMaxTracked>> track_slices_;
  /// Sums over each window of `window` complete slices tracked: calls
  /// f(first slice, sums) per window.
  template <class F> void for_windows(std::size_t window, F&& f);
  std::array<Trace, 64> trace_{};
  std::size_t trace_n_ = 0;
  std::string failure_;
  std::uint64_t event_burst_ = 0, burst_at_ = 0;
};

} // namespace sim
