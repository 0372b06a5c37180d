// SPDX-License-Identifier: Apache-2.0
// coresched-slow-file-bench: whether a fiber waiting on a slow regular file
// stalls the other fibers of its worker, on each I/O backend in one run.
//
// One worker (`core:1 pu:1`). A writer fiber writes --mib MiB to a file with
// io::write (1 MiB a call) and then io::fsync; beside it a ticker fiber
// sleeps 1 ms at a time and counts its wake-ups. While the writer's calls
// are in the kernel the ticker should keep ticking: io_uring does regular-file
// work in the kernel's own workers, the epoll backend on its BlockingPool. A
// backend that did it on the worker would show 0 ticks during the fsync.
#include "json_rounds.hpp"

#include <coresched/coresched.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fcntl.h>
#include <string>
#include <unistd.h>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;
using namespace coresched;

struct Round {
  double write_ms = 0, fsync_ms = 0;
  long ticks_during_fsync = 0; // the ticker's wake-ups while the fsync was in flight
  double max_gap_ms = 0;       // the longest the ticker waited between two wake-ups
};

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

Round measure(IoBackend backend, const std::string& path, unsigned mib) {
  Options o;
  o.topology = "core:1 pu:1";
  o.io_backend = backend;
  Runtime rt(o);
  Round r;
  std::atomic<bool> done{false};
  std::atomic<Clock::rep> fsync_from{0}, fsync_to{0};
  auto ticker = rt.spawn([&] {
    std::vector<Clock::time_point> ticks;
    while (!done.load()) {
      this_fiber::sleep_for(std::chrono::milliseconds(1));
      ticks.push_back(Clock::now());
    }
    return ticks;
  });
  auto writer = rt.spawn([&] {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) throw std::runtime_error("cannot create " + path);
    std::vector<std::byte> chunk(1 << 20, std::byte{0x5a});
    const auto t0 = Clock::now();
    for (unsigned i = 0; i < mib; ++i)
      if (const auto w = io::write(fd, chunk); !w || w.value != static_cast<std::int64_t>(chunk.size()))
        throw std::runtime_error("write: " + w.error.message());
    const auto t1 = Clock::now();
    fsync_from = t1.time_since_epoch().count();
    if (const auto f = io::fsync(fd); !f) throw std::runtime_error("fsync: " + f.error.message());
    const auto t2 = Clock::now();
    fsync_to = t2.time_since_epoch().count();
    ::close(fd);
    r.write_ms = ms(t1 - t0);
    r.fsync_ms = ms(t2 - t1);
    done = true;
  });
  writer.join();
  const auto ticks = ticker.join();
  ::unlink(path.c_str());
  const Clock::time_point from{Clock::duration(fsync_from.load())}, to{Clock::duration(fsync_to.load())};
  for (std::size_t i = 0; i < ticks.size(); ++i) {
    if (ticks[i] > from && ticks[i] < to) ++r.ticks_during_fsync;
    if (i > 0) r.max_gap_ms = std::max(r.max_gap_ms, ms(ticks[i] - ticks[i - 1]));
  }
  return r;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched-slow-file-bench: a fiber's slow file write and fsync beside a fiber ticking every 1 ms "
               "on the same worker, on each I/O backend"};
  unsigned mib = 64, rounds = 3;
  std::string dir = ".", json;
  std::vector<std::string> backends{"io_uring", "epoll"};
  app.add_option("--mib", mib, "MiB written before the fsync (default 64)")->check(CLI::Range(1u, 4096u));
  app.add_option("--rounds", rounds, "rounds per backend (default 3)")->check(CLI::Range(1u, 100u));
  app.add_option("--dir", dir, "directory on the disk to measure (default: the current one; not a tmpfs)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--backend", backends, "backends to run (io_uring, epoll; default both)")
      ->check(CLI::IsMember({"io_uring", "epoll"}));
  app.add_option("--json", json, "also write the rounds as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  JsonRounds out(json, "coresched-slow-file-bench");
  if (!out.ok()) return 1;
  out.parameters(R"("mib": %u, "dir": "%s")", mib, dir.c_str());
  const std::string path = dir + "/coresched-slow-file-bench.tmp";
  std::printf("%-9s %5s %9s %9s %22s %14s\n", "backend", "round", "write ms", "fsync ms", "ticks during fsync",
              "max gap ms");
  try {
    for (const auto& name : backends) {
      const IoBackend b = name == "epoll" ? IoBackend::epoll : IoBackend::io_uring;
      for (unsigned i = 0; i < rounds; ++i) {
        std::fprintf(stderr, "[slow-file] %s round %u/%u ...\n", name.c_str(), i + 1, rounds);
        const Round r = measure(b, path, mib);
        std::printf("%-9s %5u %9.1f %9.1f %11ld (of ~%4.0f) %14.2f\n", name.c_str(), i + 1, r.write_ms, r.fsync_ms,
                    r.ticks_during_fsync, r.fsync_ms, r.max_gap_ms);
        out.round(R"("backend": "%s", "write_ms": %.3f, "fsync_ms": %.3f, "ticks_during_fsync": %ld, "max_gap_ms": %.3f)",
                  name.c_str(), r.write_ms, r.fsync_ms, r.ticks_during_fsync, r.max_gap_ms);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-slow-file-bench: %s\n", e.what());
    ::unlink(path.c_str());
    return 1;
  }
  return 0;
}
