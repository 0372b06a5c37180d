// SPDX-License-Identifier: Apache-2.0
// Wakeup placement (seed 001). Per LLC, two atomic bitmasks: idle workers, and
// wholly idle cores. A woken fiber goes, in order, to: its previous worker if
// idle; a wholly idle core of its LLC; an idle PU whose core already runs its
// cookie; failing those, the same in the other LLCs, nearest first. An idle PU
// whose core runs another cookie could only be forced idle,
// so it is never chosen. Both searches start at the previous worker's place
// and wrap around, as the kernel's select_idle_cpu does. `scan` walks every worker instead, as the kernel did
// before the idle mask, so the two can be compared; both choose the same PU.
#pragma once

#include "core/core_coordinator.hpp"
#include "core/idle_mask.hpp"

#include <coresched/options.hpp>
#include <coresched/topology.hpp>

#include <atomic>
#include <memory>
#include <vector>

namespace coresched::detail {

class PlacementIndex {
public:
  static constexpr unsigned kNone = ~0u;

  /// `cores[i]` is the coordinator of topology core i (read for running cookies).
  PlacementIndex(const Topology& topo, std::vector<CoreCoordinator*> cores);

  /// A worker enters (true) or leaves (false) its idle loop.
  void set_idle(unsigned worker, bool idle) noexcept;
  bool idle(unsigned worker) const noexcept { return idle_[worker].load(std::memory_order_acquire); }

  /// Where a fiber of `cookie` that last ran on `prev` should run; kNone if no
  /// idle PU suits it (the caller then keeps it near the waker).
  unsigned choose(std::uint64_t cookie, unsigned prev, Placement how) const;

  /// Calls f(worker) for each idle worker of `llc` until f returns true.
  template <class F> void for_each_idle(unsigned llc, F&& f) const {
    llcs_[llc].idle_pus.find([&](unsigned bit) { return f(llcs_[llc].workers[bit]); });
  }
  unsigned llc_count() const noexcept { return static_cast<unsigned>(llcs_.size()); }

private:
  struct Llc {
    std::vector<unsigned> workers; // mask bit -> worker
    std::vector<unsigned> cores;   // core mask bit -> core
    IdleMask idle_pus;
    IdleMask idle_cores;
    Llc(std::vector<unsigned> w, std::vector<unsigned> c)
        : workers(std::move(w)), cores(std::move(c)), idle_pus(static_cast<unsigned>(workers.size())),
          idle_cores(static_cast<unsigned>(cores.size())) {}
  };
  /// 0: unsuitable; 1: idle PU on a wholly idle core; 2: idle PU whose core runs `cookie`.
  int classify(std::uint64_t cookie, unsigned worker) const noexcept;
  bool core_idle(unsigned core) const noexcept;
  unsigned choose_by_mask(std::uint64_t cookie, unsigned llc, unsigned core_bit, unsigned pu_bit) const;
  unsigned choose_by_scan(std::uint64_t cookie, unsigned llc, unsigned core_bit, unsigned pu_bit) const;

  const Topology& topo_;
  std::vector<CoreCoordinator*> cores_;
  std::vector<Llc> llcs_;
  std::vector<unsigned> pu_bit_;   // worker -> bit in its LLC's PU mask
  std::vector<unsigned> core_bit_; // core -> bit in its LLC's core mask
  std::unique_ptr<std::atomic<bool>[]> idle_;
};

} // namespace coresched::detail
