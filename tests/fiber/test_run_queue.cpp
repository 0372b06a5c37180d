// SPDX-License-Identifier: Apache-2.0
// The run queues on their own (RunQueue, LocalQueue): FIFO per cookie, steals that
// skip pinned fibers, order by virtual runtime across the tick count's wrap, bounded inserts.
#include "sched/local_queue.hpp"
#include "fiber/run_queue.hpp"

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

TEST_CASE("queues order fibers by virtual runtime, FIFO among equals", "[run_queue]") {
  using coresched::detail::LocalQueue;
  std::vector<Fiber> f(6);
  const std::uint32_t vt[] = {10, 5, 10, 7, 5, 20};
  RunQueue q;
  LocalQueue l;
  for (int i = 0; i < 6; ++i) f[i].vtime = vt[i];
  for (auto& x : f) q.push(&x);
  for (Fiber* want : {&f[1], &f[4], &f[3], &f[0], &f[2], &f[5]}) CHECK(q.pop(0) == want);
  for (auto& x : f) l.push(&x);
  for (Fiber* want : {&f[1], &f[4], &f[3], &f[0], &f[2], &f[5]}) CHECK(l.pop() == want);

  // An explicit yield goes behind every fiber and takes on the last one's vtime, keeping the order.
  for (int i = 0; i < 3; ++i) l.push(&f[i]); // 10, 5, 10 -> 5, 10, 10
  f[3].vtime = 1;
  l.push_behind_all(&f[3]);
  CHECK(f[3].vtime == 10);
  for (Fiber* want : {&f[1], &f[0], &f[2], &f[3]}) CHECK(l.pop() == want);

  // A slice's end: the runner keeps its place while it leads the next by less than its key's allowance.
  f[0].vtime = 10;
  l.push(&f[0]);
  f[1].vtime = 15;
  l.insert(&f[1], f[1].vtime - 6); // key 9 < 10: ahead of f[0]
  CHECK(l.pop() == &f[1]);
  CHECK(l.pop() == &f[0]);
}

TEST_CASE("vtime comparisons survive the 32-bit tick count wrapping", "[run_queue]") {
  namespace vtime = coresched::detail::vtime;
  const std::uint32_t near_top = 0xFFFFFFF0u;
  CHECK(vtime::before(near_top, near_top + 0x20)); // wraps to 0x10
  CHECK_FALSE(vtime::before(near_top + 0x20, near_top));
  // Placement clamps to [floor - credit, floor + lead] across the wrap, both ways.
  CHECK(vtime::placed(0, 100) == 100 - vtime::kSleeperCredit);
  CHECK(vtime::placed(near_top, 5) == 5 - vtime::kSleeperCredit);
  CHECK(vtime::placed(1000, 5) == 5 + vtime::kMaxLead);
  CHECK(vtime::placed(7, 5) == 7);
  std::vector<Fiber> f(2);
  f[0].vtime = near_top;
  f[1].vtime = near_top + 0x20;
  RunQueue q;
  q.push(&f[1]);
  q.push(&f[0]);
  CHECK(q.pop_oldest() == &f[0]);
}

TEST_CASE("an insert into a long queue walks at most a bounded distance", "[run_queue]") {
  // A million queued fibers must not make each insert a million steps: past
  // the bound a fiber is appended (FIFO), which is still correct, only less fair.
  std::vector<Fiber> f(1000);
  coresched::detail::LocalQueue l;
  for (std::uint32_t i = 0; i < 999; ++i) {
    f[i].vtime = i;
    l.push(&f[i]);
  }
  f[999].vtime = 500; // would belong in the middle, 500 steps in
  l.push(&f[999]);
  Fiber* last = nullptr;
  for (Fiber* x = l.pop(); x; x = l.pop()) last = x;
  CHECK(last == &f[999]);
}
