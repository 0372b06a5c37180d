// SPDX-License-Identifier: Apache-2.0
// The plain-threads side of the peer suite: std::jthread, std::mutex and
// std::condition_variable (futex underneath), threads pinned to CPUs where the
// workload names a placement. This is the baseline a fiber runtime exists to
// beat; skynet (a million live threads) is not run.
#include "peer_common.hpp"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

namespace {
using peers::Clock;
using peers::Figure;
using peers::Params;

void pin_self(unsigned cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) throw std::runtime_error("cannot pin to CPU");
}

// A rendezvous channel on a mutex and two condition variables: send() returns
// once a receiver took the value (the same contract as an unbuffered channel).
class Rendezvous {
public:
  void send(long v) {
    std::unique_lock lk(mu_);
    can_put_.wait(lk, [&] { return !full_; });
    value_ = v;
    full_ = true;
    ++sent_;
    changed_.notify_all();
    const long mine = sent_;
    changed_.wait(lk, [&] { return taken_ >= mine; });
  }
  long recv() {
    std::unique_lock lk(mu_);
    changed_.wait(lk, [&] { return full_; });
    const long v = value_;
    full_ = false;
    ++taken_;
    changed_.notify_all();
    can_put_.notify_one();
    return v;
  }

private:
  std::mutex mu_;
  std::condition_variable changed_, can_put_;
  long value_ = 0, sent_ = 0, taken_ = 0;
  bool full_ = false;
};

// A counting semaphore on a mutex and a condition variable.
class CvSemaphore {
public:
  void release() {
    {
      std::lock_guard lk(mu_);
      ++count_;
    }
    cv_.notify_one();
  }
  void acquire() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return count_ > 0; });
    --count_;
  }

private:
  std::mutex mu_;
  std::condition_variable cv_;
  long count_ = 0;
};

// Two threads on CPU 0 call sched_yield() (a syscall and a kernel switch each).
std::vector<Figure> yield_pingpong(const Params& p) {
  const long n = p.n;
  std::atomic<int> ready{0};
  auto body = [&] {
    pin_self(0);
    ready.fetch_add(1);
    while (ready.load() < 2) sched_yield();
    for (long i = 0; i < n; ++i) sched_yield();
  };
  const auto t0 = Clock::now();
  {
    std::jthread a(body), b(body);
  }
  return {{"time", "ns/op", peers::ns_per_op(t0, 2.0 * static_cast<double>(n))}};
}

std::vector<Figure> spawn_join(const Params& p) {
  const auto t0 = Clock::now();
  for (long i = 0; i < p.n; ++i) std::jthread([] {}).join();
  return {{"time", "ns/op", peers::ns_per_op(t0, static_cast<double>(p.n))}};
}

std::vector<Figure> spawn_many(const Params& p) {
  std::vector<std::jthread> ts;
  ts.reserve(static_cast<std::size_t>(p.n));
  const auto t0 = Clock::now();
  for (long i = 0; i < p.n; ++i) ts.emplace_back([] {});
  for (auto& t : ts) t.join();
  return {{"time", "ns/op", peers::ns_per_op(t0, static_cast<double>(p.n))}};
}

// Rendezvous round trip between a thread on CPU 0 and one on `pong_cpu`.
std::vector<Figure> channel_roundtrip(const Params& p, unsigned pong_cpu) {
  const long n = p.n;
  Rendezvous ping, pong;
  std::jthread server([&] {
    pin_self(pong_cpu);
    for (long i = 0; i < n; ++i) pong.send(ping.recv() + 1);
  });
  pin_self(0);
  const auto t0 = Clock::now();
  long x = 0;
  for (long i = 0; i < n; ++i) {
    ping.send(x);
    x = pong.recv();
  }
  const double ns = peers::ns_per_op(t0, static_cast<double>(n));
  if (x != n) throw std::runtime_error("channel: wrong count");
  return {{"time", "ns/op", ns}};
}

std::vector<Figure> wake_latency(const Params& p) {
  const long n = p.n;
  const auto gap = std::chrono::nanoseconds(static_cast<long>(p.gap_us * 1000));
  CvSemaphore to_b, to_a;
  std::atomic<Clock::rep> stamp{0};
  std::vector<double> lat;
  lat.reserve(static_cast<std::size_t>(n));
  std::jthread b([&] {
    pin_self(1);
    for (long i = 0; i < n; ++i) {
      to_b.acquire();
      lat.push_back(static_cast<double>(Clock::now().time_since_epoch().count() - stamp.load()) / 1e3);
      to_a.release();
    }
  });
  pin_self(0);
  for (long i = 0; i < n; ++i) {
    peers::spin_for(gap);
    stamp.store(Clock::now().time_since_epoch().count());
    to_b.release();
    to_a.acquire();
  }
  b.join();
  return {{"p50", "us", peers::percentile(lat, 50)}, {"p99", "us", peers::percentile(lat, 99)}};
}

} // namespace

int main(int argc, char** argv) {
  return peers::run_main(argc, argv, "threads",
                         {{"yield", yield_pingpong},
                          {"spawn_join", spawn_join},
                          {"spawn_many", spawn_many},
                          {"channel", [](const Params& p) { return channel_roundtrip(p, 1); }},
                          {"channel_1w", [](const Params& p) { return channel_roundtrip(p, 0); }},
                          {"wake", wake_latency}});
}
