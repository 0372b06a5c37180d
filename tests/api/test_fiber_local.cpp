// SPDX-License-Identifier: Apache-2.0
// FiberLocal: each fiber sees its own value across suspensions and moves
// between workers (where a thread_local shows another fiber's), a child
// joined inline has its own, values are destroyed when their fiber ends,
// under its cookie, and misuse from a plain thread is a UsageError.
#include <coresched/coresched.hpp>
#include <coresched/fiber_local.hpp>

#include "test_support.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace coresched;
using namespace std::chrono_literals;
using test_support::topo;

namespace {

// Atomic only so that the sanitizers see no data race: what the test shows
// is that fibers sharing a worker share its thread_local.
thread_local std::atomic<std::uint64_t> tls_value{0};

// 2,000 fibers each store their id, then sleep 100 us five times (they
// move between the four workers meanwhile) and read it back. Returns how
// many read another fiber's value, and counts the fibers that moved.
template <class Store, class Load>
int fibers_reading_another(Runtime& rt, Store store, Load load, std::atomic<int>& moved) {
  std::atomic<int> wrong{0};
  std::vector<JoinHandle<void>> hs;
  for (int i = 0; i < 2000; ++i)
    hs.push_back(rt.spawn([&] {
      const std::uint64_t me = this_fiber::id();
      const unsigned first_worker = this_fiber::location().worker;
      store(me);
      bool seen_other = false;
      for (int k = 0; k < 5; ++k) {
        this_fiber::sleep_for(100us);
        seen_other = seen_other || load() != me;
      }
      if (this_fiber::location().worker != first_worker) ++moved;
      if (seen_other) ++wrong;
    }));
  for (auto& h : hs) h.join();
  return wrong.load();
}

} // namespace

TEST_CASE("FiberLocal: 2,000 fibers keep their own value across sleeps and migrations; thread_local does not",
          "[fiber_local]") {
  Runtime rt(topo("core:2 pu:2"));
  static FiberLocal<std::uint64_t> local;
  std::atomic<int> moved{0};
  const int with_local = fibers_reading_another(
      rt, [](std::uint64_t v) { local.reset(new std::uint64_t(v)); }, [] { return *local; }, moved);
  CHECK(with_local == 0);
  INFO(moved.load() << " fibers moved worker");
  std::atomic<int> moved_tls{0};
  const int with_tls = fibers_reading_another(
      rt, [](std::uint64_t v) { tls_value.store(v, std::memory_order_relaxed); },
      [] { return tls_value.load(std::memory_order_relaxed); }, moved_tls);
  CHECK(with_tls > 0); // fibers that share a worker thread share its thread_local
}

TEST_CASE("FiberLocal: a child, also one joined inline, starts with none and keeps its own", "[fiber_local]") {
  Runtime rt(topo("core:1 pu:2"));
  static FiberLocal<int> local;
  rt.spawn([] {
    CHECK(local.get() == nullptr);
    local.reset(new int(1));
    auto child = coresched::spawn([] {
      const bool empty = local.get() == nullptr;
      local.reset(new int(2));
      this_fiber::yield();
      return empty && *local == 2;
    });
    CHECK(child.join()); // often run inline, on this fiber's stack
    CHECK(*local == 1);
    int* mine = local.release();
    CHECK(local.get() == nullptr);
    delete mine;
    local.reset(new int(3));
    local.reset(); // destroys 3
    CHECK(local.get() == nullptr);
  }).join();
}

TEST_CASE("FiberLocal: values are destroyed when their fiber ends, in it, under its cookie", "[fiber_local]") {
  struct Tracked {
    std::atomic<int>* destroyed;
    std::atomic<std::uint64_t>* cookie_seen;
    std::atomic<std::uint64_t>* fiber_seen;
    ~Tracked() {
      cookie_seen->store(this_fiber::cookie().value());
      fiber_seen->store(this_fiber::id());
      destroyed->fetch_add(1);
    }
  };
  static FiberLocal<Tracked> local;
  static FiberLocal<int> second;
  Runtime rt(topo("core:2 pu:2"));
  const Cookie tenant = Cookie::create("tenant");
  std::atomic<int> destroyed{0};
  std::atomic<std::uint64_t> cookie_seen{0}, fiber_seen{0}, id{0};
  auto h = rt.spawn([&] {
    id = this_fiber::id();
    local.reset(new Tracked{&destroyed, &cookie_seen, &fiber_seen});
    second.reset(new int(5));
    this_fiber::set_cookie(tenant); // the value follows the fiber, not the cookie it started with
    this_fiber::sleep_for(1ms);
  });
  h.join();
  CHECK(destroyed.load() == 1);
  CHECK(cookie_seen.load() == tenant.value());
  CHECK(fiber_seen.load() == id.load());
  // A detached fiber's too, and one that ends by an exception.
  rt.spawn([&] {
    local.reset(new Tracked{&destroyed, &cookie_seen, &fiber_seen});
    throw std::runtime_error("ends");
  }).detach();
  for (int i = 0; i < 10000 && destroyed.load() < 2; ++i) std::this_thread::sleep_for(1ms);
  CHECK(destroyed.load() == 2);
}

TEST_CASE("FiberLocal: a plain thread's use is a UsageError", "[fiber_local]") {
  static FiberLocal<int> local;
  CHECK_THROWS_AS(local.get(), UsageError);
  CHECK_THROWS_AS(local.reset(new int(1)), UsageError); // and deletes the int it was given
  CHECK_THROWS_AS(local.release(), UsageError);
}
