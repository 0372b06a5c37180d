// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file live_view.hpp
/// A live view of a running runtime for a person watching a benchmark: every
/// interval, per core, which cookie owns it, the forced-idle share of its
/// siblings' time, the fibers queued per cookie and the hand-overs (cookie
/// changes) per second; per cookie (by label, "7 (premium)", and weight) two
/// shares of the interval:
///   cpu %  = the time its fibers ran, summed over PUs / (elapsed x PUs);
///   core % = the time it held an SMT core / (elapsed x SMT cores).
/// Two busy tenants each alone on a core of two PUs read 50 / 50 in both; on
/// one core that changes hands, core % splits the core's time between them
/// and cpu % is lower by the gaps and forced idle. Computed from two
/// Runtime::stats() snapshots, so it costs the runtime one snapshot per
/// interval and nothing on its hot paths.

#include <coresched/runtime.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace coresched::bench {

class LiveView {
public:
  /// Starts printing to `out` every `interval`: a plain table, or with `json`
  /// one JSON object per line. With a `length` the view ends by itself: a
  /// frame at each interval before it and a last one at `length` (of a
  /// partial interval where `length` is not a multiple of `interval`).
  LiveView(const Runtime& rt, std::FILE* out, std::chrono::milliseconds interval, bool json,
           std::optional<std::chrono::nanoseconds> length = std::nullopt);
  /// Stops (and prints nothing more).
  ~LiveView();
  LiveView(const LiveView&) = delete;
  LiveView& operator=(const LiveView&) = delete;

  /// Waits up to `timeout` for the view to end by itself (its `length`);
  /// true once it has printed its last frame.
  bool wait_done(std::chrono::milliseconds timeout);

  /// Ends the view now with a last frame, of the time since the one before (a
  /// partial interval; none if under a millisecond); nothing if it has ended.
  void finish();

  /// One frame of the view for the change from `before` to `after` over
  /// `seconds` (also what the thread prints; public for tests).
  static std::string frame(const Stats& before, const Stats& after, double seconds, const Topology& topo, bool json,
                           double t);

private:
  void loop();

  const Runtime& rt_;
  std::FILE* out_;
  std::chrono::milliseconds interval_;
  bool json_;
  std::optional<std::chrono::nanoseconds> length_;
  std::mutex mu_;
  std::condition_variable cv_; // the thread waits on it for stop_ or finish_, others for done_
  bool stop_ = false;          // the destructor: end without a frame
  bool finish_ = false;        // finish(): end with a frame
  bool done_ = false;          // the thread printed its last frame
  std::thread thread_; // last: starts once the fields above exist
};

} // namespace coresched::bench
