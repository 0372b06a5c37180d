// SPDX-License-Identifier: Apache-2.0
// echo_server: an io_uring TCP echo server whose connections are tagged by tenant.
//
// The server listens on two ports, one per tenant. Each port's accept loop runs with that tenant's cookie and spawns
// every accepted connection on a fiber with the same cookie (SpawnOptions{.cookie = ...}), so two tenants'
// connections never run at the same instant on SMT siblings of one core. All socket I/O goes through coresched::io:
// it suspends only the calling fiber while the worker's io_uring does the work.
//
//   echo_server --serve [--port-a 9001 --port-b 9002]     serve until SIGINT/SIGTERM (or --duration seconds)
//   echo_server --client --port P --connections N --messages M
//                                                          connect, send, check every echoed byte, print requests/s
//   echo_server [--self-test]                              server on ephemeral ports plus the client against both
//                                                          ports in one process; exits 0 only if every byte matched
#include <coresched/coresched.hpp>
#include <coresched/io.hpp>
#include <coresched/sync.hpp>

#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace {

namespace io = coresched::io;
using Clock = std::chrono::steady_clock;

sockaddr_in make_address(const std::string& host, std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1)
    throw std::invalid_argument("not an IPv4 address: " + host);
  return a;
}

std::system_error errno_error(const std::string& what) {
  return std::system_error(errno, std::generic_category(), what);
}

// Echo is request/response: without TCP_NODELAY, Nagle's algorithm holds back the tail of a message until the
// peer's delayed ACK arrives (~40 ms), and large messages crawl.
void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// ---------------------------------------------------------------------------------------------------------------
// The server.

class EchoServer {
public:
  struct Tenant {
    const char* name;
    coresched::Cookie cookie = coresched::Cookie::create();
    int listen_fd = -1;
    std::uint16_t port = 0;
    io::Cancellation stop_accept;               // cancels the accept loop's pending accept (sticky)
    std::atomic<std::uint64_t> connections{0};  // accepted
    std::atomic<std::uint64_t> bytes{0};        // echoed
    std::atomic<std::uint64_t> errors{0};       // I/O errors other than a peer reset or our own stop()
  };

  // Binds both listening sockets (port 0: the kernel picks one). Plain syscalls: this runs on the main thread.
  EchoServer(const std::string& host, std::uint16_t port_a, std::uint16_t port_b) {
    tenants_[0].name = "A";
    tenants_[1].name = "B";
    listen_on(tenants_[0], host, port_a);
    listen_on(tenants_[1], host, port_b);
  }
  ~EchoServer() {
    for (auto& t : tenants_)
      if (t.listen_fd >= 0) ::close(t.listen_fd);
  }
  EchoServer(const EchoServer&) = delete;
  EchoServer& operator=(const EchoServer&) = delete;

  // Starts one accept loop per tenant, on a fiber carrying the tenant's cookie.
  void start(coresched::Runtime& rt) {
    for (auto& t : tenants_) {
      fibers_.add();
      rt.spawn([this, &t] { accept_loop(t); }, coresched::SpawnOptions{.cookie = t.cookie, .detached = true});
    }
  }

  // Stops accepting, cancels the I/O of every open connection and waits until all server fibers have finished.
  // Callable from a plain thread or a fiber that is not a server fiber.
  void stop() {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
      for (io::Cancellation* c : live_) c->cancel();
    }
    for (auto& t : tenants_) t.stop_accept.cancel();
    fibers_.wait();
  }

  Tenant& tenant(std::size_t i) { return tenants_[i]; }

private:
  void listen_on(Tenant& t, const std::string& host, std::uint16_t port) {
    const sockaddr_in addr = make_address(host, port);
    t.listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (t.listen_fd < 0) throw errno_error("socket");
    const int one = 1;
    ::setsockopt(t.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const std::string where = host + ":" + std::to_string(port);
    if (::bind(t.listen_fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
      throw errno_error("bind " + where);
    if (::listen(t.listen_fd, 1024) != 0) throw errno_error("listen " + where);
    sockaddr_in bound{};
    socklen_t len = sizeof bound;
    ::getsockname(t.listen_fd, reinterpret_cast<sockaddr*>(&bound), &len);
    t.port = ntohs(bound.sin_port);
  }

  void accept_loop(Tenant& t) {
    io::OpOptions o;
    o.cancel = &t.stop_accept;
    for (;;) {
      const io::Result r = io::accept(t.listen_fd, nullptr, nullptr, o);
      if (!r) {
        if (r.error == std::errc::operation_canceled) break; // stop()
        // Out of fds, an aborted connection...: keep serving, but back off so a persistent error cannot spin.
        std::fprintf(stderr, "accept on port %u: %s\n", t.port, r.error.message().c_str());
        t.errors.fetch_add(1, std::memory_order_relaxed);
        coresched::this_fiber::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      t.connections.fetch_add(1, std::memory_order_relaxed);
      const int fd = static_cast<int>(r.value);
      set_nodelay(fd);
      // Counted before this fiber can finish, so stop()'s wait cannot see zero while a connection is starting.
      fibers_.add();
      // The connection would inherit this fiber's cookie anyway; naming it says that the tenant, not the code
      // path, decides the tag.
      coresched::spawn([this, &t, fd] { serve(t, fd); },
                       coresched::SpawnOptions{.cookie = t.cookie, .detached = true});
    }
    fibers_.done();
  }

  void serve(Tenant& t, int fd) {
    io::Cancellation cancel; // stop() cancels through it; it lives in `live_` while the connection is open
    bool run = true;
    {
      std::lock_guard lk(mu_);
      if (stopping_) run = false;
      else live_.insert(&cancel);
    }
    io::OpOptions o;
    o.cancel = &cancel;
    std::vector<std::byte> buf(16 * 1024); // on the heap: fiber stacks are small (64 KiB by default)
    while (run) {
      const io::Result r = io::recv(fd, buf, 0, o);
      if (!r || r.value == 0) { // error, stop(), or the peer closed its side
        note_error(t, r);
        break;
      }
      const auto n = static_cast<std::size_t>(r.value);
      for (std::size_t off = 0; off < n && run;) { // send may be partial: loop until all n bytes are out
        const io::Result w = io::send(fd, std::span<const std::byte>(buf).subspan(off, n - off), 0, o);
        if (!w) {
          note_error(t, w);
          run = false;
        } else {
          off += static_cast<std::size_t>(w.value);
        }
      }
      if (run) t.bytes.fetch_add(n, std::memory_order_relaxed);
    }
    {
      std::lock_guard lk(mu_);
      live_.erase(&cancel); // after this stop() can no longer reach `cancel`, so the frame may go
    }
    io::close(fd);
    fibers_.done();
  }

  static void note_error(Tenant& t, const io::Result& r) {
    if (r.ok() || r.error == std::errc::operation_canceled || r.error == std::errc::connection_reset ||
        r.error == std::errc::broken_pipe)
      return;
    std::fprintf(stderr, "tenant %s connection: %s\n", t.name, r.error.message().c_str());
    t.errors.fetch_add(1, std::memory_order_relaxed);
  }

  Tenant tenants_[2];
  coresched::WaitGroup fibers_; // accept loops and connections still running
  coresched::Mutex mu_;         // guards stopping_ and live_
  bool stopping_ = false;
  std::set<io::Cancellation*> live_;
};

// ---------------------------------------------------------------------------------------------------------------
// The client.

struct ClientStats {
  std::uint64_t messages = 0;   // round trips whose echo matched
  std::uint64_t bytes = 0;      // bytes sent and checked
  std::uint64_t mismatches = 0; // messages whose echo differed
  std::uint64_t errors = 0;     // connections that failed (connect, send, recv, timeout, early close)
  ClientStats& operator+=(const ClientStats& o) {
    messages += o.messages, bytes += o.bytes, mismatches += o.mismatches, errors += o.errors;
    return *this;
  }
};

struct ClientConfig {
  std::string host = "127.0.0.1";
  unsigned connections = 8;
  unsigned messages = 200;
  std::size_t max_size = 4096;
  std::chrono::milliseconds timeout{10000}; // per operation: a lost echo fails the run instead of hanging it
};

// The byte at position i of message m on connection c: varies with all three, so a reordered, truncated or
// cross-connection echo is caught.
std::byte pattern(std::uint64_t c, std::uint64_t m, std::size_t i) {
  return static_cast<std::byte>((c * 131 + m * 31 + i * 7 + (i >> 8)) & 0xff);
}

// One connection: M round trips of varying size, each echo checked byte by byte. Runs on a fiber.
ClientStats run_connection(const ClientConfig& cfg, std::uint16_t port, std::uint64_t conn) {
  ClientStats st;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    std::fprintf(stderr, "client socket: %s\n", std::strerror(errno));
    st.errors = 1;
    return st;
  }
  set_nodelay(fd);
  io::OpOptions o;
  o.timeout = cfg.timeout;
  auto fail = [&](const char* what, const io::Result& r) {
    std::fprintf(stderr, "client connection %llu to port %u: %s: %s\n", static_cast<unsigned long long>(conn), port,
                 what, r.ok() ? "connection closed early" : r.error.message().c_str());
    st.errors = 1;
  };
  const sockaddr_in addr = make_address(cfg.host, port);
  if (const io::Result c = io::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr, o); !c) {
    fail("connect", c);
  } else {
    std::vector<std::byte> out(cfg.max_size), in(cfg.max_size);
    for (std::uint64_t m = 0; m < cfg.messages && !st.errors; ++m) {
      const std::size_t size = 1 + (conn * 7919 + m * 104729) % cfg.max_size;
      for (std::size_t i = 0; i < size; ++i) out[i] = pattern(conn, m, i);
      for (std::size_t off = 0; off < size && !st.errors;) {
        const io::Result w = io::send(fd, std::span<const std::byte>(out).subspan(off, size - off), 0, o);
        if (!w) fail("send", w);
        else off += static_cast<std::size_t>(w.value);
      }
      // TCP may split the echo anywhere: read until the whole message is back.
      for (std::size_t got = 0; got < size && !st.errors;) {
        const io::Result r = io::recv(fd, std::span<std::byte>(in).subspan(got, size - got), 0, o);
        if (!r || r.value == 0) fail("recv", r);
        else got += static_cast<std::size_t>(r.value);
      }
      if (st.errors) break;
      if (std::equal(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(size), in.begin())) {
        ++st.messages;
        st.bytes += size;
      } else {
        ++st.mismatches;
      }
    }
  }
  io::close(fd);
  return st;
}

// Runs cfg.connections concurrent connections to each port and sums their results. From a plain thread.
ClientStats run_client(coresched::Runtime& rt, const ClientConfig& cfg, std::span<const std::uint16_t> ports,
                       ClientStats* per_port = nullptr) {
  std::vector<coresched::JoinHandle<ClientStats>> conns;
  for (std::size_t p = 0; p < ports.size(); ++p)
    for (unsigned c = 0; c < cfg.connections; ++c)
      conns.push_back(rt.spawn([&cfg, port = ports[p], id = p * cfg.connections + c] {
        return run_connection(cfg, port, id);
      }));
  ClientStats total;
  for (std::size_t i = 0; i < conns.size(); ++i) {
    const ClientStats s = conns[i].join();
    total += s;
    if (per_port) per_port[i / cfg.connections] += s;
  }
  return total;
}

void print_client(const ClientStats& s, double seconds) {
  std::printf("client: %llu round trips, %llu bytes echoed and checked in %.3f s: %.0f requests/s, %.1f MiB/s; "
              "%llu mismatched messages, %llu failed connections\n",
              static_cast<unsigned long long>(s.messages), static_cast<unsigned long long>(s.bytes), seconds,
              static_cast<double>(s.messages) / seconds, static_cast<double>(s.bytes) / seconds / (1 << 20),
              static_cast<unsigned long long>(s.mismatches), static_cast<unsigned long long>(s.errors));
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void print_tenants(coresched::Runtime& rt, EchoServer& server) {
  const coresched::Stats stats = rt.stats();
  std::printf("%-7s %6s %7s %12s %12s %9s %12s %12s\n", "tenant", "port", "cookie", "connections", "bytes",
              "cpu ms", "fi suffered", "fi caused");
  for (std::size_t i = 0; i < 2; ++i) {
    auto& t = server.tenant(i);
    const coresched::CookieStats cs = stats.cookie(t.cookie);
    std::printf("%-7s %6u %7llu %12llu %12llu %9.2f %9.2f ms %9.2f ms\n", t.name, t.port,
                static_cast<unsigned long long>(t.cookie.value()),
                static_cast<unsigned long long>(t.connections.load()), static_cast<unsigned long long>(t.bytes.load()),
                static_cast<double>(cs.cpu_ns) / 1e6, static_cast<double>(cs.forced_idle_suffered_ns) / 1e6,
                static_cast<double>(cs.forced_idle_caused_ns) / 1e6);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Modes.

int self_test(const ClientConfig& cfg) {
  // The server outlives the runtime (declared first, destroyed last): no fiber can touch it after it is gone.
  EchoServer server(cfg.host, 0, 0); // ephemeral ports
  coresched::Runtime rt;
  std::printf("%s\n", rt.topology().describe().c_str());
  server.start(rt);
  const std::uint16_t ports[2] = {server.tenant(0).port, server.tenant(1).port};
  std::printf("self-test: tenant A on %s:%u, tenant B on %s:%u; %u connections x %u messages per port\n",
              cfg.host.c_str(), ports[0], cfg.host.c_str(), ports[1], cfg.connections, cfg.messages);

  const auto t0 = Clock::now();
  ClientStats per_port[2];
  const ClientStats total = run_client(rt, cfg, ports, per_port);
  print_client(total, seconds_since(t0));
  server.stop(); // the clients are done: stop accepting and wait for every server fiber
  print_tenants(rt, server);

  const coresched::Stats stats = rt.stats();
  bool ok = true;
  auto check = [&](bool cond, const std::string& what) {
    if (!cond) {
      std::fprintf(stderr, "FAIL: %s\n", what.c_str());
      ok = false;
    }
  };
  const std::uint64_t expected_messages = std::uint64_t{cfg.connections} * cfg.messages;
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& t = server.tenant(i);
    const std::string who = std::string("tenant ") + t.name;
    check(per_port[i].messages == expected_messages && per_port[i].mismatches == 0 && per_port[i].errors == 0,
          who + ": " + std::to_string(per_port[i].messages) + " of " + std::to_string(expected_messages) +
              " messages echoed intact");
    check(t.connections.load() == cfg.connections,
          who + ": accepted " + std::to_string(t.connections.load()) + " connections");
    check(t.bytes.load() == per_port[i].bytes, who + ": server echoed " + std::to_string(t.bytes.load()) +
                                                   " bytes, client checked " + std::to_string(per_port[i].bytes));
    check(t.errors.load() == 0, who + ": server I/O errors");
    check(stats.cookie(t.cookie).cpu_ns > 0, who + ": its cookie got no CPU time");
  }
  if (ok) std::printf("OK: every byte echoed on both tenant ports\n");
  return ok ? 0 : 1;
}

int serve(const std::string& host, std::uint16_t port_a, std::uint16_t port_b, double duration_s) {
  // Block the stop signals before the runtime starts its workers (they inherit the mask), so only sigtimedwait
  // below sees them: no handler runs on a worker in the middle of a fiber.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  EchoServer server(host, port_a, port_b); // bind first: a port in use fails before anything starts
  coresched::Runtime rt;
  std::printf("%s\n", rt.topology().describe().c_str());
  server.start(rt);
  std::printf("serving: tenant A on %s:%u, tenant B on %s:%u (Ctrl-C stops)\n", host.c_str(), server.tenant(0).port,
              host.c_str(), server.tenant(1).port);
  std::fflush(stdout);

  if (duration_s > 0) {
    const auto ns = static_cast<long long>(duration_s * 1e9);
    const timespec limit{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    while (sigtimedwait(&stop_signals, nullptr, &limit) < 0 && errno == EINTR) {}
  } else {
    int sig = 0;
    sigwait(&stop_signals, &sig);
  }
  std::printf("stopping\n");
  server.stop();
  print_tenants(rt, server);
  return 0;
}

int client(const ClientConfig& cfg, std::uint16_t port) {
  coresched::Runtime rt;
  const auto t0 = Clock::now();
  const std::uint16_t ports[1] = {port};
  const ClientStats s = run_client(rt, cfg, ports);
  print_client(s, seconds_since(t0));
  return s.mismatches == 0 && s.errors == 0 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  ClientConfig cfg;
  std::uint16_t port = 0, port_a = 9001, port_b = 9002;
  double duration_s = 0;
  unsigned timeout_ms = 10000;

  CLI::App app{"echo_server: an io_uring TCP echo server whose connections carry their tenant's core-scheduling "
               "cookie (tenant A and B listen on different ports), with a client mode and a self-test (the "
               "default)."};
  bool serve_mode = false, client_mode = false, self_test_mode = false;
  auto* serve_flag = app.add_flag("--serve", serve_mode, "Run the server until SIGINT/SIGTERM (or --duration)");
  auto* client_flag = app.add_flag("--client", client_mode, "Run the client against --port");
  auto* self_flag = app.add_flag("--self-test", self_test_mode, "Server on ephemeral ports and the client against both (default)");
  serve_flag->excludes(client_flag)->excludes(self_flag);
  client_flag->excludes(self_flag);
  app.add_option("--host", cfg.host, "IPv4 address to listen on / connect to");
  app.add_option("--port-a", port_a, "--serve: tenant A's port (0: any)")->check(CLI::Range(0, 65535));
  app.add_option("--port-b", port_b, "--serve: tenant B's port (0: any)")->check(CLI::Range(0, 65535));
  app.add_option("--duration", duration_s, "--serve: stop after this many seconds (0: only on a signal)")
      ->check(CLI::NonNegativeNumber);
  auto* port_opt = app.add_option("--port", port, "--client: the server port")->check(CLI::Range(1, 65535));
  app.add_option("--connections", cfg.connections, "Client connections (per port in the self-test)")
      ->check(CLI::Range(1, 10000));
  app.add_option("--messages", cfg.messages, "Round trips per connection")->check(CLI::Range(1, 100000000));
  app.add_option("--max-size", cfg.max_size, "Largest message in bytes (sizes vary from 1 to this)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--timeout-ms", timeout_ms, "Client: fail an operation that takes longer than this")
      ->check(CLI::Range(1, 3600000));
  port_opt->needs(client_flag);
  client_flag->needs(port_opt);
  CLI11_PARSE(app, argc, argv);
  cfg.timeout = std::chrono::milliseconds(timeout_ms);

  try {
    if (serve_mode) return serve(cfg.host, port_a, port_b, duration_s);
    if (client_mode) return client(cfg, port);
    return self_test(cfg); // --self-test, or no mode given
  } catch (const std::exception& e) { // bad address, port in use, bad CORESCHED_TOPOLOGY, ...
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
