// SPDX-License-Identifier: Apache-2.0
// Shared by the hand-over scenarios (test_oracle_handover*.cpp): seeds and
// options drawn from them, a meter of the longest wait of an always-runnable
// fiber.
#pragma once

#include "harness.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace guarantees::handover {

using coresched::Cookie;
using coresched::FairnessPolicy;
using coresched::Options;
using coresched::Runtime;
using coresched::Topology;

using Clock = std::chrono::steady_clock;

/// The seeds a randomized scenario runs: two fixed ones per topology, or the
/// one named by CORESCHED_HANDOVER_SEED.
inline std::vector<std::uint64_t> seeds(std::uint64_t base) {
  if (const char* s = std::getenv("CORESCHED_HANDOVER_SEED")) return {std::strtoull(s, nullptr, 10)};
  return {base, base + 1};
}

/// Keeps the topologies' seeds apart.
inline std::uint64_t topology_salt(const std::string& spec) { return std::hash<std::string>{}(spec) % 1000 * 1000; }

/// Options drawn from the seed; `what` says which, for INFO.
inline Options drawn_options(const std::string& spec, std::mt19937_64& rng, std::string& what) {
  Options o = options_for(spec);
  o.policy = rng() % 2 ? FairnessPolicy::forceidle_balance : FairnessPolicy::core_vruntime;
  o.handover_spin = rng() % 2 == 0;
  const int slices_us[] = {500, 1000, 2000};
  o.slice = std::chrono::microseconds(slices_us[rng() % 3]);
  o.wake_affine = rng() % 4 != 0;
  std::ostringstream s;
  s << "policy " << to_string(o.policy) << ", handover_spin " << o.handover_spin << ", slice "
    << o.slice.count() << " us, wake_affine " << o.wake_affine;
  what = s.str();
  return o;
}

/// The longest stretch between two calls of note(), across threads: how long
/// a fiber that is always runnable went without running.
class GapMeter {
public:
  /// Call from the fiber, between its bursts; `last` is the fiber's own.
  void note(Clock::time_point& last) {
    const auto now = Clock::now();
    if (last != Clock::time_point{}) {
      const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now - last).count();
      long prev = max_us.load(std::memory_order_relaxed);
      while (us > prev && !max_us.compare_exchange_weak(prev, us)) {
      }
    }
    last = now;
    turns.fetch_add(1, std::memory_order_relaxed);
  }
  std::atomic<long> max_us{0};
  std::atomic<long> turns{0};
};

/// A fiber of `c` that burns in 20 us bursts, a preemption point after each,
/// until `stop`, noting its turns on `gap` if given: a filler that keeps a PU
/// busy, or an always-runnable waiting cookie.
inline coresched::JoinHandle<void> spawn_burner(Harness& h, const std::atomic<bool>& stop, Cookie c,
                                               std::optional<unsigned> pin, const char* what,
                                               GapMeter* gap = nullptr) {
  return h.rt.spawn([&h, &stop, c, what, gap] {
    Scope s(h.oracle, c, what);
    Clock::time_point last{};
    while (!stop.load(std::memory_order_relaxed)) {
      if (gap) gap->note(last);
      s.burn(std::chrono::microseconds(20));
      s.preempt_point();
    }
  }, coresched::SpawnOptions{.cookie = c, .pin_to_pu = pin});
}

/// The wall time a cookie held some core (Stats::cookie(c).core_ns), in ms.
inline double core_ms(const Runtime& rt, Cookie c) { return static_cast<double>(rt.stats().cookie(c).core_ns) / 1e6; }

/// One measuring window: the wall time each of some cookies held some core
/// over it, and the window's own wall time, in ms.
struct Window {
  std::vector<double> owned_ms;
  double wall_ms = 0;
};

/// Sleeps `len` and reads how long each of `cookies` held a core meanwhile.
inline Window measure_window(const Runtime& rt, const std::vector<Cookie>& cookies, std::chrono::milliseconds len) {
  std::vector<double> before;
  for (Cookie c : cookies) before.push_back(core_ms(rt, c));
  const auto w0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(len);
  Window w;
  for (std::size_t i = 0; i < cookies.size(); ++i) w.owned_ms.push_back(core_ms(rt, cookies[i]) - before[i]);
  w.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count();
  return w;
}

/// Up to three windows, until `ok` holds for one; `windows` says how many
/// were taken. A window in which the host kept the workers off its CPUs reads
/// low without any starvation (sanitizer builds run 5-50x slower, and on
/// core:2 pu:2 four workers share two CPUs, while the owner is charged the
/// wall time its thread is descheduled); a starved cookie fails every window.
/// With another test process loading the machine, a share check with a
/// single window fails often under ASan.
template <class Ok>
Window measure_until(const Runtime& rt, const std::vector<Cookie>& cookies, std::chrono::milliseconds len, Ok ok,
                     int& windows) {
  Window w = measure_window(rt, cookies, len);
  for (windows = 1; windows < 3 && !ok(w); ++windows) w = measure_window(rt, cookies, len);
  return w;
}

/// The PUs of core `core`.
inline std::vector<unsigned> pus_of_core(const Topology& t, unsigned core) { return t.cores()[core].pus; }

} // namespace guarantees::handover
