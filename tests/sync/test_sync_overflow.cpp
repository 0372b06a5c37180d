// SPDX-License-Identifier: Apache-2.0
// Counts and capacities at the limits of their types: a Semaphore release or
// WaitGroup add that would overflow is refused and changes nothing, and a
// Channel capacity that cannot be allocated is a UsageError.
#include <coresched/coresched.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>

using namespace coresched;

// Unchecked, Semaphore::release would add past PTRDIFF_MAX (available() then
// reads -2), and a WaitGroup's overflowing add would be refused as "would
// become negative".
TEST_CASE("counts that would overflow are refused and left as they were", "[sync][overflow]") {
  Semaphore sem(PTRDIFF_MAX - 1);
  sem.release(1);
  CHECK_THROWS_WITH(sem.release(1), Catch::Contains("overflow"));
  CHECK(sem.available() == PTRDIFF_MAX);
  CHECK(sem.try_acquire());
  CHECK(sem.available() == PTRDIFF_MAX - 1);

  WaitGroup wg;
  wg.add(INT64_MAX);
  CHECK_THROWS_WITH(wg.add(1), Catch::Contains("overflow"));
  CHECK(wg.count() == INT64_MAX);
  CHECK_THROWS_WITH(wg.add(INT64_MIN), Catch::Contains("negative"));
  wg.add(-INT64_MAX);
  CHECK(wg.count() == 0);
}

TEST_CASE("a Channel capacity that cannot be allocated is a UsageError", "[channel][overflow]") {
  CHECK_THROWS_WITH(Channel<int>(SIZE_MAX), Catch::Contains("Channel capacity") && Catch::Contains("allocated"));
  CHECK_THROWS_AS(Channel<std::uint64_t>(std::size_t{1} << 60), UsageError);
  Channel<int> fine(4);
  CHECK(fine.try_send(1));
}
