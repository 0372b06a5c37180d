// SPDX-License-Identifier: Apache-2.0
// Oracle scenarios, part 2: every sync primitive handing work between fibers
// of different cookies, fiber I/O on a pipe and through a RecvStream, and
// shutdown while fibers wait.
// Each wait is a switch point wrapped by Scope::around(); the code between
// waits burns inside its stamped interval so that a fiber woken under the
// wrong cookie overlaps a sibling's interval long enough to be seen.
#include "harness.hpp"

#include <coresched/recv_stream.hpp>

#include <catch2/catch.hpp>

#include <cstring>
#include <deque>
#include <fcntl.h>
#include <poll.h>
#include <stop_token>
#include <sys/socket.h>
#include <unistd.h>

using namespace coresched;
using namespace guarantees;
using namespace std::chrono_literals;

namespace {

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    r = fds[0];
    w = fds[1];
  }
  ~Pipe() {
    ::close(r);
    ::close(w);
  }
};

} // namespace

TEST_CASE("Mutex and ConditionVariable hand work between cookies", "[oracle][sync]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const Cookie a = Cookie::create(), b = Cookie::create(), c = Cookie::create();
  h.start_rivals({c}, 1);
  const int per_producer = scaled(150);
  const int total = 2 * per_producer;
  Mutex mu;
  ConditionVariable cv;
  std::deque<int> q;
  int consumed = 0;
  std::atomic<bool> inside{false};
  std::atomic<int> overlap{0};
  auto exclusive = [&](Scope& s) { // mutual exclusion, checked, with work inside the section
    if (inside.exchange(true)) overlap.fetch_add(1);
    s.burn(3us);
    inside.store(false);
  };
  std::vector<JoinHandle<void>> fibers;
  for (int p = 0; p < 2; ++p)
    fibers.push_back(h.rt.spawn([&, p] {
      Scope s(h.oracle, a, "producer");
      for (int i = 0; i < per_producer; ++i) {
        s.around([&] { mu.lock(); });
        exclusive(s);
        q.push_back(p * per_producer + i);
        if (i % 7 == 0) s.yield(); // switched out while holding the mutex
        mu.unlock();
        cv.notify_one();
        s.burn(5us);
      }
    }, SpawnOptions{.cookie = a}));
  for (int k = 0; k < 2; ++k)
    fibers.push_back(h.rt.spawn([&] {
      Scope s(h.oracle, b, "consumer");
      for (;;) {
        s.around([&] {
          mu.lock();
          cv.wait(mu, [&] { return !q.empty() || consumed == total; });
        });
        if (q.empty()) {
          mu.unlock();
          return;
        }
        exclusive(s);
        q.pop_front();
        if (++consumed == total) cv.notify_all();
        mu.unlock();
        s.burn(5us);
      }
    }, SpawnOptions{.cookie = b}));
  for (auto& f : fibers) f.join();
  h.stop_rivals();
  CHECK(consumed == total);
  CHECK(overlap == 0);
  CHECK_ISOLATED(h);
}

TEST_CASE("Event and Semaphore ping-pong between cookies", "[oracle][sync]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const Cookie a = Cookie::create(), b = Cookie::create(), c = Cookie::create();
  const int rounds = scaled(200);
  Event ping, pong;
  Semaphore ab(0), ba(0), pool(2);
  std::atomic<int> in_pool{0}, pool_over{0}, pongs{0}, acks{0};
  auto pooled = [&](Scope& s) { // at most two holders of `pool` at a time
    s.around([&] { pool.acquire(); });
    if (in_pool.fetch_add(1) >= 2) pool_over.fetch_add(1);
    s.burn(4us);
    if (in_pool.load() > 1) s.yield();
    in_pool.fetch_sub(1);
    pool.release();
  };
  auto fa = h.rt.spawn([&] {
    Scope s(h.oracle, a, "event/semaphore side A");
    for (int i = 0; i < rounds; ++i) {
      ping.set();
      s.around([&] { pong.wait(); });
      pong.reset();
      pongs.fetch_add(1);
      s.burn(5us);
      ab.release();
      s.around([&] { ba.acquire(); });
      acks.fetch_add(1);
      pooled(s);
    }
  }, SpawnOptions{.cookie = a});
  auto fb = h.rt.spawn([&] {
    Scope s(h.oracle, b, "event/semaphore side B");
    for (int i = 0; i < rounds; ++i) {
      s.around([&] { ping.wait(); });
      ping.reset();
      s.burn(5us);
      pong.set();
      s.around([&] { ab.acquire(); });
      ba.release();
      pooled(s);
    }
  }, SpawnOptions{.cookie = b});
  std::vector<JoinHandle<void>> others;
  for (int k = 0; k < 2; ++k)
    others.push_back(h.rt.spawn([&] {
      Scope s(h.oracle, c, "pool user");
      for (int i = 0; i < rounds / 2; ++i) pooled(s);
    }, SpawnOptions{.cookie = c}));
  fa.join();
  fb.join();
  for (auto& o : others) o.join();
  CHECK(pongs == rounds);
  CHECK(acks == rounds);
  CHECK(pool_over == 0);
  CHECK_ISOLATED(h);
}

TEST_CASE("Channel<T> buffered and unbuffered carries requests and replies across cookies", "[oracle][sync]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  const std::size_t capacity = GENERATE(std::size_t{3}, std::size_t{0});
  INFO("capacity " << capacity);
  Harness h(spec);
  const Cookie a = Cookie::create(), b = Cookie::create();
  h.start_rivals({Cookie::create()}, 1);
  const int n = scaled(300);
  Channel<int> req(capacity), rep(capacity);
  std::atomic<int> wrong{0}, got_close{0};
  auto client = h.rt.spawn([&] {
    Scope s(h.oracle, a, "channel client");
    for (int i = 0; i < n; ++i) {
      if (!s.around([&] { return req.send(i); })) wrong.fetch_add(1);
      s.burn(3us);
      const auto r = s.around([&] { return rep.recv(); });
      if (!r || *r != 2 * i) wrong.fetch_add(1);
    }
    req.close();
  }, SpawnOptions{.cookie = a});
  auto server = h.rt.spawn([&] {
    Scope s(h.oracle, b, "channel server");
    for (int expect = 0;; ++expect) {
      const auto v = s.around([&] { return req.recv(); });
      if (!v) {
        got_close.fetch_add(1);
        return;
      }
      if (*v != expect) wrong.fetch_add(1);
      s.burn(3us);
      if (!s.around([&] { return rep.send(2 * *v); })) wrong.fetch_add(1);
    }
  }, SpawnOptions{.cookie = b});
  client.join();
  server.join();
  h.stop_rivals();
  CHECK(wrong == 0);
  CHECK(got_close == 1);
  CHECK_ISOLATED(h);
}

TEST_CASE("WaitGroup and Latch gather fibers of several cookies", "[oracle][sync]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const std::vector<Cookie> cookies{Cookie{}, Cookie::create(), Cookie::create()};
  const int rounds = scaled(60);
  std::atomic<int> wrong{0};
  auto coordinator = h.rt.spawn([&] {
    Scope s(h.oracle, cookies[0], "coordinator");
    for (int r = 0; r < rounds; ++r) {
      WaitGroup wg;
      std::atomic<int> done{0};
      wg.add(4);
      for (int k = 0; k < 4; ++k)
        s.around([&] {
          coresched::spawn([&, k] {
            Scope w(h.oracle, cookies[1 + k % 2], "wait group worker");
            w.burn(std::chrono::microseconds(5 + 5 * k));
            if (k % 2) w.yield();
            done.fetch_add(1);
            wg.done();
          }, SpawnOptions{.cookie = cookies[1 + k % 2], .detached = true});
        });
      s.around([&] { wg.wait(); });
      if (done.load() != 4) wrong.fetch_add(1);
      s.burn(5us);

      Latch latch(4);
      std::atomic<int> arrived{0};
      std::vector<JoinHandle<void>> hs;
      for (int k = 0; k < 3; ++k)
        hs.push_back(s.around([&, k] {
          return coresched::spawn([&, k] {
            Scope w(h.oracle, cookies[k], "latch member");
            w.burn(5us);
            arrived.fetch_add(1);
            w.around([&] { latch.arrive_and_wait(); });
            if (arrived.load() != 4) wrong.fetch_add(1);
            w.burn(5us);
          }, SpawnOptions{.cookie = cookies[k]});
        }));
      arrived.fetch_add(1);
      s.around([&] { latch.arrive_and_wait(); });
      for (auto& x : hs) s.join(x);
    }
  }, SpawnOptions{.cookie = cookies[0]});
  coordinator.join();
  CHECK(wrong == 0);
  CHECK_ISOLATED(h);
}

TEST_CASE("timed and stopped waits end under their own cookie, released or timed out", "[oracle][sync]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const Cookie a = Cookie::create(), b = Cookie::create(), c = Cookie::create();
  h.start_rivals({c}, 1);
  const int rounds = scaled(150);
  Mutex mu;
  Semaphore units(1);
  Channel<int> ch(1);
  std::atomic<bool> inside{false};
  std::atomic<int> overlap{0}, got{0}, timed_out{0}, sent{0}, received{0};
  // Each side takes the mutex and the semaphore with short deadlines (so
  // some take it and some time out, racing the other cookie's release), and
  // hands items over a channel with timed sends and receives.
  auto side = [&](Cookie mine, const char* name, int salt) {
    return [&, mine, name, salt] {
      Scope s(h.oracle, mine, name);
      for (int i = 0; i < rounds; ++i) {
        const auto d = std::chrono::microseconds(5 + (i * 13 + salt) % 60);
        if (s.around([&] { return mu.try_lock_for(d); })) {
          if (inside.exchange(true)) overlap.fetch_add(1);
          s.burn(4us);
          if (i % 5 == 0) s.yield();
          inside.store(false);
          mu.unlock();
          got.fetch_add(1);
        } else {
          timed_out.fetch_add(1);
        }
        if (s.around([&] { return units.try_acquire_for(d); })) {
          s.burn(3us);
          units.release();
        }
        if ((i + salt) % 2 == 0) {
          if (s.around([&] { return ch.send_for(i, d); })) sent.fetch_add(1);
        } else if (s.around([&] { return ch.recv_for(d); })) {
          received.fetch_add(1);
        }
        s.burn(3us);
      }
    };
  };
  auto fa = h.rt.spawn(side(a, "timed side A", 0), SpawnOptions{.cookie = a});
  auto fb = h.rt.spawn(side(b, "timed side B", 1), SpawnOptions{.cookie = b});
  // Waits ended by a stop request from a plain thread, under their cookies.
  std::stop_source src;
  Event never;
  std::atomic<int> stopped{0};
  std::vector<JoinHandle<void>> waiters;
  for (int i = 0; i < 4; ++i) {
    const Cookie mine = i % 2 ? a : b;
    waiters.push_back(h.rt.spawn([&, mine] {
      Scope s(h.oracle, mine, "stopped waiter");
      if (!s.around([&] { return never.wait(src.get_token()); })) stopped.fetch_add(1);
      s.burn(20us);
    }, SpawnOptions{.cookie = mine}));
  }
  fa.join();
  fb.join();
  src.request_stop();
  for (auto& w : waiters) w.join();
  while (ch.try_recv()) received.fetch_add(1);
  h.stop_rivals();
  CHECK(overlap == 0);
  CHECK(got + timed_out == 2 * rounds);
  CHECK(sent == received);
  CHECK(stopped == 4);
  CHECK(units.available() == 1);
  CHECK_ISOLATED(h);
}

TEST_CASE("io read/write/poll on a pipe and io::sleep_until between cookies", "[oracle][io]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const Cookie a = Cookie::create(), b = Cookie::create();
  h.start_rivals({Cookie::create()}, 1);
  Pipe p;
  const int n = scaled(200);
  std::atomic<int> wrong{0}, timed_out{0};
  auto writer = h.rt.spawn([&] {
    Scope s(h.oracle, a, "pipe writer");
    for (int i = 0; i < n; ++i) {
      std::uint64_t v = static_cast<std::uint64_t>(i);
      const auto r = s.around([&] { return io::write(p.w, std::as_bytes(std::span(&v, 1))); });
      if (!r || r.value != sizeof v) wrong.fetch_add(1);
      s.burn(3us);
      if (i % 10 == 0) {
        const auto sl = s.around([] { return io::sleep_until(std::chrono::steady_clock::now() + 50us); });
        if (!sl) wrong.fetch_add(1);
      }
    }
  }, SpawnOptions{.cookie = a});
  auto reader = h.rt.spawn([&] {
    Scope s(h.oracle, b, "pipe reader");
    for (int i = 0; i < n; ++i) {
      if (i % 3 == 0) {
        const auto pr = s.around([&] { return io::poll(p.r, POLLIN); });
        if (!pr || !(pr.value & POLLIN)) wrong.fetch_add(1);
      }
      std::uint64_t v = 0;
      const auto r = s.around([&] { return io::read(p.r, std::as_writable_bytes(std::span(&v, 1))); });
      if (!r || r.value != sizeof v || v != static_cast<std::uint64_t>(i)) wrong.fetch_add(1);
      s.burn(3us);
    }
    // Nothing more comes: a per-call timeout ends the read.
    std::uint64_t v = 0;
    io::OpOptions o;
    o.timeout = 2ms;
    const auto r = s.around([&] { return io::read(p.r, std::as_writable_bytes(std::span(&v, 1)), -1, o); });
    if (r.error == std::errc::timed_out) timed_out.fetch_add(1);
  }, SpawnOptions{.cookie = b});
  writer.join();
  reader.join();
  h.stop_rivals();
  CHECK(wrong == 0);
  CHECK(timed_out == 1);
  CHECK_ISOLATED(h);
}

TEST_CASE("RecvStream completions reach their reader under its cookie, on whichever worker it runs",
          "[oracle][io][recv_stream]") {
  // The stream's completions are reaped by the worker that owns its request,
  // whatever that worker runs then, and handed to the reader: the reader must
  // still run only under its own cookie. Two streams, two reader cookies, the
  // writers a third; readers yield now and then, so they move between
  // workers and re-arm their requests there.
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const Cookie w = Cookie::create();
  const Cookie readers[2] = {Cookie::create(), Cookie::create()};
  h.start_rivals({Cookie::create()}, 1);
  int sp[2][2];
  for (auto& pair : sp) REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
  const int n = scaled(300);
  std::atomic<int> wrong{0};
  std::vector<JoinHandle<void>> fibers;
  for (int k = 0; k < 2; ++k) {
    fibers.push_back(h.rt.spawn([&, k] {
      Scope s(h.oracle, w, "stream writer");
      for (int i = 0; i < n; ++i) {
        const auto v = static_cast<std::uint32_t>(i);
        const auto r = s.around([&] { return io::send(sp[k][1], std::as_bytes(std::span(&v, 1))); });
        if (!r || r.value != sizeof v) wrong.fetch_add(1);
        s.burn(5us);
      }
      ::shutdown(sp[k][1], SHUT_WR);
    }, SpawnOptions{.cookie = w}));
    fibers.push_back(h.rt.spawn([&, k] {
      Scope s(h.oracle, readers[k], "stream reader");
      io::RecvStream in(sp[k][0], 8, 2); // small buffers: many completions, some ENOBUFS re-arms
      std::vector<std::byte> got;
      std::span<const std::byte> d;
      for (unsigned i = 0;; ++i) {
        const auto r = s.around([&] { return in.next(d); });
        if (!r) {
          wrong.fetch_add(1);
          break;
        }
        if (r.value == 0) break;
        got.insert(got.end(), d.begin(), d.end());
        s.burn(3us);
        if (i % 7 == 0) s.yield();
      }
      if (got.size() != static_cast<std::size_t>(n) * sizeof(std::uint32_t)) wrong.fetch_add(1);
      for (int i = 0; i < n && got.size() >= (i + 1) * sizeof(std::uint32_t); ++i) {
        std::uint32_t v;
        std::memcpy(&v, got.data() + i * sizeof v, sizeof v);
        if (v != static_cast<std::uint32_t>(i)) {
          wrong.fetch_add(1);
          break;
        }
      }
    }, SpawnOptions{.cookie = readers[k]}));
  }
  for (auto& f : fibers) f.join();
  h.stop_rivals();
  for (auto& pair : sp)
    for (int fd : pair) ::close(fd);
  CHECK(wrong == 0);
  CHECK_ISOLATED(h);
}

TEST_CASE("shutdown while fibers wait: sleeps and I/O end early and the fibers finish under their cookie",
          "[oracle][shutdown]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const Cookie a = Cookie::create(), b = Cookie::create();
  Pipe p; // nobody writes: reads wait until shutdown cancels them
  constexpr int kFibers = 12;
  std::atomic<int> waiting{0}, finished{0}, wrong{0};
  for (int f = 0; f < kFibers; ++f)
    h.rt.spawn([&, f] {
      Scope s(h.oracle, f % 2 ? a : b, "woken by shutdown");
      s.burn(10us);
      waiting.fetch_add(1);
      const auto far = std::chrono::steady_clock::now() + 1h;
      switch (f % 4) {
      case 0: s.around([&] { this_fiber::sleep_for(1h); }); break;
      case 1: s.around([&] { this_fiber::sleep_until(far); }); break;
      case 2: {
        const auto r = s.around([&] { return io::sleep_until(far); });
        if (r.error != std::errc::operation_canceled) wrong.fetch_add(1);
        break;
      }
      default: {
        std::byte buf[8];
        const auto r = s.around([&] { return io::read(p.r, buf); });
        if (r.error != std::errc::operation_canceled) wrong.fetch_add(1);
        break;
      }
      }
      if (std::chrono::steady_clock::now() >= far) wrong.fetch_add(1);
      s.burn(200us); // woken together: fibers of both cookies compete for the core
      s.yield();
      s.burn(50us);
      finished.fetch_add(1);
    }, SpawnOptions{.cookie = f % 2 ? a : b, .detached = true});
  REQUIRE(wait_for([&] { return waiting.load() == kFibers; }));
  std::this_thread::sleep_for(100ms); // let the last ones reach their wait
  const auto t0 = std::chrono::steady_clock::now();
  h.rt.shutdown();
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took < 10s);
  CHECK(finished == kFibers);
  CHECK(wrong == 0);
  CHECK_ISOLATED(h);
}

// A spawn from a plain thread that passes the shutdown check just before
// shutdown() looks at the live-fiber count must be counted in time, or it
// never runs. Every spawn that returns must run; the others throw UsageError.
TEST_CASE("a spawn from a plain thread racing shutdown either runs or throws UsageError", "[shutdown]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  const int rounds = scaled(40);
  int lost_rounds = 0;
  for (int round = 0; round < rounds; ++round) {
    Runtime rt(options_for(spec));
    std::atomic<int> ran{0}, accepted{0};
    std::atomic<bool> go{false};
    std::thread spawner([&] {
      go.store(true);
      for (;;) {
        try {
          rt.spawn([&] { ran.fetch_add(1); }, SpawnOptions{.detached = true});
          accepted.fetch_add(1);
        } catch (const UsageError&) {
          return;
        }
      }
    });
    while (!go.load()) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(100 * (round % 10)));
    rt.shutdown();
    spawner.join();
    if (ran.load() != accepted.load()) {
      ++lost_rounds;
      UNSCOPED_INFO("round " << round << ": " << accepted.load() << " spawns accepted, " << ran.load() << " ran");
    }
  }
  CHECK(lost_rounds == 0);
}
