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
struct Violation {
  unsigned pu = 0, other_pu = 0, core = 0;
  std::uint64_t mine = 0, other = 0;
  const char* what = "";
};

class Oracle {
public:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};

  /// `t` is the machine the oracle watches: one runtime's topology, or the
  /// whole topology that several runtimes share out with Options::cpus (PUs are
  /// matched by OS index, so each runtime's worker finds its slot).
  explicit Oracle(const coresched::Topology& t)
      : id_(next_id().fetch_add(1) + 1), topo_(t), slots_(std::make_unique<Slot[]>(t.pus().size())) {
    for (const auto& p : t.pus()) {
      if (p.os_index >= by_os_.size()) by_os_.resize(p.os_index + 1, -1);
      by_os_[p.os_index] = static_cast<int>(p.index);
    }
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
  /// Checks `cookie` (held by the caller on `pu`) against the siblings.
  void check(int pu, std::uint64_t cookie, const char* what) noexcept {
    const auto& p = topo_.pus()[static_cast<unsigned>(pu)];
    for (unsigned sib : topo_.cores()[p.core].pus) {
      if (static_cast<int>(sib) == pu) continue;
      const std::uint64_t other = slots_[sib].v.load(std::memory_order_seq_cst);
      if (other != kEmpty && other != cookie) record({static_cast<unsigned>(pu), sib, p.core, cookie, other, what});
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
    for (const auto& v : first_violations()) {
      char line[200];
      std::snprintf(line, sizeof line, "  core %u: PU %u ran cookie %llu (%s) while sibling PU %u held cookie %llu\n",
                    v.core, v.pu, static_cast<unsigned long long>(v.mine), v.what, v.other_pu,
                    static_cast<unsigned long long>(v.other));
      s += line;
    }
    return s;
  }

  std::atomic<std::uint64_t> violations{0};
  std::atomic<std::uint64_t> checks{0};
  std::atomic<std::uint64_t> slot_mismatches{0};
  std::atomic<std::uint64_t> unattributed{0}; // scopes on plain threads (not subject to core scheduling)

private:
  struct alignas(64) Slot { // one cache line each: the oracle must not serialise the PUs it watches
    std::atomic<std::uint64_t> v{kEmpty};
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

} // namespace guarantees
