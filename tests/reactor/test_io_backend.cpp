// SPDX-License-Identifier: Apache-2.0
// The I/O backends: how one is chosen and said, and what the epoll backend
// must do that io_uring does by construction (keep a worker free while a
// file is slow, survive fds closed behind its back, never block a worker in
// accept).
#include <coresched/coresched.hpp>
#include <coresched/io.hpp>

#include "test_support.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fcntl.h>
#include <netinet/in.h>
#include <string>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace coresched;
using namespace std::chrono_literals;
using test_support::topo;
using Clock = std::chrono::steady_clock;

namespace {
// The backends this machine can run (io_uring only where the kernel lets us).
std::vector<IoBackend> backends() {
  std::vector<IoBackend> v{IoBackend::epoll};
  try {
    Options o = topo("core:1 pu:1");
    o.io_backend = IoBackend::io_uring;
    Runtime rt(o);
    v.push_back(IoBackend::io_uring);
  } catch (const UsageError&) {
  }
  return v;
}

// Sets an environment variable for the scope (each test runs in its own process under ctest).
struct EnvScope {
  const char* name;
  EnvScope(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~EnvScope() { ::unsetenv(name); }
};
} // namespace

TEST_CASE("the I/O backend is chosen once and said: Options, CORESCHED_IO_BACKEND, bad input", "[io]") {
  ::unsetenv("CORESCHED_IO_BACKEND");
  {
    Options o = topo("core:1 pu:1");
    o.io_backend = IoBackend::epoll;
    Runtime rt(o);
    CHECK(rt.io_backend() == IoBackend::epoll);
    CHECK(rt.io_backend_reason() == "requested");
    CHECK(rt.options().io_backend == IoBackend::epoll);
    CHECK(std::string(to_string(rt.io_backend())) == "epoll");
  }
  {
    Runtime rt(topo("core:1 pu:1"));
    CHECK(rt.io_backend() != IoBackend::automatic);
    CHECK(!rt.io_backend_reason().empty());
  }
  {
    const EnvScope env("CORESCHED_IO_BACKEND", "epoll");
    Runtime rt(topo("core:1 pu:1"));
    CHECK(rt.io_backend() == IoBackend::epoll);
  }
  {
    const EnvScope env("CORESCHED_IO_BACKEND", "kqueue");
    CHECK_THROWS_WITH(Runtime(topo("core:1 pu:1")), Catch::Contains("CORESCHED_IO_BACKEND must be auto, io_uring or epoll"));
  }
  Options bad = topo("core:1 pu:1");
  bad.io_backend = static_cast<IoBackend>(7);
  CHECK_THROWS_AS(Runtime(bad), UsageError);
}

TEST_CASE("a slow file write and fsync leave the worker's other fibers running, on either backend", "[io]") {
  // One worker: a fiber writes 32 MiB and fsyncs it (tens of ms to the disk
  // here) while another sleeps 1 ms at a time. Done on the worker, the fsync
  // would hold the sleeper for all of it; the epoll backend does it on its
  // pool. The file is in the test's working directory (the build tree, on
  // disk), not /tmp, which may be a tmpfs whose fsync costs nothing.
  for (const IoBackend b : backends()) {
    INFO("backend " << to_string(b));
    bool shown = false;
    for (int attempt = 0; attempt < 3 && !shown; ++attempt) {
      Options o = topo("core:1 pu:1");
      o.io_backend = b;
      Runtime rt(o);
      const std::string path = "coresched-test-slow-file.tmp";
      std::atomic<bool> done{false};
      std::atomic<Clock::rep> from{0}, to{0};
      auto ticker = rt.spawn([&] {
        std::vector<Clock::time_point> ticks;
        while (!done) {
          this_fiber::sleep_for(1ms);
          ticks.push_back(Clock::now());
        }
        return ticks;
      });
      const unsigned mib = 32u << attempt;
      const std::string error = rt.spawn([&] {
        const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        std::string e = fd < 0 ? "open failed" : "";
        std::vector<std::byte> chunk(1 << 20, std::byte{1});
        for (unsigned i = 0; i < mib && e.empty(); ++i)
          if (io::write(fd, chunk).value != static_cast<std::int64_t>(chunk.size())) e = "short write";
        from = Clock::now().time_since_epoch().count();
        if (e.empty() && !io::fsync(fd)) e = "fsync failed";
        to = Clock::now().time_since_epoch().count();
        if (fd >= 0) ::close(fd);
        done = true;
        return e;
      }).join();
      REQUIRE(error.empty());
      const auto ticks = ticker.join();
      ::unlink(path.c_str());
      const Clock::time_point t0{Clock::duration(from.load())}, t1{Clock::duration(to.load())};
      const double fsync_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
      long during = 0;
      for (const auto& t : ticks) during += t > t0 && t < t1;
      INFO("fsync of " << mib << " MiB took " << fsync_ms << " ms; the sleeper woke " << during << " times meanwhile");
      if (fsync_ms < 10) continue; // too fast to tell: write more
      shown = true;
      CHECK(static_cast<double>(during) >= fsync_ms / 4);
    }
    CHECK(shown);
  }
}

TEST_CASE("epoll: an fd closed behind the runtime's back and its number reused still wakes its waiter", "[io]") {
  // The runtime registered the old pipe with its epoll; ::close removed that
  // registration, and the new pipe gets the same number. A registration kept
  // from the first wait would leave the second waiting for ever.
  Options o = topo("core:1 pu:1");
  o.io_backend = IoBackend::epoll;
  Runtime rt(o);
  int a[2];
  REQUIRE(::pipe(a) == 0);
  const int number = a[0];
  auto reader = rt.spawn([&] {
    std::byte b[1];
    const auto first = io::read(a[0], b); // waits: nothing written yet
    ::close(a[0]);                        // (the write end is the test's: it closes it after the join)
    int c[2];
    if (::pipe(c) != 0) return std::string("pipe failed");
    if (c[0] != number) return std::string("the number was not reused; the test shows nothing");
    std::thread writer([w = c[1]] {
      std::this_thread::sleep_for(20ms);
      [[maybe_unused]] auto n = ::write(w, "y", 1);
      ::close(w);
    });
    const auto second = io::read(c[0], b, -1, {.timeout = 2s});
    writer.join(); // it has written: at most a moment
    ::close(c[0]);
    return std::string(first.value == 1 && second.value == 1 ? "ok" : "second read: " + second.error.message());
  });
  std::this_thread::sleep_for(20ms); // the reader waits in the runtime meanwhile
  [[maybe_unused]] auto n = ::write(a[1], "x", 1);
  CHECK(reader.join() == "ok");
  ::close(a[1]);
}

TEST_CASE("epoll: two fibers accepting on one blocking listener never block their worker", "[io]") {
  // accept(2) has no per-call non-blocking flag: the backend sets O_NONBLOCK
  // around the call. Two acceptors on one worker, one connection at a time:
  // the one that loses must wait in the runtime, not in the kernel, so the
  // ticker fiber on the same worker keeps running.
  Options o = topo("core:1 pu:1");
  o.io_backend = IoBackend::epoll;
  Runtime rt(o);
  const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(ls >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  REQUIRE(::bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(ls, 16) == 0);
  REQUIRE(::getsockname(ls, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  std::atomic<int> accepted{0};
  std::atomic<bool> stop{false};
  std::vector<JoinHandle<void>> acceptors;
  for (int i = 0; i < 2; ++i)
    acceptors.push_back(rt.spawn([&] {
      const auto r = io::accept(ls, nullptr, nullptr, {.timeout = 5s});
      if (r) {
        ::close(static_cast<int>(r.value));
        ++accepted;
      }
    }));
  std::atomic<long> ticks{0};
  auto ticker = rt.spawn([&] {
    while (!stop) {
      this_fiber::sleep_for(1ms);
      ++ticks;
    }
  });
  auto connect_one = [&] {
    const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    return c;
  };
  const int c1 = connect_one();
  const auto deadline = Clock::now() + 2s;
  while (accepted.load() < 1 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  const long before = ticks.load();
  std::this_thread::sleep_for(50ms);
  CHECK(ticks.load() - before >= 10); // the worker is not stuck in accept(2)
  const int c2 = connect_one();
  for (auto& a : acceptors) a.join();
  stop = true;
  ticker.join();
  CHECK(accepted.load() == 2);
  // The listener is blocking again, as the application left it.
  CHECK((::fcntl(ls, F_GETFL) & O_NONBLOCK) == 0);
  ::close(c1);
  ::close(c2);
  ::close(ls);
}

TEST_CASE("an operation cancelled twice at once, or cancelled as the runtime shuts down, ends once", "[io]") {
  // Both requests reach the worker in one pass: the second must find the
  // operation ended already, not end it (and wake its fiber) again.
  for (const IoBackend b : backends()) {
    INFO("backend " << to_string(b));
    for (int i = 0; i < 100; ++i) {
      Options o = topo("core:1 pu:1");
      o.io_backend = b;
      Runtime rt(o);
      int sv[2];
      REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
      io::Cancellation c;
      std::atomic<bool> waiting{false};
      auto reader = rt.spawn([&] {
        std::byte buf[8];
        waiting = true;
        return io::recv(sv[0], buf, 0, {.cancel = &c});
      });
      while (!waiting) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      c.cancel();
      if (i % 2) c.cancel();
      else rt.shutdown();
      const io::Result r = reader.join();
      CHECK(r.error == std::make_error_code(std::errc::operation_canceled));
      ::close(sv[0]);
      ::close(sv[1]);
    }
  }
}

TEST_CASE("epoll: a read of a file that takes no RWF_NOWAIT (a terminal) keeps its timeout", "[io]") {
  // A pty takes no RWF_NOWAIT: such a read waits for readiness with
  // O_NONBLOCK, where a timeout reaches it. Done the blocking way on the pool
  // it could be neither timed out nor cancelled, and would wait for data.
  Options o = topo("core:1 pu:1");
  o.io_backend = IoBackend::epoll;
  Runtime rt(o);
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  REQUIRE(master >= 0);
  REQUIRE(::grantpt(master) == 0);
  REQUIRE(::unlockpt(master) == 0);
  const int slave = ::open(::ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC);
  REQUIRE(slave >= 0);
  const auto t0 = Clock::now();
  const io::Result r = rt.spawn([&] {
    std::byte buf[16];
    return io::read(slave, buf, -1, {.timeout = 50ms});
  }).join();
  const auto took = Clock::now() - t0;
  CHECK(r.error == std::make_error_code(std::errc::timed_out));
  CHECK(took < 2s);
  ::close(slave);
  ::close(master);
}

TEST_CASE("epoll: a waiter on an fd closed behind the runtime's back does not get the next file's data", "[io]") {
  // Fiber A waits on socket N; the application closes N with ::close; a new
  // socket gets N and fiber C waits on it. A's file is gone: A ends with
  // EBADF (io_uring would leave it waiting on the closed file), and the new
  // socket's data goes to C alone.
  Options o = topo("core:1 pu:1");
  o.io_backend = IoBackend::epoll;
  Runtime rt(o);
  // The close and the new socket are done by a fiber on the same worker (a
  // plain ::close, which the runtime does not see), so that the sanitizers
  // see the fd's uses in order.
  int a[2], b[2] = {-1, -1};
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a) == 0);
  auto first = rt.spawn([&] {
    std::byte buf[8];
    return io::recv(a[0], buf, 0, {.timeout = 5s});
  });
  std::atomic<bool> b_ready{false};
  auto second = rt.spawn([&] {
    this_fiber::sleep_for(10ms); // the first waits meanwhile
    const int number = a[0];
    ::close(a[0]);
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, b) != 0) return std::string("socketpair failed");
    if (b[0] != number) std::swap(b[0], b[1]);
    if (b[0] != number) return std::string("the number was not reused; the test shows nothing");
    b_ready = true;
    char buf[8] = {};
    const auto r = io::recv(b[0], std::as_writable_bytes(std::span(buf)), 0, {.timeout = 5s});
    return r ? std::string(buf, static_cast<std::size_t>(r.value)) : r.error.message();
  });
  const auto give_up = Clock::now() + 2s; // (the fiber may return early, saying why)
  while (!b_ready && Clock::now() < give_up) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(10ms);
  if (b_ready) REQUIRE(::write(b[1], "new", 3) == 3);
  CHECK(second.join() == "new");
  const io::Result old = first.join();
  CHECK(old.error == std::error_code(EBADF, std::system_category()));
  ::close(a[1]);
  ::close(b[0]);
  ::close(b[1]);
}
