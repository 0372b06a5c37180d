// SPDX-License-Identifier: Apache-2.0
// The reactor's table of operations in flight: a cancellation that names an
// operation by address and number finds it only while that very operation
// is in flight, however its slot or address is reused afterwards.
#include "reactor/inflight_table.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

using coresched::detail::InflightTable;

namespace {
struct Op {
  std::uint64_t seq = 0;
};
} // namespace

TEST_CASE("an operation is found under its number until it is removed", "[reactor]") {
  InflightTable<Op> table;
  Op a, b;
  a.seq = table.add(&a);
  b.seq = table.add(&b);
  CHECK(a.seq != 0);
  CHECK(a.seq != b.seq);
  CHECK(table.contains(&a, a.seq));
  CHECK(table.contains(&b, b.seq));
  CHECK_FALSE(table.contains(&a, b.seq)); // another op's number
  CHECK(table.size() == 2);
  table.remove(a.seq);
  CHECK_FALSE(table.contains(&a, a.seq));
  CHECK(table.contains(&b, b.seq));
  CHECK(table.size() == 1);
}

TEST_CASE("a reused slot or address does not bring an old number back", "[reactor]") {
  InflightTable<Op> table;
  Op a;
  const std::uint64_t first = table.add(&a);
  table.remove(first);
  // The same op (a fiber's next operation at the same stack address) takes
  // the freed slot: a cancellation meant for the first must not reach it.
  const std::uint64_t second = table.add(&a);
  CHECK(second != first);
  CHECK(table.contains(&a, second));
  CHECK_FALSE(table.contains(&a, first));
  // A number from nowhere (beyond the table) is not found either.
  CHECK_FALSE(table.contains(&a, second + (std::uint64_t{1} << 30)));
  CHECK_FALSE(table.contains(&a, 0));
}

TEST_CASE("under churn every live operation is found and every finished one is not", "[reactor]") {
  InflightTable<Op> table;
  std::vector<Op> ops(64);
  std::vector<bool> live(ops.size(), false);
  std::vector<std::uint64_t> retired; // numbers of ops that finished
  std::set<std::uint64_t> issued;
  std::mt19937 rng(7);
  for (int step = 0; step < 100'000; ++step) {
    const std::size_t i = rng() % ops.size();
    if (live[i]) {
      table.remove(ops[i].seq);
      retired.push_back(ops[i].seq);
      live[i] = false;
    } else {
      ops[i].seq = table.add(&ops[i]);
      CHECK(issued.insert(ops[i].seq).second); // never handed out twice
      live[i] = true;
    }
  }
  std::size_t n = 0;
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (live[i]) {
      CHECK(table.contains(&ops[i], ops[i].seq));
      ++n;
    }
  CHECK(table.size() == n);
  for (std::uint64_t seq : retired)
    for (const Op& op : ops)
      if (op.seq != seq) CHECK_FALSE(table.contains(&op, seq));
  std::vector<Op*> snap = table.snapshot();
  CHECK(snap.size() == n);
  for (Op* op : snap) CHECK(live[static_cast<std::size_t>(op - ops.data())]);
}

TEST_CASE("numbers stay non-zero and distinct across the wrap of the add count", "[reactor]") {
  // 2^40 adds in a server's life (12 days at a million a second per worker)
  // wrap the count: a number of 0 would read as "nothing submitted" to a
  // RecvStream, whose cancel would then never be sent.
  const std::uint64_t last_round = (std::uint64_t{1} << 40) - 1;
  InflightTable<Op> table(last_round - 2);
  Op op;
  std::set<std::uint64_t> seen;
  for (int i = 0; i < 8; ++i) { // through the wrap, always in slot 0
    op.seq = table.add(&op);
    CHECK(op.seq != 0);
    CHECK(table.contains(&op, op.seq));
    CHECK(seen.insert(op.seq).second);
    table.remove(op.seq);
    CHECK_FALSE(table.contains(&op, op.seq));
  }
}
