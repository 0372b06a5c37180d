// SPDX-License-Identifier: Apache-2.0
// An application-level isolation oracle, written only against the public API
// and independent of the runtime's own checker (CORESCHED_ISOLATION_CHECK).
//
// The guarantee under test: two fibers of different cookies never run user
// code at the same instant on sibling PUs of one core. While user code runs it
// holds a Scope, which stamps the cookie the code *believes* it has in its PU's
// slot (seq_cst store) and then reads every sibling's slot (seq_cst loads). Of
// two overlapping stamped intervals on one core at least one therefore sees
// the other. The believed cookie is tracked by the test (the spawn cookie, the
// inherited one, the last set_cookie), never read from this_fiber::cookie():
// a runtime that loses track of a cookie must not also fool its own oracle.
//
// Every potential switch point in user code goes through Scope::around(),
// which restores the slot before the call and stamps again after it (on
// whatever PU the fiber then runs). Scopes nest: a destructor that runs
// inside other user code (or inside the runtime, after another fiber's cookie
// was published) stamps its own cookie and restores the previous slot value.
//
// The body of a coresched::blocking_call is user code of its fiber's cookie
// too, but it runs on a plain helper thread that may be on any PU of the core
// the fiber called from. It holds a CallScope instead, which stamps one of
// that core's call slots: a call is checked against every PU of its core and
// the core's other calls, and every PU's check covers its core's calls. Of a
// call and a fiber of another cookie on any PU of its core, at once, one is
// seen. A core of one PU has no sibling: its worker and a call's helper share
// one CPU in turns, so its calls are checked against nothing.
#pragma once

#include <coresched/coresched.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace guarantees {

/// One observed overlap: PU `pu` stamped `mine` while sibling `other_pu` held `other`.
/// Where a side is a blocking call (`mine_call`, `other_call`) its number is
/// the index of the core's call slot it held instead of a PU.
struct Violation {
  unsigned pu = 0, other_pu = 0, core = 0;
  std::uint64_t mine = 0, other = 0;
  const char* what = "";
  bool mine_call = false, other_call = false;
};

class Oracle {
public:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  /// Blocking calls one core can have stamped at once (CallScope). A core's
  /// calls are all of one cookie, but each fiber of it may have one in flight.
  static constexpr unsigned kCallSlots = 16;

  /// `t` is the machine the oracle watches: one runtime's topology, or the
  /// whole topology that several runtimes share out with Options::cpus (PUs are
  /// matched by OS index, so each runtime's worker finds its slot).
  explicit Oracle(const coresched::Topology& t)
      : id_(next_id().fetch_add(1) + 1), topo_(t), slots_(std::make_unique<Slot[]>(t.pus().size())),
        calls_(std::make_unique<CallSlots[]>(t.cores().size())) {
    for (const auto& p : t.pus()) {
      if (p.os_index >= by_os_.size()) by_os_.resize(p.os_index + 1, -1);
      by_os_[p.os_index] = static_cast<int>(p.index);
    }
    for (std::size_t c = 0; c < t.cores().size(); ++c)
      for (auto& v : calls_[c].v) v.store(kEmpty, std::memory_order_relaxed);
  }
  Oracle(const Oracle&) = delete;
  Oracle& operator=(const Oracle&) = delete;

  /// Where the calling code runs: a worker (PU) index, or -1 on a plain thread.
  /// Inside a fiber that is this_fiber::location(). Outside one, the code may
  /// still run on a worker thread (a destructor the runtime calls between two
  /// fibers, say): workers are threads pinned 1:1 to PUs, so the PU a thread
  /// was last seen on in a fiber is its PU. noinline: the thread-local must be
  /// read afresh on every call, never cached across a fiber switch.
  [[gnu::noinline]] int current_pu() noexcept {
    thread_local std::uint64_t seen_by = 0;
    thread_local int seen_pu = -1;
    if (coresched::this_fiber::in_fiber()) {
      const unsigned worker = coresched::this_fiber::location().worker;
      const unsigned os = coresched::Runtime::current()->topology().pus()[worker].os_index;
      seen_by = id_;
      seen_pu = os < by_os_.size() ? by_os_[os] : -1;
      if (seen_pu < 0) unattributed.fetch_add(1, std::memory_order_relaxed);
      return seen_pu;
    }
    if (seen_by == id_) return seen_pu;
    unattributed.fetch_add(1, std::memory_order_relaxed);
    return -1;
  }

  /// Runs one pinned fiber per PU so current_pu() knows every worker thread
  /// even when a destructor runs there before any stamped fiber did.
  void prime(coresched::Runtime& rt) {
    std::vector<coresched::JoinHandle<void>> hs;
    for (unsigned pu = 0; pu < rt.topology().pus().size(); ++pu)
      hs.push_back(rt.spawn([this] { (void)current_pu(); }, coresched::SpawnOptions{.pin_to_pu = pu}));
    for (auto& h : hs) h.join();
  }

  /// Stamps `cookie` on `pu` and checks the siblings; returns what the slot held before.
  std::uint64_t stamp(int pu, std::uint64_t cookie, const char* what) noexcept {
    if (pu < 0) return kEmpty;
    const std::uint64_t before = slots_[pu].v.exchange(cookie, std::memory_order_seq_cst);
    check(pu, cookie, what);
    return before;
  }
  /// Puts back what stamp() returned (leaving, or ending a nested scope) and,
  /// if that is a cookie again, checks it against the siblings as a new interval.
  void restore(int pu, std::uint64_t expect, std::uint64_t previous, const char* what) noexcept {
    if (pu < 0) return;
    // The slot no longer holds our stamp: code ran on this PU inside our
    // interval without a scope of its own, or a scope ends on another PU than it
    // began (an unwrapped switch point). Counted, and the slot is left alone so
    // that the code stamped there now is not clobbered.
    if (!slots_[pu].v.compare_exchange_strong(expect, previous, std::memory_order_seq_cst)) {
      slot_mismatches.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (previous != kEmpty) check(pu, previous, what);
  }
  /// Checks `cookie` (held by the caller on `pu`) against the siblings and
  /// the blocking calls of the PU's core.
  void check(int pu, std::uint64_t cookie, const char* what) noexcept {
    const auto& p = topo_.pus()[static_cast<unsigned>(pu)];
    const auto& pus = topo_.cores()[p.core].pus;
    for (unsigned sib : pus) {
      if (static_cast<int>(sib) == pu) continue;
      const std::uint64_t other = slots_[sib].v.load(std::memory_order_seq_cst);
      if (other != kEmpty && other != cookie) record({static_cast<unsigned>(pu), sib, p.core, cookie, other, what});
    }
    if (pus.size() > 1)
      for (unsigned k = 0; k < kCallSlots; ++k) {
        const std::uint64_t other = calls_[p.core].v[k].load(std::memory_order_seq_cst);
        if (other != kEmpty && other != cookie)
          record({static_cast<unsigned>(pu), k, p.core, cookie, other, what, false, true});
      }
    checks.fetch_add(1, std::memory_order_relaxed);
  }

  /// The core of PU `pu` (an index into the watched topology, as current_pu()
  /// returns): the core a blocking call made on that PU is attributed to.
  unsigned core_of(int pu) const noexcept { return topo_.pus()[static_cast<unsigned>(pu)].core; }

  /// Stamps a blocking call of `cookie` on `core` in a free call slot and
  /// checks it; returns the slot, or -1 if all were taken (counted in
  /// call_slots_full; the call is then checked without being seen).
  int stamp_call(unsigned core, std::uint64_t cookie, const char* what) noexcept {
    call_scopes.fetch_add(1, std::memory_order_relaxed);
    int slot = -1;
    for (unsigned k = 0; k < kCallSlots && slot < 0; ++k) {
      std::uint64_t empty = kEmpty;
      if (calls_[core].v[k].compare_exchange_strong(empty, cookie, std::memory_order_seq_cst))
        slot = static_cast<int>(k);
    }
    if (slot < 0) call_slots_full.fetch_add(1, std::memory_order_relaxed);
    check_call(core, slot, cookie, what);
    return slot;
  }
  /// Frees what stamp_call() took (nothing if it returned -1).
  void restore_call(unsigned core, int slot, std::uint64_t cookie) noexcept {
    if (slot < 0) return;
    std::uint64_t expect = cookie;
    if (!calls_[core].v[slot].compare_exchange_strong(expect, kEmpty, std::memory_order_seq_cst))
      slot_mismatches.fetch_add(1, std::memory_order_relaxed);
  }
  /// Checks a blocking call of `cookie` (in call slot `slot` of `core`, -1:
  /// none) against every PU of the core and the core's other calls.
  void check_call(unsigned core, int slot, std::uint64_t cookie, const char* what) noexcept {
    const auto& pus = topo_.cores()[core].pus;
    const unsigned mine = slot < 0 ? kCallSlots : static_cast<unsigned>(slot);
    if (pus.size() > 1) {
      for (unsigned pu : pus) {
        const std::uint64_t other = slots_[pu].v.load(std::memory_order_seq_cst);
        if (other != kEmpty && other != cookie) record({mine, pu, core, cookie, other, what, true, false});
      }
      for (unsigned k = 0; k < kCallSlots; ++k) {
        if (static_cast<int>(k) == slot) continue;
        const std::uint64_t other = calls_[core].v[k].load(std::memory_order_seq_cst);
        if (other != kEmpty && other != cookie) record({mine, k, core, cookie, other, what, true, true});
      }
    }
    checks.fetch_add(1, std::memory_order_relaxed);
  }

  /// The first few violations, for messages.
  std::vector<Violation> first_violations() const {
    std::lock_guard lk(mu_);
    return first_;
  }
  /// A short report: count and the first few, one line each.
  std::string report() const {
    std::string s = "oracle: " + std::to_string(violations.load()) + " violation(s), " +
                    std::to_string(checks.load()) + " checks, " + std::to_string(slot_mismatches.load()) +
                    " slot mismatches\n";
    if (const auto n = call_scopes.load()) s += "  " + std::to_string(n) + " blocking-call scopes\n";
    for (const auto& v : first_violations()) {
      char line[240];
      std::snprintf(line, sizeof line, "  core %u: %s %u ran cookie %llu (%s) while %s %u held cookie %llu\n", v.core,
                    v.mine_call ? "the blocking call in call slot" : "PU", v.pu,
                    static_cast<unsigned long long>(v.mine), v.what,
                    v.other_call ? "the blocking call in call slot" : v.mine_call ? "PU" : "sibling PU", v.other_pu,
                    static_cast<unsigned long long>(v.other));
      s += line;
    }
    return s;
  }

  std::atomic<std::uint64_t> violations{0};
  std::atomic<std::uint64_t> checks{0};
  std::atomic<std::uint64_t> slot_mismatches{0};
  std::atomic<std::uint64_t> unattributed{0}; // scopes on plain threads (not subject to core scheduling)
  std::atomic<std::uint64_t> call_scopes{0};     // CallScopes entered
  std::atomic<std::uint64_t> call_slots_full{0}; // CallScopes that found no free call slot

private:
  struct alignas(64) Slot { // one cache line each: the oracle must not serialise the PUs it watches
    std::atomic<std::uint64_t> v{kEmpty};
  };
  // A core's call slots share their lines: written only as calls start and
  // end, and read by every check on the core.
  struct alignas(64) CallSlots {
    std::atomic<std::uint64_t> v[kCallSlots];
  };
  void record(const Violation& v) noexcept {
    if (violations.fetch_add(1, std::memory_order_relaxed) >= 8) return;
    try {
      std::lock_guard lk(mu_);
      first_.push_back(v);
    } catch (...) {
    }
  }
  static std::atomic<std::uint64_t>& next_id() {
    static std::atomic<std::uint64_t> n{0};
    return n;
  }

  const std::uint64_t id_;
  const coresched::Topology& topo_;
  std::vector<int> by_os_; // PU OS index -> index into topo_.pus(), -1 where it has none
  std::unique_ptr<Slot[]> slots_;
  std::unique_ptr<CallSlots[]> calls_; // per core
  mutable std::mutex mu_; // never held across a switch point
  std::vector<Violation> first_;
};

/// User code of one cookie: stamped from construction to destruction, except
/// inside around(). Not copyable; lives on the fiber's stack (or in a destructor).
/// A Scope nested in another one of the same fiber must not call around(): its
/// leave() would put the outer cookie back while the fiber is switched out.
class Scope {
public:
  Scope(Oracle& o, coresched::Cookie believed, const char* what = "user code")
      : o_(o), cookie_(believed.value()), what_(what) {
    enter();
  }
  ~Scope() { leave(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

  /// Runs a potential switch point `f` outside the stamped interval: the slot
  /// is restored before and stamped again after (also when `f` throws).
  template <class F> decltype(auto) around(F&& f) {
    leave();
    struct Reenter {
      Scope* s;
      ~Reenter() { s->enter(); }
    } re{this};
    return std::forward<F>(f)();
  }

  /// set_cookie through the oracle: the believed cookie changes with the call.
  void set_cookie(coresched::Cookie c) {
    around([&] {
      coresched::this_fiber::set_cookie(c);
      cookie_ = c.value();
    });
  }
  void yield() { around([] { coresched::this_fiber::yield(); }); }
  void preempt_point() { around([] { coresched::this_fiber::preempt_point(); }); }
  void sleep_for(std::chrono::nanoseconds d) { around([d] { coresched::this_fiber::sleep_for(d); }); }
  template <class T> T join(coresched::JoinHandle<T>& h) {
    return around([&]() -> T { return h.join(); });
  }

  /// Busy work inside the interval, re-checking the siblings as it goes, so
  /// an overlap with a sibling's interval is long enough to be seen.
  void burn(std::chrono::microseconds d) {
    const auto until = std::chrono::steady_clock::now() + d;
    do
      if (pu_ >= 0) o_.check(pu_, cookie_, what_);
    while (std::chrono::steady_clock::now() < until);
  }

  coresched::Cookie cookie() const noexcept { return coresched::Cookie::from_value(cookie_); }
  /// The PU the current interval is stamped on (-1 on a plain thread).
  int pu() const noexcept { return pu_; }
  Oracle& oracle() noexcept { return o_; }

private:
  void enter() noexcept {
    pu_ = o_.current_pu();
    previous_ = o_.stamp(pu_, cookie_, what_);
  }
  void leave() noexcept {
    // A fiber that migrated inside a stamped interval (a switch point that
    // was not wrapped) would restore another PU's slot: caught as a mismatch.
    const int now = o_.current_pu();
    if (now != pu_) o_.slot_mismatches.fetch_add(1, std::memory_order_relaxed);
    o_.restore(pu_, cookie_, previous_, what_);
    pu_ = -1;
  }

  Oracle& o_;
  std::uint64_t cookie_;
  const char* what_;
  int pu_ = -1;
  std::uint64_t previous_ = Oracle::kEmpty;
};

/// The body of a blocking call (coresched::blocking_call) of cookie
/// `believed`, made by a fiber on `core`: stamped in one of the core's call
/// slots from construction to destruction. The core is the one of the
/// caller's Scope before it wraps the call in around() (Oracle::core_of(s.pu())).
/// A call may first wait for its cookie's turn on the core, and an unpinned
/// fiber may move to another core meanwhile and call from there: a call is
/// attributable only where its fiber is pinned or its runtime has one core,
/// or the oracle reports overlaps on a core the call never ran on. The body
/// has no switch point: it runs on a plain thread, and a sleep or blocking
/// system call in it stays inside the interval, as the core stays claimed
/// for the cookie until the call returns.
///
///   const unsigned core = oracle.core_of(s.pu());
///   s.around([&] { coresched::blocking_call([&] { CallScope cs(oracle, core, s.cookie()); cs.burn(1ms); }); });
class CallScope {
public:
  CallScope(Oracle& o, unsigned core, coresched::Cookie believed, const char* what = "blocking call")
      : o_(o), core_(core), cookie_(believed.value()), what_(what), slot_(o.stamp_call(core, cookie_, what)) {}
  ~CallScope() { o_.restore_call(core_, slot_, cookie_); }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

  /// Busy work inside the interval, re-checking the core as it goes.
  void burn(std::chrono::microseconds d) {
    const auto until = std::chrono::steady_clock::now() + d;
    do
      o_.check_call(core_, slot_, cookie_, what_);
    while (std::chrono::steady_clock::now() < until);
  }
  /// The call slot it holds (-1: none was free).
  int slot() const noexcept { return slot_; }

private:
  Oracle& o_;
  const unsigned core_;
  const std::uint64_t cookie_;
  const char* what_;
  const int slot_;
};

} // namespace guarantees
