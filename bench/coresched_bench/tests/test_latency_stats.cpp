// SPDX-License-Identifier: Apache-2.0
// The latency statistics of latt, schbench and tenants: Welford's running
// figures match a two-pass computation, merging equals adding, percentiles
// are nearest-rank.
#define CATCH_CONFIG_MAIN
#include "latency_stats.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

using coresched::bench::LatencyRecorder;
using coresched::bench::nearest_rank;
using coresched::bench::Welford;

TEST_CASE("Welford's mean and population stdev match two passes", "[bench]") {
  const std::vector<double> xs{26, 128, 16, 3763, 20861, 4637, 1, 1, 99.5};
  Welford w;
  double sum = 0;
  for (double x : xs) w.add(x), sum += x;
  const double mean = sum / static_cast<double>(xs.size());
  double sq = 0;
  for (double x : xs) sq += (x - mean) * (x - mean);
  const double stdev = std::sqrt(sq / static_cast<double>(xs.size()));
  CHECK(w.count() == xs.size());
  CHECK(w.mean() == Approx(mean));
  CHECK(w.stdev() == Approx(stdev));
  CHECK(w.stdev_mean() == Approx(stdev / 3.0)); // sqrt(9)
  CHECK(w.min() == 1);
  CHECK(w.max() == 20861);
}

TEST_CASE("merging recorders equals recording everything in one", "[bench]") {
  LatencyRecorder all, a, b, empty;
  for (int i = 0; i < 1000; ++i) {
    const double x = (i * 37) % 101 + 0.25 * i;
    all.add(x);
    (i % 3 ? a : b).add(x);
  }
  a.merge(empty);
  a.merge(b);
  empty.merge(a);
  for (const LatencyRecorder* r : {&a, &empty}) {
    CHECK(r->stats().count() == all.stats().count());
    CHECK(r->stats().mean() == Approx(all.stats().mean()));
    CHECK(r->stats().stdev() == Approx(all.stats().stdev()));
    CHECK(r->stats().min() == all.stats().min());
    CHECK(r->stats().max() == all.stats().max());
  }
  const double ps[] = {50, 99};
  CHECK(a.summarize(ps).at(99) == all.summarize(ps).at(99));
}

TEST_CASE("percentiles are nearest-rank, ordered, and values that occurred", "[bench]") {
  std::vector<double> sorted;
  for (int i = 1; i <= 100; ++i) sorted.push_back(i);
  CHECK(nearest_rank(sorted, 50) == 50);
  CHECK(nearest_rank(sorted, 99) == 99);
  CHECK(nearest_rank(sorted, 99.5) == 100);
  CHECK(nearest_rank(sorted, 100) == 100);
  CHECK(nearest_rank(sorted, 0.1) == 1);
  CHECK(nearest_rank({}, 50) == 0);
  CHECK(nearest_rank({7}, 99.9) == 7);
  LatencyRecorder r;
  for (double x : {5.0, 1.0, 3.0}) r.add(x);
  const double ps[] = {50, 90, 99};
  const auto s = r.summarize(ps);
  CHECK(s.at(50) == 3);
  CHECK(s.at(90) == 5);
  CHECK(s.at(75) == 0); // not asked for
  CHECK(s.count == 3);
}
