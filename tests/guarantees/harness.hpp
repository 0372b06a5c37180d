// SPDX-License-Identifier: Apache-2.0
// Shared by the oracle scenarios: a runtime with an Oracle beside it, rival
// fibers that keep sibling PUs busy with other cookies (without them an
// overlap has nobody to overlap with), and objects whose destructors are user
// code that must run under their owning fiber's cookie.
#pragma once

#include "oracle.hpp"

#include <coresched/coresched.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace guarantees {

/// Sanitizer builds scale the work down: CORESCHED_STRESS_SCALE (default 1).
inline double stress_scale() {
  const char* s = std::getenv("CORESCHED_STRESS_SCALE");
  const double v = s ? std::atof(s) : 1.0;
  return v > 0 ? v : 1.0;
}
/// Whether checks on the share of work a fiber got are meaningful here:
/// CORESCHED_SHARE_CHECKS=0 turns them off where the host takes the CPUs
/// away unseen (the 2-core SMT guest, 4 vCPUs on 2 host CPUs: tests/vm).
/// Checks on what the coordinator granted (core ownership) stay on.
inline bool share_checks() {
  const char* s = std::getenv("CORESCHED_SHARE_CHECKS");
  return !s || *s != '0';
}
/// `n` scaled by stress_scale(), at least 1.
inline int scaled(int n) {
  const int v = static_cast<int>(n * stress_scale());
  return v > 0 ? v : 1;
}

inline coresched::Options options_for(const std::string& spec) {
  coresched::Options o;
  o.topology = spec;
  // Tests burn the CPU inside stamped intervals on purpose, and two synthetic
  // PUs share each real CPU here: stall reports would only be noise.
  o.stall_threshold = std::chrono::milliseconds(0);
  return o;
}

/// A runtime and its oracle; rival fibers on demand.
class Harness {
public:
  explicit Harness(const std::string& spec) : Harness(options_for(spec)) {}
  /// With options of the test's own (options_for(spec), then changed).
  explicit Harness(coresched::Options o) : rt(std::move(o)), oracle(rt.topology()) { oracle.prime(rt); }
  // The runtime shuts down before the oracle goes: the last destructors of
  // fibers' captures (Stamper) run during shutdown and still stamp.
  ~Harness() {
    stop_rivals();
    rt.shutdown();
  }
  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  /// Starts `per_cookie` fibers of each cookie that burn in stamped intervals
  /// and yield, until stop_rivals(). They are what a leaked cookie collides with.
  void start_rivals(const std::vector<coresched::Cookie>& cookies, int per_cookie = 2) {
    for (const auto c : cookies)
      for (int i = 0; i < per_cookie; ++i)
        rivals_.push_back(rt.spawn([this, c, i] {
          Scope s(oracle, c, "rival");
          for (unsigned n = 0; !stop_.load(std::memory_order_relaxed); ++n) {
            s.burn(std::chrono::microseconds(20 + 10 * i));
            if (n % 4 == 3) s.preempt_point();
            else s.yield();
          }
        }, coresched::SpawnOptions{.cookie = c}));
  }
  void stop_rivals() {
    stop_.store(true);
    for (auto& h : rivals_) h.join();
    rivals_.clear();
  }

  /// One line per interesting number, for INFO() on failure.
  std::string summary() {
    const auto st = rt.stats();
    return oracle.report() + "runtime's own checker: " + std::to_string(st.isolation_violations) +
           " violation(s)\n" + st.to_table();
  }

  coresched::Runtime rt;
  Oracle oracle;

private:
  std::atomic<bool> stop_{false};
  std::vector<coresched::JoinHandle<void>> rivals_;
};

/// What a fiber's code believes its cookie is, shared with the objects it owns
/// so that their destructors know which cookie they belong to.
struct Owner {
  explicit Owner(coresched::Cookie c) : cookie(c.value()) {}
  std::atomic<std::uint64_t> cookie;
  std::atomic<int> destroyed{0};
};

/// A move-only value whose destructor is user code of its owner: it stamps
/// the owner's believed cookie and burns a while, so that running it under
/// another cookie (after the next fiber's was published, say) is observable.
/// A moved-from Stamper is inert. adopt() hands it to a new owner (a joiner
/// that receives it as a fiber's result).
class Stamper {
public:
  Stamper(Oracle& o, std::shared_ptr<Owner> owner, const char* what) : o_(&o), owner_(std::move(owner)), what_(what) {}
  Stamper(Stamper&& x) noexcept : o_(x.o_), owner_(std::move(x.owner_)), what_(x.what_) {}
  Stamper& operator=(Stamper&&) = delete;
  ~Stamper() {
    if (!owner_) return;
    {
      Scope s(*o_, coresched::Cookie::from_value(owner_->cookie.load()), what_);
      s.burn(std::chrono::microseconds(40));
    }
    owner_->destroyed.fetch_add(1);
  }
  void adopt(std::shared_ptr<Owner> o) { owner_ = std::move(o); }

private:
  Oracle* o_;
  std::shared_ptr<Owner> owner_;
  const char* what_;
};

/// What the scenarios throw: a tag says whose exception it is.
struct Tagged {
  std::uint64_t tag;
};

/// Whether std::current_exception() is the Tagged exception `tag`.
inline bool current_is(std::uint64_t tag) {
  const std::exception_ptr p = std::current_exception();
  if (!p) return false;
  try {
    std::rethrow_exception(p);
  } catch (const Tagged& t) {
    return t.tag == tag;
  } catch (...) {
    return false;
  }
}

/// Waits on a plain thread until `pred()` or `limit` passes; true if pred() held.
template <class Pred> bool wait_for(Pred pred, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

/// The two topologies every scenario runs on, at least: one SMT-2 core, and
/// two of them (so fibers also migrate between cores).
#define GUARANTEE_TOPOLOGIES GENERATE(as<std::string>{}, "core:1 pu:2", "core:2 pu:2")

/// The oracle saw no overlap and no inconsistent use of its slots.
#define CHECK_ISOLATED(h)                                \
  do {                                                   \
    INFO((h).summary());                                 \
    CHECK((h).oracle.violations.load() == 0);            \
    CHECK((h).oracle.slot_mismatches.load() == 0);       \
    CHECK((h).oracle.checks.load() > 0);                 \
  } while (0)

} // namespace guarantees
