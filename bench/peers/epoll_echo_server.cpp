// SPDX-License-Identifier: Apache-2.0
// The epoll thread-per-core echo server, the classic hand-written C++ design a
// fiber runtime's I/O is measured against.
//
// Choices, and why:
// - One thread per CPU, pinned, each with its own epoll instance and its own
//   SO_REUSEPORT listener: the kernel spreads connections over the listeners,
//   so no accept lock or cross-thread hand-off exists at all, and a connection
//   lives on one CPU for good (as coresched's pinned workers do).
// - Level-triggered: an event is handled with one recv() and one send() of a
//   small message, so edge-triggered mode would only add the obligation to
//   drain until EAGAIN (an extra, always-failing recv per event) for nothing.
// - A send that cannot complete (never seen with 64-byte messages) keeps the
//   rest and waits for EPOLLOUT, so the server stays correct for any client.
#include "echo_common.hpp"

#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>

#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

class EchoLoop {
public:
  explicit EchoLoop(int listener) : listener_(listener), ep_(epoll_create1(EPOLL_CLOEXEC)) {
    if (ep_ < 0) peers::throw_errno("epoll_create1");
    watch(listener_, EPOLLIN);
  }

  [[noreturn]] void run() {
    epoll_event evs[128];
    for (;;) {
      const int k = epoll_wait(ep_, evs, 128, -1);
      for (int i = 0; i < k; ++i) {
        const int fd = evs[i].data.fd;
        if (fd == listener_) accept_all();
        else if (evs[i].events & EPOLLOUT) flush(fd);
        else echo(fd);
      }
    }
  }

private:
  void watch(int fd, std::uint32_t events) {
    epoll_event e{};
    e.events = events;
    e.data.fd = fd;
    epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &e);
  }

  void accept_all() {
    for (;;) {
      const int c = accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (c < 0) return; // EAGAIN: drained (the listener is non-blocking)
      peers::set_nodelay(c);
      watch(c, EPOLLIN);
    }
  }

  void echo(int fd) {
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      drop(fd);
      return;
    }
    send_or_queue(fd, buf, static_cast<std::size_t>(n));
  }

  void send_or_queue(int fd, const char* p, std::size_t len) {
    const ssize_t s = send(fd, p, len, MSG_NOSIGNAL);
    if (s == static_cast<ssize_t>(len)) return;
    if (s < 0 && errno != EAGAIN) {
      drop(fd);
      return;
    }
    const std::size_t sent = s > 0 ? static_cast<std::size_t>(s) : 0;
    pending_[fd].append(p + sent, len - sent);
    epoll_event e{};
    e.events = EPOLLOUT; // stop reading until the backlog is out
    e.data.fd = fd;
    epoll_ctl(ep_, EPOLL_CTL_MOD, fd, &e);
  }

  void flush(int fd) {
    std::string rest = std::move(pending_[fd]);
    pending_.erase(fd);
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = fd;
    epoll_ctl(ep_, EPOLL_CTL_MOD, fd, &e);
    send_or_queue(fd, rest.data(), rest.size());
  }

  void drop(int fd) {
    pending_.erase(fd);
    close(fd); // also removes it from the epoll set
  }

  int listener_, ep_;
  std::unordered_map<int, std::string> pending_;
};

void pin_self(unsigned cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"epoll thread-per-core echo server: prints PORT <n>, serves until killed"};
  unsigned threads = std::thread::hardware_concurrency();
  app.add_option("--threads", threads, "threads (one per CPU, pinned)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    peers::raise_nofile_limit();
    // Every listener is bound before any thread runs: the first picks the port.
    std::vector<int> listeners{peers::make_listener(0, true, true)};
    const int port = peers::local_port(listeners[0]);
    for (unsigned i = 1; i < threads; ++i) listeners.push_back(peers::make_listener(port, true, true));
    std::vector<std::thread> ts;
    for (unsigned i = 0; i < threads; ++i)
      ts.emplace_back([i, fd = listeners[i]] {
        pin_self(i % std::thread::hardware_concurrency());
        EchoLoop(fd).run();
      });
    peers::announce_port(port);
    for (auto& t : ts) t.join(); // never returns: the driver kills us
  } catch (const std::exception& e) {
    std::fprintf(stderr, "epoll-echo-server: %s\n", e.what());
    return 1;
  }
}
