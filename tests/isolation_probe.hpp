// SPDX-License-Identifier: Apache-2.0
// An application-level isolation checker, independent of the runtime's own:
// while a fiber runs user code it publishes its cookie in a per-PU slot and
// checks the slots of its core's siblings. Two different cookies ever seen at
// once on one core is a violation. Slots use seq_cst, so of two overlapping
// fibers at least one sees the other.
#pragma once

#include <coresched/coresched.hpp>

#include <atomic>
#include <memory>
#include <vector>

class IsolationProbe {
public:
  explicit IsolationProbe(const coresched::Topology& t) : topo_(t), slots_(new std::atomic<std::uint64_t>[t.pus().size()]) {
    for (std::size_t i = 0; i < t.pus().size(); ++i) slots_[i].store(kEmpty);
  }
  /// Call when the fiber (re)starts running user code.
  void enter() {
    const auto where = coresched::this_fiber::location();
    const std::uint64_t mine = coresched::this_fiber::cookie().value();
    slots_[where.worker].store(mine);
    for (unsigned pu : topo_.cores()[where.core].pus) {
      if (pu == where.worker) continue;
      const std::uint64_t other = slots_[pu].load();
      if (other != kEmpty && other != mine) violations.fetch_add(1);
    }
  }
  /// Call before anything that may switch the fiber out.
  void leave() { slots_[coresched::this_fiber::location().worker].store(kEmpty); }

  std::atomic<std::uint64_t> violations{0};

private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  const coresched::Topology& topo_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> slots_;
};
