// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file latency_stats.hpp
/// Latency statistics for latt, schbench and tenants: Welford's running mean
/// and variance (as latt computes them) plus the samples themselves, for
/// percentiles. Header-only, so a unit test can link it without the program.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

namespace coresched::bench {

/// Microseconds between two steady-clock points, with the clock's resolution.
inline double micros(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

/// Welford's online mean and variance: numerically stable however many
/// samples, one pass. Mergeable (Chan et al.), so each fiber keeps its own and
/// no two fibers write one cache line while they measure.
class Welford {
public:
  void add(double x) noexcept {
    ++n_;
    const double d = x - mean_;
    mean_ += d / static_cast<double>(n_);
    m2_ += d * (x - mean_);
    min_ = std::min(min_, x);
    max_ = std::max(max_, x);
  }

  void merge(const Welford& o) noexcept {
    if (o.n_ == 0) return;
    if (n_ == 0) { *this = o; return; }
    const double n = static_cast<double>(n_ + o.n_);
    const double d = o.mean_ - mean_;
    mean_ += d * static_cast<double>(o.n_) / n;
    m2_ += o.m2_ + d * d * static_cast<double>(n_) * static_cast<double>(o.n_) / n;
    n_ += o.n_;
    min_ = std::min(min_, o.min_);
    max_ = std::max(max_, o.max_);
  }

  std::uint64_t count() const noexcept { return n_; }
  double mean() const noexcept { return mean_; }
  double min() const noexcept { return n_ ? min_ : 0; }
  double max() const noexcept { return n_ ? max_ : 0; }
  /// Population standard deviation, as every coresched-bench table reports it.
  double stdev() const noexcept { return n_ ? std::sqrt(m2_ / static_cast<double>(n_)) : 0; }
  /// stdev / sqrt(n): latt's "Stdev mean", the standard error of the average.
  double stdev_mean() const noexcept { return n_ ? stdev() / std::sqrt(static_cast<double>(n_)) : 0; }

private:
  std::uint64_t n_ = 0;
  double mean_ = 0, m2_ = 0;
  double min_ = std::numeric_limits<double>::infinity();
  double max_ = -std::numeric_limits<double>::infinity();
};

/// The figures of one latency measurement.
struct LatencySummary {
  std::uint64_t count = 0;
  double min = 0, max = 0, avg = 0, stdev = 0, stdev_mean = 0;
  std::vector<std::pair<double, double>> percentiles; ///< (p, value), in the order asked for

  /// The value of percentile p (0 if it was not asked for).
  double at(double p) const noexcept {
    for (const auto& [q, v] : percentiles)
      if (q == p) return v;
    return 0;
  }
};

/// The p-th percentile (0 < p <= 100) of sorted samples, by nearest rank: a
/// value that occurred, and ordered in p by construction.
inline double nearest_rank(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

/// Every sample of one measurement, with its running statistics.
class LatencyRecorder {
public:
  void add(double x) {
    stats_.add(x);
    samples_.push_back(x);
  }
  void merge(const LatencyRecorder& o) {
    stats_.merge(o.stats_);
    samples_.insert(samples_.end(), o.samples_.begin(), o.samples_.end());
  }
  const Welford& stats() const noexcept { return stats_; }

  /// The summary, with the percentiles `ps` (in percent).
  LatencySummary summarize(std::span<const double> ps) const {
    LatencySummary s{stats_.count(), stats_.min(), stats_.max(), stats_.mean(),
                     stats_.stdev(), stats_.stdev_mean(), {}};
    std::vector<double> sorted = samples_;
    std::sort(sorted.begin(), sorted.end());
    for (double p : ps) s.percentiles.emplace_back(p, nearest_rank(sorted, p));
    return s;
  }

private:
  Welford stats_;
  std::vector<double> samples_;
};

} // namespace coresched::bench
