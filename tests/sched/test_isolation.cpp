// SPDX-License-Identifier: Apache-2.0
// User code run on a fiber's behalf keeps that fiber's cookie: its joiner
// resumed after an inline child changed its cookie, and the destructors of its
// captures and results, run in the fiber they belong to.
#include "guarantees/oracle.hpp"
#include "test_support.hpp"

#include <coresched/coresched.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

using namespace coresched;
using guarantees::Oracle;
using guarantees::Scope;
using test_support::scaled;
using test_support::spin;
using test_support::topo;

namespace {

// Fibers of `c` that stamp the oracle while they spin, until `stop`.
void busy_tenant(Runtime& rt, Oracle& oracle, Cookie c, std::atomic<bool>& stop, int n,
                 std::vector<JoinHandle<void>>& out) {
  for (int i = 0; i < n; ++i)
    out.push_back(rt.spawn(
        [&oracle, &stop, c] {
          while (!stop.load(std::memory_order_relaxed)) {
            {
              Scope s(oracle, c);
              spin(200);
            }
            this_fiber::yield();
          }
        },
        SpawnOptions{.cookie = c}));
}

} // namespace

TEST_CASE("a child joined inline that changes its cookie leaves its joiner under the joiner's cookie",
          "[isolation]") {
  for (const char* spec : {"core:1 pu:2", "core:2 pu:2"}) {
    Runtime rt(topo(spec));
    Oracle oracle(rt.topology());
    const Cookie a = Cookie::create(), b = Cookie::create();
    std::atomic<bool> stop{false};
    std::vector<JoinHandle<void>> hs;
    busy_tenant(rt, oracle, b, stop, 2 * static_cast<int>(rt.topology().cores().size()), hs);
    std::atomic<long> intervals{0};
    for (int p = 0; p < 2; ++p)
      hs.push_back(rt.spawn(
          [&] {
            for (int i = 0; i < scaled(20000); ++i) {
              // Joined before it started: it runs inline on this PU, and switches itself to b.
              spawn([&] { this_fiber::set_cookie(b); }).join();
              {
                Scope s(oracle, a); // this fiber is still a
                spin(200);
              }
              intervals.fetch_add(1, std::memory_order_relaxed);
            }
          },
          SpawnOptions{.cookie = a}));
    hs[hs.size() - 1].join();
    hs[hs.size() - 2].join();
    stop = true;
    hs.clear();
    INFO(spec << ": " << intervals.load() << " intervals");
    CHECK(oracle.violations.load() == 0);
  }
}

namespace {
// A capture whose destructor is user code of the fiber's cookie: it stamps the
// oracle while it runs, as a destructor zeroising a tenant's key would touch it.
struct StampOnDestroy {
  Oracle* oracle = nullptr;
  std::atomic<long>* outside = nullptr;
  StampOnDestroy(Oracle* p, std::atomic<long>* o) : oracle(p), outside(o) {}
  StampOnDestroy(StampOnDestroy&& o) noexcept : oracle(std::exchange(o.oracle, nullptr)), outside(o.outside) {}
  StampOnDestroy(const StampOnDestroy&) = delete;
  ~StampOnDestroy() {
    if (!oracle) return; // moved from
    if (!this_fiber::in_fiber()) { // the runtime destroyed it between fibers
      outside->fetch_add(1);
      return;
    }
    Scope s(*oracle, this_fiber::cookie()); // under the cookie the runtime says this fiber has now
    spin(200);
  }
};
} // namespace

TEST_CASE("a finished fiber's captures and uncollected result are destroyed under its own cookie",
          "[isolation]") {
  Runtime rt(topo("core:1 pu:2"));
  Oracle oracle(rt.topology());
  const Cookie a = Cookie::create(), b = Cookie::create();
  std::atomic<long> outside{0};
  std::atomic<int> done{0};
  const int n = scaled(20000);
  // Two tenants of detached fibers: captures with destructors, and results
  // (a detached fiber's result is the runtime's to destroy) with them too.
  auto spawner = [&](Cookie c) {
    return rt.spawn(
        [&, c] {
          for (int i = 0; i < n; ++i) {
            spawn(
                [cap = StampOnDestroy(&oracle, &outside), &done] {
                  spin(100);
                  done.fetch_add(1, std::memory_order_relaxed);
                  return StampOnDestroy(cap.oracle, cap.outside);
                },
                SpawnOptions{.cookie = c, .detached = true});
            if (i % 16 == 0) this_fiber::yield();
          }
        },
        SpawnOptions{.cookie = c});
  };
  auto ha = spawner(a), hb = spawner(b);
  ha.join();
  hb.join();
  rt.shutdown();
  CHECK(done.load() == 2 * n);
  CHECK(outside.load() == 0);
  CHECK(oracle.violations.load() == 0);
}

TEST_CASE("a result whose handle goes after the fiber finished is destroyed by the handle's owner",
          "[isolation]") {
  // Once a fiber is done, its result belongs to whoever holds the handle; a
  // detach then destroys it in that fiber, not with the record's last
  // reference, which the finished fiber's worker often drops while already
  // running another fiber.
  struct Ids {
    std::atomic<std::uint64_t> owner{0}, child{0};
    std::atomic<int> wrong{0}, destroyed{0};
  };
  struct Tracker {
    Ids* ids = nullptr;
    explicit Tracker(Ids* i) : ids(i) {}
    Tracker(Tracker&& o) noexcept : ids(std::exchange(o.ids, nullptr)) {}
    ~Tracker() {
      if (!ids) return;
      const std::uint64_t me = this_fiber::id();
      if (me != ids->owner.load() && me != ids->child.load()) ids->wrong.fetch_add(1);
      ids->destroyed.fetch_add(1);
    }
  };
  Runtime rt(topo("core:2 pu:1"));
  const int n = scaled(3000);
  auto h = rt.spawn([&] {
    int wrong = 0;
    for (int i = 0; i < n; ++i) {
      Ids ids;
      ids.owner = this_fiber::id();
      std::atomic<bool> returning{false};
      auto child = spawn(
          [&] {
            returning.store(true);
            return Tracker(&ids);
          },
          SpawnOptions{.pin_to_pu = 1}); // beside this fiber, which is pinned to PU 0
      ids.child = child.id();
      while (!returning.load()) this_fiber::yield(); // it runs on the other worker
      spin((i % 64) * 8);                            // sweep the detach across the child's last steps
      child.detach();
      while (ids.destroyed.load() == 0) this_fiber::yield();
      wrong += ids.wrong.load();
    }
    return wrong;
  }, SpawnOptions{.pin_to_pu = 0});
  CHECK(h.join() == 0);
}
