// SPDX-License-Identifier: Apache-2.0
// What the sync primitives' tests share (test_sync.cpp, test_channel.cpp):
// stress sizes scaled for sanitizer builds, a watchdog that turns a lost
// wake-up into an abort with a message, and the isolation counter.
#pragma once

#include <coresched/coresched.hpp>

#include "test_support.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace sync_support {
using namespace std::chrono_literals;
using coresched::Runtime;
using test_support::stress_scale;

using test_support::scaled;

// A lost wake-up shows as a hang. Fail at once with a message instead of
// waiting for the ctest timeout: abort if `progress` stops moving.
class Watchdog {
public:
  Watchdog(const char* what, const std::atomic<std::uint64_t>& progress, std::chrono::seconds limit = 60s)
      : thread_([this, what, &progress, limit] {
          std::unique_lock lk(mu_);
          std::uint64_t seen = progress.load();
          auto last = std::chrono::steady_clock::now();
          while (!cv_.wait_for(lk, 100ms, [this] { return stop_; })) {
            const std::uint64_t now = progress.load();
            if (now != seen) {
              seen = now;
              last = std::chrono::steady_clock::now();
            } else if (std::chrono::steady_clock::now() - last > limit) {
              std::fprintf(stderr, "%s: no progress for %llds at %llu (lost wake-up?)\n", what,
                           static_cast<long long>(limit.count()), static_cast<unsigned long long>(now));
              std::abort();
            }
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Waits (up to 10 s) until `v` reaches `want`, then checks it stays there for 30 ms.
inline bool settles_at(const std::atomic<int>& v, int want) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (v.load() < want && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(30ms);
  return v.load() == want;
}

inline void check_isolation(const Runtime& rt) {
#ifdef CORESCHED_ISOLATION_CHECK
  CHECK(rt.stats().isolation_violations == 0);
#else
  (void)rt;
#endif
}
} // namespace sync_support
