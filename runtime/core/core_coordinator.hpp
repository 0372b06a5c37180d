// SPDX-License-Identifier: Apache-2.0
// The per-core coordinator: one per physical core, shared by the workers of its
// sibling PUs. It owns their run queues under one lock (as the kernel's
// core-wide runqueue lock does) and makes the core-wide pick: which cookie the
// core runs next, and which fiber each sibling runs, or that it is forced idle.
//
// Invariant (isolation): two siblings never publish different cookies in
// `running` at the same time. A sibling publishes a cookie only under the lock
// and only when every other sibling runs nothing or that same cookie; a sibling
// clears its cookie only after its fiber stopped. The cookie hand-over therefore
// has no overlap window: the new cookie starts after the old one stopped.
#pragma once

#include "platform/clock.hpp"
#include "platform/gap_histogram.hpp"
#include "fiber/run_queue.hpp"
#include "fiber/spawn_ring.hpp"
#include "platform/spin_lock.hpp"

#include <coresched/options.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <unordered_map>
#include <vector>

namespace coresched::detail {

/// "No fiber running" in Sibling::running.
inline constexpr std::uint64_t kNoCookie = std::numeric_limits<std::uint64_t>::max();

struct Sibling;

/// Most PUs one core may have (the Scheduler refuses bigger cores with a
/// TopologyError). SMT-8 is the widest shipping today.
inline constexpr std::size_t kMaxPusPerCore = 64;

class CoreCoordinator;

/// Sleeping siblings to wake once the core lock is released. Every list holds
/// siblings of one core, each at most once (a sibling is added only as its
/// `sleeping` flag is cleared): a bit per sibling, so none is ever dropped
/// (with fewer slots a 16-PU core would lose wake-ups and hang at shutdown).
/// Bits, not pointers: a list lives on the caller's stack in most of the
/// runtime's paths (a pick, a wake-up, a spawn), and 64 pointers made each of
/// those frames half a kilobyte of the running fiber's stack.
class WakeList {
public:
  void add(CoreCoordinator& core, unsigned sibling) noexcept {
    core_ = &core;
    sleepers_ |= std::uint64_t{1} << sibling;
  }
  /// Bumps each sibling's wake word and wakes its worker; call after unlocking.
  void notify() noexcept;
  bool empty() const noexcept { return sleepers_ == 0; }

private:
  CoreCoordinator* core_ = nullptr;
  std::uint64_t sleepers_ = 0; // bit s: sibling s of core_
};
static_assert(kMaxPusPerCore <= 64, "WakeList keeps a bit per sibling");

class Reactor;

/// A flag written only under the core lock. Read under it too, except by a
/// spawner deciding whether a single-PU worker needs waking
/// (Scheduler::wake_helper, Help::spawned), which reads it without the lock.
/// The worker sets it before the seq_cst fence in Worker::sleep_once and then
/// reads the other cores' queued counts; the spawner adds to its count
/// (seq_cst) and then reads this (seq_cst). In the one total order of seq_cst
/// operations and fences, either the read comes after the fence and sees
/// `true`, or the add comes before it and the worker sees the count.
class LockedFlag {
public:
  operator bool() const noexcept { return v_.load(std::memory_order_relaxed); }
  LockedFlag& operator=(bool b) noexcept {
    v_.store(b, std::memory_order_relaxed);
    return *this;
  }
  bool read_unlocked() const noexcept { return v_.load(std::memory_order_seq_cst); }

private:
  std::atomic<bool> v_{false};
};

/// The per-PU part of a core's state.
class CoreCoordinator;

/// The cookie a sibling publishes: that of the fiber it runs or is about to
/// start, kNoCookie while it runs none. Isolation rests on it: a sibling may
/// publish a cookie only while every other sibling of its core publishes that
/// cookie or none. Anyone reads it; only CoreCoordinator writes it, through
/// publish_locked and publish_single_pu (the rule and its one exemption).
class PublishedCookie {
public:
  std::uint64_t load(std::memory_order o = std::memory_order_acquire) const noexcept { return v_.load(o); }

private:
  friend class CoreCoordinator;
  // Release: a sibling that reads the cookie (acquire) sees what the
  // publisher did before it. Unchanged values are not stored again (the
  // single-PU fast path republishes at every switch).
  void store(std::uint64_t cookie) noexcept {
    if (v_.load(std::memory_order_relaxed) != cookie) v_.store(cookie, std::memory_order_release);
  }
  std::atomic<std::uint64_t> v_{kNoCookie};
};

struct Sibling {
  unsigned worker = 0;  // global worker index
  RunQueue queue;       // guarded by the core lock
  PublishedCookie running; // written by CoreCoordinator only (publish_locked, publish_single_pu)
  std::atomic<bool> preempt{false};     // asks the running fiber to yield at its next preempt_point (ask_preempt)
  // Set with `preempt` when the owner keeps the core only until a waiting
  // cookie is due: by a pick that kept it for the rest of its least turn, or
  // while the waiting one does not lead yet (pick_locked), and by an arrival
  // that does not lead yet (preempt_owner_for). A preemption point before
  // this time (ns) runs on without the lock (Worker::preempt). 0: none. Any
  // other request clears it (ask_preempt).
  std::atomic<std::uint64_t> repick_at{0};
  std::atomic<bool> wake_waits{false};  // a fiber woken here waits for the next tick to preempt the runner (Arrival::collected)
  std::atomic<std::uint32_t> wake_word{0}; // bumped on every wake-up, re-checked before sleeping
  std::atomic<Reactor*> ring{nullptr};     // the worker sleeps in its reactor; wakers call its wake()
  // A hand-over to this forced-idle sibling is due (Options::handover_spin):
  // it spins, instead of sleeping, until this time (ns).
  std::atomic<std::uint64_t> spin_until{0};
  // Within-cookie fairness (fiber_vtime.hpp), relaxed: written by the worker
  // as it starts a fiber, read by wakers under the lock.
  std::atomic<std::uint32_t> vfloor{0}; // the largest vtime started here (CFS's min_vruntime)
  LockedFlag sleeping;      // the worker is (about to be) blocked on wake_word
  bool forced_idle = false; // guarded: idle although the core has runnable fibers

  /// Asks the running fiber to stop at its next preemption point. Every
  /// request but the young turn's own goes through here, so that none waits
  /// for a young turn's re-pick time (repick_at).
  /// (Release, paired with the acquire fence in Worker::young_turn_holds: a
  /// fiber that sees this request sees repick_at cleared too. A pick that
  /// keeps a young turn at the same instant can still set it again after the
  /// clear; the request then waits for the re-pick time, at most a least
  /// turn, as a request cleared by pick_locked's own reset is lost.)
  void ask_preempt() noexcept {
    repick_at.store(0, std::memory_order_relaxed);
    preempt.store(true, std::memory_order_release);
  }
};

/// What a sibling should do next.
struct Pick {
  enum class Kind { run, idle, forced_idle };
  Kind kind = Kind::idle;
  Fiber* fiber = nullptr;
  std::uint64_t wanted = 0;       // forced idle: the cookie it would have run
  std::uint64_t blocker = 0;      // forced idle: the cookie holding the core
  enum class Steal { none, cookie, any };
  Steal steal = Steal::none;      // what it may take from other cores:
  std::uint64_t steal_cookie = 0; // fibers of this cookie (Steal::cookie)
  // run: this start ended a hand-over (the core changed cookie while the old
  // one still had work) after this gap; kNoGap otherwise.
  static constexpr std::uint64_t kNoGap = ~std::uint64_t{0};
  std::uint64_t handover_gap_ns = kNoGap;
  std::uint64_t handover_from = 0; // with handover_gap_ns: the cookie the core left
};

/// Why a fiber joins a queue: where it is placed in vtime (fiber_vtime.hpp).
enum class Arrival {
  spawned, ///< at the PU's floor
  woken,   ///< at most the sleeper credit behind the floor; may preempt the PU's runner
  moved,   ///< stolen from another core: clamped around the floor, never preempting
  /// woken by a completion the running fiber collected at its first
  /// preemption point, submitting what its worker held back for it
  /// (Worker::ask_back_for_io): placed as `woken`, but the runner is asked to
  /// stop only at the next tick (Sibling::wake_waits)
  collected,
};

/// How a fiber that ran goes back to its queue.
enum class Requeue {
  yielded,   ///< this_fiber::yield(): behind every fiber of its cookie
  preempted, ///< its slice ended: stays ahead while it leads the next by less than the granularity
};

struct CoreConfig {
  FairnessPolicy policy = FairnessPolicy::core_vruntime;
  std::uint64_t granularity_ns = 500'000; // hysteresis before the core changes cookie
  /// Read only off the hot paths (see clock.hpp); the deterministic simulation
  /// (tests/sim/) substitutes simulated time. An indirect call costs nothing
  /// beside the 28 ns of the clock read itself.
  ClockFn clock = now_ns;
};

/// A core's scheduling state as the fiber dump shows it.
struct CoreSnapshot {
  bool locked = false;            // false: the lock stayed busy; only the published cookies were read
  std::uint64_t owner = kNoCookie;
  std::uint64_t owner_since_ns = 0;
  struct Entry { std::uint64_t cookie; std::size_t runnable; std::uint64_t vruntime; std::int64_t waited; };
  std::vector<Entry> cookies;     // the core-wide books (SMT cores)
  struct Queued { unsigned sibling; std::uint64_t id, cookie; int pinned; bool fresh; };
  std::vector<Queued> queued;     // at most kMaxQueued, in queue order
  std::size_t queued_total = 0;
  struct Pu { std::uint64_t running; bool forced_idle, sleeping, preempt; std::size_t queue; };
  std::vector<Pu> pus;
  std::vector<std::pair<std::uint64_t, std::size_t>> runnable; // fibers queued per cookie (all siblings)
  static constexpr std::size_t kMaxQueued = 64;
};

class CoreCoordinator {
public:
  CoreCoordinator(unsigned index, const std::vector<unsigned>& workers, CoreConfig cfg);
  CoreCoordinator(const CoreCoordinator&) = delete;
  CoreCoordinator& operator=(const CoreCoordinator&) = delete;

  SpinLock& lock() noexcept { return lock_; }
  Sibling& sibling(unsigned s) noexcept { return *siblings_[s]; }
  const Sibling& sibling(unsigned s) const noexcept { return *siblings_[s]; }
  unsigned size() const noexcept { return static_cast<unsigned>(siblings_.size()); }
  unsigned index() const noexcept { return index_; }
  bool single_pu() const noexcept { return single_pu_; }
  FairnessPolicy policy() const noexcept { return cfg_.policy; }

  // ---- under lock() ----
  /// Queues `f` on sibling `s` and wakes a sibling that can run it. Returns
  /// true when `f` waits for another cookie's turn to end and nobody here
  /// times that end: no sibling was woken for it and none is forced idle
  /// (a forced-idle sibling arms a timer for it, forced_idle.cpp). Only the
  /// slice ticker's preemption request then ends the turn, so the caller asks
  /// it for its fine period (Scheduler::want_fine_ticks).
  [[nodiscard]] bool enqueue_locked(unsigned s, Fiber* f, WakeList& wakes, Arrival why = Arrival::woken);
  /// Puts a fiber back on sibling `s`'s queue in its vtime order, as it is
  /// (no wake-ups): a fiber picked and put back, or moved from the worker's
  /// own queue.
  void requeue_locked(unsigned s, Fiber* f);
  /// Puts the fiber that just ran on sibling `s` back on its queue (no
  /// wake-ups) and makes the pick for `s`: pick_locked's result.
  Pick requeue_and_pick_locked(unsigned s, Fiber* f, Requeue how, WakeList& wakes);
  /// Queues a fiber stolen from another core on sibling `s` (no wake-ups).
  void adopt_locked(unsigned s, Fiber* f);
  /// The core-wide pick for sibling `s`, whose fiber (if any) has stopped.
  Pick pick_locked(unsigned s, WakeList& wakes);
  /// Removes `f` from sibling `s`'s queue if it is there, has never run and is
  /// still the fiber of `j` (then no other worker can touch it, so its fields
  /// are safe to read; `f` may be a stale pointer until it is found).
  bool remove_unstarted_locked(unsigned s, Fiber* f, const JoinRecord* j);
  /// Takes unpinned queued fibers for a worker of another core: up to `max`,
  /// and at most half of what is queued here (the victim keeps work too). The
  /// first one's cookie is `cookie` (any if `any`); the rest share it. Returns
  /// how many were stored in `out`.
  unsigned steal_locked(std::uint64_t cookie, bool any, Fiber** out, unsigned max);
  /// Moves the fibers of the spawn ring, if any, to sibling `s`'s queue
  /// (single-PU cores: the pick, an inline join and the rescue look only at
  /// the queue). Every locked reader of the queue calls it first; the check
  /// is one load, the move out of line.
  void drain_spawned_locked(unsigned s) {
    if (!spawned_.empty()) [[unlikely]]
      move_spawned_locked(s);
  }
  /// Removes the first unpinned fiber of `cookie` from sibling `s`'s queue,
  /// for the ticker to move to another core (rescue.cpp); null if none.
  Fiber* evict_locked(unsigned s, std::uint64_t cookie);
  /// Moves the first unpinned fiber of the cookie sibling `from` runs from
  /// its queue to sibling `to`'s (the only cookie `to` may run beside it), in
  /// `to`'s vtime order; wakes `to` if it sleeps. The core's books do not
  /// change: the fiber stays on the core. Returns whether one moved.
  bool move_queued_locked(unsigned from, unsigned to, WakeList& wakes);
  /// Whether sibling `s` could start a fiber of `cookie` now without breaking isolation.
  bool compatible_locked(unsigned s, std::uint64_t cookie) const noexcept;
  /// Under lock(): sibling `s` publishes `cookie` (kNoCookie: it runs
  /// nothing). The only write of a published cookie on a core with siblings:
  /// every pick reads its siblings' cookies under the same lock, so no two
  /// siblings can each see the other idle and publish different cookies.
  void publish_locked(unsigned s, std::uint64_t cookie) noexcept;
  /// The one exemption, without the lock: on a single-PU core no sibling
  /// compares with the cookie (placement, rescue and the dump read it as a
  /// hint), so the worker's private fast path republishes as it switches.
  /// Inline, on the worker's own sibling: it is on yield's path.
  void publish_single_pu(Sibling& me, std::uint64_t cookie) noexcept { me.running.store(cookie); }
  /// The running fiber on `s` changes its cookie; false if a sibling runs another cookie.
  bool change_running_cookie_locked(unsigned s, std::uint64_t cookie, WakeList& wakes);
  /// Sibling `s` is going to sleep: wakes it up on the next change.
  void prepare_sleep_locked(unsigned s);
  /// A blocking call of `cookie` starts (blocking_call.cpp): its fiber, which
  /// runs `cookie` on a sibling now, hands its claim on the core to the call,
  /// whose helper thread runs on this core's CPUs. Until release_hold_locked
  /// the core behaves as if a sibling ran `cookie`: the others run only
  /// `cookie` or idle. Without the hold the helper's code could run beside
  /// another cookie's fiber on a sibling, which nothing else would see.
  void hold_locked(std::uint64_t cookie);
  /// hold_locked, unless another cookie with fibers waiting leads `cookie`
  /// (its turn is over): then false, and nothing is held.
  bool try_hold_locked(std::uint64_t cookie);
  /// A blocking call ended: the last one lets the core change cookie again.
  void release_hold_locked(WakeList& wakes);

  /// Hand-overs (changes of cookie while the old one still had work) and
  /// their gaps: from the change to the first fiber of the new cookie starting.
  struct Handovers { std::uint64_t count, p50_ns, p99_ns, max_ns; };
  Handovers handovers(); // takes the lock
  /// When the owner's turn ends, for forced-idle sibling `s`: the time (ns)
  /// at which the cookie choose_cookie would take next leads the owner by the
  /// granularity. Exact while nothing else changes, because only one side
  /// moves, with wall time: the owner's vruntime (core_vruntime) or the
  /// waiters' wait (forceidle_balance). 0: `s` is not forced idle, or no other
  /// cookie is runnable. May be in the past (the owner has not stopped yet).
  std::uint64_t turn_due_locked(unsigned s) const noexcept;

  // ---- lock-free ----
  /// Isolation checker: does any other sibling publish a cookie other than `cookie`?
  bool sibling_conflict(unsigned s, std::uint64_t cookie) const noexcept;
  /// The cookie any sibling runs, or kNoCookie (placement reads this racily).
  std::uint64_t running_cookie() const noexcept;
  /// How many siblings are forced idle now (for the slice tick rule).
  int forced_idle_count() const noexcept { return forced_.load(std::memory_order_relaxed); }
  /// Fibers queued on the core, its spawn ring's included (a hint: the ring
  /// changes without the lock).
  int queued_hint() const noexcept { return queued_.load(std::memory_order_relaxed); }
  /// Single-PU cores, their worker only: queues a fiber it spawned on the
  /// spawn ring (spawn_ring.hpp), without the lock. False when the ring is full.
  /// The ring's fibers count in queued_hint(), so the worker's private fast
  /// paths (local_ok) stay off while any wait there, and thieves look here.
  bool push_spawned(Fiber* f) noexcept {
    if (!spawned_.push(f)) return false;
    // seq_cst: pairs with the fence of a worker about to sleep (see
    // LockedFlag); on x86 the same locked add as a relaxed one.
    queued_.fetch_add(1, std::memory_order_seq_cst);
    return true;
  }
  /// Any thread, no lock: takes half the spawn ring (at most `max`) for
  /// another core. The caller queues them there under that core's lock.
  unsigned steal_spawned(Fiber** out, unsigned max) noexcept {
    const unsigned n = spawned_.take(out, max, true);
    if (n) queued_.fetch_sub(static_cast<int>(n), std::memory_order_relaxed);
    return n;
  }
  /// Any thread, no lock: takes `f` off the spawn ring if it is the oldest
  /// there (an inline join of a fiber just spawned).
  bool take_spawned_if_oldest(const Fiber* f) noexcept {
    if (!spawned_.take_if_oldest(f)) return false;
    queued_.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }
  /// Wake-affine placements onto this core so far (affine_grace.hpp).
  std::uint32_t affine_seq() const noexcept { return affine_seq_.load(std::memory_order_relaxed); }
  /// Under lock(): a fiber running here woke a fiber onto this core to run next.
  void note_affine_locked() noexcept {
    affine_seq_.store(affine_seq_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  /// The core's cookie as last set (for a forced-idle PU awaiting a hand-over).
  std::uint64_t published_owner() const noexcept { return owner_pub_.load(std::memory_order_relaxed); }
  /// Asks every sibling that runs `cookie` to stop at its next preemption
  /// point (a forced-idle sibling at the end of the owner's turn). Only a
  /// request: the core's pick decides under the lock what runs next.
  void request_stop(std::uint64_t cookie) noexcept {
    for (auto& sp : siblings_)
      if (sp->running.load(std::memory_order_relaxed) == cookie) sp->ask_preempt();
  }

  // ---- statistics (relaxed counters) ----
  std::atomic<std::uint64_t> cookie_switches{0};
  std::atomic<std::uint64_t> forced_idle_ns{0};
  struct CookieTime { std::uint64_t cookie; std::uint64_t core_ns; };
  /// Core-ownership time per cookie so far (takes the lock).
  std::vector<CookieTime> ownership();
  /// Reads the core's state for a dump, waiting at most `patience_us` for the
  /// lock (a stuck or preempted holder must not block the dump).
  CoreSnapshot snapshot(int patience_us);

private:
  void move_spawned_locked(unsigned s); // drain_spawned_locked's move
  struct CookieEntry {
    std::uint64_t cookie;
    std::size_t runnable = 0;    // queued on this core
    std::uint64_t vruntime = 0;  // core-wide: time this cookie owned the core, x 100 / weight
    std::int64_t waited = 0;     // time it was runnable while another cookie owned the core (weighted:
                                 // its lag, core_fairness.cpp), relative to the current owner (at 0)
    std::int64_t earned = 0;     // weighted forceidle_balance: lag earned since place() (settle_departure)
    std::uint32_t weight = 100;  // cookie_weight(), as of the last checkpoint
    std::uint64_t owned_ns = 0;  // statistics: wall time it owned the core while on the books
    bool placed = false;         // it has arrived here before: place() may give it the sleeper credit
    std::uint64_t missed = 0;    // siblings that held its fibers through its last turn and started none
    unsigned next_missed = 0;    // the sibling its next turn looks at first among them (hand_to_missed)
  };
  CookieEntry& entry(std::uint64_t cookie);
  void count_queued(std::uint64_t cookie, int delta);
  void arrive(CookieEntry& e);
  void place(CookieEntry& e, bool carried = false);
  std::uint64_t other_running(unsigned s) const noexcept;
  std::uint64_t published_other(unsigned except, std::uint64_t same, std::memory_order o) const noexcept;
  /// The cookie the core runs next (false: none is runnable). `kept_until`
  /// is set when the owner is kept while another cookie waits: to the end of
  /// the owner's least turn (ns) if that cookie leads, else to when it will
  /// lead (leads_at); left alone otherwise.
  bool choose_cookie(std::uint64_t running, std::uint64_t& out, std::uint64_t& kept_until);
  bool prefer(const CookieEntry& a, const CookieEntry& b) const noexcept;
  bool leads(const CookieEntry& a, const CookieEntry& owner) const noexcept;
  std::uint64_t hysteresis(const CookieEntry& a, const CookieEntry& b, FairnessPolicy book) const noexcept;
  std::int64_t until_leads(const CookieEntry& a, const CookieEntry& owner) const noexcept;
  void refresh_weights();
  std::uint64_t competing_weight() const noexcept;
  static std::int64_t wait_rate(std::uint32_t w, std::uint32_t w_owner, std::uint64_t total) noexcept;
  void time_weighted_turn(const CookieEntry& owner, std::uint64_t& kept_until) const noexcept;
  std::uint64_t leads_at(const CookieEntry& a, const CookieEntry& owner) const noexcept;
  static constexpr unsigned kMinTurnShift = 3; // a turn's least length: granularity >> this
  void preempt_owner_for(std::uint64_t cookie);
  void checkpoint(std::uint64_t now);
  void book_weighted(std::uint64_t now, std::int64_t span);
  Fiber* take(unsigned s, std::uint64_t cookie);
  Pick pick_single_pu(unsigned s, bool count);
  Pick forced_idle(unsigned s, std::uint64_t wanted, std::uint64_t blocker);
  void start(unsigned s, Fiber* f, WakeList& wakes, Pick& p);
  void set_forced(unsigned s, bool on) noexcept;
  void wake_sleepers(WakeList& wakes, unsigned except, bool only_with_work);
  Pick stop_and_idle(unsigned s, std::uint64_t running_elsewhere, WakeList& wakes);

  SpinLock lock_;
  unsigned index_;
  CoreConfig cfg_;
  std::vector<std::unique_ptr<Sibling>> siblings_;
  bool single_pu_ = false; // cached: read on every yield
  std::vector<CookieEntry> cookies_;
  std::uint64_t owner_ = kNoCookie;  // the core's current cookie (sticky while idle)
  std::uint64_t owner_since_ = 0;
  std::uint64_t last_checkpoint_ = 0;
  std::uint64_t turn_start_ = 0;   // when owner_ last changed (set_owner)
  std::uint64_t min_vruntime_ = 0; // monotonic floor, as CFS's min_vruntime
  std::uint64_t weights_seen_ = 0; // weights_generation() the books' weights are from
  bool weighted_ = false;          // some cookie on the books has a weight other than the default
  /// `starts_on`: the sibling where a fiber of the new owner starts with the
  /// change (owner_started_), or kNoSibling.
  void set_owner(std::uint64_t cookie, unsigned starts_on);
  static constexpr unsigned kNoSibling = ~0u;
  void settle_departure(CookieEntry& leaver, std::uint64_t next);
  void owner_started(std::uint64_t now);
  /// When the started owner's least turn ends, weighted; 0 otherwise.
  std::uint64_t least_turn_end() const noexcept;
  bool owner_started_ = true; // a fiber of owner_ has started since it became the owner
  // Siblings, a bit each: `awaited_` held fibers of owner_ when it became
  // the owner and have started none since (what they still hold at the
  // turn's end is the cookie's `missed`); `reserved_`, the one the turn
  // begins on (hand_to_missed).
  std::uint64_t awaited_ = 0;
  std::uint64_t reserved_ = 0;
  static_assert(kMaxPusPerCore <= 64, "a bit per sibling");
  std::uint64_t holders(std::uint64_t cookie, unsigned except) const noexcept;
  bool hand_to_missed(unsigned s, std::uint64_t want, WakeList& wakes);
  bool reserved_elsewhere(unsigned s);
  void forget_idle_owner();
  // Blocking calls in flight on this core, and their cookie (hold_locked):
  // written under the lock; held_ is read lock-free by sibling_conflict.
  unsigned holds_ = 0;
  std::atomic<std::uint64_t> held_{kNoCookie};
  GapHistogram handover_gaps_;
  std::uint64_t handover_since_ = 0;        // a hand-over is under way since (ns); 0: none
  std::uint64_t handover_from_ = kNoCookie; // the cookie it left
  void update_min_vruntime();
  std::atomic<int> forced_{0};
  std::atomic<std::uint64_t> owner_pub_{kNoCookie}; // owner_, for lock-free readers
  std::atomic<int> queued_{0}; // queued fibers, the spawn ring's included
  std::atomic<std::uint32_t> affine_seq_{0}; // beside queued_: a thief reads both
  SpawnRing spawned_; // single-PU cores: unpinned fibers the worker spawned (Worker::enqueue_spawned)
  // Statistics: ownership of cookies entry() forgot (the books hold the
  // rest, so a checkpoint adds to a field, not to a hash map).
  std::unordered_map<std::uint64_t, std::uint64_t> owned_ns_;
};

namespace testing {
/// Test-only: when set, pick_locked ignores what siblings run, breaking
/// isolation on purpose so tests can prove the checker catches it.
extern std::atomic<bool> ignore_siblings;
} // namespace testing

} // namespace coresched::detail
