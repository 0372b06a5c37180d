// SPDX-License-Identifier: Apache-2.0
// The coresched echo server: straight-line code, a fiber per connection, all
// I/O through coresched::io (each worker's io_uring): one io::recv and one
// io::send per message. --recv-stream receives through an io::RecvStream
// instead (one standing multishot recv), for comparison: it is no faster
// here (docs/performance.md, "Echo with a multishot recv").
//
// Like the epoll server it has one SO_REUSEPORT listener per worker, with an
// acceptor fiber pinned there, so the kernel spreads connections over the
// workers the same way; connection fibers are not pinned (a busy worker's
// fibers may be stolen by an idle one).
#include "echo_common.hpp"

#include <coresched/coresched.hpp>
#include <coresched/io.hpp>
#include <coresched/recv_stream.hpp>

#include <CLI/CLI.hpp>

#include <array>
#include <cstddef>
#include <span>
#include <vector>

namespace {
using namespace coresched;

// Sends all of `data` (a short send is continued, an error ends the connection).
bool send_all(int fd, std::span<const std::byte> data) {
  while (!data.empty()) {
    const io::Result r = io::send(fd, data);
    if (!r || r.value <= 0) return false;
    data = data.subspan(static_cast<std::size_t>(r.value));
  }
  return true;
}

void serve_plain(int fd) {
  std::array<std::byte, 4096> buf; // on the fiber's stack
  for (;;) {
    const io::Result r = io::recv(fd, buf);
    if (!r || r.value == 0) break;
    if (!send_all(fd, std::span<const std::byte>(buf.data(), static_cast<std::size_t>(r.value)))) break;
  }
}

void serve_stream(int fd) {
  // One request in flight per connection: two buffers of 1 KiB are plenty,
  // and with the buffer ring they fit in one page.
  io::RecvStream in(fd, 1024, 2);
  std::span<const std::byte> data;
  for (;;) {
    const io::Result r = in.next(data);
    if (!r || r.value == 0) break;
    if (!send_all(fd, data)) break;
  }
}

void serve_connection(int fd, bool plain) {
  if (plain) serve_plain(fd);
  else serve_stream(fd);
  io::close(fd);
}

// Blocking listener on purpose: io_uring then arms an internal poll instead of
// failing with EAGAIN, so accept never busy-loops.
[[noreturn]] void accept_loop(Runtime& rt, int listener, bool plain) {
  for (;;) {
    const io::Result r = io::accept(listener);
    if (!r) continue;
    const int fd = static_cast<int>(r.value);
    peers::set_nodelay(fd);
    rt.spawn([fd, plain] { serve_connection(fd, plain); }, SpawnOptions{.detached = true});
  }
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched echo server: prints PORT <n>, serves until killed"};
  bool stream = false;
  app.add_flag("--recv-stream", stream, "receive through an io::RecvStream (one multishot recv) instead of io::recv");
  unsigned slice_us = 0;
  app.add_option("--slice-us", slice_us, "the runtime's slice in microseconds (Options::slice; default its default)")
      ->check(CLI::Range(100u, 1'000'000u));
  CLI11_PARSE(app, argc, argv);
  try {
    peers::raise_nofile_limit();
    Options opts;
    if (slice_us) opts.slice = std::chrono::microseconds(slice_us);
    Runtime rt(opts);
    const auto workers = static_cast<unsigned>(rt.topology().pus().size());
    std::vector<int> listeners{peers::make_listener(0, true, false)};
    const int port = peers::local_port(listeners[0]);
    for (unsigned i = 1; i < workers; ++i) listeners.push_back(peers::make_listener(port, true, false));
    for (unsigned i = 0; i < workers; ++i)
      rt.spawn([&rt, fd = listeners[i], plain = !stream] { accept_loop(rt, fd, plain); },
               SpawnOptions{.pin_to_pu = i, .detached = true});
    peers::announce_port(port);
    for (;;) pause(); // the driver kills us
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-echo-server: %s\n", e.what());
    return 1;
  }
}
