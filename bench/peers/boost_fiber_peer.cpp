// SPDX-License-Identifier: Apache-2.0
// The Boost.Fiber side of the peer suite, on its work_stealing algorithm as
// shipped (Debian's libboost-fiber-dev): one scheduler thread per CPU, the
// default stack allocator (fixedsize_stack, 128 KiB malloc'd), suspend=false
// (an idle scheduler thread keeps polling for work to steal instead of
// sleeping on a condition variable; that is the library's default and its
// fastest setting for hand-offs).
//
// work_stealing keeps its registry in function statics: it can be set up once
// per process, with one thread count. So each invocation builds one Pool, the
// warm-up and the trial share it, and "on one worker" (yield) uses a pool of
// one thread.
#include "peer_common.hpp"

#include <boost/fiber/algo/work_stealing.hpp>
#include <boost/fiber/all.hpp>

#include <array>
#include <atomic>
#include <memory>
#include <stdexcept>
#include <thread>

namespace {
namespace bf = boost::fibers;
using peers::Clock;
using peers::Figure;
using peers::Params;

// The calling thread plus `threads - 1` helpers, all on work_stealing. A
// helper runs jobs in its main fiber, which work_stealing never migrates:
// that is how a workload puts something on "the other worker" for sure.
class Pool {
public:
  explicit Pool(unsigned threads) {
    for (unsigned i = 1; i < threads; ++i)
      helpers_.emplace_back([this, threads] {
        bf::use_scheduling_algorithm<bf::algo::work_stealing>(threads);
        std::function<void()> job;
        while (jobs_.pop(job) == bf::channel_op_status::success) job();
      });
    bf::use_scheduling_algorithm<bf::algo::work_stealing>(threads); // waits for the helpers (a barrier)
  }
  ~Pool() {
    jobs_.close();
    for (auto& t : helpers_) t.join();
  }
  /// Runs `job` in a helper thread's main fiber (needs threads >= 2).
  void on_helper(std::function<void()> job) { jobs_.push(std::move(job)); }

private:
  bf::buffered_channel<std::function<void()>> jobs_{2};
  std::vector<std::thread> helpers_;
};

std::vector<Figure> yield_pingpong(const Params& p) {
  const long n = p.n;
  auto body = [n] {
    for (long i = 0; i < n; ++i) boost::this_fiber::yield();
  };
  const auto t0 = Clock::now();
  bf::fiber a(body), b(body);
  a.join();
  b.join();
  return {{"time", "ns/op", peers::ns_per_op(t0, 2.0 * static_cast<double>(n))}};
}

std::vector<Figure> spawn_join(const Params& p) {
  const long n = p.n;
  double ns = 0;
  bf::fiber([&] {
    const auto t0 = Clock::now();
    for (long i = 0; i < n; ++i) bf::fiber([] {}).join();
    ns = peers::ns_per_op(t0, static_cast<double>(n));
  }).join();
  return {{"time", "ns/op", ns}};
}

std::vector<Figure> spawn_many(const Params& p) {
  const long n = p.n;
  double ns = 0;
  bf::fiber([&] {
    std::vector<bf::fiber> fs;
    fs.reserve(static_cast<std::size_t>(n));
    const auto t0 = Clock::now();
    for (long i = 0; i < n; ++i) fs.emplace_back([] {});
    for (auto& f : fs) f.join();
    ns = peers::ns_per_op(t0, static_cast<double>(n));
  }).join();
  return {{"time", "ns/op", ns}};
}

long skynet(long num, long size) {
  if (size == 1) return num;
  const long child = size / 10;
  std::array<long, 10> results{};
  std::array<bf::fiber, 10> fs;
  for (long i = 0; i < 10; ++i)
    fs[static_cast<std::size_t>(i)] =
        bf::fiber([&results, i, num, child] { results[static_cast<std::size_t>(i)] = skynet(num + i * child, child); });
  long sum = 0;
  for (std::size_t i = 0; i < 10; ++i) {
    fs[i].join();
    sum += results[i];
  }
  return sum;
}

std::vector<Figure> skynet_workload(const Params& p) {
  const long leaves = p.n;
  long sum = 0;
  const auto t0 = Clock::now();
  bf::fiber([&] { sum = skynet(0, leaves); }).join();
  const double ns = peers::ns_per_op(t0, static_cast<double>(leaves));
  if (sum != peers::skynet_expected(leaves)) throw std::runtime_error("skynet: wrong sum");
  return {{"time", "ns/leaf", ns}};
}

// Unbuffered channel round trip: ping in this thread's main fiber, pong in
// the helper's main fiber (across two workers) or in a fiber of this thread
// (`same_worker`, with a pool of one thread so nothing can be stolen).
std::vector<Figure> channel_roundtrip(Pool& pool, const Params& p, bool same_worker) {
  const long n = p.n;
  bf::unbuffered_channel<long> ping, pong;
  bf::promise<void> served;
  auto done = served.get_future();
  auto serve = [&] {
    long v;
    while (ping.pop(v) == bf::channel_op_status::success) pong.push(v + 1);
    served.set_value();
  };
  bf::fiber local;
  if (same_worker) local = bf::fiber(serve);
  else pool.on_helper(serve);
  const auto t0 = Clock::now();
  long x = 0;
  for (long i = 0; i < n; ++i) {
    ping.push(x);
    pong.pop(x);
  }
  const double ns = peers::ns_per_op(t0, static_cast<double>(n));
  ping.close();
  done.wait();
  if (local.joinable()) local.join();
  if (x != n) throw std::runtime_error("channel: wrong count");
  return {{"time", "ns/op", ns}};
}

// Wake: this thread's main fiber pauses, stamps, and releases the helper's
// main fiber (blocked on a channel pop); the helper records the latency.
std::vector<Figure> wake_latency(Pool& pool, const Params& p) {
  const long n = p.n;
  const auto gap = std::chrono::nanoseconds(static_cast<long>(p.gap_us * 1000));
  bf::buffered_channel<int> to_b{2}, to_a{2};
  std::atomic<Clock::rep> stamp{0};
  std::vector<double> lat;
  lat.reserve(static_cast<std::size_t>(n));
  pool.on_helper([&] {
    int v;
    for (long i = 0; i < n; ++i) {
      to_b.pop(v);
      lat.push_back(static_cast<double>(Clock::now().time_since_epoch().count() - stamp.load()) / 1e3);
      to_a.push(1);
    }
  });
  for (long i = 0; i < n; ++i) {
    peers::spin_for(gap);
    stamp.store(Clock::now().time_since_epoch().count());
    to_b.push(1);
    int v;
    to_a.pop(v);
  }
  return {{"p50", "us", peers::percentile(lat, 50)}, {"p99", "us", peers::percentile(lat, 99)}};
}

unsigned cpus() { return std::max(2u, std::thread::hardware_concurrency()); }

} // namespace

int main(int argc, char** argv) {
  // The pool is built lazily, after the command line is parsed (--help must not start threads).
  std::unique_ptr<Pool> pool;
  auto with = [&pool](unsigned threads, auto fn) {
    return [&pool, threads, fn](const Params& p) {
      if (!pool) pool = std::make_unique<Pool>(threads);
      return fn(p);
    };
  };
  const int rc = peers::run_main(
      argc, argv, "boost_fiber",
      {{"yield", with(1, yield_pingpong)}, // one worker: a pool of one thread
       {"spawn_join", with(cpus(), spawn_join)},
       {"spawn_many", with(cpus(), spawn_many)},
       {"skynet", with(cpus(), skynet_workload)},
       {"channel", with(cpus(), [&pool](const Params& p) { return channel_roundtrip(*pool, p, false); })},
       {"channel_1w", with(1, [&pool](const Params& p) { return channel_roundtrip(*pool, p, true); })},
       {"wake", with(cpus(), [&pool](const Params& p) { return wake_latency(*pool, p); })}});
  pool.reset();
  return rc;
}
