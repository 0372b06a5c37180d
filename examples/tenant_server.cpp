// SPDX-License-Identifier: Apache-2.0
// tenant_server: one TCP port, many tenants; a connection learns its tenant from its first line.
//
// A connection starts on a fiber of the acceptor, untagged: until the client says who it is, the server cannot
// know. Its first line is "TENANT <name>"; the fiber then takes that tenant's cookie (this_fiber::set_cookie), so
// everything it does afterwards runs, and is accounted, as that tenant, and never beside another tenant's code on
// the SMT siblings of a core. Tenants are cookies made by name with a weight (Cookie::create(name, weight), cgroup
// cpu.weight semantics): where they compete for a core, each gets a share proportional to its weight.
//
// Protocol, one line each way:   TENANT <name>  -> OK | ERR unknown tenant
//                                HEAVY <seed>   -> <hex>  (about --heavy-us of computation)
//                                LIGHT <token>  -> <token>
//                                RESOLVE <host> -> <IPv4 address> | ERR <reason>
// RESOLVE looks the name up with getaddrinfo, which blocks its thread: it runs in coresched::blocking_call, on a
// helper thread, so the worker's other connections go on, and under the tenant's cookie like the rest.
// A client that has not said who it is within --handshake-ms is dropped (a timed RecvStream::next). The acceptor
// and a ticker fiber (it samples the tenants' stats every --tick-ms and prints them every --stats-every seconds)
// belong to no tenant; both end on one std::stop_source (the accept through OpOptions::stop, the ticker's sleep
// through its token). Where they run is --infra: untagged (they are then a third cookie,
// cookie 0, that forces siblings idle like any other), under the first tenant's cookie, or untagged but pinned to
// the last PU (their forced idle confined to one core). SIGINT or SIGTERM stops the server: the acceptor and every
// connection are cancelled, the runtime's fibers finish, the per-tenant stats are printed, and it exits 0.
//
//   tenant_server [--port 0] [--tenant gold:300 --tenant bronze:100] [--stats-every 1]
//   tenant_server --self-test 2    client threads drive every tenant with both request types, then the program
//                                   raises SIGTERM on itself; exits 1 if a request failed or a tenant got no CPU
#include <coresched/coresched.hpp>
#include <coresched/io.hpp>
#include <coresched/recv_stream.hpp>
#include <coresched/sync.hpp>

#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

namespace io = coresched::io;
namespace this_fiber = coresched::this_fiber;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------------------------
// The work.

// A HEAVY request: `rounds` of integer mixing from `seed`, with a preemption point every 1024 rounds so that the
// other tenant's turn on the core, and the other connections of this worker, are never held up for long.
std::uint64_t heavy(std::uint64_t seed, std::uint64_t rounds) {
  std::uint64_t x = seed | 1;
  for (std::uint64_t i = 0; i < rounds; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    x ^= x >> 29;
    if ((i & 0x3ff) == 0) this_fiber::preempt_point(); // on a plain thread (the expected replies): nothing
  }
  return x;
}

// Rounds of heavy() per microsecond, measured on the main thread before the runtime starts.
double rounds_per_us() {
  const std::uint64_t n = 1 << 22;
  const auto t0 = Clock::now();
  volatile std::uint64_t keep = heavy(1, n);
  (void)keep;
  return static_cast<double>(n) / std::max(1.0, std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
}

// ---------------------------------------------------------------------------------------------------------------
// The server.

struct Tenant {
  std::string name;
  coresched::Cookie cookie;
  std::atomic<std::uint64_t> connections{0}, heavy{0}, light{0}, resolved{0};
};

enum class Infra { untagged, tenant, pinned };

class Server {
public:
  Server(std::vector<Tenant>& tenants, std::uint64_t heavy_rounds, std::chrono::milliseconds handshake_limit)
      : tenants_(tenants), heavy_rounds_(heavy_rounds), handshake_limit_(handshake_limit) {}
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  ~Server() {
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }

  // Binds 127.0.0.1:port (0: the kernel picks one); returns the port. Plain system calls, on the main thread.
  std::uint16_t listen(std::uint16_t port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(listen_fd_, 1024) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("listen on 127.0.0.1:" + std::to_string(port) + ": " + std::strerror(errno));
    return ntohs(a.sin_port);
  }

  // Starts the acceptor and the ticker where --infra says.
  void start(coresched::Runtime& rt, Infra infra, std::chrono::milliseconds tick, double stats_every_s) {
    coresched::SpawnOptions o{.detached = true};
    if (infra == Infra::tenant) o.cookie = tenants_.front().cookie;
    if (infra == Infra::pinned) o.pin_to_pu = static_cast<unsigned>(rt.topology().pus().size() - 1);
    fibers_.add(2);
    rt.spawn([this] { accept_loop(); }, o);
    rt.spawn([this, tick, stats_every_s] { ticker(tick, stats_every_s); }, o);
  }

  // Stops accepting, cancels every connection and the ticker, and waits for all of the server's fibers.
  void stop() {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
      for (io::RecvStream* s : live_) s->cancel();
    }
    stop_.request_stop(); // the acceptor's accept and the ticker's sleep end
    fibers_.wait();
  }

  std::uint64_t errors() const { return errors_.load(); }
  std::uint64_t handshake_timeouts() const { return handshake_timeouts_.load(); }

private:
  void accept_loop() {
    const io::OpOptions o{.stop = stop_.get_token()};
    for (;;) {
      const io::Result r = io::accept(listen_fd_, nullptr, nullptr, o);
      if (r.error == std::errc::operation_canceled) break; // stop()
      if (!r) { // out of fds, an aborted connection: go on, but back off so a lasting error cannot spin
        std::fprintf(stderr, "accept: %s\n", r.error.message().c_str());
        this_fiber::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      const int fd = static_cast<int>(r.value);
      const int one = 1; // one line each way: Nagle's algorithm would hold a reply back for the peer's ACK
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      fibers_.add(); // before this fiber can end, so stop() cannot see zero while a connection starts
      // Untagged (not the acceptor's cookie, whatever --infra says): the tenant is not known until the connection
      // says it, and a handshake run under one tenant's cookie would be charged to that tenant. Not pinned.
      coresched::spawn([this, fd] { serve(fd); },
                       coresched::SpawnOptions{.cookie = coresched::Cookie{}, .detached = true});
    }
    fibers_.done();
  }

  void ticker(std::chrono::milliseconds tick, double stats_every_s) {
    auto next_print = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(stats_every_s > 0 ? stats_every_s : 1e9));
    for (;;) {
      if (!this_fiber::sleep_for(tick, stop_.get_token())) break; // stop()
      const coresched::Stats st = coresched::Runtime::current()->stats(); // what a metrics exporter would sample
      if (Clock::now() >= next_print) {
        print_stats(st, "periodic");
        next_print += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(stats_every_s));
      }
    }
    fibers_.done();
  }

public:
  void print_stats(const coresched::Stats& st, const char* when) const {
    std::uint64_t total = 0;
    for (const auto& c : st.cookies) total += c.cpu_ns;
    auto ms = [](std::uint64_t ns) { return static_cast<double>(ns) / 1e6; };
    std::printf("%s stats\n%-22s %6s %6s %9s %9s %10s %6s %12s %12s\n", when, "tenant", "weight", "conns", "heavy",
                "light", "cpu ms", "cpu %", "fi suffered", "fi caused");
    auto row = [&](const std::string& label, const coresched::CookieStats& cs, std::uint64_t conns, std::uint64_t h,
                   std::uint64_t l) {
      std::printf("%-22s %6u %6" PRIu64 " %9" PRIu64 " %9" PRIu64 " %10.1f %6.1f %9.1f ms %9.1f ms\n", label.c_str(),
                  cs.weight, conns, h, l, ms(cs.cpu_ns), total ? 100.0 * ms(cs.cpu_ns) / ms(total) : 0.0,
                  ms(cs.forced_idle_suffered_ns), ms(cs.forced_idle_caused_ns));
    };
    for (const Tenant& t : tenants_) {
      coresched::CookieStats cs = st.cookie(t.cookie);
      cs.weight = t.cookie.weight(); // a tenant that never ran has no entry, but has its weight
      row(t.name, cs, t.connections.load(), t.heavy.load(), t.light.load());
    }
    row("(untagged: infra)", st.cookie(coresched::Cookie{}), 0, 0, 0);
    std::fflush(stdout);
  }

private:
  const Tenant* find(std::string_view name) const {
    for (const Tenant& t : tenants_)
      if (t.name == name) return &t;
    return nullptr;
  }

  // One connection: the handshake untagged, then requests under the tenant's cookie.
  void serve(int fd) {
    serve_stream(fd);
    io::close(fd); // after the stream is gone (it receives on fd until then); the FIN ends the client's wait
    fibers_.done();
  }

  void serve_stream(int fd) {
    io::RecvStream in(fd);
    bool run = true;
    {
      std::lock_guard lk(mu_);
      if (stopping_) run = false;
      else live_.insert(&in);
    }
    Tenant* tenant = nullptr;
    std::string buf, reply;
    std::span<const std::byte> chunk;
    while (run) {
      // Until the client has said who it is, it has --handshake-ms: a connection that never speaks must not
      // hold a fiber and a socket for ever.
      const io::Result r = tenant ? in.next(chunk) : in.next(chunk, handshake_limit_);
      if (!r || r.value == 0) { // stop(), the handshake's time ran out, or the peer closed its side
        if (r.error == std::errc::timed_out) handshake_timeouts_.fetch_add(1, std::memory_order_relaxed);
        else if (!r && r.error != std::errc::operation_canceled && r.error != std::errc::connection_reset) note_error(r);
        break;
      }
      buf.append(reinterpret_cast<const char*>(chunk.data()), chunk.size());
      reply.clear();
      std::size_t eol;
      while (run && (eol = buf.find('\n')) != std::string::npos) {
        const std::string_view line(buf.data(), eol);
        if (!tenant) run = handshake(line, tenant, reply);
        else request(*tenant, line, reply);
        buf.erase(0, eol + 1);
      }
      if (!send_all(fd, reply)) break;
    }
    std::lock_guard lk(mu_);
    live_.erase(&in); // stop() can no longer reach the stream, so it may go
  }

  bool handshake(std::string_view line, Tenant*& tenant, std::string& reply) {
    constexpr std::string_view kHello = "TENANT ";
    const Tenant* t = line.starts_with(kHello) ? find(line.substr(kHello.size())) : nullptr;
    if (!t) {
      reply += "ERR unknown tenant\n";
      return false;
    }
    tenant = const_cast<Tenant*>(t);
    tenant->connections.fetch_add(1, std::memory_order_relaxed);
    // From here on the connection is the tenant's: its CPU time is the tenant's, and it never shares a core with
    // another tenant's code. If a sibling runs another cookie now, this yields until the core is the tenant's.
    this_fiber::set_cookie(tenant->cookie);
    reply += "OK\n";
    return true;
  }

  void request(Tenant& t, std::string_view line, std::string& reply) {
    if (line.starts_with("HEAVY ")) {
      const std::uint64_t seed = std::strtoull(std::string(line.substr(6)).c_str(), nullptr, 10);
      char hex[32];
      std::snprintf(hex, sizeof hex, "%016" PRIx64 "\n", heavy(seed, heavy_rounds_));
      reply += hex;
      t.heavy.fetch_add(1, std::memory_order_relaxed);
    } else if (line.starts_with("RESOLVE ")) {
      reply += resolve(std::string(line.substr(8)));
      reply += '\n';
      t.resolved.fetch_add(1, std::memory_order_relaxed);
    } else if (line.starts_with("LIGHT ")) {
      reply.append(line.substr(6));
      reply += '\n';
      t.light.fetch_add(1, std::memory_order_relaxed);
    } else {
      reply += "ERR unknown request\n";
    }
  }

  // getaddrinfo blocks its thread (files, DNS): off the worker, in blocking_call.
  static std::string resolve(const std::string& host) {
    return coresched::blocking_call([&]() -> std::string {
      addrinfo hints{};
      hints.ai_family = AF_INET;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* res = nullptr;
      if (const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0)
        return std::string("ERR ") + ::gai_strerror(rc);
      char text[INET_ADDRSTRLEN] = "";
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr, text, sizeof text);
      ::freeaddrinfo(res);
      return text;
    });
  }

  bool send_all(int fd, std::string_view data) {
    while (!data.empty()) {
      const io::Result w = io::send(fd, std::as_bytes(std::span(data.data(), data.size())), MSG_NOSIGNAL);
      if (!w) {
        if (w.error != std::errc::broken_pipe && w.error != std::errc::connection_reset &&
            w.error != std::errc::operation_canceled)
          note_error(w);
        return false;
      }
      data.remove_prefix(static_cast<std::size_t>(w.value));
    }
    return true;
  }

  void note_error(const io::Result& r) {
    std::fprintf(stderr, "connection: %s\n", r.error.message().c_str());
    errors_.fetch_add(1, std::memory_order_relaxed);
  }

  std::vector<Tenant>& tenants_;
  const std::uint64_t heavy_rounds_;
  const std::chrono::milliseconds handshake_limit_;
  int listen_fd_ = -1;
  std::stop_source stop_; // the acceptor and the ticker
  coresched::WaitGroup fibers_; // the acceptor, the ticker and the connections still running
  coresched::Mutex mu_;         // guards stopping_ and live_
  bool stopping_ = false;
  std::set<io::RecvStream*> live_;
  std::atomic<std::uint64_t> errors_{0}, handshake_timeouts_{0};
};

// ---------------------------------------------------------------------------------------------------------------
// The self-test's clients: plain threads with blocking sockets, outside the runtime, like real clients.

struct ClientTotals {
  std::atomic<std::uint64_t> heavy{0}, light{0}, failed{0}, closed_by_server{0};
};

class LineClient {
public:
  explicit LineClient(std::uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const timeval limit{10, 0}; // a lost reply fails the run instead of hanging it
    const int one = 1;
    ok_ = fd_ >= 0 && ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit) == 0 &&
          ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0 &&
          ::connect(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
  }
  ~LineClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  LineClient(const LineClient&) = delete;
  LineClient& operator=(const LineClient&) = delete;

  // Sends `line` and returns the reply line; nullopt on an error or end of stream.
  std::optional<std::string> ask(const std::string& line) {
    const std::string out = line + "\n";
    if (!ok_ || ::send(fd_, out.data(), out.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(out.size()))
      return std::nullopt;
    return read_line();
  }
  std::optional<std::string> read_line() {
    for (;;) {
      if (const auto eol = buf_.find('\n'); eol != std::string::npos) {
        std::string line = buf_.substr(0, eol);
        buf_.erase(0, eol + 1);
        return line;
      }
      char chunk[512];
      const ssize_t n = ok_ ? ::recv(fd_, chunk, sizeof chunk, 0) : -1;
      if (n <= 0) {
        eof_ = n == 0;
        return std::nullopt;
      }
      buf_.append(chunk, static_cast<std::size_t>(n));
    }
  }
  bool eof() const { return eof_; }
  bool ok() const { return ok_; }
  // Sends nothing and waits (up to the 10 s receive limit) for the server to close the connection.
  bool wait_for_close() { return !read_line() && eof_; }

private:
  int fd_;
  bool ok_ = false, eof_ = false;
  std::string buf_;
};

// One client thread: connections of `per_connection` requests of one kind to one tenant, until `stop`; then it
// keeps its last connection open, says it is idle, and waits for the server to close it at shutdown.
void client(std::uint16_t port, const std::string& tenant, bool heavy_kind, unsigned per_connection,
            const std::vector<std::string>& expected, const std::atomic<bool>& stop, std::atomic<unsigned>& idle,
            ClientTotals& totals) {
  std::uint64_t n = 0;
  std::optional<LineClient> conn;
  while (!stop.load()) {
    conn.emplace(port);
    if (conn->ask("TENANT " + tenant) != "OK" || conn->ask("RESOLVE localhost") != "127.0.0.1") {
      totals.failed.fetch_add(1);
      break;
    }
    for (unsigned i = 0; i < per_connection && !stop.load(); ++i, ++n) {
      const std::string arg = std::to_string(n % expected.size());
      const auto reply = conn->ask((heavy_kind ? "HEAVY " : "LIGHT ") + arg);
      const bool good = reply && *reply == (heavy_kind ? expected[n % expected.size()] : arg);
      (good ? (heavy_kind ? totals.heavy : totals.light) : totals.failed).fetch_add(1);
      if (!good) break;
    }
  }
  idle.fetch_add(1);
  if (conn && !conn->read_line() && conn->eof()) totals.closed_by_server.fetch_add(1);
}

Infra parse_infra(const std::string& s) {
  return s == "tenant" ? Infra::tenant : s == "pinned" ? Infra::pinned : Infra::untagged;
}

} // namespace

int main(int argc, char** argv) {
  std::uint16_t port = 0;
  std::vector<std::string> tenant_specs{"gold:300", "bronze:100"};
  double stats_every_s = 0, self_test_s = 0;
  unsigned heavy_us = 2000, tick_ms = 10, clients = 2, per_connection = 50, handshake_ms = 5000;
  std::string infra_name = "untagged";

  CLI::App app{"tenant_server: a TCP service on 127.0.0.1 whose connections name their tenant in a first line "
               "(TENANT <name>) and then run under that tenant's weighted core-scheduling cookie. SIGINT/SIGTERM "
               "stop it and print each tenant's CPU and forced-idle time."};
  app.add_option("--port", port, "Port to listen on (0: any; the port is printed)")->check(CLI::Range(0, 65535));
  app.add_option("--tenant", tenant_specs, "A tenant as name:weight (weight 1-10000); repeat for each")
      ->check([](const std::string& s) {
        const auto colon = s.rfind(':');
        return colon == std::string::npos || colon == 0 ? std::string("expected name:weight") : std::string();
      });
  app.add_option("--heavy-us", heavy_us, "Computation of a HEAVY request, in microseconds")
      ->check(CLI::Range(1u, 1000000u));
  app.add_option("--stats-every", stats_every_s, "Print the per-tenant stats every this many seconds (0: at exit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--handshake-ms", handshake_ms, "How long a new connection may take to name its tenant")
      ->check(CLI::Range(1u, 3600000u));
  app.add_option("--tick-ms", tick_ms, "How often the ticker fiber samples the stats")->check(CLI::Range(1u, 60000u));
  app.add_option("--infra", infra_name, "Where the acceptor and ticker run: untagged, tenant (the first one's "
                                        "cookie) or pinned (untagged, on the last PU)")
      ->check(CLI::IsMember({"untagged", "tenant", "pinned"}));
  app.add_option("--self-test", self_test_s, "Drive every tenant with client threads for this many seconds, then "
                                             "SIGTERM; exit 1 if a request failed or a tenant got no CPU")
      ->check(CLI::Range(0.01, 3600.0));
  app.add_option("--clients", clients, "--self-test: client threads per tenant for each request type")
      ->check(CLI::Range(1u, 64u));
  app.add_option("--requests-per-connection", per_connection, "--self-test: requests before a client reconnects")
      ->check(CLI::Range(1u, 1000000u));
  CLI11_PARSE(app, argc, argv);

  try {
    std::vector<Tenant> tenants(tenant_specs.size());
    for (std::size_t i = 0; i < tenant_specs.size(); ++i) {
      const auto colon = tenant_specs[i].rfind(':');
      tenants[i].name = tenant_specs[i].substr(0, colon);
      tenants[i].cookie = coresched::Cookie::create(tenants[i].name, static_cast<std::uint32_t>(
                                                                         std::stoul(tenant_specs[i].substr(colon + 1))));
    }
    const auto rounds = static_cast<std::uint64_t>(heavy_us * rounds_per_us());
    std::vector<std::string> expected; // HEAVY 0..7's replies, for the self-test's clients to check
    for (std::uint64_t seed = 0; seed < 8; ++seed) {
      char hex[32];
      std::snprintf(hex, sizeof hex, "%016" PRIx64, heavy(seed, rounds));
      expected.emplace_back(hex);
    }

    // The stop signals are blocked before any thread starts (all inherit the mask), so only the sigwait below
    // takes them: no handler ever runs on a worker in the middle of a fiber.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    // Outlives the runtime: no fiber can touch it after it is gone.
    Server server(tenants, rounds, std::chrono::milliseconds(handshake_ms));
    const std::uint16_t bound = server.listen(port);
    coresched::Runtime rt;
    std::printf("%s\nio backend: %s (%s)\nlistening on 127.0.0.1:%u (infrastructure fibers: %s)\n",
                rt.topology().describe().c_str(), coresched::to_string(rt.io_backend()),
                rt.io_backend_reason().c_str(), bound, infra_name.c_str());
    std::fflush(stdout);
    server.start(rt, parse_infra(infra_name), std::chrono::milliseconds(tick_ms), stats_every_s);

    ClientTotals totals;
    std::atomic<bool> stop_clients{false};
    std::atomic<unsigned> idle{0};
    std::vector<std::thread> threads;
    std::thread silent; // a client that never names its tenant: the server must drop it after --handshake-ms
    std::atomic<bool> silent_dropped{false};
    if (self_test_s > 0) {
      silent = std::thread([&] {
        LineClient c(bound);
        silent_dropped = c.ok() && c.wait_for_close();
      });
      for (const Tenant& t : tenants)
        for (unsigned c = 0; c < 2 * clients; ++c)
          threads.emplace_back(client, bound, t.name, c % 2 == 0, per_connection, std::cref(expected),
                               std::cref(stop_clients), std::ref(idle), std::ref(totals));
      threads.emplace_back([&, n = threads.size()] {
        std::this_thread::sleep_for(std::chrono::duration<double>(self_test_s));
        stop_clients.store(true);
        while (idle.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ::kill(::getpid(), SIGTERM); // to the process: the main thread's sigwait takes it
      });
    }
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::printf("%s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    server.stop(); // the acceptor, the ticker and every connection end
    rt.shutdown(); // and with them the runtime's fibers
    for (auto& t : threads) t.join();
    if (silent.joinable()) silent.join();
    const coresched::Stats st = rt.stats();
    server.print_stats(st, "final");
    if (self_test_s <= 0) return 0;

    bool ok = true;
    auto check = [&](bool cond, const std::string& what) {
      if (!cond) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
      ok = ok && cond;
    };
    check(totals.failed.load() == 0, std::to_string(totals.failed.load()) + " requests failed");
    check(server.errors() == 0, std::to_string(server.errors()) + " connection errors on the server");
    if (std::chrono::milliseconds(handshake_ms) < std::chrono::duration<double>(self_test_s))
      check(silent_dropped.load() && server.handshake_timeouts() >= 1,
            "a client that never named its tenant was " +
                std::string(silent_dropped.load() ? "dropped" : "not dropped") + " (" +
                std::to_string(server.handshake_timeouts()) + " handshake timeouts)");
    const auto client_threads = static_cast<std::uint64_t>(threads.size() - 1);
    check(totals.closed_by_server.load() == client_threads,
          std::to_string(totals.closed_by_server.load()) + " of " + std::to_string(client_threads) +
              " connections closed by the server at shutdown");
    for (const Tenant& t : tenants) {
      check(t.heavy.load() > 0 && t.light.load() > 0 && t.resolved.load() > 0,
            t.name + " served " + std::to_string(t.heavy.load()) + " heavy, " + std::to_string(t.light.load()) +
                " light and " + std::to_string(t.resolved.load()) + " resolve requests");
      const coresched::CookieStats cs = st.cookie(t.cookie);
      check(cs.cpu_ns > 0 && cs.name == t.name, t.name + ": its cookie's stats read " +
                                                    std::to_string(cs.cpu_ns) + " ns of CPU, name '" + cs.name + "'");
    }
    if (ok)
      std::printf("OK: %" PRIu64 " heavy and %" PRIu64 " light requests answered, every connection closed\n",
                  totals.heavy.load(), totals.light.load());
    return ok ? 0 : 1;
  } catch (const std::exception& e) { // a bad tenant name or weight, a port in use, a bad CORESCHED_TOPOLOGY
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
