// SPDX-License-Identifier: Apache-2.0
// The one load generator used against every echo server, so the servers are
// compared under identical load: C++, epoll (level-triggered), non-blocking
// sockets spread over --threads threads (default one per CPU, NOT pinned: on
// a machine as small as the 2-CPU development VM the client necessarily
// shares the CPUs with the server, and the scheduler places both).
//
// Closed loop: every connection has exactly one 64-byte request in flight;
// when its echo is complete (and checked) the next request goes out. After a
// warm-up, the requests completed during --seconds give requests/s.
#include "echo_common.hpp"
#include "peer_common.hpp"

#include <sys/epoll.h>

#include <atomic>
#include <thread>
#include <vector>

namespace {

struct Conn {
  int fd;
  unsigned char tag;   // every byte of this connection's requests
  std::size_t got = 0; // bytes of the current echo received so far
};

struct Config {
  int port = 0;
  int connections = 1000;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::size_t size = 64;
  double seconds = 2.0, warmup = 0.5;
  std::string label = "server";
};

int connect_one(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) peers::throw_errno("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) peers::throw_errno("connect");
  peers::set_nodelay(fd);
  return fd;
}

class ClientLoop {
public:
  ClientLoop(std::vector<Conn> conns, std::size_t size) : conns_(std::move(conns)), req_(size), ep_(epoll_create1(EPOLL_CLOEXEC)) {
    if (ep_ < 0) peers::throw_errno("epoll_create1");
  }
  ~ClientLoop() { close(ep_); }

  void run(const std::atomic<bool>& stop) {
    for (std::size_t i = 0; i < conns_.size(); ++i) {
      epoll_event e{};
      e.events = EPOLLIN;
      e.data.u64 = i;
      if (epoll_ctl(ep_, EPOLL_CTL_ADD, conns_[i].fd, &e) != 0) peers::throw_errno("epoll_ctl");
      request(conns_[i]);
    }
    epoll_event evs[256];
    while (!stop.load(std::memory_order_relaxed)) {
      const int k = epoll_wait(ep_, evs, 256, 50);
      for (int i = 0; i < k; ++i) on_readable(conns_[evs[i].data.u64]);
    }
  }

  std::atomic<std::uint64_t> completed{0};
  std::atomic<std::uint64_t> corrupt{0};

private:
  void request(Conn& c) {
    std::fill(req_.begin(), req_.end(), c.tag);
    // One request in flight and an empty socket buffer: a 64-byte send always completes.
    if (send(c.fd, req_.data(), req_.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req_.size()))
      peers::throw_errno("send (server closed the connection?)");
  }

  void on_readable(Conn& c) {
    unsigned char buf[4096];
    const ssize_t n = recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) peers::throw_errno("recv (server closed the connection?)");
    for (ssize_t i = 0; i < n; ++i) corrupt.fetch_add(buf[i] != c.tag, std::memory_order_relaxed);
    c.got += static_cast<std::size_t>(n);
    if (c.got < req_.size()) return;
    c.got = 0;
    completed.fetch_add(1, std::memory_order_relaxed);
    request(c);
  }

  std::vector<Conn> conns_;
  std::vector<unsigned char> req_;
  int ep_;
};

std::uint64_t total(const std::vector<std::unique_ptr<ClientLoop>>& loops) {
  std::uint64_t t = 0;
  for (const auto& l : loops) t += l->completed.load(std::memory_order_relaxed);
  return t;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"echo load generator: N connections, one request in flight each; prints requests/s as a JSON line"};
  Config cfg;
  app.add_option("--port", cfg.port, "server port on 127.0.0.1")->required();
  app.add_option("--connections", cfg.connections, "connections")->check(CLI::PositiveNumber);
  app.add_option("--threads", cfg.threads, "client threads (default: one per CPU)")->check(CLI::PositiveNumber);
  app.add_option("--size", cfg.size, "request size in bytes")->check(CLI::Range(1, 4096));
  app.add_option("--seconds", cfg.seconds, "measured duration")->check(CLI::PositiveNumber);
  app.add_option("--warmup", cfg.warmup, "warm-up before measuring, seconds");
  app.add_option("--label", cfg.label, "peer name printed in the JSON line");
  CLI11_PARSE(app, argc, argv);
  try {
    peers::raise_nofile_limit();
    std::vector<std::vector<Conn>> split(cfg.threads);
    for (int i = 0; i < cfg.connections; ++i)
      split[static_cast<std::size_t>(i) % cfg.threads].push_back(
          Conn{connect_one(cfg.port), static_cast<unsigned char>('a' + i % 26)});
    std::vector<std::unique_ptr<ClientLoop>> loops;
    for (auto& s : split) loops.push_back(std::make_unique<ClientLoop>(std::move(s), cfg.size));
    std::atomic<bool> stop{false}, failed{false};
    std::vector<std::jthread> ts;
    for (auto& l : loops)
      ts.emplace_back([&, loop = l.get()] {
        try {
          loop->run(stop);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "echo-client: %s\n", e.what());
          failed.store(true);
        }
      });
    std::this_thread::sleep_for(std::chrono::duration<double>(cfg.warmup));
    const std::uint64_t c0 = total(loops);
    const auto t0 = peers::Clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(cfg.seconds));
    const std::uint64_t c1 = total(loops);
    const double secs = peers::ns_since(t0) / 1e9;
    stop.store(true);
    ts.clear();
    std::uint64_t corrupt = 0;
    for (const auto& l : loops) corrupt += l->corrupt.load();
    if (failed.load()) return 1;
    if (corrupt) {
      std::fprintf(stderr, "echo-client: %llu echoed bytes differ from the request\n",
                   static_cast<unsigned long long>(corrupt));
      return 1;
    }
    if (c1 == c0) {
      std::fprintf(stderr, "echo-client: no request completed during the measurement\n");
      return 1;
    }
    peers::emit(cfg.label, "echo", {"rps", "req/s", static_cast<double>(c1 - c0) / secs});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "echo-client: %s\n", e.what());
    return 1;
  }
  return 0;
}
