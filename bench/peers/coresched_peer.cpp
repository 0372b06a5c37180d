// SPDX-License-Identifier: Apache-2.0
// The coresched side of the peer suite: every workload on one Runtime over
// the real topology (one pinned worker per CPU, default options), so these
// are the figures a user gets without tuning.
//
// "On one worker" and "across two workers" use SpawnOptions::pin_to_pu:
// coresched can pin a fiber, which Go cannot, so where the workload names a
// placement coresched is held to it exactly.
#include "peer_common.hpp"

#include <coresched/coresched.hpp>
#include <coresched/sync.hpp>

#include <array>
#include <atomic>
#include <stdexcept>

namespace {
using namespace coresched;
using peers::Clock;
using peers::Figure;
using peers::Params;

// Two fibers on worker 0 yield to each other; ns per yield (one switch each).
std::vector<Figure> yield_pingpong(Runtime& rt, const Params& p) {
  const long n = p.n;
  auto body = [n] {
    for (long i = 0; i < n; ++i) this_fiber::yield();
  };
  const SpawnOptions on0{.pin_to_pu = 0};
  const double ns = rt.spawn([&] {
                        const auto t0 = Clock::now();
                        auto other = coresched::spawn(body, on0);
                        body();
                        other.join();
                        return peers::ns_per_op(t0, 2.0 * static_cast<double>(n));
                      }, on0)
                        .join();
  return {{"time", "ns/op", ns}};
}

// Spawn an empty fiber and join it, n times in a row, from a fiber.
std::vector<Figure> spawn_join(Runtime& rt, const Params& p) {
  const long n = p.n;
  const double ns = rt.spawn([n] {
                        const auto t0 = Clock::now();
                        for (long i = 0; i < n; ++i) coresched::spawn([] {}).join();
                        return peers::ns_per_op(t0, static_cast<double>(n));
                      }).join();
  return {{"time", "ns/op", ns}};
}

// Spawn n empty fibers (all handles held), then join them all.
std::vector<Figure> spawn_many(Runtime& rt, const Params& p) {
  const long n = p.n;
  const double ns = rt.spawn([n] {
                        std::vector<JoinHandle<void>> hs;
                        hs.reserve(static_cast<std::size_t>(n));
                        const auto t0 = Clock::now();
                        for (long i = 0; i < n; ++i) hs.push_back(coresched::spawn([] {}));
                        for (auto& h : hs) h.join();
                        return peers::ns_per_op(t0, static_cast<double>(n));
                      }).join();
  return {{"time", "ns/op", ns}};
}

// The same million, waited for as Go's peer does: detached fibers counting
// down one WaitGroup, so nothing is kept per fiber once it has run.
std::vector<Figure> spawn_many_wg(Runtime& rt, const Params& p) {
  const long n = p.n;
  const double ns = rt.spawn([n] {
                        WaitGroup wg;
                        const auto t0 = Clock::now();
                        wg.add(n);
                        for (long i = 0; i < n; ++i) coresched::spawn([&wg] { wg.done(); }, SpawnOptions{.detached = true});
                        wg.wait();
                        return peers::ns_per_op(t0, static_cast<double>(n));
                      }).join();
  return {{"time", "ns/op", ns}};
}

// n detached fibers parked on one Event, as a server parks a fiber per idle
// connection: the time to start them all (each counts itself parked just
// before it waits), the resident memory each adds, and the time for all of
// them to finish once the Event is set.
std::vector<Figure> park(Runtime& rt, const Params& p) {
  const long n = p.n;
  struct Out {
    double start_ns, rss_bytes, drain_ns;
  };
  const Out out = rt.spawn([n] {
                    Event go;
                    WaitGroup done;
                    std::atomic<long> parked{0};
                    const long rss0 = peers::rss_bytes();
                    const auto t0 = Clock::now();
                    done.add(n);
                    for (long i = 0; i < n; ++i)
                      coresched::spawn(
                          [&] {
                            parked.fetch_add(1, std::memory_order_relaxed);
                            go.wait();
                            done.done();
                          },
                          SpawnOptions{.detached = true});
                    while (parked.load(std::memory_order_relaxed) < n) this_fiber::yield();
                    const double start_ns = peers::ns_since(t0);
                    const long rss1 = peers::rss_bytes();
                    const auto t1 = Clock::now();
                    go.set();
                    done.wait();
                    return Out{start_ns, static_cast<double>(rss1 - rss0), peers::ns_since(t1)};
                  }).join();
  const auto per = static_cast<double>(n);
  return {{"start", "ns/fiber", out.start_ns / per},
          {"rss", "bytes/fiber", out.rss_bytes / per},
          {"drain", "ns/fiber", out.drain_ns / per}};
}

// skynet: a node spawns 10 children over its range and sums what they return;
// a node of size 1 returns its number. Children run anywhere (stealing).
long skynet(long num, long size) {
  if (size == 1) return num;
  const long child = size / 10;
  std::array<JoinHandle<long>, 10> hs;
  for (long i = 0; i < 10; ++i) hs[static_cast<std::size_t>(i)] = coresched::spawn([=] { return skynet(num + i * child, child); });
  long sum = 0;
  for (auto& h : hs) sum += h.join();
  return sum;
}

std::vector<Figure> skynet_workload(Runtime& rt, const Params& p) {
  const long leaves = p.n;
  const auto t0 = Clock::now();
  const long sum = rt.spawn([leaves] { return skynet(0, leaves); }).join();
  const double ns = peers::ns_per_op(t0, static_cast<double>(leaves));
  if (sum != peers::skynet_expected(leaves)) throw std::runtime_error("skynet: wrong sum");
  return {{"time", "ns/leaf", ns}};
}

// Where a two-fiber workload's fibers run: pinned to PUs 0 and 1 (across two
// workers), both to PU 0 (one worker), or unpinned, placed by the runtime
// (as Go's goroutines are).
enum class Placed { two_workers, one_worker, by_runtime };

SpawnOptions on_pu(Placed how, unsigned pu) {
  if (how == Placed::by_runtime) return {};
  return SpawnOptions{.pin_to_pu = how == Placed::two_workers ? pu : 0};
}

// Unbuffered Channel round trip between a ping and a pong fiber.
std::vector<Figure> channel_roundtrip(Runtime& rt, const Params& p, Placed how) {
  const long n = p.n;
  Channel<long> ping(0), pong(0);
  auto server = rt.spawn([&] {
    while (auto v = ping.recv()) pong.send(*v + 1);
  }, on_pu(how, 1));
  const double ns = rt.spawn([&] {
                        const auto t0 = Clock::now();
                        long x = 0;
                        for (long i = 0; i < n; ++i) {
                          ping.send(x);
                          x = pong.recv().value();
                        }
                        const double r = peers::ns_per_op(t0, static_cast<double>(n));
                        ping.close();
                        if (x != n) throw std::runtime_error("channel: wrong count");
                        return r;
                      }, on_pu(how, 0))
                        .join();
  server.join();
  return {{"time", "ns/op", ns}};
}

// A producer and a consumer, each with 1 us of work per item, through a
// Channel of 64: ns per item. Both placed by the runtime. They can overlap on
// two workers (~1 us per item) or take turns on one (~2 us): what a wake-up
// from a producer that runs on, rather than blocks, costs.
std::vector<Figure> pipeline(Runtime& rt, const Params& p) {
  const long n = p.n;
  auto work = [] {
    const auto until = Clock::now() + std::chrono::nanoseconds(1000);
    while (Clock::now() < until) this_fiber::preempt_point();
  };
  Channel<long> items(64);
  const auto t0 = Clock::now();
  auto consumer = rt.spawn([&] {
    long sum = 0;
    while (auto v = items.recv()) {
      work();
      sum += *v;
    }
    return sum;
  });
  rt.spawn([&] {
    for (long i = 0; i < n; ++i) {
      work();
      items.send(i);
    }
    items.close();
  }).join();
  const long sum = consumer.join();
  const double ns = peers::ns_per_op(t0, static_cast<double>(n));
  if (sum != n * (n - 1) / 2) throw std::runtime_error("pipeline: wrong sum");
  return {{"time", "ns/item", ns}};
}

// Fiber A pauses gap_us, stamps the clock and releases fiber B, blocked
// meanwhile; B records stamp -> running. Across two workers (A on worker 0, B
// on worker 1, which has gone idle meanwhile), or placed by the runtime. With
// `run_on`, A runs on that long after the release (calling preempt_point, as
// cooperative code does) before it waits for B: the waker that does not block.
std::vector<Figure> wake_latency(Runtime& rt, const Params& p, Placed how,
                                 std::chrono::microseconds run_on = std::chrono::microseconds(0)) {
  const long n = p.n;
  const auto gap = std::chrono::nanoseconds(static_cast<long>(p.gap_us * 1000));
  Semaphore to_b, to_a;
  std::atomic<Clock::rep> stamp{0};
  std::vector<double> lat;
  lat.reserve(static_cast<std::size_t>(n));
  auto b = rt.spawn([&] {
    for (long i = 0; i < n; ++i) {
      to_b.acquire();
      lat.push_back(static_cast<double>(Clock::now().time_since_epoch().count() - stamp.load()) / 1e3);
      to_a.release();
    }
  }, on_pu(how, 1));
  rt.spawn([&] {
    for (long i = 0; i < n; ++i) {
      peers::spin_for(gap);
      stamp.store(Clock::now().time_since_epoch().count());
      to_b.release();
      const auto until = Clock::now() + run_on;
      while (Clock::now() < until) this_fiber::preempt_point();
      to_a.acquire();
    }
  }, on_pu(how, 0)).join();
  b.join();
  return {{"p50", "us", peers::percentile(lat, 50)}, {"p99", "us", peers::percentile(lat, 99)}};
}

// One fiber sleeps gap_us at a time, n times, on a worker with nothing else
// to run: how late each wake-up comes (the backend's timer and the worker's
// sleep in its reactor).
std::vector<Figure> sleep_lateness(Runtime& rt, const Params& p) {
  const auto gap = std::chrono::nanoseconds(static_cast<long>(p.gap_us * 1000));
  std::vector<double> late;
  late.reserve(static_cast<std::size_t>(p.n));
  rt.spawn([&] {
    for (long i = 0; i < p.n; ++i) {
      const auto deadline = Clock::now() + gap;
      this_fiber::sleep_until(deadline);
      late.push_back(std::chrono::duration<double, std::micro>(Clock::now() - deadline).count());
    }
  }).join();
  return {{"p50", "us", peers::percentile(late, 50)}, {"p99", "us", peers::percentile(late, 99)}};
}

} // namespace

int main(int argc, char** argv) {
  try {
    Runtime rt;
    if (rt.topology().pus().size() < 2) {
      std::fprintf(stderr, "coresched peer: needs at least 2 PUs (have %zu)\n", rt.topology().pus().size());
      return 1;
    }
    return peers::run_main(argc, argv, "coresched",
                           {{"yield", [&](const Params& p) { return yield_pingpong(rt, p); }},
                            {"spawn_join", [&](const Params& p) { return spawn_join(rt, p); }},
                            {"spawn_many", [&](const Params& p) { return spawn_many(rt, p); }},
                            {"spawn_many_wg", [&](const Params& p) { return spawn_many_wg(rt, p); }},
                            {"skynet", [&](const Params& p) { return skynet_workload(rt, p); }},
                            {"park", [&](const Params& p) { return park(rt, p); }},
                            {"channel", [&](const Params& p) { return channel_roundtrip(rt, p, Placed::two_workers); }},
                            {"channel_1w", [&](const Params& p) { return channel_roundtrip(rt, p, Placed::one_worker); }},
                            {"channel_any", [&](const Params& p) { return channel_roundtrip(rt, p, Placed::by_runtime); }},
                            {"pipeline", [&](const Params& p) { return pipeline(rt, p); }},
                            {"wake", [&](const Params& p) { return wake_latency(rt, p, Placed::two_workers); }},
                            {"wake_any", [&](const Params& p) { return wake_latency(rt, p, Placed::by_runtime); }},
                            {"sleep", [&](const Params& p) { return sleep_lateness(rt, p); }},
                            {"wake_run_on", [&](const Params& p) {
                               return wake_latency(rt, p, Placed::by_runtime, std::chrono::microseconds(100));
                             }}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched peer: %s\n", e.what());
    return 1;
  }
}
