// SPDX-License-Identifier: Apache-2.0
// Oracle scenarios, part 1: spawning and joining (inline and not), cookies
// (inherited, explicit, set_cookie anywhere), scheduling points, exceptions,
// and the destructors of what a fiber owns. Every scenario runs beside rival
// fibers of other cookies that keep the sibling PUs busy, with busy work in
// each stamped interval, so a cookie the runtime loses track of collides with
// a rival's while the oracle watches.
#include "harness.hpp"

#include <catch2/catch.hpp>

#include <exception>

using namespace coresched;
using namespace guarantees;
using namespace std::chrono_literals;

namespace {

/// Touches `n` bytes of stack; the child of the stack-size scenario.
[[gnu::noinline]] int use_stack(std::size_t n) {
  volatile char* buf = static_cast<volatile char*>(__builtin_alloca(n));
  for (std::size_t i = 0; i < n; i += 256) buf[i] = static_cast<char>(i);
  return buf[n / 2];
}

} // namespace

TEST_CASE("oracle unit: different cookies on sibling PUs are flagged and other cores are not", "[oracle]") {
  const Topology t = Topology::discover("core:2 pu:2");
  Oracle o(t);
  const auto& c0 = t.cores()[0].pus;
  const auto& c1 = t.cores()[1].pus;
  const int a0 = static_cast<int>(c0[0]), a1 = static_cast<int>(c0[1]), b0 = static_cast<int>(c1[0]);
  CHECK(o.stamp(a0, 7, "first") == Oracle::kEmpty);
  o.stamp(a1, 7, "same cookie beside it");
  o.stamp(b0, 9, "other core");
  CHECK(o.violations == 0);
  o.restore(a1, 7, Oracle::kEmpty, "leave");
  const std::uint64_t prev = o.stamp(a1, 9, "different cookie beside it");
  CHECK(o.violations == 1);
  REQUIRE(o.first_violations().size() == 1);
  CHECK(o.first_violations()[0].mine == 9);
  CHECK(o.first_violations()[0].other == 7);
  CHECK(o.first_violations()[0].pu == static_cast<unsigned>(a1));
  // A nested interval puts the outer cookie back, and that is checked again.
  o.restore(a1, 9, prev, "leave");
  const std::uint64_t outer = o.stamp(a0, 7, "nested, same cookie");
  CHECK(outer == 7);
  o.restore(a0, 7, outer, "end of nested");
  CHECK(o.violations == 1);
  CHECK(o.slot_mismatches == 0);
  o.restore(a0, 8, Oracle::kEmpty, "leave with the wrong cookie");
  CHECK(o.slot_mismatches == 1);
}

TEST_CASE("spawn with inherited and explicit cookies joined after the child started", "[oracle][spawn]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const Cookie a = Cookie::create(), b = Cookie::create();
  h.start_rivals({a, b});
  const int rounds = scaled(60);
  std::atomic<int> ran{0}, wrong_cookie{0}, wrong_value{0};
  std::vector<JoinHandle<void>> parents;
  for (int p = 0; p < 4; ++p) {
    const Cookie mine = p % 2 ? a : b, other = p % 2 ? b : a;
    parents.push_back(h.rt.spawn([&, mine, other] {
      Scope s(h.oracle, mine, "parent");
      for (int i = 0; i < rounds; ++i) {
        const bool inherit = i % 2 == 0;
        const Cookie expect = inherit ? mine : other;
        std::atomic<bool> started{false};
        auto child = s.around([&] {
          return coresched::spawn([&, expect] {
            Scope cs(h.oracle, expect, inherit ? "inherited child" : "explicit child");
            if (this_fiber::cookie() != expect) wrong_cookie.fetch_add(1);
            started.store(true);
            cs.burn(20us);
            cs.yield();
            cs.burn(10us);
            ran.fetch_add(1);
            return i;
          }, inherit ? SpawnOptions{} : SpawnOptions{.cookie = other});
        });
        while (!started.load()) s.yield(); // so the join below is not an inline one
        s.burn(10us);
        if (s.join(child) != i) wrong_value.fetch_add(1);
      }
    }, SpawnOptions{.cookie = mine}));
  }
  for (auto& p : parents) p.join();
  h.stop_rivals();
  CHECK(ran == 4 * rounds);
  CHECK(wrong_cookie == 0);
  CHECK(wrong_value == 0);
  CHECK_ISOLATED(h);
}

TEST_CASE("join right after spawn (inline join) with inherited and explicit cookies", "[oracle][inline]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const Cookie a = Cookie::create(), b = Cookie::create();
  h.start_rivals({b});
  const int rounds = scaled(150);
  std::atomic<int> wrong_value{0}, wrong_cookie{0};
  std::vector<JoinHandle<void>> parents;
  for (int p = 0; p < 3; ++p)
    parents.push_back(h.rt.spawn([&] {
      Scope s(h.oracle, a, "parent");
      for (int i = 0; i < rounds; ++i) {
        const Cookie expect = i % 3 == 2 ? b : a;
        auto child = s.around([&] {
          return coresched::spawn([&, i, expect] {
            Scope cs(h.oracle, expect, "inline-joined child");
            cs.burn(10us);
            if (i % 2) cs.yield(); // blocks with its parent suspended underneath it
            cs.burn(5us);
            return i;
          }, i % 3 == 2 ? SpawnOptions{.cookie = b} : SpawnOptions{});
        });
        if (s.join(child) != i) wrong_value.fetch_add(1);
        if (this_fiber::cookie() != a) wrong_cookie.fetch_add(1);
        s.burn(20us);
      }
    }, SpawnOptions{.cookie = a}));
  for (auto& p : parents) p.join();
  h.stop_rivals();
  CHECK(wrong_value == 0);
  CHECK(wrong_cookie == 0);
  CHECK_ISOLATED(h);
}

// The inline-joined child's new cookie must not stay published for its
// parent, or the parent's code runs under B beside B's rivals.
TEST_CASE("set_cookie in an inline-joined child does not leak into its parent", "[oracle][inline][cookie]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const Cookie a = Cookie::create(), b = Cookie::create(), c = Cookie::create();
  h.start_rivals({b, c});
  const int rounds = scaled(150);
  std::atomic<int> child_cookie_wrong{0};
  std::vector<JoinHandle<void>> parents;
  for (int p = 0; p < 2; ++p)
    parents.push_back(h.rt.spawn([&] {
      Scope s(h.oracle, a, "parent after an inline join");
      for (int i = 0; i < rounds; ++i) {
        auto child = s.around([&] {
          return coresched::spawn([&] {
            Scope cs(h.oracle, a, "inline-joined child");
            cs.burn(5us);
            cs.set_cookie(b);
            if (this_fiber::cookie() != b) child_cookie_wrong.fetch_add(1);
            cs.burn(10us);
          });
        });
        s.join(child);
        s.burn(60us); // the parent still believes it is `a`
        s.yield();
      }
    }, SpawnOptions{.cookie = a}));
  for (auto& p : parents) p.join();
  h.stop_rivals();
  CHECK(child_cookie_wrong == 0);
  CHECK_ISOLATED(h);
}

TEST_CASE("set_cookie after every kind of wait / holding a mutex / in destructors (also unwinding)",
          "[oracle][cookie]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const std::vector<Cookie> cookies{Cookie{}, Cookie::create(), Cookie::create(), Cookie::create()};
  h.start_rivals({cookies[1], cookies[2]}, 1);
  const int rounds = scaled(40);
  Mutex mu;
  Channel<int> ch(2);
  std::atomic<int> wrong_cookie{0}, caught{0};
  // A scope-exit guard whose destructor switches cookie: runs at the end of a
  // block and while an exception unwinds through it.
  struct Restore {
    Scope& s;
    Cookie back;
    ~Restore() { s.set_cookie(back); }
  };
  std::vector<JoinHandle<void>> fibers;
  for (int f = 0; f < 4; ++f)
    fibers.push_back(h.rt.spawn([&, f] {
      Scope s(h.oracle, cookies[f], "set_cookie fiber");
      auto next = [&, k = f]() mutable { return cookies[++k % cookies.size()]; };
      auto verify = [&] { if (this_fiber::cookie() != s.cookie()) wrong_cookie.fetch_add(1); };
      for (int i = 0; i < rounds; ++i) {
        s.sleep_for(20us);
        s.set_cookie(next());
        verify();
        s.burn(10us);
        s.around([&] { mu.lock(); });
        s.set_cookie(next()); // may yield while holding the mutex
        s.burn(10us);
        mu.unlock();
        verify();
        auto child = s.around([&] { return coresched::spawn([] { this_fiber::yield(); }); });
        s.join(child);
        s.set_cookie(next());
        s.around([&] { (void)ch.send(i); });
        s.around([&] { (void)ch.recv(); });
        s.set_cookie(next());
        verify();
        {
          Restore r{s, s.cookie()};
          s.set_cookie(next());
          s.burn(5us);
        }
        verify();
        try {
          Restore r{s, s.cookie()};
          s.set_cookie(next());
          throw Tagged{static_cast<std::uint64_t>(i)};
        } catch (const Tagged& t) {
          if (t.tag == static_cast<std::uint64_t>(i)) caught.fetch_add(1);
        }
        verify();
        s.burn(10us);
      }
    }, SpawnOptions{.cookie = cookies[f]}));
  for (auto& fb : fibers) fb.join();
  h.stop_rivals();
  CHECK(wrong_cookie == 0);
  CHECK(caught == 4 * rounds);
  CHECK_ISOLATED(h);
}

TEST_CASE("yield / preempt_point / sleep_for keep cookies apart", "[oracle][sched]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const std::vector<Cookie> cookies{Cookie{}, Cookie::create(), Cookie::create()};
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(scaled(300));
  std::vector<JoinHandle<void>> fibers;
  for (int f = 0; f < 9; ++f)
    fibers.push_back(h.rt.spawn([&, f] {
      Scope s(h.oracle, cookies[f % 3], "scheduling points");
      for (unsigned n = 0; std::chrono::steady_clock::now() < until; ++n) {
        s.burn(std::chrono::microseconds(5 + n % 30));
        switch (n % 5) {
        case 0: s.yield(); break;
        case 1: s.sleep_for(std::chrono::microseconds(n % 100)); break;
        default: s.preempt_point(); break;
        }
      }
    }, SpawnOptions{.cookie = cookies[f % 3]}));
  for (auto& fb : fibers) fb.join();
  CHECK_ISOLATED(h);
}

TEST_CASE("exceptions through join (inline and not) reach exactly their joiner", "[oracle][exception]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const Cookie a = Cookie::create(), b = Cookie::create();
  h.start_rivals({b});
  const int rounds = scaled(100);
  std::atomic<int> wrong{0};
  std::vector<JoinHandle<void>> parents;
  for (int p = 0; p < 3; ++p)
    parents.push_back(h.rt.spawn([&, p] {
      Scope s(h.oracle, a, "joiner of a throwing child");
      for (int i = 0; i < rounds; ++i) {
        const std::uint64_t tag = static_cast<std::uint64_t>(p) << 32 | static_cast<unsigned>(i);
        const Cookie cc = i % 2 ? b : a;
        auto child = s.around([&] {
          return coresched::spawn([&, tag, cc]() -> int {
            Scope cs(h.oracle, cc, "throwing child");
            cs.burn(5us);
            if (tag % 3 == 0) cs.yield();
            throw Tagged{tag};
          }, SpawnOptions{.cookie = cc});
        });
        if (i % 4 >= 2) s.yield(); // half are joined after the child may have started
        try {
          (void)s.join(child);
          wrong.fetch_add(1);
        } catch (const Tagged& t) {
          if (t.tag != tag) wrong.fetch_add(1);
          s.burn(5us);
        }
        if (std::current_exception()) wrong.fetch_add(1);
      }
    }, SpawnOptions{.cookie = a}));
  for (auto& p : parents) p.join();
  h.stop_rivals();
  CHECK(wrong == 0);
  CHECK_ISOLATED(h);
}

// The exception being handled is the fiber's, not the worker thread's:
// otherwise, after a suspension inside a catch block, current_exception() and
// `throw;` give another fiber's exception (or crash).
TEST_CASE("a fiber that suspends inside a catch block keeps its own exception", "[oracle][exception]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const std::vector<Cookie> cookies{Cookie::create(), Cookie::create()};
  Mutex mu;
  const int rounds = scaled(60);
  std::atomic<int> wrong{0}, uncaught_wrong{0}, handled{0};
  // A destructor that switches while an exception unwinds through it.
  struct SwitchInDtor {
    Scope& s;
    std::atomic<int>& bad;
    ~SwitchInDtor() {
      const int before = std::uncaught_exceptions();
      s.yield();
      if (std::uncaught_exceptions() != before || before != 1) bad.fetch_add(1);
    }
  };
  std::vector<JoinHandle<void>> fibers;
  for (int f = 0; f < 8; ++f)
    fibers.push_back(h.rt.spawn([&, f] {
      Scope s(h.oracle, cookies[f % 2], "catch block");
      for (int i = 0; i < rounds; ++i) {
        const std::uint64_t tag = static_cast<std::uint64_t>(f) << 32 | static_cast<unsigned>(i);
        try {
          throw Tagged{tag};
        } catch (const Tagged& e) {
          switch (i % 3) { // other fibers catch their own exceptions meanwhile
          case 0: s.yield(); break;
          case 1: s.sleep_for(30us); break;
          default: s.around([&] { mu.lock(); }); s.yield(); mu.unlock(); break;
          }
          if (e.tag != tag || !current_is(tag)) wrong.fetch_add(1);
          try {
            throw;
          } catch (const Tagged& again) {
            s.yield();
            if (again.tag != tag || !current_is(tag)) wrong.fetch_add(1);
          }
          if (!current_is(tag)) wrong.fetch_add(1);
          handled.fetch_add(1);
        }
        if (std::current_exception()) wrong.fetch_add(1);
        try {
          SwitchInDtor d{s, uncaught_wrong};
          throw Tagged{tag};
        } catch (const Tagged& e) {
          if (e.tag != tag) wrong.fetch_add(1);
        }
      }
    }, SpawnOptions{.cookie = cookies[f % 2]}));
  for (auto& fb : fibers) fb.join();
  CHECK(handled == 8 * rounds);
  CHECK(wrong == 0);
  CHECK(uncaught_wrong == 0);
  CHECK_ISOLATED(h);
}

// A child joined inline runs on its joiner's thread without a switch, so
// unless its exception state is swapped it sees the joiner's:
// current_exception() inside it is the joiner's exception, `throw;` rethrows
// it, and during the joiner's unwinding (a JoinHandle destructor joins)
// uncaught_exceptions() is 1 in the child.
TEST_CASE("a child joined inline from a catch block or during unwinding has no exception of its own",
          "[oracle][exception][inline]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const int rounds = scaled(50);
  std::atomic<int> saw_parents{0}, saw_uncaught{0}, wrong_after{0};
  auto child_body = [&] {
    if (std::current_exception()) saw_parents.fetch_add(1);
    if (std::uncaught_exceptions() != 0) saw_uncaught.fetch_add(1);
    try { // the child's own exception, with a suspension, then none again
      throw Tagged{7};
    } catch (const Tagged&) {
      this_fiber::yield();
    }
    if (std::current_exception()) saw_parents.fetch_add(1);
  };
  auto parent = h.rt.spawn([&] {
    for (int i = 0; i < rounds; ++i) {
      try {
        throw Tagged{static_cast<std::uint64_t>(i)};
      } catch (const Tagged&) {
        auto c = coresched::spawn(child_body); // joined before it started: inline
        c.join();
        if (!current_is(static_cast<std::uint64_t>(i))) wrong_after.fetch_add(1);
      }
      try {
        auto c = coresched::spawn(child_body);
        throw Tagged{0}; // ~JoinHandle joins the child while this unwinds
      } catch (const Tagged&) {
      }
    }
  });
  parent.join();
  CHECK(saw_parents == 0);
  CHECK(saw_uncaught == 0);
  CHECK(wrong_after == 0);
}

// A finished fiber's captures (and a detached fiber's result) must be
// destroyed before the next fiber's cookie is published.
TEST_CASE("captures and results are destroyed under their own fiber's cookie", "[oracle][destructor]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const Cookie a = Cookie::create(), b = Cookie::create(), c = Cookie::create();
  h.start_rivals({b}, 3);
  const int n = scaled(150);
  std::vector<std::shared_ptr<Owner>> owners;
  for (int i = 0; i < n; ++i) owners.push_back(std::make_shared<Owner>(a));

  SECTION("detached fibers: captures and the discarded result") {
    auto spawner = h.rt.spawn([&] {
      Scope s(h.oracle, a, "spawner");
      for (int i = 0; i < n; ++i) {
        auto o = owners[static_cast<std::size_t>(i)];
        s.around([&] {
          coresched::spawn([&h, o, i, c, st = Stamper(h.oracle, o, "capture destructor")]() mutable {
            Scope fs(h.oracle, Cookie::from_value(o->cookie), "detached fiber");
            fs.burn(15us);
            if (i % 2) { // the destructors belong to the cookie the fiber ends with
              fs.set_cookie(c);
              o->cookie = c.value();
            }
            return Stamper(h.oracle, o, "detached result destructor");
          }, SpawnOptions{.detached = true});
        });
        // A bounded backlog, so destructors run while rivals and spawns still compete.
        const auto give_up = std::chrono::steady_clock::now() + 10s;
        while (i >= 8 && owners[static_cast<std::size_t>(i - 8)]->destroyed.load() < 2 &&
               std::chrono::steady_clock::now() < give_up)
          s.yield();
      }
    }, SpawnOptions{.cookie = a});
    spawner.join();
    CHECK(wait_for([&] {
      for (auto& o : owners)
        if (o->destroyed.load() < 2) return false;
      return true;
    }));
  }
  SECTION("joined fibers: captures, and the result the joiner adopts") {
    auto joiner = h.rt.spawn([&] {
      Scope s(h.oracle, a, "joiner");
      auto mine = std::make_shared<Owner>(a);
      for (int i = 0; i < n; ++i) {
        auto o = owners[static_cast<std::size_t>(i)];
        auto child = s.around([&] {
          return coresched::spawn([&h, o, st = Stamper(h.oracle, o, "capture destructor")]() mutable {
            Scope fs(h.oracle, Cookie::from_value(o->cookie), "joined fiber");
            fs.burn(15us);
            return Stamper(h.oracle, o, "moved-from result");
          });
        });
        if (i % 2) s.yield();
        Stamper r = s.join(child);
        r.adopt(mine); // now the joiner's: destroyed at the end of this iteration, inside its scope
      }
    }, SpawnOptions{.cookie = a});
    joiner.join();
    CHECK(wait_for([&] {
      for (auto& o : owners)
        if (o->destroyed.load() < 1) return false;
      return true;
    }));
  }
  SECTION("joined by a fiber of another cookie") {
    auto joiner = h.rt.spawn([&] {
      Scope s(h.oracle, b, "joiner of another cookie");
      for (int i = 0; i < n; ++i) {
        auto o = owners[static_cast<std::size_t>(i)];
        auto child = s.around([&] {
          return coresched::spawn([&h, o, st = Stamper(h.oracle, o, "capture destructor")] {
            Scope fs(h.oracle, Cookie::from_value(o->cookie), "joined fiber");
            fs.burn(15us);
          }, SpawnOptions{.cookie = a});
        });
        s.join(child);
      }
    }, SpawnOptions{.cookie = b});
    joiner.join();
  }
  h.stop_rivals();
  CHECK_ISOLATED(h);
}

// An inline join must not run the child on the joiner's stack whatever
// stack_size the child asked for; this child overflows a 64 KiB stack (the
// runtime reports the overflow and aborts).
TEST_CASE("a child joined inline gets the stack size it asked for", "[stack][inline]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const int rounds = scaled(20);
  auto parent = h.rt.spawn([&] {
    int sum = 0;
    for (int i = 0; i < rounds; ++i) {
      auto child = coresched::spawn([] { return use_stack(200 * 1024); }, SpawnOptions{.stack_size = 512 * 1024});
      sum += child.join() == static_cast<char>(100 * 1024 % 256) ? 1 : 0;
    }
    return sum;
  });
  CHECK(parent.join() == rounds);
}
