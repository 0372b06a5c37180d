// SPDX-License-Identifier: Apache-2.0
#include "core/placement.hpp"

namespace coresched::detail {

PlacementIndex::PlacementIndex(const Topology& topo, std::vector<CoreCoordinator*> cores)
    : topo_(topo), cores_(std::move(cores)), pu_bit_(topo.pus().size()), core_bit_(topo.cores().size()),
      idle_(new std::atomic<bool>[topo.pus().size()]) {
  std::vector<std::vector<unsigned>> workers(topo.llcs().size()), llc_cores(topo.llcs().size());
  for (const auto& c : topo.cores()) {
    core_bit_[c.index] = static_cast<unsigned>(llc_cores[c.llc].size());
    llc_cores[c.llc].push_back(c.index);
  }
  for (const auto& pu : topo.pus()) {
    pu_bit_[pu.index] = static_cast<unsigned>(workers[pu.llc].size());
    workers[pu.llc].push_back(pu.index);
    idle_[pu.index].store(false, std::memory_order_relaxed);
  }
  llcs_.reserve(workers.size());
  for (std::size_t l = 0; l < workers.size(); ++l) llcs_.emplace_back(std::move(workers[l]), std::move(llc_cores[l]));
}

bool PlacementIndex::core_idle(unsigned core) const noexcept {
  for (unsigned pu : topo_.cores()[core].pus)
    if (!idle_[pu].load(std::memory_order_acquire)) return false;
  return true;
}

void PlacementIndex::set_idle(unsigned worker, bool idle) noexcept {
  const PuInfo& pu = topo_.pus()[worker];
  Llc& l = llcs_[pu.llc];
  idle_[worker].store(idle, std::memory_order_seq_cst);
  if (idle) {
    l.idle_pus.set(pu_bit_[worker]);
    // Of two siblings idling at once, at least one sees the other (seq_cst): the core bit gets set.
    if (core_idle(pu.core)) l.idle_cores.set(core_bit_[pu.core]);
  } else {
    l.idle_cores.clear(core_bit_[pu.core]);
    l.idle_pus.clear(pu_bit_[worker]);
  }
}

int PlacementIndex::classify(std::uint64_t cookie, unsigned worker) const noexcept {
  if (!idle_[worker].load(std::memory_order_acquire)) return 0;
  const unsigned core = topo_.pus()[worker].core;
  // What the core runs, a blocking call's held cookie included: a core whose
  // PUs all idle beside another cookie's call is no place for this fiber.
  const std::uint64_t running = cores_[core]->running_cookie();
  if (running == kNoCookie && core_idle(core)) return 1;
  // A sibling between fibers (running nothing) conflicts with nothing either.
  return running == cookie || running == kNoCookie ? 2 : 0;
}

unsigned PlacementIndex::choose_by_mask(std::uint64_t cookie, unsigned llc, unsigned core_bit,
                                        unsigned pu_bit) const {
  const Llc& l = llcs_[llc];
  // A wholly idle core: a word or two, then a check that the bit is not stale.
  auto whole = [&](unsigned core) {
    for (unsigned pu : topo_.cores()[core].pus)
      if (classify(cookie, pu) == 1) return pu;
    return kNone;
  };
  const int cb = l.idle_cores.find_from(core_bit, [&](unsigned b) { return whole(l.cores[b]) != kNone; });
  if (cb >= 0) return whole(l.cores[static_cast<unsigned>(cb)]);
  // Then an idle PU whose core already runs this cookie.
  const int bit = l.idle_pus.find_from(pu_bit, [&](unsigned b) { return classify(cookie, l.workers[b]) == 2; });
  return bit >= 0 ? l.workers[static_cast<unsigned>(bit)] : kNone;
}

unsigned PlacementIndex::choose_by_scan(std::uint64_t cookie, unsigned llc, unsigned core_bit,
                                        unsigned pu_bit) const {
  const Llc& l = llcs_[llc];
  const auto n = static_cast<unsigned>(l.workers.size());
  // Same order as the mask: cores from the start core, then PUs from the start PU.
  for (unsigned i = 0; i < l.cores.size(); ++i) {
    const unsigned core = l.cores[(core_bit + i) % l.cores.size()];
    for (unsigned pu : topo_.cores()[core].pus)
      if (classify(cookie, pu) == 1) return pu;
  }
  for (unsigned i = 0; i < n; ++i) {
    const unsigned pu = l.workers[(pu_bit + i) % n];
    if (classify(cookie, pu) == 2) return pu;
  }
  return kNone;
}

unsigned PlacementIndex::choose(std::uint64_t cookie, unsigned prev, Placement how) const {
  if (classify(cookie, prev) != 0) return prev; // cache-warm and free
  const PuInfo& from = topo_.pus()[prev];
  auto search = [&](unsigned llc, unsigned core_bit, unsigned pu_bit) {
    return how == Placement::mask ? choose_by_mask(cookie, llc, core_bit, pu_bit)
                                  : choose_by_scan(cookie, llc, core_bit, pu_bit);
  };
  unsigned w = search(from.llc, core_bit_[from.core], pu_bit_[prev]);
  // Nothing idle in its own LLC: an idle worker in another LLC beats queueing
  // behind a busy one (on machines whose every core is its own LLC, like the
  // development VM, this is the only way to reach another core).
  for (unsigned i = 1; w == kNone && i < llcs_.size(); ++i) w = search((from.llc + i) % llc_count(), 0, 0);
  return w;
}

} // namespace coresched::detail
