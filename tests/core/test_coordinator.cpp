// SPDX-License-Identifier: Apache-2.0
// The core-wide pick, driven step by step without threads.
#include "core/core_coordinator.hpp"

#include <catch2/catch.hpp>

#include <mutex>
#include <vector>

using namespace coresched::detail;
using Kind = Pick::Kind;

namespace {
// A clock the tests move by hand (CoreConfig::clock), for every test here: on
// the real clock a test descheduled between two picks on a loaded machine
// (ctest -j2) would see a slice pass that it did not script.
std::uint64_t fake_now = 1'000'000'000;
std::uint64_t fake_clock() noexcept { return fake_now; }

struct Core {
  explicit Core(unsigned n, coresched::FairnessPolicy policy = coresched::FairnessPolicy::core_vruntime,
                std::uint64_t gran = 500'000, ClockFn clock = fake_clock)
      : c(0, workers(n), CoreConfig{policy, gran, clock}) {}
  static std::vector<unsigned> workers(unsigned n) {
    std::vector<unsigned> w;
    for (unsigned i = 0; i < n; ++i) w.push_back(i);
    return w;
  }
  void add(unsigned s, Fiber& f) {
    WakeList w;
    (void)c.enqueue_locked(s, &f, w);
  }
  Pick pick(unsigned s) {
    WakeList w;
    return c.pick_locked(s, w);
  }
  CoreCoordinator c;
  // Single-threaded: every call runs under the core lock, as a worker's do.
  std::unique_lock<SpinLock> held{c.lock()};
};

Fiber& fiber(std::vector<Fiber>& pool, std::size_t i, std::uint64_t cookie, int pinned = kNotPinned) {
  pool[i].cookie = cookie;
  pool[i].pinned = pinned;
  return pool[i];
}
} // namespace

TEST_CASE("single-PU core picks round-robin across cookies", "[coordinator]") {
  Core core(1);
  std::vector<Fiber> f(3);
  core.add(0, fiber(f, 0, 1));
  core.add(0, fiber(f, 1, 2));
  core.add(0, fiber(f, 2, 1));
  CHECK(core.pick(0).fiber == &f[0]);
  CHECK(core.pick(0).fiber == &f[1]);
  CHECK(core.pick(0).fiber == &f[2]);
  CHECK(core.pick(0).kind == Kind::idle);
}

TEST_CASE("a sibling runs the core's cookie, taking from its sibling's queue", "[coordinator]") {
  Core core(2);
  std::vector<Fiber> f(3);
  core.add(0, fiber(f, 0, 5));
  core.add(0, fiber(f, 1, 5));
  const Pick a = core.pick(0);
  REQUIRE(a.kind == Kind::run);
  CHECK(a.fiber->cookie == 5);
  const Pick b = core.pick(1);
  REQUIRE(b.kind == Kind::run);
  CHECK(b.fiber == &f[1]);
  CHECK_FALSE(core.c.sibling_conflict(0, 5));
}

TEST_CASE("a sibling with only another cookie is forced idle", "[coordinator]") {
  Core core(2);
  std::vector<Fiber> f(2);
  core.add(0, fiber(f, 0, 5));
  core.add(1, fiber(f, 1, 6));
  const Pick a = core.pick(0);
  REQUIRE(a.kind == Kind::run);
  const std::uint64_t running = a.fiber->cookie;
  const Pick b = core.pick(1);
  CHECK(b.kind == Kind::forced_idle);
  CHECK(b.fiber == nullptr);
  CHECK(b.blocker == running);
  CHECK(core.c.forced_idle_count() == 1);
  // It may only steal the core's cookie from other cores.
  CHECK(b.steal == Pick::Steal::cookie);
  CHECK(b.steal_cookie == running);
  CHECK(core.c.running_cookie() == running);
}

TEST_CASE("when another cookie is due, the running sibling is asked to stop first", "[coordinator]") {
  Core core(2, coresched::FairnessPolicy::core_vruntime, 0);
  std::vector<Fiber> f(2);
  core.add(0, fiber(f, 0, 5, 0));
  REQUIRE(core.pick(0).fiber == &f[0]); // cookie 5 owns the core from now
  fake_now += 3'000'000; // 3 ms
  core.add(1, fiber(f, 1, 6, 1)); // placed level with cookie 5 (the kernel's min_vruntime)
  fake_now += 1'000; // cookie 5 runs on while 6 waits: now 6 is due (on the real clock, the time to pick)
  const Pick b = core.pick(1);
  REQUIRE(b.kind == Kind::forced_idle); // no overlap: it waits
  CHECK(b.wanted == 6);
  CHECK(b.blocker == 5);
  CHECK(core.c.sibling(0).preempt.load()); // sibling 0 must yield
  CHECK(b.steal == Pick::Steal::none);
  // Sibling 0 yields: its fiber goes back, and the core hands over to cookie 6.
  WakeList w;
  core.c.requeue_locked(0, &f[0]);
  const Pick a = core.pick(0);
  CHECK(a.kind == Kind::forced_idle); // cookie 6 is pinned to sibling 1
  CHECK(a.blocker == 6);
  const Pick b2 = core.pick(1);
  REQUIRE(b2.kind == Kind::run);
  CHECK(b2.fiber == &f[1]);
}

TEST_CASE("forced-idle balance favours the cookie that waited longest", "[coordinator]") {
  Core core(2, coresched::FairnessPolicy::forceidle_balance, 0);
  std::vector<Fiber> f(3);
  core.add(0, fiber(f, 0, 5, 0));
  core.add(0, fiber(f, 2, 5, 0));
  REQUIRE(core.pick(0).fiber == &f[0]);
  core.add(1, fiber(f, 1, 6, 1));
  core.pick(1); // a checkpoint: cookie 6 starts waiting
  fake_now += 3'000'000; // 3 ms
  const Pick b = core.pick(1);
  CHECK(b.kind == Kind::forced_idle);
  CHECK(b.wanted == 6); // 6 waited while 5 held the core: 6 is due
  CHECK(core.c.sibling(0).preempt.load());
}

TEST_CASE("the turn's end the coordinator predicts is when its pick hands over", "[coordinator]") {
  // A forced-idle sibling sleeps until turn_due_locked and then asks the
  // owner to stop (forced_idle.cpp): a microsecond before that time the pick
  // must keep the owner, a microsecond after it must hand over, under both
  // policies, and the checkpoints of the picks in between must not move it.
  for (const auto policy : {coresched::FairnessPolicy::core_vruntime, coresched::FairnessPolicy::forceidle_balance}) {
    INFO(coresched::to_string(policy));
    Core core(2, policy, 500'000);
    std::vector<Fiber> f(2);
    core.add(0, fiber(f, 0, 5, 0));
    REQUIRE(core.pick(0).fiber == &f[0]); // cookie 5 owns the core
    fake_now += 2'000'000;
    core.add(1, fiber(f, 1, 6, 1));
    REQUIRE(core.pick(1).kind == Kind::forced_idle); // 6 is not ahead by the granularity yet
    const std::uint64_t due = core.c.turn_due_locked(1);
    REQUIRE(due > fake_now);
    CHECK(due - fake_now <= 1'000'000); // within two granularities
    fake_now = due - 1'000;
    core.c.requeue_locked(0, &f[0]);
    REQUIRE(core.pick(0).fiber == &f[0]); // the owner keeps the core
    CHECK(core.pick(1).kind == Kind::forced_idle);
    CHECK(core.c.turn_due_locked(1) == due);
    fake_now = due + 1'000;
    core.c.requeue_locked(0, &f[0]);
    const Pick a = core.pick(0);
    CHECK(a.kind == Kind::forced_idle); // handed over: cookie 6 is pinned to sibling 1
    CHECK(a.blocker == 6);
    CHECK(core.pick(1).fiber == &f[1]);
    CHECK(core.c.turn_due_locked(1) == 0); // sibling 1 runs: no turn to wait for
  }
}

TEST_CASE("the isolation invariant holds for every scripted pick", "[coordinator]") {
  Core core(4);
  std::vector<Fiber> f(64);
  for (std::size_t i = 0; i < f.size(); ++i) core.add(i % 4, fiber(f, i, i % 3));
  std::vector<Fiber*> running(4, nullptr);
  for (int step = 0; step < 400; ++step) {
    const unsigned s = static_cast<unsigned>(step * 7 % 4);
    if (running[s]) core.c.requeue_locked(s, running[s]);
    const Pick p = core.pick(s);
    running[s] = p.kind == Kind::run ? p.fiber : nullptr;
    for (unsigned t = 0; t < 4; ++t)
      if (running[t]) REQUIRE_FALSE(core.c.sibling_conflict(t, running[t]->cookie));
  }
}

TEST_CASE("a steal takes half the queue, one cookie, never a pinned fiber", "[coordinator]") {
  Core core(1);
  std::vector<Fiber> f(10);
  for (std::size_t i = 0; i < 6; ++i) core.add(0, fiber(f, i, 1));
  core.add(0, fiber(f, 6, 2));
  core.add(0, fiber(f, 7, 1, 0)); // pinned
  Fiber* out[32];
  // 8 queued: at most 4, all of cookie 1 (the first one's), oldest first.
  REQUIRE(core.c.steal_locked(0, true, out, 32) == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(out[i] == &f[i]);
  CHECK(core.c.queued_hint() == 4);
  // The cap wins over the half.
  CHECK(core.c.steal_locked(1, false, out, 1) == 1);
  CHECK(out[0] == &f[4]);
  // Cookie 1 has only its pinned fiber left: nothing of it to take.
  CHECK(core.c.steal_locked(1, false, out, 32) == 1); // f[5]
  CHECK(core.c.steal_locked(1, false, out, 32) == 0);
  CHECK(core.c.steal_locked(2, false, out, 32) == 1);
  CHECK(out[0] == &f[6]);
}

// ---- the fairness books' failure cases, on a clock moved by hand (tests/sim/ checks them at scale) ----

namespace {
using coresched::FairnessPolicy;
constexpr std::uint64_t kMs = 1'000'000;

// Cookie 5 runs alone on both siblings for 2 s, yielding (single-cookie
// picks read no clock); then cookie 6 arrives.
struct LateArrival {
  explicit LateArrival(FairnessPolicy policy) : core(2, policy, kMs / 2, fake_clock), f(3) {
    core.add(0, fiber(f, 0, 5));
    core.add(1, fiber(f, 1, 5));
    REQUIRE(core.pick(0).fiber == &f[0]);
    REQUIRE(core.pick(1).fiber == &f[1]);
    for (int i = 0; i < 2000; ++i) { // 2 s of 1 ms slices
      fake_now += kMs;
      yield(i % 2);
    }
    core.add(0, fiber(f, 2, 6));
  }
  Pick yield(unsigned s) {
    core.c.requeue_locked(s, &f[s]);
    return core.pick(s);
  }
  Core core;
  std::vector<Fiber> f;
};
} // namespace

TEST_CASE("a cookie arriving after a long solo run is placed level with the owner", "[coordinator]") {
  // Placed at the stale floor it would be 2 s behind, due at once, and the
  // owner would then get nothing for 2 s.
  LateArrival t(FairnessPolicy::core_vruntime);
  fake_now += kMs / 10;
  const Pick early = t.yield(0);
  CHECK(early.kind == Kind::run); // not ahead by the granularity yet: cookie 5 keeps the core
  CHECK(early.fiber == &t.f[0]);
  fake_now += kMs / 2;
  const Pick due = t.yield(0);
  CHECK(due.kind == Kind::forced_idle); // now it is: sibling 1 is asked to stop
  CHECK(due.wanted == 6);
  CHECK(t.core.c.sibling(1).preempt.load());
}

TEST_CASE("forced-idle balance counts an arrival's wait from its arrival", "[coordinator]") {
  // Skipping the first span after an arrival would lose the wait before the
  // first pick after it: the arrival would be due later.
  LateArrival t(FairnessPolicy::forceidle_balance);
  fake_now += 3 * kMs / 10;
  CHECK(t.yield(0).fiber == &t.f[0]); // waited 0.3 ms: not due
  fake_now += 3 * kMs / 10;
  const Pick due = t.yield(0); // waited 0.6 ms > the granularity
  CHECK(due.kind == Kind::forced_idle);
  CHECK(due.wanted == 6);
}

TEST_CASE("a hand-over to a pinned cookie survives the handing sibling going to sleep", "[coordinator]") {
  // Were the handing sibling to reset the owner as it sleeps, the woken one
  // would choose afresh (the owner charged for the wake-up), hand the core
  // back to a cookie pinned to the sleeper, and the two would wake each
  // other for ever.
  Core core(2, FairnessPolicy::core_vruntime, kMs / 2, fake_clock);
  std::vector<Fiber> f(2);
  core.c.prepare_sleep_locked(1);
  core.add(1, fiber(f, 0, 7, 1)); // wakes sibling 1
  core.add(0, fiber(f, 1, 8, 0));
  const Pick hand = core.pick(0);
  REQUIRE(hand.kind == Kind::forced_idle); // 7 is due, but only sibling 1 may run it
  REQUIRE(hand.blocker == 7);
  fake_now += 3'000; // spins, then sleeps
  REQUIRE(core.pick(0).kind == Kind::forced_idle);
  core.c.prepare_sleep_locked(0);
  fake_now += 50'000; // sibling 1's wake-up
  const Pick run = core.pick(1);
  REQUIRE(run.kind == Kind::run);
  CHECK(run.fiber == &f[0]);
}

TEST_CASE("set_cookie into a long-absent cookie places it at the floor", "[coordinator]") {
  // The fiber brings the cookie without queueing it; its vruntime from a
  // visit 2 s ago would be credit that keeps it on the core for 2 s.
  Core core(2, FairnessPolicy::core_vruntime, kMs / 2, fake_clock);
  std::vector<Fiber> f(3);
  core.add(0, fiber(f, 0, 9));
  REQUIRE(core.pick(0).fiber == &f[0]); // cookie 9 for 1 s, then it leaves
  fake_now += 1000 * kMs;
  REQUIRE(core.pick(0).kind == Kind::idle);
  core.c.prepare_sleep_locked(0);
  core.add(0, fiber(f, 1, 5)); // cookie 5 for 2 s
  REQUIRE(core.pick(0).fiber == &f[1]);
  fake_now += 2000 * kMs;
  WakeList w;
  REQUIRE(core.c.change_running_cookie_locked(0, 9, w)); // alone: granted at once
  f[1].cookie = 9;
  core.add(1, fiber(f, 2, 5)); // cookie 5 has work again
  // A set_cookie earns no sleeper credit: 9 carries on from 5's place.
  fake_now += 6 * kMs / 10;
  const Pick p = core.pick(1);
  CHECK(p.kind == Kind::forced_idle);
  CHECK(p.wanted == 5);
  CHECK(core.c.sibling(0).preempt.load()); // 9 has had its granularity: 5 is due
}

TEST_CASE("a cookie that comes back gets the sleeper credit, a new one does not", "[coordinator]") {
  // Cookie 5 owns the core on sibling 0 for 10 ms; then cookie 6 arrives on
  // sibling 1. New to the core, it is placed level with 5 and waits out the
  // granularity. Had it been here before (a short visit first), it is placed
  // the credit (two granularities) behind 5, is due at once, and its arrival
  // asks the owner to stop (wake-up preemption between cookies).
  for (const auto policy : {FairnessPolicy::core_vruntime, FairnessPolicy::forceidle_balance}) {
    for (const bool visited : {false, true}) {
      INFO(coresched::to_string(policy) << (visited ? ", 6 visited before" : ", 6 is new"));
      Core core(2, policy, kMs / 2, fake_clock);
      std::vector<Fiber> f(3);
      if (visited) {
        core.add(1, fiber(f, 2, 6, 1));
        REQUIRE(core.pick(1).fiber == &f[2]);
        fake_now += kMs / 10;
        REQUIRE(core.pick(1).kind == Kind::idle);
      }
      core.add(0, fiber(f, 0, 5, 0));
      REQUIRE(core.pick(0).fiber == &f[0]); // 5 owns the core
      fake_now += 10 * kMs;
      core.add(1, fiber(f, 1, 6, 1));
      // Both ask the owner's sibling to pick again: at once for the returning
      // cookie (repick_at 0), when it will lead for the new one (a re-pick time
      // after now, leads_at).
      CHECK(core.c.sibling(0).preempt.load());
      const std::uint64_t repick = core.c.sibling(0).repick_at.load();
      if (visited) CHECK(repick == 0);
      else CHECK(repick > fake_now);
      CHECK(core.pick(1).kind == Kind::forced_idle); // 5 still runs on sibling 0
      fake_now += kMs / 10;
      core.c.requeue_locked(0, &f[0]);
      const Pick p = core.pick(0);
      if (visited) {
        CHECK(p.kind == Kind::forced_idle); // handed over: 6 is pinned to sibling 1
        CHECK(p.blocker == 6);
        CHECK(core.pick(1).fiber == &f[1]);
      } else {
        CHECK(p.fiber == &f[0]); // 6 is not ahead by the granularity: 5 keeps the core
      }
    }
  }
}

TEST_CASE("a pick that keeps a young owner asks to pick again when its least turn ends, and other requests clear that",
          "[coordinator]") {
  // Cookie 5 runs on both siblings; cookie 6 (pinned to sibling 1) has been
  // here before, so when it comes back 10 µs into a new turn of 5 it leads
  // with the sleeper credit. The picks in 5's least turn (a granularity / 8)
  // keep 5 and set the sibling's repick_at to the turn's end, with its
  // preempt flag (Worker::preempt runs on until then, without the lock). The
  // first pick after it hands over, and its request to the other sibling
  // clears that sibling's repick_at, so it stops at its next point.
  constexpr std::uint64_t kGran = 500'000;
  Core core(2, coresched::FairnessPolicy::core_vruntime, kGran);
  std::vector<Fiber> f(3);
  core.add(1, fiber(f, 2, 6, 1));
  REQUIRE(core.pick(1).fiber == &f[2]); // 6 visits
  fake_now += 100'000;
  core.add(0, fiber(f, 0, 5, 0));
  core.add(1, fiber(f, 1, 5, 1));
  REQUIRE(core.pick(1).fiber == &f[1]); // f2 parked: 5 takes the core
  REQUIRE(core.pick(0).fiber == &f[0]);
  fake_now += 10'000'000; // 5 runs 10 ms: 6 is far behind
  core.add(1, f[2]);      // 6 comes back with the credit, leads, asks 5 to stop
  CHECK(core.c.sibling(0).preempt.load());
  core.c.requeue_locked(1, &f[1]);
  REQUIRE(core.pick(1).kind == Kind::forced_idle); // 5's turn is old: 6 is due
  core.c.requeue_locked(0, &f[0]);
  REQUIRE(core.pick(0).kind == Kind::forced_idle); // 6 pinned to sibling 1: the core is handed to it
  REQUIRE(core.pick(1).fiber == &f[2]);
  fake_now += 5'000;
  REQUIRE(core.pick(1).fiber == &f[1]); // 6 parks after 5 µs: 5's new turn
  REQUIRE(core.pick(0).fiber == &f[0]);
  const std::uint64_t turn_start = fake_now;
  fake_now += 10'000;
  // A re-pick time left from an earlier young turn (stale: every request
  // but a young turn's own must clear it, or it would wait for it).
  for (unsigned s : {0u, 1u}) core.c.sibling(s).repick_at.store(fake_now + 1'000'000'000);
  core.add(1, f[2]); // 6 is back 10 µs into 5's turn, and leads
  for (unsigned s : {0u, 1u}) {
    INFO("sibling " << s);
    CHECK(core.c.sibling(s).preempt.load());
    CHECK(core.c.sibling(s).repick_at.load() == 0); // the arrival's request (request_stop) cleared it
    core.c.requeue_locked(s, &f[s]);
    const Pick p = core.pick(s);
    CHECK(p.fiber == &f[s]); // young: 5 is kept
    CHECK(core.c.sibling(s).preempt.load());
    CHECK(core.c.sibling(s).repick_at.load() == turn_start + (kGran >> 3));
  }
  fake_now = turn_start + (kGran >> 3) + 1'000;
  core.c.requeue_locked(0, &f[0]);
  CHECK(core.pick(0).kind == Kind::forced_idle); // the least turn is over: 6's turn
  CHECK(core.c.sibling(1).preempt.load());
  CHECK(core.c.sibling(1).repick_at.load() == 0); // sibling 1 stops at its next point
}
