// SPDX-License-Identifier: Apache-2.0
// matrix --compare-kernel's weights: cgroup weights map to the nice values
// whose kernel weights (sched_prio_to_weight) come nearest their ratio, the
// default-weight tenant staying at nice 0.
#define CATCH_CONFIG_MAIN
#include "kernel_tag.hpp"

#include <catch2/catch.hpp>

#include <array>

using coresched::bench::kernel_nice_for_ratio;
using coresched::bench::kernel_nice_weight;
using coresched::bench::kernel_nices_for_weights;

TEST_CASE("the kernel's nice weights are sched_prio_to_weight's", "[bench]") {
  CHECK(kernel_nice_weight(0) == 1024);
  CHECK(kernel_nice_weight(-5) == 3121);
  CHECK(kernel_nice_weight(5) == 335);
  CHECK(kernel_nice_weight(-20) == 88761);
  CHECK(kernel_nice_weight(19) == 15);
  for (int n = -20; n < 19; ++n) CHECK(kernel_nice_weight(n) > kernel_nice_weight(n + 1));
}

TEST_CASE("a ratio maps to the nice whose weight ratio is nearest", "[bench]") {
  CHECK(kernel_nice_for_ratio(1.0) == 0);
  CHECK(kernel_nice_for_ratio(3.0) == -5);       // 3.05
  CHECK(kernel_nice_for_ratio(1.0 / 3.0) == 5);  // 0.327
  CHECK(kernel_nice_for_ratio(1.5) == -2);       // 1.549, not nice -1's 1.247
  CHECK(kernel_nice_for_ratio(1e6) == -20);      // beyond the table: its end
  CHECK(kernel_nice_for_ratio(1e-6) == 19);
}

TEST_CASE("the default-weight tenant stays at nice 0", "[bench]") {
  CHECK(kernel_nices_for_weights(300, 100) == std::array<int, 2>{-5, 0});
  CHECK(kernel_nices_for_weights(100, 300) == std::array<int, 2>{0, -5});
  CHECK(kernel_nices_for_weights(100, 33) == std::array<int, 2>{0, 5});
  CHECK(kernel_nices_for_weights(100, 100) == std::array<int, 2>{0, 0});
  CHECK(kernel_nices_for_weights(250, 250) == std::array<int, 2>{0, 0});
  CHECK(kernel_nices_for_weights(10000, 1) == std::array<int, 2>{-20, 0}); // 1 is as far from 100 as 10000
  // Neither at the default: the one nearer it (200) stays, the other moves by 300 / 200.
  CHECK(kernel_nices_for_weights(200, 300) == std::array<int, 2>{0, -2});
}
