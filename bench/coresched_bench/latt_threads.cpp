// SPDX-License-Identifier: Apache-2.0
// `coresched-bench latt --compare-threads`: the seed's latt experiment on
// plain kernel threads, so that the kernel's figures come from the same
// program, the same work and the same wake sequence as the fibers'. Each client is a thread blocked in read(2) on its own pipe, as in
// latt; the kernel's scheduler places and preempts everything.
#include "common.hpp"
#include "latt_work.hpp"

#include <memory>
#include <optional>
#include <utility>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <system_error>
#include <thread>
#include <unistd.h>

namespace coresched::bench::latt {
namespace {

using Rep = Clock::duration::rep;

class Pipe {
public:
  Pipe() {
    if (::pipe2(fds_, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "latt: pipe2");
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  ~Pipe() {
    close_write();
    ::close(fds_[0]);
  }
  int read_end() const noexcept { return fds_[0]; }
  /// Writes one stamp (a pipe write this small is atomic and never short).
  void send(Clock::time_point t) const noexcept {
    const Rep r = t.time_since_epoch().count();
    while (::write(fds_[1], &r, sizeof r) < 0 && errno == EINTR) {
    }
  }
  /// The client's read then sees end of file.
  void close_write() noexcept {
    if (fds_[1] >= 0) ::close(std::exchange(fds_[1], -1));
  }

private:
  int fds_[2] = {-1, -1};
};

/// Blocks for the next stamp; nullopt at end of file.
std::optional<Clock::time_point> receive(int fd) {
  Rep r = 0;
  for (;;) {
    const ssize_t n = ::read(fd, &r, sizeof r);
    if (n == static_cast<ssize_t>(sizeof r)) return Clock::time_point(Clock::duration(r));
    if (n < 0 && errno == EINTR) continue;
    return std::nullopt; // end of file (a stamp is never split: see Pipe::send)
  }
}

} // namespace

Measurement measure_threads(const Shape& shape, const std::vector<unsigned char>& in, std::size_t expected,
                            std::atomic<std::uint64_t>& entries) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> load;
  for (unsigned i = 0; i < shape.load; ++i) load.emplace_back([&stop] { (void)burn(stop); });

  std::vector<std::unique_ptr<Pipe>> pipes;
  for (unsigned i = 0; i < shape.clients; ++i) pipes.push_back(std::make_unique<Pipe>());
  std::vector<ClientResult> results(shape.clients);
  std::vector<std::thread> clients;
  for (unsigned i = 0; i < shape.clients; ++i) {
    clients.emplace_back([fd = pipes[i]->read_end(), &r = results[i], &in, expected, &entries] {
      r = serve([fd] { return receive(fd); }, in, expected, entries);
    });
  }

  Measurement m;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(shape.time_s));
  std::thread waker([&] {
    WakeIntervals intervals(shape);
    for (; (!shape.rounds || m.rounds < *shape.rounds) && !interrupted(); ++m.rounds) {
      const auto at = Clock::now() + intervals.next();
      if (!shape.rounds && at > deadline) break;
      std::this_thread::sleep_until(at);
      for (auto& p : pipes) p->send(Clock::now());
    }
    for (auto& p : pipes) p->close_write();
  });
  waker.join();
  for (auto& c : clients) c.join();
  m.elapsed_s = seconds(Clock::now() - start);
  stop = true;
  for (auto& l : load) l.join();
  for (const auto& r : results) {
    m.wakeup.merge(r.wakeup);
    m.work.merge(r.work);
    m.bad_outputs += r.bad_outputs;
  }
  return m;
}

} // namespace coresched::bench::latt
