// SPDX-License-Identifier: Apache-2.0
// coresched::Channel, buffered and unbuffered: every item delivered once and
// in order per producer, close, try_send/try_recv, fibers and plain threads on
// both sides, across workers.
#include <coresched/coresched.hpp>
#include <coresched/sync.hpp>

#include "sync_support.hpp"
#include "test_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace coresched;
using namespace std::chrono_literals;
using namespace sync_support;
using test_support::stress_scale;
using test_support::topo;

// ------------------------------------------------------------------ Channel

TEST_CASE("sync: Channel with many producers and consumers delivers every item exactly once, in order per producer",
          "[sync][channel][stress]") {
  Runtime rt(topo("core:2 pu:2"));
  constexpr int kProducers = 8, kConsumers = 8;
  const int per = scaled(25'000);
  Channel<std::uint64_t> ch(8);
  CHECK(ch.capacity() == 8);
  std::vector<std::atomic<int>> seen(static_cast<std::size_t>(kProducers + 1) * per);
  std::atomic<int> out_of_order{0}, failed_sends{0};
  std::atomic<std::uint64_t> progress{0};
  Watchdog dog("channel", progress);
  auto consume = [&] {
    std::vector<int> last(kProducers + 1, -1);
    while (auto v = ch.recv()) {
      const auto p = static_cast<int>(*v >> 32), i = static_cast<int>(*v & 0xffffffffu);
      if (i <= last[static_cast<std::size_t>(p)]) out_of_order.fetch_add(1);
      last[static_cast<std::size_t>(p)] = i;
      seen[static_cast<std::size_t>(p) * per + i].fetch_add(1);
      progress.fetch_add(1, std::memory_order_relaxed);
    }
  };
  auto produce = [&](int p) {
    for (int i = 0; i < per; ++i)
      if (!ch.send((std::uint64_t(p) << 32) | std::uint64_t(i))) failed_sends.fetch_add(1);
  };
  std::vector<JoinHandle<void>> consumers, producers;
  for (int c = 0; c < kConsumers; ++c) consumers.push_back(rt.spawn(consume));
  for (int p = 0; p < kProducers; ++p) producers.push_back(rt.spawn([&, p] { produce(p); }));
  std::thread thread_consumer(consume);
  std::thread thread_producer([&] { produce(kProducers); });
  for (auto& h : producers) h.join();
  thread_producer.join();
  ch.close();
  for (auto& h : consumers) h.join();
  thread_consumer.join();
  int once = 0;
  for (auto& s : seen) once += s.load() == 1;
  CHECK(once == static_cast<int>(seen.size()));
  CHECK(out_of_order.load() == 0);
  CHECK(failed_sends.load() == 0);
  CHECK(ch.size() == 0);
  check_isolation(rt);
}

TEST_CASE("sync: Channel close: buffered items drain, then recv gives nullopt and send fails", "[sync][channel]") {
  Runtime rt(topo("core:2 pu:2"));
  Channel<std::string> ch(4);
  REQUIRE(ch.send(std::string("a")));
  const std::string b = "b";
  REQUIRE(ch.send(b));
  CHECK_FALSE(ch.closed());
  ch.close();
  ch.close(); // idempotent
  CHECK(ch.closed());
  std::string c = "c";
  CHECK_FALSE(ch.send(std::move(c)));
  CHECK(c == "c"); // not taken
  CHECK_FALSE(ch.try_send(std::string("d")));
  auto h = rt.spawn([&] {
    std::vector<std::string> got;
    while (auto v = ch.recv()) got.push_back(*v);
    return got;
  });
  CHECK(h.join() == std::vector<std::string>{"a", "b"});
  CHECK_FALSE(ch.recv().has_value());
  CHECK_FALSE(ch.try_recv().has_value());
}

TEST_CASE("sync: Channel close releases blocked senders (false) and blocked receivers (nullopt)", "[sync][channel]") {
  Runtime rt(topo("core:2 pu:2"));
  SECTION("receivers") {
    Channel<int> ch(1);
    std::vector<JoinHandle<bool>> hs;
    for (int i = 0; i < 4; ++i) hs.push_back(rt.spawn([&] { return ch.recv().has_value(); }));
    std::optional<int> thread_got = 1;
    std::thread t([&] { thread_got = ch.recv(); });
    std::this_thread::sleep_for(20ms);
    ch.close();
    for (auto& h : hs) CHECK_FALSE(h.join());
    t.join();
    CHECK_FALSE(thread_got.has_value());
  }
  SECTION("senders") {
    Channel<std::unique_ptr<int>> ch(1);
    REQUIRE(ch.send(std::make_unique<int>(0)));
    std::vector<JoinHandle<std::pair<bool, bool>>> hs;
    for (int i = 1; i <= 4; ++i)
      hs.push_back(rt.spawn([&, i] {
        auto p = std::make_unique<int>(i);
        const bool ok = ch.send(std::move(p));
        return std::make_pair(ok, p != nullptr && *p == i); // a failed send leaves the value with the caller
      }));
    std::this_thread::sleep_for(20ms);
    CHECK(ch.size() == 1);
    ch.close();
    for (auto& h : hs) {
      const auto [ok, kept] = h.join();
      CHECK_FALSE(ok);
      CHECK(kept);
    }
    auto v = ch.recv(); // the buffered item survives close
    REQUIRE(v.has_value());
    CHECK(**v == 0);
    CHECK_FALSE(ch.recv().has_value());
  }
}

TEST_CASE("sync: Channel try_send and try_recv never wait; a blocked sender's item keeps FIFO order",
          "[sync][channel]") {
  Runtime rt(topo("core:2 pu:2"));
  Channel<std::unique_ptr<int>> ch(2);
  CHECK_FALSE(ch.try_recv().has_value());
  CHECK(ch.try_send(std::make_unique<int>(1)));
  CHECK(ch.try_send(std::make_unique<int>(2)));
  auto three = std::make_unique<int>(3);
  CHECK_FALSE(ch.try_send(std::move(three)));
  REQUIRE(three != nullptr); // full: untouched
  auto sender = rt.spawn([&] { return ch.send(std::move(three)); }); // blocks: full
  std::this_thread::sleep_for(20ms);
  CHECK(ch.size() == 2);
  auto a = ch.try_recv();
  REQUIRE(a.has_value());
  CHECK(**a == 1);
  CHECK(sender.join()); // its item moved into the freed slot, behind 2
  auto b = ch.recv(), c = ch.recv();
  REQUIRE((b && c));
  CHECK(**b == 2);
  CHECK(**c == 3);
  CHECK_FALSE(ch.try_recv().has_value());
  // A waiting receiver takes a try_send directly.
  auto receiver = rt.spawn([&] { return *ch.recv().value(); });
  while (!ch.try_send(std::make_unique<int>(9))) std::this_thread::yield();
  CHECK(receiver.join() == 9);
}

// ------------------------------------------------------------------ Channel, unbuffered (capacity 0)

TEST_CASE("sync: unbuffered Channel: send waits for a receiver, the value moves across directly",
          "[sync][channel][unbuffered]") {
  Runtime rt(topo("core:2 pu:2"));
  Channel<std::unique_ptr<int>> ch(0);
  CHECK(ch.capacity() == 0);
  CHECK(ch.size() == 0);
  SECTION("a fiber sender waits until a plain thread receives") {
    std::atomic<bool> sent{false};
    auto sender = rt.spawn([&] {
      const bool ok = ch.send(std::make_unique<int>(7));
      sent.store(true);
      return ok;
    });
    std::this_thread::sleep_for(20ms);
    CHECK_FALSE(sent.load()); // nobody received yet: still waiting
    CHECK(ch.size() == 0);    // nothing is ever buffered
    auto v = ch.recv();
    REQUIRE(v.has_value());
    CHECK(**v == 7);
    CHECK(sender.join());
    CHECK(sent.load());
  }
  SECTION("a plain-thread sender waits until a fiber receives") {
    std::atomic<bool> sent{false}, ok{false};
    std::thread sender([&] {
      ok.store(ch.send(std::make_unique<int>(8)));
      sent.store(true);
    });
    std::this_thread::sleep_for(20ms);
    CHECK_FALSE(sent.load());
    auto receiver = rt.spawn([&] { return *ch.recv().value(); });
    CHECK(receiver.join() == 8);
    sender.join();
    CHECK(sent.load());
    CHECK(ok.load());
  }
  SECTION("a receiver that comes first gets the next send") {
    auto receiver = rt.spawn([&] { return *ch.recv().value(); });
    std::this_thread::sleep_for(10ms);
    CHECK(ch.send(std::make_unique<int>(9)));
    CHECK(receiver.join() == 9);
  }
}

TEST_CASE("sync: unbuffered Channel: try_send only to a waiting receiver, try_recv only from a waiting sender",
          "[sync][channel][unbuffered]") {
  Runtime rt(topo("core:2 pu:2"));
  Channel<std::unique_ptr<int>> ch(0);
  auto one = std::make_unique<int>(1);
  CHECK_FALSE(ch.try_send(std::move(one))); // nobody waits to receive
  REQUIRE(one != nullptr);                  // untouched
  CHECK_FALSE(ch.try_recv().has_value());   // nobody waits to send
  auto receiver = rt.spawn([&] { return *ch.recv().value(); });
  while (!ch.try_send(std::move(one))) std::this_thread::yield(); // succeeds once the receiver waits
  CHECK(one == nullptr);
  CHECK(receiver.join() == 1);
  auto sender = rt.spawn([&] { return ch.send(std::make_unique<int>(2)); });
  std::optional<std::unique_ptr<int>> got;
  while (!(got = ch.try_recv())) std::this_thread::yield(); // succeeds once the sender waits
  CHECK(**got == 2);
  CHECK(sender.join());
}

TEST_CASE("sync: unbuffered Channel close fails waiting senders (value kept) and releases receivers",
          "[sync][channel][unbuffered]") {
  Runtime rt(topo("core:2 pu:2"));
  SECTION("senders") {
    Channel<std::unique_ptr<int>> ch(0);
    std::vector<JoinHandle<std::pair<bool, bool>>> hs;
    for (int i = 1; i <= 4; ++i)
      hs.push_back(rt.spawn([&, i] {
        auto p = std::make_unique<int>(i);
        const bool ok = ch.send(std::move(p));
        return std::make_pair(ok, p != nullptr && *p == i);
      }));
    std::pair<bool, bool> thread_result{true, false};
    std::thread t([&] {
      auto p = std::make_unique<int>(5);
      const bool ok = ch.send(std::move(p));
      thread_result = {ok, p != nullptr && *p == 5};
    });
    std::this_thread::sleep_for(20ms);
    ch.close();
    for (auto& h : hs) {
      const auto [ok, kept] = h.join();
      CHECK_FALSE(ok);
      CHECK(kept);
    }
    t.join();
    CHECK_FALSE(thread_result.first);
    CHECK(thread_result.second);
    CHECK_FALSE(ch.recv().has_value()); // nothing was buffered
    CHECK_FALSE(ch.send(std::make_unique<int>(6)));
    CHECK_FALSE(ch.try_send(std::make_unique<int>(6)));
  }
  SECTION("receivers") {
    Channel<int> ch(0);
    std::vector<JoinHandle<bool>> hs;
    for (int i = 0; i < 4; ++i) hs.push_back(rt.spawn([&] { return ch.recv().has_value(); }));
    std::optional<int> thread_got = 1;
    std::thread t([&] { thread_got = ch.recv(); });
    std::this_thread::sleep_for(20ms);
    ch.close();
    for (auto& h : hs) CHECK_FALSE(h.join());
    t.join();
    CHECK_FALSE(thread_got.has_value());
    CHECK_FALSE(ch.try_recv().has_value());
  }
}

TEST_CASE("sync: unbuffered Channel with many producers and consumers across workers delivers every item once",
          "[sync][channel][unbuffered][stress]") {
  Runtime rt(topo("core:2 pu:2"));
  constexpr int kProducers = 6, kConsumers = 6;
  const int per = scaled(10'000);
  Channel<std::uint64_t> ch(0);
  // Producers kProducers and kProducers+1 and consumer kConsumers are plain threads.
  std::vector<std::atomic<int>> seen(static_cast<std::size_t>(kProducers + 2) * per);
  std::atomic<int> out_of_order{0}, failed_sends{0};
  std::atomic<std::uint64_t> progress{0};
  Watchdog dog("unbuffered channel", progress);
  auto consume = [&] {
    std::vector<int> last(kProducers + 2, -1);
    while (auto v = ch.recv()) {
      const auto p = static_cast<int>(*v >> 32), i = static_cast<int>(*v & 0xffffffffu);
      if (i <= last[static_cast<std::size_t>(p)]) out_of_order.fetch_add(1);
      last[static_cast<std::size_t>(p)] = i;
      seen[static_cast<std::size_t>(p) * per + i].fetch_add(1);
      progress.fetch_add(1, std::memory_order_relaxed);
    }
  };
  auto produce = [&](int p) {
    for (int i = 0; i < per; ++i) {
      const std::uint64_t v = (std::uint64_t(p) << 32) | std::uint64_t(i);
      // Mix blocking sends with try_send, which succeeds only with a receiver waiting.
      if (i % 4 == 0 && ch.try_send(v)) continue;
      if (!ch.send(v)) failed_sends.fetch_add(1);
    }
  };
  std::vector<JoinHandle<void>> consumers, producers;
  for (int c = 0; c < kConsumers; ++c)
    consumers.push_back(rt.spawn(consume, SpawnOptions{.pin_to_pu = static_cast<unsigned>(c % 4)}));
  for (int p = 0; p < kProducers; ++p)
    producers.push_back(rt.spawn([&, p] { produce(p); }, SpawnOptions{.pin_to_pu = static_cast<unsigned>((p + 1) % 4)}));
  std::thread thread_consumer(consume);
  std::thread thread_producer0([&] { produce(kProducers); });
  std::thread thread_producer1([&] { produce(kProducers + 1); });
  for (auto& h : producers) h.join();
  thread_producer0.join();
  thread_producer1.join();
  ch.close();
  for (auto& h : consumers) h.join();
  thread_consumer.join();
  int once = 0;
  for (auto& s : seen) once += s.load() == 1;
  CHECK(once == static_cast<int>(seen.size()));
  CHECK(out_of_order.load() == 0);
  CHECK(failed_sends.load() == 0);
  check_isolation(rt);
}

TEST_CASE("sync: unbuffered Channel ping-pong between two pinned fibers and between a fiber and a thread",
          "[sync][channel][unbuffered][stress]") {
  Runtime rt(topo("core:2 pu:2"));
  const int rounds = scaled(20'000);
  std::atomic<std::uint64_t> progress{0};
  Watchdog dog("unbuffered ping-pong", progress);
  auto pong = [&](Channel<int>& ping, Channel<int>& back) {
    while (auto v = ping.recv()) {
      progress.fetch_add(1, std::memory_order_relaxed);
      if (!back.send(*v + 1)) return;
    }
  };
  auto ping = [&](Channel<int>& ping_ch, Channel<int>& back) {
    long sum = 0;
    for (int i = 0; i < rounds; ++i) {
      if (!ping_ch.send(i)) return -1L; // no Catch2 assertions off the main thread
      sum += back.recv().value();
    }
    ping_ch.close();
    return sum;
  };
  const long want = static_cast<long>(rounds) * (rounds + 1) / 2;
  Channel<int> a(0), b(0); // fiber on PU 0 <-> fiber on PU 2 (another core)
  auto server = rt.spawn([&] { pong(a, b); }, SpawnOptions{.pin_to_pu = 2});
  auto client = rt.spawn([&] { return ping(a, b); }, SpawnOptions{.pin_to_pu = 0});
  CHECK(client.join() == want);
  server.join();
  Channel<int> c(0), d(0); // plain thread <-> fiber
  auto fiber_server = rt.spawn([&] { pong(c, d); });
  CHECK(ping(c, d) == want);
  fiber_server.join();
}
