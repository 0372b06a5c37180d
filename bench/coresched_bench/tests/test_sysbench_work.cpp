// SPDX-License-Identifier: Apache-2.0
// The cpu event does exactly sysbench 1.0.20's work.
#define CATCH_CONFIG_MAIN
#include "sysbench_work.hpp"

#include <catch2/catch.hpp>

TEST_CASE("the cpu event finds the 1,228 primes below 10,000, as sysbench's does", "[bench]") {
  CHECK(coresched::bench::cpu_event(10000) == 1228);
  CHECK(coresched::bench::cpu_event(100) == 24); // 3..99: every prime but 2
}
