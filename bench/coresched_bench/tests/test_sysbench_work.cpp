// SPDX-License-Identifier: Apache-2.0
// The cpu event does exactly sysbench 1.0.20's work.
#define CATCH_CONFIG_MAIN
#include "sysbench_work.hpp"

#include <catch2/catch.hpp>

TEST_CASE("the cpu event finds the 1,228 primes below 10,000, as sysbench's does", "[bench]") {
  CHECK(coresched::bench::cpu_event(10000) == 1228);
  CHECK(coresched::bench::cpu_event(100) == 24); // 3..99: every prime but 2
}

TEST_CASE("the memory event writes each 8-byte word of the block with its distance to the block's end, as sysbench's does",
          "[bench]") {
  using coresched::bench::MemoryBuffer;
  using coresched::bench::MemoryCursor;
  MemoryBuffer buf(1024, 2048); // two blocks of 128 words
  REQUIRE(buf.block_bytes() == 1024);
  REQUIRE(buf.buffer_bytes() == 2048);
  MemoryCursor cur(buf);
  cur.event(); // the first block
  for (std::size_t i = 0; i < 128; ++i) REQUIRE(buf.word(i) == 128 - i);
  for (std::size_t i = 128; i < 256; ++i) REQUIRE(buf.word(i) == 0);
  cur.event(); // the second, then it wraps
  for (std::size_t i = 128; i < 256; ++i) REQUIRE(buf.word(i) == 256 - i);
}
