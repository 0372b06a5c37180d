// SPDX-License-Identifier: Apache-2.0
// Weights in real time, measured in user code: three cookies of weights 100,
// 200 and 400 keep one SMT core (core:1 pu:2) busy, two fibers each, and
// each fiber clocks the stretches it runs between preemption points. Over
// each 1 s window every cookie's share of the time its fibers ran is within
// 15 % (relative) of weight / sum of weights: 1/7, 2/7, 4/7. The weights are
// then reversed while the fibers run (400, 200, 100), and the next windows
// follow the new weights. The runtime's own books (CookieStats::core_ns, what
// the core granted) are checked the same way. Timing on a shared machine is
// noisy: a failing attempt is retried, up to three in all, as the other
// real-time share tests are; the bounds are not widened. Two more cases take
// weights far apart: a weight-1 cookie pinned to a sleeping sibling beside
// weight 1,000 gets its share, and a weight-25 cookie's fiber pinned to a
// sibling runs in its turns beside a busy weight-2,500 cookie.
#include "harness.hpp"

#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

using namespace coresched;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kCookies = 3;

struct Window {
  std::array<double, kCookies> ran{};  // seconds, as the fibers clocked them
  std::array<double, kCookies> core{}; // seconds, CookieStats::core_ns
};

std::string check_window(const Window& w, const std::array<std::uint32_t, kCookies>& weights, bool user) {
  double wsum = 0, rsum = 0, csum = 0;
  for (int i = 0; i < kCookies; ++i) {
    wsum += weights[static_cast<std::size_t>(i)];
    rsum += w.ran[static_cast<std::size_t>(i)];
    csum += w.core[static_cast<std::size_t>(i)];
  }
  std::string err;
  for (int i = 0; i < kCookies; ++i) {
    const auto k = static_cast<std::size_t>(i);
    const double expected = weights[k] / wsum;
    const double by_core = w.core[k] / csum, by_user = w.ran[k] / rsum;
    char m[200];
    if (std::fabs(by_core / expected - 1) > 0.15) {
      std::snprintf(m, sizeof m, "weight %u: core_ns share %.3f, expected %.3f; ", weights[k], by_core, expected);
      err += m;
    }
    if (user && std::fabs(by_user / expected - 1) > 0.15) {
      std::snprintf(m, sizeof m, "weight %u: measured share %.3f, expected %.3f; ", weights[k], by_user, expected);
      err += m;
    }
  }
  return err;
}

/// One attempt: `windows` 1 s windows under each of the two weightings.
std::string attempt(int windows) {
  Runtime rt(guarantees::options_for("core:1 pu:2"));
  std::array<std::uint32_t, kCookies> weights{100, 200, 400};
  std::array<Cookie, kCookies> cookies;
  for (int i = 0; i < kCookies; ++i)
    cookies[static_cast<std::size_t>(i)] =
        Cookie::create("w" + std::to_string(weights[static_cast<std::size_t>(i)]), weights[static_cast<std::size_t>(i)]);
  std::array<std::atomic<std::int64_t>, kCookies> ran_ns{};
  std::atomic<bool> stop{false};
  std::vector<JoinHandle<void>> fibers;
  for (int i = 0; i < kCookies; ++i)
    for (int f = 0; f < 2; ++f)
      fibers.push_back(rt.spawn([&, i] {
        auto& total = ran_ns[static_cast<std::size_t>(i)];
        while (!stop.load(std::memory_order_relaxed)) {
          // One stretch: from after the preemption point returns to before the next.
          const auto t0 = Clock::now();
          auto t1 = t0;
          while (t1 - t0 < 30us) t1 = Clock::now();
          total.fetch_add((t1 - t0).count(), std::memory_order_relaxed);
          this_fiber::preempt_point();
        }
      }, SpawnOptions{.cookie = cookies[static_cast<std::size_t>(i)]}));
  auto sample = [&](Window& w) {
    const Stats st = rt.stats();
    for (int i = 0; i < kCookies; ++i) {
      const auto k = static_cast<std::size_t>(i);
      w.ran[k] = static_cast<double>(ran_ns[k].load()) / 1e9;
      w.core[k] = static_cast<double>(st.cookie(cookies[k]).core_ns) / 1e9;
    }
  };
  std::string err;
  std::this_thread::sleep_for(200ms); // past the arrivals
  for (int phase = 0; phase < 2 && err.empty(); ++phase) {
    if (phase == 1) {
      weights = {400, 200, 100};
      for (int i = 0; i < kCookies; ++i) cookies[static_cast<std::size_t>(i)].set_weight(weights[static_cast<std::size_t>(i)]);
      std::this_thread::sleep_for(200ms); // the change settles: old leads are repaid
    }
    Window before;
    sample(before);
    for (int n = 0; n < windows && err.empty(); ++n) {
      std::this_thread::sleep_for(1s);
      Window after, delta;
      sample(after);
      for (std::size_t k = 0; k < kCookies; ++k) {
        delta.ran[k] = after.ran[k] - before.ran[k];
        delta.core[k] = after.core[k] - before.core[k];
      }
      err = check_window(delta, weights, guarantees::share_checks());
      if (!err.empty()) err = "phase " + std::to_string(phase) + ", window " + std::to_string(n) + ": " + err;
      before = after;
    }
  }
  stop = true;
  for (auto& f : fibers) f.join();
  return err;
}

/// One attempt at an extreme ratio on `core:1 pu:2`: a fiber of a cookie of
/// weight 1000 pinned to PU 0, one of weight 1 pinned to PU 1, each running
/// 30 us stretches. Each owns the core in proportion to its weight, and so
/// runs: the light cookie's share of the CPU time (CookieStats::cpu_ns) is
/// 1/1001, within 25 %. The worst case for hand-overs: PU 1 has nothing else
/// to run, so it sleeps between the light cookie's turns and each turn
/// starts with its wake-up, which must not be charged to the light cookie at
/// its weight's rate (100 / w per ns): charged, it would lose every turn
/// before its fiber started and never run. By its own clock it must run at least
/// 0.4 of its share: a turn at this ratio is the least turn (an eighth of a
/// granularity), of which the switches take a part.
std::string extreme_attempt() {
  Runtime rt(guarantees::options_for("core:1 pu:2"));
  const Cookie heavy = Cookie::create("heavy", 1000), light = Cookie::create("light", 1);
  std::array<std::atomic<std::int64_t>, 2> ran_ns{};
  std::atomic<bool> stop{false};
  auto body = [&](std::size_t k) {
    return [&, k] {
      while (!stop.load(std::memory_order_relaxed)) {
        const auto t0 = Clock::now();
        auto t1 = t0;
        while (t1 - t0 < 30us) t1 = Clock::now();
        ran_ns[k].fetch_add((t1 - t0).count(), std::memory_order_relaxed);
        this_fiber::preempt_point();
      }
    };
  };
  std::vector<JoinHandle<void>> fibers;
  fibers.push_back(rt.spawn(body(0), SpawnOptions{.cookie = heavy, .pin_to_pu = 0u}));
  fibers.push_back(rt.spawn(body(1), SpawnOptions{.cookie = light, .pin_to_pu = 1u}));
  std::this_thread::sleep_for(200ms);
  auto cpu = [&](const Stats& st, const Cookie& c) { return static_cast<double>(st.cookie(c).cpu_ns); };
  const Stats s0 = rt.stats();
  const std::int64_t h0 = ran_ns[0].load(), l0 = ran_ns[1].load();
  std::this_thread::sleep_for(3s);
  const Stats s1 = rt.stats();
  const auto h = static_cast<double>(ran_ns[0].load() - h0), l = static_cast<double>(ran_ns[1].load() - l0);
  stop = true;
  for (auto& f : fibers) f.join();
  const double ch = cpu(s1, heavy) - cpu(s0, heavy), cl = cpu(s1, light) - cpu(s0, light);
  const double by_cpu = cl / (ch + cl), by_user = l / (h + l), expected = 1.0 / 1001;
  if (std::fabs(by_cpu / expected - 1) <= 0.25 && by_user >= 0.4 * expected) return {};
  char m[200];
  std::snprintf(m, sizeof m, "weight 1 beside 1000: share of cpu_ns %.5f, expected %.5f +- 25%%; by its own clock %.5f",
                by_cpu, expected, by_user);
  return m;
}

/// One attempt: a cookie of weight 25 with one fiber on PU 0 and one pinned
/// to PU 2 of `core:1 pu:4`, beside a busy cookie of weight 2,500 pinned to
/// PU 0, 2 s. PU 0 begins the light cookie's turns, each the least turn; PU
/// 2 (a CPU shared with PU 0 here) must be woken for them, and its fiber
/// must run in them too: at least a fifth as many 20 us stretches as its
/// sibling fiber on PU 0 (a third, typically; unless a sibling that missed a
/// turn begins the next, it misses nearly every turn).
std::string pinned_light_attempt(FairnessPolicy policy) {
  Options o = guarantees::options_for("core:1 pu:4");
  o.policy = policy;
  o.slice = 500us;
  Runtime rt(o);
  const Cookie heavy = Cookie::create("heavy", 2500), light = Cookie::create("light", 25);
  std::atomic<bool> stop{false};
  std::array<std::atomic<long>, 3> runs{}; // heavy, light on PU 0, light on PU 2
  auto busy = [&](std::size_t k) {
    return [&, k] {
      while (!stop.load(std::memory_order_relaxed)) {
        const auto t0 = Clock::now();
        while (Clock::now() - t0 < 20us) {}
        runs[k].fetch_add(1, std::memory_order_relaxed);
        this_fiber::preempt_point();
      }
    };
  };
  std::vector<JoinHandle<void>> fibers;
  fibers.push_back(rt.spawn(busy(0), SpawnOptions{.cookie = heavy, .pin_to_pu = 0u}));
  fibers.push_back(rt.spawn(busy(1), SpawnOptions{.cookie = light, .pin_to_pu = 0u}));
  fibers.push_back(rt.spawn(busy(2), SpawnOptions{.cookie = light, .pin_to_pu = 2u}));
  std::this_thread::sleep_for(2s);
  stop = true;
  for (auto& f : fibers) f.join();
  const long on0 = runs[1].load(), on2 = runs[2].load();
  if (on0 > 0 && 5 * on2 >= on0) return {};
  char m[200];
  std::snprintf(m, sizeof m, "%s: the light cookie's fiber on PU 0 ran %ld stretches, the one pinned to PU 2 %ld (heavy: %ld)",
                to_string(policy), on0, on2, runs[0].load());
  return m;
}

/// Up to three attempts, until one passes: timing on a shared machine is
/// noisy, so a failing attempt is retried rather than its bound widened.
template <class Attempt> std::string retried(Attempt attempt) {
  std::string err;
  for (int tries = 0; tries < 3; ++tries) {
    err = attempt();
    if (err.empty()) break;
    WARN("attempt " << tries + 1 << ": " << err);
  }
  return err;
}

} // namespace

TEST_CASE("weights 100/200/400 share one core 1/7, 2/7, 4/7 in real time, and follow a change", "[weights]") {
  const int windows = guarantees::stress_scale() < 1 ? 1 : 2;
  const std::string err = retried([&] { return attempt(windows); });
  INFO(err);
  CHECK(err.empty());
}

TEST_CASE("a cookie of weight 1 beside one of 1000 gets its share in real time", "[weights]") {
  // Timed in the plain build only: under TSan (CORESCHED_STRESS_SCALE < 1)
  // a switch takes most of a least turn, and the light cookie's share swings
  // from none to 1.5 times its due (docs/limitations.md).
  if (!guarantees::share_checks() || guarantees::stress_scale() < 1) {
    WARN("skipped: share checks are off here (CORESCHED_SHARE_CHECKS=0 or a sanitizer build)");
    return;
  }
  const std::string err = retried([&] { return extreme_attempt(); });
  INFO(err);
  CHECK(err.empty());
}

TEST_CASE("a light cookie's fiber pinned to a sibling runs in its turns beside a heavy busy cookie", "[weights]") {
  // Timed in the plain build only, as the 1 : 1,000 case: under TSan a
  // switch takes most of a least turn, and the pinned fiber's sibling, woken
  // for each turn, ran 10-11 stretches against its neighbour's 54-71. The
  // simulation's pinned_light scenario checks the rule without timing.
  if (!guarantees::share_checks() || guarantees::stress_scale() < 1) {
    WARN("skipped: share checks are off here (CORESCHED_SHARE_CHECKS=0 or a sanitizer build)");
    return;
  }
  for (auto policy : {FairnessPolicy::forceidle_balance, FairnessPolicy::core_vruntime}) {
    const std::string err = retried([&] { return pinned_light_attempt(policy); });
    INFO(err);
    CHECK(err.empty());
  }
}
