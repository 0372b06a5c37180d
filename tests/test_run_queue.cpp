// SPDX-License-Identifier: Apache-2.0
#include "run_queue.hpp"

#include <catch2/catch.hpp>

#include <vector>

using coresched::detail::Fiber;
using coresched::detail::RunQueue;

TEST_CASE("run queue keeps FIFO order per cookie and across cookies", "[run_queue]") {
  std::vector<Fiber> f(6);
  const std::uint64_t cookies[] = {0, 7, 0, 7, 9, 0};
  RunQueue q;
  for (int i = 0; i < 6; ++i) {
    f[i].cookie = cookies[i];
    q.push(&f[i]);
  }
  CHECK(q.size() == 6);
  CHECK(q.count(7) == 2);
  CHECK(q.pop(7) == &f[1]);
  CHECK(q.pop_oldest() == &f[0]);
  CHECK(q.pop_oldest() == &f[2]);
  CHECK(q.pop(9) == &f[4]);
  CHECK(q.pop(9) == nullptr);
  CHECK(q.pop_oldest() == &f[3]);
  CHECK(q.pop_oldest() == &f[5]);
  CHECK(q.empty());
}

TEST_CASE("stealing skips pinned fibers", "[run_queue]") {
  std::vector<Fiber> f(3);
  f[0].pinned = 0;
  f[1].pinned = coresched::detail::kNotPinned;
  f[2].pinned = 1;
  RunQueue q;
  for (auto& x : f) q.push(&x);
  CHECK(q.steal(0, false) == &f[1]);
  CHECK(q.steal(0, false) == nullptr);
  CHECK(q.steal(0, true) == nullptr);
  CHECK(q.size() == 2);
  CHECK(q.pop(0) == &f[0]);
  CHECK(q.pop(0) == &f[2]);
}
