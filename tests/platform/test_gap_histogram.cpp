// SPDX-License-Identifier: Apache-2.0
// The hand-over gap histogram: its percentiles are within one bucket (12.5 %)
// of the exact ones, and it never reports below the true value's bucket.
#include "platform/gap_histogram.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

using coresched::detail::GapHistogram;

TEST_CASE("gap histogram: empty, exact small values, and the maximum", "[histogram]") {
  GapHistogram h;
  CHECK(h.count() == 0);
  CHECK(h.quantile(0.5) == 0);
  for (std::uint64_t v : {0, 1, 2, 3, 4, 5, 6, 7}) h.record(v);
  CHECK(h.count() == 8);
  CHECK(h.quantile(0.5) == 3); // values below 8 ns have buckets of their own
  CHECK(h.quantile(1.0) == 7);
  CHECK(h.max() == 7);
  h.record(~std::uint64_t{0});
  CHECK(h.max() == ~std::uint64_t{0});
  CHECK(h.quantile(1.0) == ~std::uint64_t{0});
}

TEST_CASE("gap histogram: percentiles of random gaps within 12.5 %", "[histogram]") {
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> gap(9.0, 2.0); // ~8 us median, spanning ns to ms
  GapHistogram h;
  std::vector<std::uint64_t> all;
  for (int i = 0; i < 100000; ++i) {
    const auto v = static_cast<std::uint64_t>(gap(rng));
    h.record(v);
    all.push_back(v);
  }
  std::sort(all.begin(), all.end());
  for (double q : {0.5, 0.9, 0.99, 0.999}) {
    const std::uint64_t exact = all[static_cast<std::size_t>(q * static_cast<double>(all.size()) + 0.999999) - 1];
    const std::uint64_t got = h.quantile(q);
    INFO("q " << q << " exact " << exact << " histogram " << got);
    CHECK(got >= exact);                                 // the bucket's upper edge
    CHECK(static_cast<double>(got) <= static_cast<double>(exact) * 1.125 + 1);
  }
  CHECK(h.max() == all.back());
}
